"""The fused CPU kernels (transformer/runtime/fused_kernels.cc) compute what the model's TensorFlow
ops compute: layer norm and the attention's masked softmax, values and gradients; their dropout
drops at its rate and its gradient follows the same mask; only training calls use them."""

import numpy as np
import pytest
import tensorflow as tf
from helpers_model import build, random_ids

from transformer.model.affine import add_bias, affine
from transformer.model.dropout import DropoutSwitch, attach_dropout_switch, no_dropout
from transformer.model.layer_norm import LayerNorm, fused_layer_norm, layer_norm
from transformer.model.layers import NEG_INF, FeedForward, batch_matmul, masked_softmax_dropout
from transformer.model.logits import project
from transformer.model.losses import MaskedAccuracy, MaskedSparseCrossEntropy, fused_cross_entropy, smoothed_cross_entropy
from transformer.runtime.fused_kernels import KernelsUnavailable, disable_fused_kernels, enable_fused_kernels

FUSED_OPS = {"FusedLayerNorm", "FusedLayerNormGrad", "FusedAttentionSoftmax", "FusedAttentionSoftmaxGrad"}


@pytest.fixture
def kernels():
    """The op library, enabled for the model's training calls during the test."""
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        state = enable_fused_kernels("on", "cpu", xla=False)
    except KernelsUnavailable as err:
        pytest.skip(f"fused kernels cannot be built here: {err}")
    from transformer.runtime.fused_kernels import active_kernels
    assert state["enabled"]
    yield active_kernels()
    disable_fused_kernels()


def _as_float(t):
    return tf.cast(tf.convert_to_tensor(t), tf.float32).numpy()


@pytest.mark.parametrize("dtype,shape", [(tf.float32, (3, 5, 20)), (tf.float32, (9, 64)), (tf.bfloat16, (4, 7, 48))])
def test_layer_norm_kernel_matches_the_closed_form(kernels, dtype, shape):
    rng = np.random.default_rng(0)
    d = shape[-1]  # 20 and 48 are not multiples of 16: the vector loops' tails run too
    x = tf.cast(rng.normal(1.0, 3.0, shape), dtype)
    gamma, beta = tf.constant(rng.normal(1.0, 0.5, d), tf.float32), tf.constant(rng.normal(0.0, 0.5, d), tf.float32)
    upstream = tf.cast(rng.normal(size=shape), dtype)

    def run(norm):
        with tf.GradientTape() as tape:
            tape.watch([x, gamma, beta])
            y = norm(x, gamma, beta)
        return [y, *tape.gradient(y, [x, gamma, beta], output_gradients=upstream)]

    got = run(lambda *a: fused_layer_norm(kernels, *a, 1e-6))
    want = run(lambda *a: layer_norm(*a, 1e-6))
    assert got[0].dtype == got[1].dtype == dtype and got[2].dtype == tf.float32
    # float32: summation order only; bfloat16 x and dx: one rounding step of the output apart.
    tolerance = 1e-5 if dtype == tf.float32 else 3e-2
    for a, b in zip(got, want):
        np.testing.assert_allclose(_as_float(a), _as_float(b), atol=tolerance * max(1.0, np.abs(_as_float(b)).max()),
                                   rtol=tolerance)


