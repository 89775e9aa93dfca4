"""transformer.model.affine.affine: Keras' dense function and gradients, with the bias gradient
summed in float32, in the layers that use it (the FFN and the attention output projection)."""

import numpy as np
import pytest
import tensorflow as tf

from transformer.model.affine import affine
from transformer.model.layers import CachedMultiHeadAttention, FeedForward


def _exact_bias_gradient(upstream) -> np.ndarray:
    """Σ over every row of `upstream [..., C]`, in float64."""
    values = tf.cast(upstream, tf.float64).numpy()
    return values.reshape(-1, values.shape[-1]).sum(0)


def _relative_error(got, want) -> float:
    return float(np.linalg.norm(tf.cast(got, tf.float64).numpy() - want) / np.linalg.norm(want))


def _value_and_gradients(function, upstream, *inputs):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        y = function(*inputs)
    return [y] + tape.gradient(y, list(inputs), output_gradients=upstream)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("compiled", ["eager", "function", "xla"])
def test_affine_equals_matmul_plus_bias_forward_and_backward(relu, compiled):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(3, 5, 8)), tf.float32)
    kernel, bias = tf.constant(rng.normal(size=(8, 6)), tf.float32), tf.constant(rng.normal(size=6), tf.float32)
    upstream = tf.constant(rng.normal(size=(3, 5, 6)), tf.float32)

    def reference(x, kernel, bias):
        y = tf.tensordot(x, kernel, axes=[[-1], [0]]) + bias
        return tf.nn.relu(y) if relu else y

    def ours(x, kernel, bias):
        return affine(x, kernel, bias, relu=relu)

    if compiled != "eager":
        ours = tf.function(ours, jit_compile=compiled == "xla")
    got = _value_and_gradients(ours, upstream, x, kernel, bias)
    want = _value_and_gradients(reference, upstream, x, kernel, bias)
    assert got[0].shape == (3, 5, 6)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_bfloat16_affine_sums_the_bias_gradient_in_float32():
    rng = np.random.default_rng(0)
    x = tf.cast(rng.normal(size=(64, 32, 256)), tf.bfloat16)  # 2,048 rows: a training batch's tokens
    kernel = tf.cast(rng.normal(0.0, 0.05, (256, 128)), tf.bfloat16)
    bias = tf.cast(rng.normal(size=128), tf.bfloat16)
    upstream = tf.cast(rng.normal(0.0, 1e-3, (64, 32, 128)), tf.bfloat16)
    _, _, _, dbias = _value_and_gradients(lambda *a: affine(*a), upstream, x, kernel, bias)
    assert dbias.dtype == tf.bfloat16 and dbias.shape == bias.shape
    # The final rounding to bfloat16 (2^-9 relative) and no more; TensorFlow's CPU BiasAddGrad: ~5%.
    assert _relative_error(dbias, _exact_bias_gradient(upstream)) < 4e-3


def _bias_gradients(layer, call, upstream_shape):
    """(upstream, {bias variable path: its gradient}) for a fixed upstream gradient on `call(x)`."""
    rng = np.random.default_rng(1)
    x = tf.cast(rng.normal(size=upstream_shape[:-1] + (64,)), tf.bfloat16)
    upstream = tf.cast(rng.normal(0.0, 1e-3, upstream_shape), tf.bfloat16)
    biases = [v for v in layer.trainable_variables if v.path.endswith("bias")]
    with tf.GradientTape() as tape:
        y = call(x)
    return upstream, dict(zip([v.path for v in biases], tape.gradient(y, biases, output_gradients=upstream)))


def test_bfloat16_feed_forward_output_bias_gradient_is_summed_in_float32():
    layer = FeedForward(d_model=64, dff=256, dropout_rate=0.0, dtype="mixed_bfloat16")
    layer.build((64, 32, 64))
    upstream, grads = _bias_gradients(layer, lambda x: layer(x, training=True), (64, 32, 64))
    (outer,) = [g for path, g in grads.items() if path.endswith("outer/bias")]
    assert _relative_error(outer, _exact_bias_gradient(upstream)) < 4e-3


def test_bfloat16_attention_output_bias_gradient_is_summed_in_float32():
    layer = CachedMultiHeadAttention(num_heads=4, key_dim=16, dtype="mixed_bfloat16")
    layer.build((64, 32, 64), (64, 32, 64))
    upstream, grads = _bias_gradients(layer, lambda x: layer(x, x, training=True), (64, 32, 64))
    (output,) = [g for path, g in grads.items() if "attention_output" in path]
    assert _relative_error(output, _exact_bias_gradient(upstream)) < 4e-3


@pytest.mark.parametrize("training", [True, False])
def test_feed_forward_equals_its_keras_dense_layers(training):
    layer = FeedForward(d_model=16, dff=32, dropout_rate=0.0)
    x = tf.random.normal([3, 5, 16])
    layer.build(x.shape)
    for variable in layer.trainable_variables:  # non-zero biases
        variable.assign(tf.random.normal(variable.shape))
    variables = [x] + layer.trainable_variables
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours = layer(x, training=training)
        keras_layers = layer.outer(layer.inner(x))  # Dense(dff, relu) → Dense(d_model)
    np.testing.assert_allclose(ours.numpy(), keras_layers.numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(tape.gradient(ours, variables), tape.gradient(keras_layers, variables)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
