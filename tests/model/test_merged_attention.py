"""Training's attention with merged head matrices (`CachedMultiHeadAttention._attend_merged`, heads
at least as wide as the inputs: the tutorial's) computes what the per-head form computes: output,
scores and every gradient, with and without biases, a mask, cross-attention and dropout; under a
bfloat16 policy with the fused kernels it runs without transposes."""

import numpy as np
import pytest
import tensorflow as tf

from transformer.model import layers
from transformer.model.layers import CachedMultiHeadAttention
from transformer.runtime.fused_kernels import KernelsUnavailable, disable_fused_kernels, enable_fused_kernels

DIM, HEADS, BATCH, LENGTH, KEYS = 8, 3, 2, 5, 6


def built_attention(key_dim=DIM, use_bias=True, dtype="float32", dropout=0.0) -> CachedMultiHeadAttention:
    layer = CachedMultiHeadAttention(num_heads=HEADS, key_dim=key_dim, use_bias=use_bias, dtype=dtype, dropout=dropout)
    layer.build((BATCH, LENGTH, DIM), (BATCH, KEYS, DIM))
    for index, weight in enumerate(layer.weights):  # biases too: Keras starts them at zero, which would hide a lost bias
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(index, 1), stddev=0.5))
    return layer


def attend(layer, merged: bool, x, memory, mask):
    """(output, scores, gradients of a loss reading every output w.r.t. x, memory and every weight)."""
    layer.merges_heads = lambda query, value: merged  # the instance attribute shadows the method
    weights = tf.random.stateless_normal(x.shape, seed=(9, 0))
    with tf.GradientTape() as tape:
        tape.watch([x, memory])
        output, scores = layer(x, memory, attention_mask=mask, training=True, return_attention_scores=True)
        loss = tf.reduce_sum(tf.cast(output, tf.float32) * weights)
    grads = tape.gradient(loss, [x, memory, *layer.trainable_weights])
    return output, scores, [tf.convert_to_tensor(g) for g in grads]


def _float(t):
    return tf.cast(t, tf.float32).numpy()


@pytest.mark.parametrize("cross,use_bias,key_dim", [(False, True, DIM), (True, True, DIM), (True, False, DIM),
                                                     (False, True, DIM + 4)])
def test_merged_heads_give_the_per_head_attention_and_gradients(cross, use_bias, key_dim):
    tf.config.experimental.enable_tensor_float_32_execution(False)
    layer = built_attention(key_dim, use_bias)
    x = tf.random.stateless_normal([BATCH, LENGTH, DIM], seed=(1, 0))
    memory = tf.random.stateless_normal([BATCH, KEYS, DIM], seed=(2, 0)) if cross else x
    keys = KEYS if cross else LENGTH
    mask = tf.sequence_mask([keys, 3], keys)[:, tf.newaxis] if cross else tf.linalg.band_part(
        tf.ones([LENGTH, LENGTH], tf.bool), -1, 0)[tf.newaxis]  # padding; causal
    assert layer.merges_heads(x, memory)
    per_head = attend(layer, False, x, memory, mask)
    merged = attend(layer, True, x, memory, mask)
    np.testing.assert_allclose(merged[0].numpy(), per_head[0].numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(merged[1].numpy(), per_head[1].numpy(), atol=1e-6)  # [B, N, T, S]
    names = ["x", "memory", *(weight.path for weight in layer.trainable_weights)]
    for name, got, want in zip(names, merged[2], per_head[2]):
        if use_bias and name.endswith("key/bias"):
            assert not got.numpy().any()  # exactly 0, as in exact arithmetic
        else:
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)


def test_merged_heads_keep_the_value_bias_under_dropout(monkeypatch):
    """With dropout a query's attention weights no longer sum to 1: the value bias's share is their
    sum (`_attend_merged`'s r). A dropout that depends on each weight's value only (so both layouts
    drop the same weights) must give the per-head output."""
    tf.config.experimental.enable_tensor_float_32_execution(False)
    monkeypatch.setattr(layers, "fast_dropout", lambda scores, *_: tf.where(scores > 0.2, scores / 0.8, 0.0))
    layer = built_attention(dropout=0.2)
    x = tf.random.stateless_normal([BATCH, LENGTH, DIM], seed=(1, 0))
    per_head, merged = (attend(layer, flag, x, x, None) for flag in (False, True))
    assert layer._value_dense.bias is not None and np.abs(layer._value_dense.bias.numpy()).max() > 0.1
    np.testing.assert_allclose(merged[0].numpy(), per_head[0].numpy(), atol=1e-5, rtol=1e-5)
    for got, want in zip(merged[2], per_head[2]):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4, rtol=1e-4)


