"""Exponential moving average (EMA) of the weights (`--ema-decay D`), kept beside the model.

Each trainable variable θ has a float32 shadow θ̄ of its shape, an optimizer variable of
`FusedAdam` (transformer/model/optimizer.py), so it is saved in every checkpoint and backup and
restored on `--resume`. Every `every` = K optimizer updates (after the update whose 0-based
index t is a multiple of K):

    θ̄ ← θ̄ − (1 − d_t^K)·(θ̄ − θ),   d_t = min(D, (1 + n) / (10 + n)),   n = t + 1 updates so far

and the first update of a run (t = 0) copies θ. The warm-up of d_t is OpenNMT-tf's
(`tf.train.ExponentialMovingAverage(num_updates=step)`): without it the average of a short run
keeps a share D^T of its first, random weights (0.999^1600 = 20%). With it the average spans
about the last n / 9 updates until n ≈ 9 / (1 − D), then 1 / (1 − D). Raising d_t to the K-th
power makes K steps apart weigh as K single updates would; between updates the shadow lags the
weights by less than K steps.

The raw weights are never touched: the run's checkpoints hold both, and `ema_copy` builds the
model that `<run>/ema/` saves at the end of training (`--checkpoint ema`). Keras' own
`use_ema` is not used: it has no warm-up, updates every step in ~5 element-wise passes per
variable, overwrites the model's weights with the average when `fit` ends, and puts the shadows
before Adam's moments in the optimizer's variables (checkpoints of runs with and without it
would not line up).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from transformer.model.transformer import Transformer

WARMUP_OFFSET = 10.0  # d_n = min(D, (1 + n) / (10 + n))


def decay_at(step, decay: float, every: int = 1) -> tf.Tensor:
    """The factor d_t^K that scales the shadow at update `step` (t, 0-based; 0 at the first: a copy)."""
    n = tf.cast(step, tf.float32) + 1.0
    warm = tf.minimum(tf.constant(decay, tf.float32), (1.0 + n) / (WARMUP_OFFSET + n))
    return tf.where(tf.equal(step, 0), tf.constant(0.0), tf.pow(warm, float(every)))


def update_shadows(strategy: tf.distribute.Strategy, pairs: list, step, decay: float, every: int) -> None:
    """For `pairs` [(variable, shadow)]: shadow ← shadow − (1 − d)·(shadow − variable) when step % every == 0.

    Called from the optimizer's update (a replica context under a strategy), in one
    cross-replica call. Plain variables (one device) are updated by one XLA-compiled function:
    one fused pass per variable (read both, write the shadow) instead of three element-wise
    ops, about half the time on CPU (docs/speed.md); a strategy's distributed variables are
    updated on every replica's copy, op by op.
    """
    weight = 1.0 - decay_at(step, decay, every)  # () float32
    variables, shadows = [_tf_variable(v) for v, _ in pairs], [_tf_variable(s) for _, s in pairs]
    distributed = any(isinstance(v, tf.distribute.DistributedValues) for v in variables + shadows)

    def merged(distribution):
        def update_all():
            if distributed:
                for variable, shadow in zip(variables, shadows):
                    distribution.extended.update(shadow, _move, args=(variable, weight), group=False)
            else:
                _fused_move(shadows, variables, weight)
            return tf.constant(True)

        if every == 1:
            update_all()
        else:
            tf.cond(tf.equal(step % every, 0), update_all, lambda: tf.constant(False))

    tf.__internal__.distribute.interim.maybe_merge_call(merged, strategy)


def _move(shadow, variable, weight):
    shadow.assign_sub(weight * (shadow - variable))


@tf.function(jit_compile=True)
def _fused_move(shadows, variables, weight):
    for shadow, variable in zip(shadows, variables):
        _move(shadow, variable, weight)


def moving_averages(optimizer) -> list:
    """[(trainable variable, its moving average)] of `FusedAdam(ema_decay=…)`, also inside the
    LossScaleOptimizer that Keras wraps it in under mixed_float16; [] without an average."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return optimizer.moving_averages() if hasattr(optimizer, "moving_averages") else []


def ema_copy(model: Transformer) -> Transformer:
    """A built copy of `model` holding its optimizer's moving averages (`FusedAdam(ema_decay=…)`) as weights.

    Trainable weights take their shadow's value, the others (none in the Transformer) the model's.
    """
    shadows = {id(variable): shadow for variable, shadow in moving_averages(model.optimizer)}
    if len(shadows) != len(model.trainable_weights) or any(id(w) not in shadows for w in model.trainable_weights):
        raise ValueError("the optimizer's moving averages are not those of the model's trainable weights")
    copy = Transformer.from_model_config(model.config)
    copy.build()
    if [w.shape for w in copy.weights] != [w.shape for w in model.weights]:
        raise ValueError("the copy of the model has other weights than the model")
    for target, weight in zip(copy.weights, model.weights):  # same construction, same order
        source = shadows.get(id(weight), weight)
        target.assign(keras.ops.cast(source.numpy(), target.dtype))
    return copy


def _tf_variable(variable):
    """The tf.Variable of a Keras variable (what a strategy's `extended.update` takes)."""
    return variable.value if isinstance(variable, keras.Variable) else variable
