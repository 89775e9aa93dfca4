"""transformer.model.logits: float32 logits under every policy; a bfloat16 model's training calls
run the projection's two gradient products in bfloat16 and nothing else changes."""

import numpy as np
import pytest
import tensorflow as tf
from helpers_model import build, random_ids

from transformer.model.logits import Logits, project
from transformer.model.losses import MaskedSparseCrossEntropy
from transformer.model.tied import TiedLogits


def _relative_error(got, want) -> float:
    got, want = (tf.cast(t, tf.float64).numpy() for t in (got, want))
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _value_and_gradients(function, upstream, *inputs):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        y = function(*inputs)
    return [y] + tape.gradient(y, list(inputs), output_gradients=upstream)


def _matmul_dtypes(function, *args) -> set:
    """The dtypes of every MatMul in `function`'s graph (gradients included)."""
    graph = tf.function(function).get_concrete_function(*args).graph
    return {op.get_attr("T") for op in graph.get_operations() if op.type == "MatMul"}


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("compiled", ["eager", "function", "xla"])
def test_project_keeps_the_float32_forward_and_rounds_only_the_gradient_products(transposed, compiled):
    rng = np.random.default_rng(0)
    x = tf.cast(tf.cast(rng.normal(size=(3, 5, 16)), tf.bfloat16), tf.float32)  # a bfloat16 model's decoder output
    matrix = tf.constant(rng.normal(0.0, 0.2, (40, 16) if transposed else (16, 40)), tf.float32)
    bias = tf.constant(rng.normal(size=40), tf.float32)
    upstream = tf.constant(rng.normal(0.0, 1e-3, (3, 5, 40)), tf.float32)

    def reference(x, matrix, bias):
        return tf.einsum("btd,vd->btv" if transposed else "btd,dv->btv", x, matrix) + bias

    def ours(x, matrix, bias):
        return project(x, matrix, bias, tf.bfloat16, transposed=transposed)

    if compiled != "eager":
        ours = tf.function(ours, jit_compile=compiled == "xla")
    logits, dx, dmatrix, dbias = _value_and_gradients(ours, upstream, x, matrix, bias)
    want = _value_and_gradients(reference, upstream, x, matrix, bias)
    assert logits.dtype == dx.dtype == dmatrix.dtype == tf.float32
    np.testing.assert_allclose(logits.numpy(), want[0].numpy(), rtol=1e-5, atol=1e-5)  # forward: float32
    np.testing.assert_allclose(dbias.numpy(), want[3].numpy(), rtol=1e-5, atol=1e-9)  # summed in float32
    for got, exact in ((dx, want[1]), (dmatrix, want[2])):  # bfloat16 inputs (2^-9 each), float32 sums
        assert 1e-5 < _relative_error(got, exact) < 1e-2
    without = _value_and_gradients(lambda *a: project(*a, transposed=transposed), upstream, x, matrix, bias)
    # grad_dtype None: autodiff's float32 products. The logits to the forward check's tolerance above: a
    # matmul and an einsum sum in different orders on some CPUs (Eigen's kernels on an AVX2 EPYC Zen 3:
    # 3e-8 apart at logits of ~1e-3, past rtol 1e-5).
    for got, exact, atol in zip(without, want, (1e-5, 1e-9, 1e-9, 1e-9)):
        np.testing.assert_allclose(got.numpy(), exact.numpy(), rtol=1e-5, atol=atol)


def test_logits_layer_is_a_float32_dense_whose_training_gradient_runs_in_bfloat16():
    layer = Logits(40, grad_dtype="bfloat16")
    x = tf.cast(tf.random.stateless_normal((3, 5, 16), seed=(1, 2)), tf.bfloat16)
    layer.build(x.shape)
    assert [v.path for v in layer.weights] == [f"{layer.name}/kernel", f"{layer.name}/bias"]  # Dense's checkpoint layout
    inference, training = layer(x, training=False), layer(x, training=True)
    assert inference.dtype == training.dtype == tf.float32
    np.testing.assert_allclose(training.numpy(), inference.numpy(), rtol=1e-5, atol=1e-5)

    def gradient(training):
        def loss(x):
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(tf.square(layer(x, training=training)))
            return tape.gradient(y, layer.kernel)
        return loss

    assert tf.bfloat16 in _matmul_dtypes(gradient(True), x)
    assert _matmul_dtypes(gradient(False), x) == {tf.float32}
    assert Logits.from_config(layer.get_config()).grad_dtype == "bfloat16"


@pytest.mark.parametrize("tie_embeddings", ["none", "output"])
def test_bfloat16_model_loss_is_unchanged_and_gradients_are_within_bfloat16_rounding(
        tiny_model_config, bfloat16_policy, tie_embeddings):
    model = build(tiny_model_config(tie_embeddings=tie_embeddings))
    assert isinstance(model.final_layer, Logits if tie_embeddings == "none" else TiedLogits)
    assert model.final_layer.grad_dtype == "bfloat16"
    src, tgt = random_ids(model.config)
    loss_fn = MaskedSparseCrossEntropy(0.1)

    def loss_and_gradients():
        with tf.GradientTape() as tape:
            logits = model((src, tgt[:, :-1]), training=True)
            loss = loss_fn(tgt[:, 1:], logits)
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = loss_and_gradients()
    model.final_layer.grad_dtype = None  # the float32 products' gradient, same weights
    loss32, grads32 = loss_and_gradients()
    assert float(loss) == float(loss32)  # the forward is the same float32 projection
    for path, g, g32 in zip([v.path for v in model.trainable_variables], grads, grads32):
        if g32 is None:
            continue
        g, g32 = (tf.convert_to_tensor(t) for t in (g, g32))  # an embedding's IndexedSlices
        if float(tf.norm(tf.cast(g32, tf.float32))) == 0.0:
            continue
        assert _relative_error(g, g32) < 3e-2, path


def test_float32_model_trains_with_float32_products_only(tiny_model_config):
    model = build(tiny_model_config())
    assert model.final_layer.grad_dtype is None
    src, tgt = (tf.constant(a) for a in random_ids(model.config))

    def gradients(src, tgt):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model((src, tgt), training=True))
        return tape.gradient(loss, model.trainable_variables)

    assert _matmul_dtypes(gradients, src, tgt) == {tf.float32}
