"""Learning-rate schedules."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="transformer")
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)  (Vaswani et al. 2017).

    `step` counts from 1 (the optimizer's iteration count + 1), so the first update is
    not taken at lr 0. Peak lr = (d_model · warmup)^-0.5 at step == warmup_steps.
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000):
        self.d_model = d_model
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        scale = tf.math.rsqrt(tf.cast(self.d_model, tf.float32))
        return scale * tf.minimum(tf.math.rsqrt(step), step * float(self.warmup_steps) ** -1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps}
