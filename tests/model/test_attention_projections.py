"""The attention's projections as 2-D matmuls (`CachedMultiHeadAttention._project_heads`,
`_project_output`) compute what Keras' own EinsumDense sublayers compute, fused or not, with
and without biases, in float32 and under a bfloat16 policy."""

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