def test_only_heads_at_least_as_wide_as_the_inputs_merge():
    x = tf.zeros([BATCH, LENGTH, DIM])
    assert built_attention(key_dim=DIM).merges_heads(x, x)
    assert not built_attention(key_dim=DIM // 2).merges_heads(x, x)  # "paper" widths: merging adds work


@pytest.fixture
def kernels():
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        enable_fused_kernels("on", "cpu", xla=False)
    except KernelsUnavailable as err:
        pytest.skip(f"fused kernels cannot be built here: {err}")
    yield
    disable_fused_kernels()


def test_bfloat16_merged_attention_runs_the_fused_kernels_without_transposes(kernels, bfloat16_policy):
    layer = built_attention(dtype="mixed_bfloat16")
    x = tf.cast(tf.random.stateless_normal([BATCH, LENGTH, DIM], seed=(1, 0)), tf.bfloat16)
    mask = tf.linalg.band_part(tf.ones([LENGTH, LENGTH], tf.bool), -1, 0)[tf.newaxis]

    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x, x, attention_mask=mask, training=True)
        return y, tape.gradient(y, layer.trainable_weights)

    types = {op.type for op in tf.function(step).get_concrete_function(x).graph.get_operations()}
    assert {"FusedAttentionSoftmax", "FusedAttentionSoftmaxGrad", "FusedBiasRelu"} <= types
    assert "Transpose" not in types
    per_head, merged = (attend(layer, flag, x, x, mask) for flag in (False, True))
    scale = np.abs(_float(per_head[0])).max()
    np.testing.assert_allclose(_float(merged[0]), _float(per_head[0]), atol=0.03 * scale, rtol=0)
    for got, want in zip(merged[2], per_head[2]):  # bfloat16 products in another order
        np.testing.assert_allclose(_float(got), _float(want), atol=0.05 * max(1.0, np.abs(_float(want)).max()), rtol=0)


def test_merged_attention_takes_the_value_bias_share_from_the_kernel(kernels):
    """With the fused kernels the value bias's share r comes from `FusedAttentionSoftmax`'s row sums
    (no reduction of the weights in the graph): every weight dropped leaves the output bias alone,
    as in the per-head form, where r = 1 would add Σ bv_n Wo_n."""
    layer = built_attention(dropout=1.0)
    x = tf.random.stateless_normal([BATCH, LENGTH, DIM], seed=(1, 0))
    mask = tf.linalg.band_part(tf.ones([LENGTH, LENGTH], tf.bool), -1, 0)[tf.newaxis]
    per_head, merged = (attend(layer, flag, x, x, mask) for flag in (False, True))
    bias = np.broadcast_to(layer._output_dense.bias.numpy(), per_head[0].shape)
    np.testing.assert_allclose(per_head[0].numpy(), bias, atol=1e-6)
    np.testing.assert_allclose(merged[0].numpy(), bias, atol=1e-6)
    layer.merges_heads = lambda query, value: True
    graph = tf.function(lambda x: layer(x, x, attention_mask=mask, training=True)).get_concrete_function(x).graph
    assert "Sum" not in {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("merged", [False, True])
def test_float32_attention_with_the_small_products_equals_tensorflows(kernels, monkeypatch, merged):
    """Where TensorFlow's oneDNN ops are off, the float32 attention's batched products (per head, or
    per batch row when merged) run as `SmallBatchMatMul`, forward and backward, with TensorFlow's
    values and gradients (a mask, biases, no dropout)."""
    from transformer.runtime import fused_kernels
    layer = built_attention()
    x = tf.random.stateless_normal([BATCH, LENGTH, DIM], seed=(1, 0))
    mask = tf.linalg.band_part(tf.ones([LENGTH, LENGTH], tf.bool), -1, 0)[tf.newaxis]
    monkeypatch.setattr(fused_kernels, "_small_products", False)  # TensorFlow's BatchMatMul
    kernels_on = attend(layer, merged, x, x, mask)
    monkeypatch.setattr(fused_kernels, "_small_products", True)
    small = attend(layer, merged, x, x, mask)

    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x, x, attention_mask=mask, training=True)
        return y, tape.gradient(y, layer.trainable_weights)

    graph = tf.function(step).get_concrete_function(x).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("SmallBatchMatMul") == 6 and "BatchMatMulV2" not in types  # 2 products, 2 gradients each
    np.testing.assert_allclose(small[0].numpy(), kernels_on[0].numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(small[1].numpy(), kernels_on[1].numpy(), atol=1e-6)
    for got, want in zip(small[2], kernels_on[2]):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)
