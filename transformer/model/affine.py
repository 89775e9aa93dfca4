"""The FFN's and attention output's dense layers as one 2-D product: `x · W + b` (then ReLU), fused
forward, bias gradient summed in float32.

    y = affine(x, kernel, bias, relu=True)   # x [..., d_in], kernel [d_in, d_out], bias [d_out] → [..., d_out]

Two things Keras' `Dense` / `EinsumDense` leave on the table on a CPU, in training above all:

- **The bias gradient is wrong in bfloat16.** Keras 3 adds the bias with `tf.nn.bias_add`, whose
  gradient `BiasAddGrad` sums bfloat16 rows in bfloat16 on a CPU: every FFN and attention-output
  bias gradient of a mixed-precision step came out ~5% off (L2; `[2048, 1024]` and `[2048, 256]`
  N(0, 1e-3) rows, 1.9% at 256 rows), where a matrix product with a row of ones is off only by the
  final bfloat16 rounding (0.17%; oneDNN and cuBLAS accumulate in float32), and is the faster of
  the two (0.41 against 0.89 ms on `[2048, 1024]`, one thread, EPYC Zen 4).
- **The forward is three kernels.** Keras' `tensordot` puts a reshape between the MatMul and its
  BiasAdd, so TensorFlow's remapper cannot fuse them. Here the MatMul, BiasAdd and ReLU are
  adjacent 2-D ops, which the remapper runs as one oneDNN matmul with the bias and ReLU applied
  in its epilogue (`_MklNativeFusedMatMul`; `_FusedMatMul` without oneDNN's ops).

The gradient is written out (`tf.custom_gradient`) so that no gradient op reads the pre-ReLU
product (which would keep it alive and block the fusion): the same MatMuls autodiff runs, ReLU's
gradient from its output, and the bias gradient as `ones [1, rows] · upstream` (with the fused
kernels, `FusedBiasReluGrad` applies the ReLU's and the dropout's masks and sums it in one pass).
The FFN block (`[64, 32, 256]` → 1024 → 256, bfloat16, forward + backward) ran 1.05× as fast as
Keras' layers, float32 without oneDNN's ops 0.99-1.00× (docs/speed.md).
"""

from __future__ import annotations

import math
from typing import Optional

import tensorflow as tf

from transformer.model.dropout import no_dropout


def affine(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, relu: bool = False, kernels=None,
           dropout: Optional[tuple] = None) -> tf.Tensor:
    """`x [..., d_in] · kernel [d_in, d_out] + bias [d_out]`, then ReLU if `relu`; all in x's dtype.

    `kernels`: the fused CPU kernels' op library (a training call while they are enabled), or None.
    With it, a bfloat16 product runs alone (oneDNN's plain matmul: AMX) and `FusedBiasRelu` adds
    the bias (and ReLU) in one pass; the remapper's fused product ran on oneDNN's slower
    `inner_product` there (docs/speed.md). Its gradient `FusedBiasReluGrad` applies the ReLU's
    mask and sums the bias gradient in one pass.
    `dropout`: `(rate, seed)` (float32 scalar, int32 `[2]`; `dropout.dropout_rate_and_seed`), applied
    to the result by the same kernels; only where `uses_kernels(x.dtype, kernels)`.
    """
    d_in, d_out = kernel.shape
    rows = tf.reshape(x, [-1, d_in])
    fused = kernels if uses_kernels(x.dtype, kernels) else None
    if dropout is not None and fused is None:
        raise ValueError("affine's dropout runs in the fused kernels: a bfloat16 training call with them enabled")
    y = _affine_rows(rows, kernel, bias, relu, fused, dropout)
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [d_out]], axis=0))