@pytest.mark.parametrize("dtype,smoothing", [(tf.float32, 0.0), (tf.float32, 0.1), (tf.bfloat16, 0.1)])
def test_cross_entropy_kernel_matches_the_closed_form(kernels, dtype, smoothing):
    """Per-token loss and its gradient equal `smoothed_cross_entropy` on the float32 logits (V = 37:
    the vector loops' tails run; logits up to ±40 with one row's label far below its maximum)."""
    rng = np.random.default_rng(3)
    logits = tf.cast(rng.normal(0.0, 8.0, (3, 5, 37)).clip(-40, 40), dtype)
    labels = tf.constant(rng.integers(0, 37, (3, 5)), tf.int32)
    upstream = tf.constant(rng.normal(size=(3, 5)), tf.float32)

    def run(loss):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits, smoothing)
        return value, tape.gradient(value, logits, output_gradients=upstream)

    got_loss, got_grad = run(lambda *a: fused_cross_entropy(kernels, *a))
    want_loss, want_grad = run(lambda y, z, s: smoothed_cross_entropy(y, tf.cast(z, tf.float32), s))
    assert got_loss.dtype == tf.float32 and got_grad.dtype == dtype
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-5, atol=1e-4)
    # the gradient in the logits' dtype: bfloat16 is one rounding of it apart
    tolerance = 1e-5 if dtype == tf.float32 else 1e-2
    np.testing.assert_allclose(_as_float(got_grad), _as_float(want_grad), rtol=tolerance, atol=tolerance)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of"):
        kernels.fused_cross_entropy(logits, labels + 37, smoothing=0.0)


def test_accuracy_takes_the_row_maxima_of_the_fused_loss(kernels):
    """In one graph (Keras' training step: the loss, then the metrics) `MaskedAccuracy` compares each
    label's logit with the maximum `FusedCrossEntropy` found in its pass, with no second pass (no
    Max op), and counts what argmax would (a tie at the maximum as a hit; padding not at all)."""
    rng = np.random.default_rng(5)
    y_true = tf.constant([[5, 9, 2, 0], [7, 1, 3, 0]], tf.int32)
    logits = rng.normal(0.0, 3.0, (2, 4, 11)).astype(np.float32)
    logits[0, 0, 5] = logits[0, 0].max() + 1.0  # hits
    logits[1, 0, 7] = logits[1, 0].max() + 1.0
    logits[1, 2, 3] = logits[1, 2, 8] = logits[1, 2].max() + 1.0  # a tie at the maximum
    logits[0, 1, 9] = logits[0, 1].min() - 1.0  # misses
    logits[0, 2, 2] = logits[0, 2].min() - 1.0
    logits[1, 1, 1] = logits[1, 1].min() - 1.0
    y_pred = tf.constant(logits)
    loss, metric = MaskedSparseCrossEntropy(0.1), MaskedAccuracy()

    @tf.function
    def step(y, z):
        value = loss(y, z)
        metric.update_state(y, z)
        return value

    types = {op.type for op in step.get_concrete_function(y_true, y_pred).graph.get_operations()}
    assert "FusedCrossEntropy" in types and "Max" not in types
    step(y_true, y_pred)
    assert metric.result().numpy() == pytest.approx(3 / 6)


def test_masked_loss_uses_the_kernel_while_enabled(kernels):
    """`MaskedSparseCrossEntropy` runs `FusedCrossEntropy` (bfloat16 logits read as they are) and
    gives the float32 formulation's value; padding still does not count."""
    rng = np.random.default_rng(4)
    y_true = tf.constant([[5, 9, 2, 0], [7, 1, 0, 0]], tf.int32)
    y_pred = tf.cast(rng.normal(0.0, 3.0, (2, 4, 11)), tf.bfloat16)
    loss = MaskedSparseCrossEntropy(0.1)
    graph = tf.function(lambda y, z: loss(y, z)).get_concrete_function(y_true, y_pred).graph
    assert "FusedCrossEntropy" in {op.type for op in graph.get_operations()}
    disable_fused_kernels()
    want = loss(y_true, tf.cast(y_pred, tf.float32)).numpy()
    enable_fused_kernels("on", "cpu", xla=False)
    np.testing.assert_allclose(loss(y_true, y_pred).numpy(), want, rtol=1e-5)


def _reference_softmax(logits, mask):
    return tf.nn.softmax(tf.cast(logits, tf.float32) + tf.where(mask, 0.0, NEG_INF)[:, tf.newaxis], axis=-1)


