"""Layer normalization with a hand-written gradient: fewer ops than Keras' autodiff.

Keras 3's `LayerNormalization` builds the norm from basic float32 ops and leaves the
gradient to autodiff, which on CPU (no XLA) runs as a long chain of small element-wise and
reduction kernels: layer norm was 8.7% of the default model's mixed-precision training step
(`--profile-steps`, docs/speed.md). `layer_norm` computes the same function
in float32 (two-pass moments: mean, then mean of squared deviations) and supplies its
gradient in closed form:

    x̂ = (x - μ) · r,  r = (σ² + ε)^-½,  y = γ x̂ + β
    ∂x = r · (g - mean(g) - x̂ · mean(g · x̂)),  g = γ ∂y;   ∂γ = Σ ∂y x̂;   ∂β = Σ ∂y

Measured on `[64, 32, 256]` bfloat16, forward + backward: 1.30× Keras' layer (Zen 5, one
core, contended). `LayerNorm` is a drop-in `keras.layers.LayerNormalization` (same
config, same `gamma`/`beta` variables, so checkpoints of the Keras layer load unchanged);
it falls back to Keras' computation for other axes, `rms_scaling` or no center/scale.

In training calls, while the fused CPU kernels are enabled (`transformer/runtime/fused_kernels.py`),
`fused_layer_norm` computes the same function and gradient in one C++ kernel each way, on x's own
dtype (no casts): 3.3× the closed form above on `[64, 32, 256]` bfloat16, forward + backward.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from transformer.runtime.fused_kernels import active_kernels


def _normalized(x32: tf.Tensor, epsilon: float) -> tuple:
    """(x̂ = (x - μ) · r, r = (σ² + ε)^-½) over the last axis of float32 `x32` (two-pass moments)."""
    mean = tf.reduce_mean(x32, -1, keepdims=True)
    centred = x32 - mean
    inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centred), -1, keepdims=True) + epsilon)
    return centred * inv, inv


def layer_norm_value(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """`layer_norm`'s value, the same ops, without its gradient (no custom-gradient wrapper):
    for inference steps, where every op counts. gamma, beta: float32 `[d]`; returns x's dtype."""
    normed, _ = _normalized(tf.cast(x, tf.float32), epsilon)
    return tf.cast(normed * gamma + beta, x.dtype)


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """Normalize `x [..., d]` (any float dtype) over its last axis in float32; returns x's dtype.

    gamma, beta: float32 `[d]`.
    """

    @tf.custom_gradient
    def _norm(x32, gamma, beta):
        normed, inv = _normalized(x32, epsilon)

        def grad(dy):
            with tf.name_scope("layer_norm_grad"):  # else at the root scope: `--profile-steps` says "other"
                rows = tf.range(tf.rank(dy) - 1)
                g = dy * gamma
                dx = inv * (g - tf.reduce_mean(g, -1, keepdims=True)
                            - normed * tf.reduce_mean(g * normed, -1, keepdims=True))
                return dx, tf.reduce_sum(dy * normed, rows), tf.reduce_sum(dy, rows)

        return normed * gamma + beta, grad

    y = _norm(tf.cast(x, tf.float32), tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))
    return tf.cast(y, x.dtype)


def fused_layer_norm(kernels, x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """`layer_norm` by the fused kernels' `FusedLayerNorm` (`kernels`: the op library), x's dtype in and out.

    x: `[..., d]` float32, bfloat16 or float16; gamma, beta: `[d]` (cast to float32).
    """

    @tf.custom_gradient
    def _norm(x, gamma, beta):
        y, mean, inv = kernels.fused_layer_norm(x, gamma, beta, epsilon=epsilon)

        def grad(dy):
            with tf.name_scope("layer_norm_grad"):
                return kernels.fused_layer_norm_grad(dy, x, gamma, mean, inv)

        return y, grad

    return _norm(x, tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))


@keras.saving.register_keras_serializable(package="transformer")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` computed by `layer_norm` (last axis, center and scale)."""

    def call(self, inputs, training=None):
        if (list(self.axis) in ([-1], [len(inputs.shape) - 1]) and self.center and self.scale
                and not self.rms_scaling):
            x = tf.convert_to_tensor(inputs)
            kernels = active_kernels() if training else None
            if kernels is not None and x.dtype in (tf.float32, tf.bfloat16, tf.float16):
                return tf.cast(fused_layer_norm(kernels, x, tf.convert_to_tensor(self.gamma),
                                                tf.convert_to_tensor(self.beta), self.epsilon), self.compute_dtype)
            return tf.cast(layer_norm(x, tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta),
                                      self.epsilon), self.compute_dtype)
        return super().call(inputs)
