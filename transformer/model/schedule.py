"""Learning-rate schedules (all take the optimizer's step count; lr in optimizer units).

`WarmupInverseSqrt` is the paper's / TF tutorial's schedule. `WarmupCosine` warms up
linearly for `warmup_steps`, then follows a half cosine from `peak_lr` down to
`final_fraction · peak_lr` over the *planned* length of the run, given either as a step
count or as a `progress` variable in [0, 1] that a callback keeps up to date (the fraction
of a `--time-budget` spent, see transformer/training/budget.py), so a time-budgeted run ends its
schedule exactly when its time runs out.

`scale_for_batch` adapts a recipe's `peak_lr` and `warmup_steps` to a batch k times the
batch they were tuned for (`--lr-scaling`): the warmup keeps its length in tokens
(warmup_steps / k) and the peak grows as √k (Adam's square-root rule: Hoffer et al. 2017,
Malladi et al. 2022), capped at `MAX_PEAK_LR_FACTOR` = √2 because the post-norm default
recipe broke at 2× its peak (2e-3: 1.5 BLEU at 1,600 steps, docs/recipes.md) and Adam's
step size, not the gradient noise that a larger batch lowers, is what breaks it; √2 is
the geometric middle of the rate measured good (1×) and the one measured broken (2×).
Ott et al. 2018 likewise only doubled the rate for a 16× batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import keras
import tensorflow as tf

from transformer.base.config import TrainConfig

MAX_PEAK_LR_FACTOR = math.sqrt(2.0)  # the peak learning rate grows at most this much with the batch


def resolve_lr_scaling(requested: str, batch_was_auto: bool) -> str:
    """`--lr-scaling` auto → off: the recipe's schedule whatever the batch (sqrt only when asked).

    Measured: the recipe's own schedule at 16,384 tokens reached validation BLEU 29.17 in 3
    minutes on an H100; the sqrt rule at 8× the batch gave 0.52 BLEU against the recipe's 10.66
    at equal target tokens on a CPU (2-core Intel Xeon, amx_bf16, 1,600 vs 200 steps, one seed),
    and uncapped it diverged (docs/batch-size.md). `batch_was_auto` is kept for the record.
    """
    del batch_was_auto
    return "off" if requested == "auto" else requested


def batch_factor(max_tokens: Optional[int], reference_tokens: int) -> float:
    """k = max_tokens / reference_tokens (1.0 for sentence batches, max_tokens None)."""
    return 1.0 if max_tokens is None else max_tokens / reference_tokens


def scale_for_batch(train: TrainConfig, factor: float, rule: str, d_model: int) -> TrainConfig:
    """`train` with its schedule scaled for a batch `factor` × `train.lr_reference_tokens`.

    rule "sqrt": warmup_steps / k (rounded, ≥ 1) and peak_lr × min(√k, MAX_PEAK_LR_FACTOR); "off":
    unchanged. The result records `lr_scaling` = rule and `lr_batch_factor` = k; a config that
    already records a factor (a saved config.json) is returned as it is, so scaling is applied
    once. An inverse-sqrt schedule without `peak_learning_rate` gets its implied peak,
    (d_model · warmup)^-0.5, made explicit before scaling.
    """
    if train.lr_batch_factor is not None:
        return train
    if rule == "off" or factor == 1.0:
        return dataclasses.replace(train, lr_scaling=rule, lr_batch_factor=factor)
    peak = train.peak_learning_rate
    if peak is None:
        peak = (d_model * train.warmup_steps) ** -0.5
    return dataclasses.replace(
        train, lr_scaling=rule, lr_batch_factor=factor,
        peak_learning_rate=peak * min(math.sqrt(factor), MAX_PEAK_LR_FACTOR),
        warmup_steps=max(1, round(train.warmup_steps / factor)))


@keras.saving.register_keras_serializable(package="transformer")
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)  (Vaswani et al. 2017).

    `step` counts from 1 (the optimizer's iteration count + 1), so the first update is
    not taken at lr 0. Peak lr = (d_model · warmup)^-0.5 at step == warmup_steps; with
    `peak_lr` the curve is rescaled to peak there instead.
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, peak_lr: Optional[float] = None):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.peak_lr = peak_lr

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        if self.peak_lr is None:
            scale = tf.math.rsqrt(tf.cast(self.d_model, tf.float32))
        else:  # (d_model · warmup)^-0.5 → peak_lr
            scale = self.peak_lr * math.sqrt(self.warmup_steps)
        return scale * tf.minimum(tf.math.rsqrt(step), step * float(self.warmup_steps) ** -1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "peak_lr": self.peak_lr}


@keras.saving.register_keras_serializable(package="transformer")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak_lr`, then cosine decay to `final_fraction · peak_lr`.

    Args:
        peak_lr: float. Learning rate at the end of warmup.
        warmup_steps: int. Steps of linear warmup (from peak_lr / warmup_steps).
        total_steps: int or None. Planned optimizer steps; decay ends there.
        progress: scalar float tf.Variable or None. Fraction of the run done (0 → 1);
            used instead of `total_steps` when given (time budgets).
        final_fraction: float. lr at the end, as a fraction of `peak_lr`.
    """

    def __init__(self, peak_lr: float, warmup_steps: int, total_steps: Optional[int] = None,
                 progress: Optional[tf.Variable] = None, final_fraction: float = 0.0):
        if total_steps is None and progress is None:
            raise ValueError("WarmupCosine needs the planned length: total_steps or a progress variable")
        self.peak_lr = peak_lr
        self.warmup_steps = max(1, int(warmup_steps))
        self.total_steps = total_steps
        self.progress = progress
        self.final_fraction = final_fraction

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warm = tf.minimum(1.0, step / float(self.warmup_steps))
        if self.progress is not None:
            done = tf.cast(tf.convert_to_tensor(self.progress), tf.float32)
        else:
            decay_steps = float(max(1, self.total_steps - self.warmup_steps))
            done = (step - float(self.warmup_steps)) / decay_steps
        done = tf.clip_by_value(done, 0.0, 1.0)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * done))
        return self.peak_lr * warm * (self.final_fraction + (1.0 - self.final_fraction) * cosine)

    def get_config(self):
        return {"peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "final_fraction": self.final_fraction}