def _attention_inputs(dtype, shape=(2, 3, 5, 37), seed=0):
    rng = np.random.default_rng(seed)
    batch, _, queries, keys = shape
    logits = tf.cast(rng.normal(0.0, 3.0, shape), dtype)
    mask = rng.random((batch, queries, keys)) < 0.7
    mask[0, 1] = False  # a row with every key masked: uniform weights, as the additive bias gives
    return logits, tf.constant(mask)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_masked_softmax_kernel_without_dropout_matches_tensorflow(kernels, dtype):
    logits, mask = _attention_inputs(dtype)
    upstream = tf.cast(np.random.default_rng(1).normal(size=logits.shape), dtype)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        dropped, scores, sums = masked_softmax_dropout(kernels, logits, mask, tf.constant(0.0), tf.constant([1, 2]))
        want = _reference_softmax(logits, mask)
    tolerance = 1e-6 if dtype == tf.float32 else 4e-3
    np.testing.assert_allclose(_as_float(dropped), want.numpy(), atol=tolerance)
    np.testing.assert_allclose(_as_float(scores), want.numpy(), atol=tolerance)
    np.testing.assert_allclose(_as_float(dropped[0, :, 1]), 1 / 37, atol=tolerance)  # the fully masked row
    assert sums.dtype == tf.float32 and sums.shape == logits.shape[:3]
    np.testing.assert_allclose(sums.numpy(), _as_float(dropped).sum(axis=-1), rtol=1e-6)  # of the stored weights
    got_grad = tape.gradient(dropped, logits, output_gradients=upstream)
    want_grad = tape.gradient(want, logits, output_gradients=tf.cast(upstream, tf.float32))
    np.testing.assert_allclose(_as_float(got_grad), want_grad.numpy(), atol=1e-6 if dtype == tf.float32 else 2e-2)