def add_bias(y: tf.Tensor, bias: tf.Tensor, kernels=None) -> tf.Tensor:
    """`y [..., *b] + bias b` (any rank, y's last axes) in y's dtype. Where `uses_kernels`, by
    `FusedBiasRelu` (in place), whose gradient `FusedBiasReluGrad` sums the bias gradient in float32
    in the same pass that hands the upstream gradient on; else TensorFlow's add."""
    bias = tf.cast(bias, y.dtype)
    if not uses_kernels(y.dtype, kernels):
        return y + bias
    rate, seed = no_dropout()
    width, shape = math.prod(bias.shape), tf.shape(y)

    @tf.custom_gradient
    def forward(y, bias):
        out = kernels.fused_bias_relu(tf.reshape(y, [-1, width]), tf.reshape(bias, [width]), rate, seed, relu=False)

        def grad(upstream):
            d_y, d_bias = kernels.fused_bias_relu_grad(tf.reshape(upstream, [-1, width]), out, rate, seed, relu=False)
            return tf.reshape(d_y, shape), tf.reshape(d_bias, tf.shape(bias))

        return tf.reshape(out, shape), grad

    return forward(y, bias)


def uses_kernels(dtype: tf.DType, kernels) -> bool:
    """Whether `affine` on `dtype` rows runs its bias (ReLU, dropout) in the fused `kernels` (bfloat16 only)."""
    return kernels is not None and dtype == tf.bfloat16


def with_ones_column(x: tf.Tensor) -> tf.Tensor:
    """`x [..., d]` → `[..., d + 1]`, a last column of ones: the input of a product whose kernel has
    the bias as its last row (`bias_row`)."""
    return tf.concat([x, tf.ones(tf.concat([tf.shape(x)[:-1], [1]], axis=0), x.dtype)], axis=-1)


def bias_row(kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """`kernel [d_in, *out]` with `bias [*out]` appended as row d_in: `[d_in + 1, *out]`."""
    return tf.concat([kernel, tf.cast(bias, kernel.dtype)[tf.newaxis]], axis=0)


def _affine_rows(rows: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, relu: bool, kernels=None,
                 dropout: Optional[tuple] = None) -> tf.Tensor:
    """`affine` on `rows [N, d_in]` → `[N, d_out]`, with its closed-form gradient.

    With the fused kernels, a product at least as wide as its input without ReLU or dropout is ONE
    matmul, `[rows, 1] · [kernel; bias]`: the product adds the bias inside its float32 accumulation
    (one rounding where a separate add makes two) and its kernel gradient's last row is the bias
    gradient, summed in float32 and rounded once. No pass over the `[N, d_out]` result either way:
    on `[8192, 128] → 1024` bfloat16, forward + backward 5.4 ms against 10.5 with `FusedBiasRelu`
    (AMX Xeon, docs/speed.md); where the input is the wider, copying it with the column costs more.
    """
    if kernels is not None and not relu and dropout is None and kernel.shape[1] >= kernel.shape[0]:
        return tf.matmul(with_ones_column(rows), bias_row(kernel, bias))
    if kernels is not None:
        rate, seed = dropout if dropout is not None else no_dropout()

    @tf.custom_gradient
    def forward(rows, kernel, bias):
        if kernels is not None:
            y = kernels.fused_bias_relu(tf.matmul(rows, kernel), bias, rate, seed, relu=relu)
        else:
            y = tf.nn.bias_add(tf.matmul(rows, kernel), bias)
            if relu:
                y = tf.nn.relu(y)

        def grad(upstream):
            if kernels is not None:
                pre, d_bias = kernels.fused_bias_relu_grad(upstream, y, rate, seed, relu=relu)  # ∂/∂(xW + b), Σ rows
            else:
                pre = tf.raw_ops.ReluGrad(gradients=upstream, features=y) if relu else upstream
                d_bias = tf.reshape(tf.matmul(tf.ones([1, tf.shape(pre)[0]], pre.dtype), pre), [-1])
            return tf.matmul(pre, kernel, transpose_b=True), tf.matmul(rows, pre, transpose_a=True), d_bias

        return y, grad

    return forward(rows, kernel, bias)
