"""The attention's projections as 2-D matmuls (`CachedMultiHeadAttention._project_heads`,
`_project_output`) compute what Keras' own EinsumDense sublayers compute, fused or not, with
and without biases, in float32 and under a bfloat16 policy; training's projections (the
query pre-scaled, the key bias left out) give the same attention and the same gradients."""

import numpy as np
import pytest
import tensorflow as tf

from transformer.model.layers import CachedMultiHeadAttention

DIM, HEADS, KEY_DIM, BATCH, LENGTH = 12, 3, 5, 2, 7


def built_attention(dtype="float32", use_bias=True) -> CachedMultiHeadAttention:
    tf.random.set_seed(3)
    layer = CachedMultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM, use_bias=use_bias, dtype=dtype)
    layer.build((BATCH, LENGTH, DIM), (BATCH, LENGTH, DIM))
    for index, weight in enumerate(layer.weights):  # biases too: Keras starts them at zero, which would hide a lost bias
        weight.assign(tf.random.normal(weight.shape, seed=index))
    return layer


@pytest.mark.parametrize("use_bias", [True, False])
def test_projections_equal_the_einsum_dense_sublayers(use_bias):
    tf.config.experimental.enable_tensor_float_32_execution(False)
    layer = built_attention(use_bias=use_bias)
    x = tf.random.normal([BATCH, LENGTH, DIM], seed=1)
    denses = (layer._query_dense, layer._key_dense, layer._value_dense)
    fused = layer._project_heads(x, denses)
    alone = [layer._project_heads(x, (dense,))[0] for dense in denses]
    for dense, one, other in zip(denses, fused, alone):
        expected = dense(x).numpy()  # [B, T, N, H]
        assert one.shape == expected.shape == (BATCH, LENGTH, HEADS, KEY_DIM)
        np.testing.assert_allclose(one.numpy(), expected, atol=1e-5, rtol=0)
        np.testing.assert_allclose(other.numpy(), expected, atol=1e-5, rtol=0)
    heads = tf.random.normal([BATCH, LENGTH, HEADS, KEY_DIM], seed=2)
    np.testing.assert_allclose(layer._project_output(heads).numpy(), layer._output_dense(heads).numpy(),
                               atol=1e-5, rtol=0)


def test_projections_under_a_bfloat16_policy_stay_bfloat16():
    layer = built_attention(dtype="mixed_bfloat16")
    x = tf.cast(tf.random.normal([BATCH, LENGTH, DIM], seed=1), tf.bfloat16)
    query, = layer._project_heads(x, (layer._query_dense,))
    assert query.dtype == tf.bfloat16
    expected = tf.cast(layer._query_dense(x), tf.float32).numpy()
    np.testing.assert_allclose(tf.cast(query, tf.float32).numpy(), expected, atol=0.1, rtol=0.02)
    assert layer._project_output(tf.cast(query, tf.bfloat16)).dtype == tf.bfloat16


@pytest.mark.parametrize("cross", [False, True])
def test_training_projections_give_the_same_attention_and_gradients(cross):
    """Training scales the query through its kernel and skips the key bias (`_project_training`):
    the output and every gradient equal inference's path (which adds the key bias and scales the
    activations), and the key bias's gradient is exactly 0, as it is in exact arithmetic."""
    tf.config.experimental.enable_tensor_float_32_execution(False)
    layer = built_attention()  # dropout 0: training and inference differ only in the projections
    x = tf.random.normal([BATCH, LENGTH, DIM], seed=1)
    memory = tf.random.normal([BATCH, LENGTH + 2, DIM], seed=4) if cross else x
    mask = tf.sequence_mask([LENGTH + 2, 4], LENGTH + 2)[:, tf.newaxis] if cross else None
    weights = tf.random.normal([BATCH, LENGTH, DIM], seed=5)  # a loss that reads every output
    results = {}
    for training in (True, False):
        with tf.GradientTape() as tape:
            output = layer(x, memory, attention_mask=mask, training=training)
            loss = tf.reduce_sum(output * weights)
        grads = tape.gradient(loss, layer.trainable_weights)
        results[training] = output.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]
    (train_out, train_grads), (infer_out, infer_grads) = results[True], results[False]
    np.testing.assert_allclose(train_out, infer_out, atol=1e-5, rtol=1e-5)
    checked = 0
    for weight, train_grad, infer_grad in zip(layer.trainable_weights, train_grads, infer_grads):
        if weight is layer._key_dense.bias:
            assert not train_grad.any()
            np.testing.assert_allclose(infer_grad, 0.0, atol=1e-4)  # autodiff's rounding of a zero
        else:
            np.testing.assert_allclose(train_grad, infer_grad, atol=1e-4, rtol=1e-4)
            checked += 1
    assert checked == len(layer.trainable_weights) - 1 == 7  # kernels and biases of q, k, v, output