def test_dropout_kernel_drops_at_its_rate_and_its_gradient_follows_the_same_mask(kernels):
    logits, mask = _attention_inputs(tf.float32, shape=(4, 4, 32, 40))
    rate, seed = tf.constant(0.25), tf.constant([7, 11])
    with tf.GradientTape() as tape:
        tape.watch(logits)
        dropped, scores, _ = masked_softmax_dropout(kernels, logits, mask, rate, seed)
    upstream = tf.constant(np.random.default_rng(2).normal(size=logits.shape), tf.float32)
    grad = tape.gradient(dropped, logits, output_gradients=upstream)
    probs = _reference_softmax(logits, mask)
    kept = (dropped.numpy() != 0) | (probs.numpy() == 0)
    weighted = probs.numpy() > 0  # ~70% of 20,480 (the others are masked)
    assert abs(1 - kept[weighted].mean() - 0.25) < 0.015
    np.testing.assert_allclose(dropped.numpy()[kept], probs.numpy()[kept] / 0.75, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(scores.numpy(), probs.numpy(), atol=1e-6)  # the scores are not dropped
    with tf.GradientTape() as tape:  # the same mask, by autodiff
        tape.watch(logits)
        want = _reference_softmax(logits, mask) * tf.constant(kept / 0.75, tf.float32)
    np.testing.assert_allclose(grad.numpy(), tape.gradient(want, logits, output_gradients=upstream).numpy(), atol=1e-6)

    again, _, _ = masked_softmax_dropout(kernels, logits, mask, rate, seed)
    other, _, _ = masked_softmax_dropout(kernels, logits, mask, rate, tf.constant([7, 12]))
    np.testing.assert_array_equal(again.numpy(), dropped.numpy())  # a seed decides the mask
    assert ((other.numpy() == 0) != (dropped.numpy() == 0)).mean() > 0.2  # another seed, another mask
    everything, _, _ = masked_softmax_dropout(kernels, logits, mask, tf.constant(1.0), seed)
    assert not everything.numpy().any()


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_dropout_kernel_row_sums_and_their_gradient(kernels, dtype):
    """The third output is each row's sum of the dropped weights as stored (below 1 under dropout),
    and a loss reading both the weights and their sums gets the gradient autodiff gives the same
    dropped softmax."""
    logits, mask = _attention_inputs(dtype, shape=(2, 3, 16, 24))
    rate, seed = tf.constant(0.3), tf.constant([5, 9])
    rng = np.random.default_rng(3)
    upstream = tf.constant(rng.normal(size=logits.shape), tf.float32)
    sums_upstream = tf.constant(rng.normal(size=logits.shape[:3]), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        dropped, _, sums = masked_softmax_dropout(kernels, logits, mask, rate, seed)
        loss = tf.reduce_sum(tf.cast(dropped, tf.float32) * upstream) + tf.reduce_sum(sums * sums_upstream)
    grad = tape.gradient(loss, logits)
    stored = _as_float(dropped)
    np.testing.assert_allclose(sums.numpy(), stored.sum(axis=-1), rtol=1e-5, atol=1e-6)
    attending = np.broadcast_to(mask.numpy().any(axis=-1)[:, None], sums.shape)
    assert (sums.numpy()[attending] < 0.999).mean() > 0.3  # dropout moves rows' sums off 1
    kept = tf.constant((stored != 0) / 0.7, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        want = _reference_softmax(logits, mask) * kept
        want_loss = tf.reduce_sum(want * upstream) + tf.reduce_sum(tf.reduce_sum(want, -1) * sums_upstream)
    want_grad = tape.gradient(want_loss, logits)
    atol = 1e-5 if dtype == tf.float32 else 5e-2
    np.testing.assert_allclose(_as_float(grad), _as_float(want_grad), atol=atol)
    without_sums = tf.GradientTape()  # the sums unused: the gradient of the weights alone
    with without_sums:
        without_sums.watch(logits)
        alone, _, _ = masked_softmax_dropout(kernels, logits, mask, rate, seed)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        want = tf.reduce_sum(_reference_softmax(logits, mask) * kept * upstream)
    np.testing.assert_allclose(_as_float(without_sums.gradient(alone, logits, output_gradients=tf.cast(upstream, dtype))),
                               _as_float(tape.gradient(want, logits)), atol=atol)


def _op_types(function, *args) -> set:
    return {op.type for op in function.get_concrete_function(*args).graph.get_operations()}


def test_only_training_calls_use_the_kernels(kernels, tiny_model_config):
    """Inference graphs (the translator, every export) must load without the library."""
    config = tiny_model_config(dropout_rate=0.1)
    model = build(config)
    src, tgt = (tf.constant(a) for a in random_ids(config))

    def step(training):
        @tf.function
        def forward(src, tgt):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model((src, tgt), training=training))
            return tape.gradient(loss, model.trainable_variables)
        return forward

    assert FUSED_OPS <= _op_types(step(True), src, tgt)
    assert not FUSED_OPS & _op_types(step(False), src, tgt)
    norm = LayerNorm()
    norm.build((None, 8))
    assert not FUSED_OPS & _op_types(tf.function(lambda x: norm(x)), tf.TensorSpec([None, 8]))


def _assert_training_pass_equals_tensorflow_ops(model, src, tgt):
    """The logits and every gradient of a training pass, with the kernels as enabled now, equal the
    same pass after `disable_fused_kernels` (TensorFlow's ops)."""
    def loss_and_grads():
        with tf.GradientTape() as tape:
            logits = model((src, tgt), training=True)
            loss = tf.reduce_mean(tf.square(logits))
        return [logits, *tape.gradient(loss, model.trainable_variables)]

    fused = loss_and_grads()
    disable_fused_kernels()
    plain = loss_and_grads()
    for got, want in zip(fused, plain):
        if want is not None:
            np.testing.assert_allclose(_as_float(got), _as_float(want), atol=2e-5, rtol=1e-4)


def test_model_training_pass_equals_tensorflow_ops_without_dropout(kernels, tiny_model_config):
    config = tiny_model_config(dropout_rate=0.1)
    model = build(config)
    src, tgt = random_ids(config)
    switch = DropoutSwitch(on=False)  # late dropout, off: the rate tensor is 0 inside the kernel
    attach_dropout_switch(model, switch)

    _assert_training_pass_equals_tensorflow_ops(model, src, tgt)


def test_training_with_the_kernels_lowers_the_loss(kernels, tiny_model_config):
    config = tiny_model_config(dropout_rate=0.1)
    model = build(config)
    src, tgt = random_ids(config)
    optimizer = tf.keras.optimizers.Adam(3e-3)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            logits = model((src, tgt[:, :-1]), training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(tgt[:, 1:], logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    assert FUSED_OPS <= _op_types(train_step)
    losses = [float(train_step()) for _ in range(40)]
    assert losses[-1] < 0.6 * losses[0]





def _rounded(values, dtype) -> np.ndarray:
    """float32/float64 `values` rounded once to `dtype`, as float32."""
    return _as_float(tf.cast(tf.constant(values, tf.float32), dtype))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_bias_relu_kernel_adds_the_bias_once_rounded(kernels, dtype):
    rng = np.random.default_rng(5)
    y, bias = tf.cast(rng.normal(size=(6, 37)), dtype), tf.cast(rng.normal(size=37), dtype)
    exact = _as_float(y) + _as_float(bias)
    for relu in (False, True):
        want = np.maximum(exact, 0) if relu else exact
        got = _as_float(kernels.fused_bias_relu(y, bias, *no_dropout(), relu=relu))
        if dtype == tf.float32:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        else:  # float32 inside, one rounding to bfloat16 at the end
            np.testing.assert_array_equal(got, _rounded(want, tf.bfloat16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias must be"):
        kernels.fused_bias_relu(y, bias[:5], *no_dropout(), relu=False)


@pytest.mark.parametrize("relu", [False, True])
def test_bias_kernel_dropout_and_its_gradient_share_one_mask(kernels, relu):
    """FusedBiasRelu drops at its rate, scales the rest, repeats itself for a seed; FusedBiasReluGrad
    passes the upstream gradient exactly where the output was kept (and positive, with ReLU),
    scaled alike, and sums the bias gradient in float32 (one bfloat16 rounding)."""
    rng = np.random.default_rng(7)
    y, bias = tf.cast(rng.normal(size=(300, 197)), tf.bfloat16), tf.cast(rng.normal(size=197), tf.bfloat16)
    upstream = tf.cast(rng.normal(size=(300, 197)), tf.bfloat16)
    rate, seed = tf.constant(0.25), tf.constant([3, 11], tf.int32)
    out = _as_float(kernels.fused_bias_relu(y, bias, rate, seed, relu=relu))
    full = _as_float(kernels.fused_bias_relu(y, bias, *no_dropout(), relu=relu))
    dropped = (out == 0) & (full > 0 if relu else full != 0)  # ReLU's zeros (and y = -bias) are not the dropout's
    dropped_share = dropped.sum() / (full > 0).sum() if relu else dropped.mean()
    assert abs(dropped_share - 0.25) < 0.01
    scale = np.float32(1.0) / np.float32(0.75)  # the kernel's float32 arithmetic, one rounding at the end
    exact = _as_float(y) + _as_float(bias)
    kept = (np.maximum(exact, 0.0) if relu else exact) * scale
    np.testing.assert_array_equal(out[~dropped], _rounded(kept, tf.bfloat16)[~dropped])
    np.testing.assert_array_equal(out, _as_float(kernels.fused_bias_relu(y, bias, rate, seed, relu=relu)))
    assert (out != _as_float(kernels.fused_bias_relu(y, bias, rate, seed + 1, relu=relu))).any()

    d_y, d_bias = kernels.fused_bias_relu_grad(upstream, kernels.fused_bias_relu(y, bias, rate, seed, relu=relu),
                                               rate, seed, relu=relu)
    flows = out > 0 if relu else ~dropped
    want = np.where(flows, _as_float(upstream) * scale, 0.0)
    known = full != 0 if not relu else np.ones(out.shape, bool)  # y = -bias: 0 whether dropped or not
    assert known.mean() > 0.99
    np.testing.assert_array_equal(_as_float(d_y)[known], _rounded(want, tf.bfloat16)[known])
    np.testing.assert_array_equal(_as_float(d_bias), _rounded(_as_float(d_y).astype(np.float64).sum(0), tf.bfloat16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one shape"):
        kernels.fused_bias_relu_grad(upstream, y[:5], rate, seed, relu=relu)


@pytest.mark.parametrize("relu,d_in,d_out", [(True, 24, 40), (False, 24, 40), (False, 40, 24)])
def test_bfloat16_affine_with_the_kernels_matches_the_fused_product(kernels, relu, d_in, d_out):
    """`affine(..., kernels=)` on bfloat16 rows: values and all three gradients within bfloat16
    rounding of the remapper's fused product; a product with ReLU, or narrower than its input, adds
    its bias with FusedBiasRelu, one at least as wide without ReLU is one matmul with the bias as the
    kernel's last row; float32 rows ignore the kernels."""
    rng = np.random.default_rng(6)
    x = tf.cast(rng.normal(size=(2, 9, d_in)), tf.bfloat16)
    kernel = tf.cast(rng.normal(0, 0.3, (d_in, d_out)), tf.bfloat16)
    bias = tf.cast(rng.normal(size=d_out), tf.bfloat16)
    upstream = tf.cast(rng.normal(size=(2, 9, d_out)), tf.bfloat16)

    def run(ops):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            y = affine(x, kernel, bias, relu=relu, kernels=ops)
        return [y, *tape.gradient(y, [x, kernel, bias], output_gradients=upstream)]

    graph = tf.function(lambda x: run(kernels)).get_concrete_function(x).graph
    types = [op.type for op in graph.get_operations()]
    bias_row = not relu and d_out >= d_in
    assert ("FusedBiasRelu" in types) != bias_row and ("FusedBiasReluGrad" in types) != bias_row
    if bias_row:
        assert types.count("MatMul") + types.count("BatchMatMulV2") == 3  # forward, d_x, d_kernel (its last row: d_bias)
    f32 = tf.function(lambda x: affine(x, tf.cast(kernel, tf.float32), tf.cast(bias, tf.float32), kernels=kernels))
    assert "FusedBiasRelu" not in {op.type for op in f32.get_concrete_function(tf.cast(x, tf.float32)).graph.get_operations()}
    for a, b in zip(run(kernels), run(None)):
        scale = np.abs(_as_float(b)).max()
        np.testing.assert_allclose(_as_float(a), _as_float(b), atol=0.02 * scale, rtol=0)


def test_bfloat16_model_trains_with_the_bias_kernel_only(kernels, tiny_model_config, bfloat16_policy):
    """A bfloat16 model's training graph runs its dense layers' bias through FusedBiasRelu; its
    inference graph does not (exports load without the library)."""
    model = build(tiny_model_config())
    src, tgt = (tf.constant(a) for a in random_ids(model.config))
    call = lambda training: tf.function(lambda s, t: model((s, t), training=training))  # noqa: E731
    assert "FusedBiasRelu" in _op_types(call(True), src, tgt)
    assert "FusedBiasRelu" not in _op_types(call(False), src, tgt)

    def gradients(s, t):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model((s, t), training=True))
        return tape.gradient(loss, model.trainable_variables)

    assert "FusedCastSum" in _op_types(tf.function(gradients), src, tgt)  # the projection's gradient


def test_bfloat16_feed_forward_drops_in_its_bias_kernels(kernels, bfloat16_policy):
    """A bfloat16 FFN's training call drops its ReLU outputs and its output inside FusedBiasRelu
    (no random-number ops), at the layer's rates; a late-dropout switch turns that off."""
    layer = FeedForward(d_model=32, dff=64, dropout_rate=0.2, activation_dropout=0.1)
    x = tf.cast(tf.random.stateless_normal((8, 50, 32), seed=(4, 2)), tf.bfloat16)
    layer.build(x.shape)

    def train_step(x):
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
        return y, tape.gradient(y, layer.trainable_variables)

    types = _op_types(tf.function(train_step), x)
    assert {"FusedBiasRelu", "FusedBiasReluGrad"} <= types
    assert not any("Random" in t for t in types) and "ReluGrad" not in types
    full = _as_float(layer(x, training=False))
    out = _as_float(layer(x, training=True))
    dropped = (out == 0) & (full != 0)
    assert abs(dropped.mean() - 0.2) < 0.02
    switch = DropoutSwitch(on=False)
    assert attach_dropout_switch(layer, switch) == 2
    np.testing.assert_allclose(_as_float(layer(x, training=True)), full, atol=0.05 * np.abs(full).max(), rtol=0)
    assert ((_as_float(layer(x, training=True)) == 0) == (full == 0)).mean() > 0.99


def test_add_bias_with_the_kernels_is_the_sum_and_its_gradient(kernels):
    """`add_bias` on bfloat16 `[B, T, N, H]` heads and an `[N, H]` bias: the sum rounded once, the
    upstream gradient handed on unchanged, the bias gradient summed in float32; float32 heads
    take TensorFlow's add."""
    rng = np.random.default_rng(8)
    y = tf.cast(rng.normal(size=(3, 7, 4, 16)), tf.bfloat16)
    bias = tf.cast(rng.normal(size=(4, 16)), tf.bfloat16)
    upstream = tf.cast(rng.normal(size=(3, 7, 4, 16)), tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch([y, bias])
        out = add_bias(y, bias, kernels)
    d_y, d_bias = tape.gradient(out, [y, bias], output_gradients=upstream)
    np.testing.assert_array_equal(_as_float(out), _rounded(_as_float(y) + _as_float(bias), tf.bfloat16))
    np.testing.assert_array_equal(_as_float(d_y), _as_float(upstream))
    assert d_bias.shape == bias.shape
    np.testing.assert_array_equal(_as_float(d_bias), _rounded(_as_float(upstream).astype(np.float64).sum((0, 1)),
                                                              tf.bfloat16))
    graph = tf.function(lambda y: add_bias(y, bias, kernels)).get_concrete_function(y).graph
    assert "FusedBiasRelu" in {op.type for op in graph.get_operations()}
    f32 = tf.function(lambda y: add_bias(y, tf.cast(bias, tf.float32), kernels))
    assert "FusedBiasRelu" not in {op.type for op in f32.get_concrete_function(tf.cast(y, tf.float32)).graph.get_operations()}


def test_cast_sum_kernel_rounds_once_and_sums_rows_in_float32(kernels):
    rng = np.random.default_rng(9)
    x = tf.constant(rng.normal(size=(130, 37)), tf.float32)  # 130 rows: three row blocks, the last partial
    y, sums = kernels.fused_cast_sum(x, Tout=tf.bfloat16)
    assert y.dtype == tf.bfloat16 and sums.dtype == tf.float32
    np.testing.assert_array_equal(_as_float(y), _rounded(x.numpy(), tf.bfloat16))
    np.testing.assert_allclose(sums.numpy(), x.numpy().astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transposed", [False, True])
def test_projection_gradient_with_the_cast_sum_kernel_equals_tensorflows(kernels, transposed):
    """`logits.project`'s bfloat16 gradient: `FusedCastSum` in place of a cast and a Sum, same values."""
    rng = np.random.default_rng(10)
    x = tf.cast(tf.cast(rng.normal(size=(3, 5, 16)), tf.bfloat16), tf.float32)
    matrix = tf.constant(rng.normal(0.0, 0.2, (40, 16) if transposed else (16, 40)), tf.float32)
    bias, upstream = tf.constant(rng.normal(size=40), tf.float32), tf.constant(rng.normal(size=(3, 5, 40)), tf.float32)

    def gradients(ops):
        call = tf.function(lambda x, m, b: project(x, m, b, tf.bfloat16, transposed=transposed, kernels=ops))
        with tf.GradientTape() as tape:
            tape.watch([x, matrix, bias])
            y = call(x, matrix, bias)
        return tape.gradient(y, [x, matrix, bias], output_gradients=upstream)

    got, want = gradients(kernels), gradients(None)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(got[2].numpy(), want[2].numpy(), rtol=1e-5, atol=1e-5)


@pytest.fixture
def small_products(kernels, monkeypatch):
    """The kernels with the attention's batched products routed through `SmallBatchMatMul`, as in a
    process whose TensorFlow runs without its oneDNN ops (whatever this machine's default)."""
    from transformer.runtime import fused_kernels
    monkeypatch.setattr(fused_kernels, "_small_products", True)
    return kernels


@pytest.mark.parametrize("adj_y", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 7, 4), (2, 3, 6, 9, 5)])  # [..., M, K, N], odd sizes
def test_small_batch_matmul_and_its_gradients_match_tf_matmul(kernels, adj_y, shape):
    rng = np.random.default_rng(7)
    *batch, m, k, n = shape
    x = tf.constant(rng.normal(size=(*batch, m, k)), tf.float32)
    y = tf.constant(rng.normal(size=(*batch, n, k) if adj_y else (*batch, k, n)), tf.float32)
    upstream = tf.constant(rng.normal(size=(*batch, m, n)), tf.float32)

    def run(ops):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            z = batch_matmul(ops, x, y, adj_y=adj_y)
        return [z, *tape.gradient(z, [x, y], output_gradients=upstream)]

    for got, want in zip(run(kernels), run(None)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)
    both = kernels.small_batch_mat_mul(x, y if adj_y else tf.linalg.matrix_transpose(y), adj_x=False, adj_y=True)
    np.testing.assert_allclose(both.numpy(), tf.matmul(x, y, transpose_b=adj_y).numpy(), atol=1e-5)
    adjoint_x = kernels.small_batch_mat_mul(tf.linalg.matrix_transpose(x), y, adj_x=True, adj_y=adj_y)
    np.testing.assert_allclose(adjoint_x.numpy(), tf.matmul(x, y, transpose_b=adj_y).numpy(), atol=1e-5)


def test_small_batch_matmul_refuses_unequal_leading_axes(kernels):
    with pytest.raises(tf.errors.InvalidArgumentError, match="same leading axes"):
        kernels.small_batch_mat_mul(tf.zeros([2, 3, 4]), tf.zeros([1, 4, 5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="inner dimensions"):
        kernels.small_batch_mat_mul(tf.zeros([2, 3, 4]), tf.zeros([2, 5, 4]))
    assert kernels.small_batch_mat_mul(tf.zeros([0, 3, 4]), tf.zeros([0, 4, 5])).shape == (0, 3, 5)


def test_training_pass_with_the_small_products_equals_tensorflow_ops(small_products, tiny_model_config):
    """Training calls route the attention's products through the kernel (inference never does) and
    compute what TensorFlow's ops compute, values and every gradient (heads narrower than the
    model: wider ones attend with merged head matrices)."""
    config = tiny_model_config(dropout_rate=0.1, head_width="paper")
    model = build(config)
    src, tgt = random_ids(config)
    attach_dropout_switch(model, DropoutSwitch(on=False))

    def op_types(training):
        return _op_types(tf.function(lambda s, t: model((s, t), training=training)), tf.constant(src), tf.constant(tgt))

    assert "SmallBatchMatMul" in op_types(True) and "SmallBatchMatMul" not in op_types(False)
    _assert_training_pass_equals_tensorflow_ops(model, src, tgt)


def test_small_products_follow_tensorflows_onednn_state(kernels):
    """On where TensorFlow runs without its oneDNN ops (its BatchMatMul is slow there), else off."""
    from transformer.runtime.fused_kernels import small_product_kernels
    from transformer.runtime.onednn import onednn_enabled
    assert (small_product_kernels() is not None) == (onednn_enabled() is False)
