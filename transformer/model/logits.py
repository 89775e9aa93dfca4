"""The output projection: logits `x · W + b` in float32, and in a bfloat16 model's training calls its
two gradient products in bfloat16.

    logits = Logits(vocab_size, grad_dtype="bfloat16", name="logits")(x, training=True)
    # x [B, T, d_model] → logits [B, T, V] float32

The forward stays float32 under every policy, so the softmax and the loss see the float32 logits
the tests pin. What changes is the backward of a bfloat16 model's training call: the upstream
gradient `[B·T, V]` is rounded to bfloat16 once, and the products `∂x = g · Wᵀ` and `∂W = xᵀ · g`
run in bfloat16 (oneDNN on AMX / AVX512-BF16, tensor cores on a GPU), float32 accumulation
inside; the bias gradient is summed from the float32 upstream (with the fused CPU kernels, in the
same pass that rounds it: `FusedCastSum`). `x` itself is a bfloat16 model's
decoder output, so its float32 copy holds bfloat16 values and rounding it back is exact. On the
AMX Xeon the float32 projection was ~17% of the bfloat16 step's device time, two thirds of it
backward (docs/speed.md, "The projection's gradient in bfloat16").

Rounding the *forward* logits to bfloat16 as well measured +0.018 validation loss at 1,600 steps
(docs/recipes.md); rounding only the gradient is what mixed precision does everywhere else in
the model.
"""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf

from transformer.runtime.fused_kernels import active_kernels


def project(x: tf.Tensor, matrix: tf.Tensor, bias: tf.Tensor, grad_dtype: Optional[tf.DType] = None,
            transposed: bool = False, kernels=None) -> tf.Tensor:
    """`x [..., d] · W + b` float32 → `[..., V]`, W = `matrix [d, V]` (`transposed`: `matrix [V, d]`, W = matrixᵀ).

    grad_dtype: None, the float32 products' own gradient; or the dtype (bfloat16) the two gradient
        products run in, the upstream rounded to it once and `∂matrix` returned in float32.
    kernels: the fused CPU kernels (a training call while they are enabled) or None. With them
        and a `grad_dtype`, `FusedCastSum` rounds the upstream and sums the bias gradient in one pass.
    """
    x32, matrix, bias = tf.cast(x, tf.float32), tf.cast(matrix, tf.float32), tf.cast(bias, tf.float32)
    if grad_dtype is None:
        logits = tf.einsum("...d,vd->...v" if transposed else "...d,dv->...v", x32, matrix)
        return logits + bias
    return _project_low_grad(x32, matrix, bias, tf.as_dtype(grad_dtype), transposed, kernels)


def _project_low_grad(x, matrix, bias, grad_dtype, transposed, kernels):
    d, vocab = x.shape[-1], bias.shape[0]

    @tf.custom_gradient
    def forward(x, matrix, bias):
        rows = tf.reshape(x, [-1, d])  # [N, d]
        logits = tf.nn.bias_add(tf.matmul(rows, matrix, transpose_b=transposed), bias)  # [N, V]

        def grad(upstream):
            up = tf.reshape(upstream, [-1, vocab])  # [N, V] float32
            if kernels is not None:
                g, d_bias = kernels.fused_cast_sum(up, Tout=grad_dtype)
            else:
                g, d_bias = tf.cast(up, grad_dtype), tf.reduce_sum(up, axis=0)
            low_rows, low_matrix = tf.cast(rows, grad_dtype), tf.cast(matrix, grad_dtype)
            d_rows = tf.matmul(g, low_matrix, transpose_b=not transposed)  # [N, d]
            d_matrix = (tf.matmul(g, low_rows, transpose_a=True) if transposed  # [V, d]
                        else tf.matmul(low_rows, g, transpose_a=True))  # [d, V]
            return tf.reshape(tf.cast(d_rows, x.dtype), tf.shape(x)), tf.cast(d_matrix, matrix.dtype), d_bias

        return tf.reshape(logits, tf.concat([tf.shape(x)[:-1], [vocab]], axis=0)), grad

    return forward(x, matrix, bias)


@keras.saving.register_keras_serializable(package="transformer")
class Logits(keras.layers.Dense):
    """The untied output projection: a float32 `Dense(vocab_size)` (same variables, checkpoints and
    inference call), whose training calls take `project`'s bfloat16 gradient products when
    `grad_dtype` is set (a bfloat16 model's; None otherwise).

    Call arguments:
        x: `[batch, length, d_model]` (cast to float32 by Keras).
        training: bool.

    Returns:
        logits `[batch, length, vocab_size]` float32.
    """

    def __init__(self, units, grad_dtype: Optional[str] = None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(units, **kwargs)
        self.grad_dtype = grad_dtype

    def call(self, inputs, training=None):
        if training and self.grad_dtype is not None:
            return project(inputs, self.kernel, self.bias, self.grad_dtype, kernels=active_kernels())
        return super().call(inputs)

    def get_config(self):
        return {**super().get_config(), "grad_dtype": self.grad_dtype}
