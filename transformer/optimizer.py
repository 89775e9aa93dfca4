"""What a run trains with: the learning-rate schedule, Adam, the masked loss and accuracy."""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf

from transformer.config import RunConfig
from transformer.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from transformer.model import Transformer
from transformer.schedule import WarmupCosine, WarmupInverseSqrt


def make_schedule(config: RunConfig, d_model: int, progress: Optional[tf.Variable] = None,
                  total_steps: Optional[int] = None) -> keras.optimizers.schedules.LearningRateSchedule:
    """The learning-rate schedule of `config.train` (see transformer/schedule.py).

    The cosine schedule decays over the planned run: `progress` (a time budget's fraction
    spent, from `budget.TrainingClock`) when there is a budget, else `total_steps`.
    """
    train_config = config.train
    if train_config.lr_schedule == "inverse-sqrt":
        return WarmupInverseSqrt(d_model, train_config.warmup_steps, train_config.peak_learning_rate)
    if train_config.time_budget_minutes is not None:
        return WarmupCosine(train_config.peak_learning_rate, train_config.warmup_steps, progress=progress)
    if total_steps is None:
        raise ValueError("the cosine schedule needs the planned length: give --time-budget or --steps-per-epoch")
    return WarmupCosine(train_config.peak_learning_rate, train_config.warmup_steps, total_steps=total_steps)


def compile_model(model: Transformer, config: RunConfig, schedule=None) -> keras.optimizers.Optimizer:
    """Adam(0.9, 0.98, 1e-9) on `schedule` (default: `make_schedule`), masked loss/accuracy, optional XLA.

    Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer. The optimizer's
    variables are created here so a checkpoint can restore them before the first step.
    Call it under the strategy's scope, as `build_model`.
    """
    if schedule is None:
        schedule = make_schedule(config, model.config.d_model)
    optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    model.compile(
        optimizer=optimizer,
        loss=MaskedSparseCrossEntropy(config.train.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=config.train.xla,
    )
    model.optimizer.build(model.trainable_variables)
    return model.optimizer
