"""transformer.model.fused: the XLA-fused training blocks compute the unfused model's function."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import TINY_MODEL, build, random_ids

from transformer.model.fused import residual_norm, softmax_dropout
from transformer.model.losses import MaskedSparseCrossEntropy


def _loss_and_gradients(model, src, tgt):
    with tf.GradientTape() as tape:
        logits = model((src, tgt[:, :-1]), training=True)
        loss = MaskedSparseCrossEntropy(0.1)(tgt[:, 1:], logits)
    return logits, loss, tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("policy,head_width", [("float32", "paper"), ("float32", "tutorial"),
                                               ("mixed_bfloat16", "paper")])
def test_fused_training_pass_equals_the_unfused_one_without_dropout(policy, head_width):
    keras.mixed_precision.set_global_policy(policy)
    try:
        config = dataclasses.replace(TINY_MODEL, head_width=head_width, num_heads=4, d_model=32, dff=64)
        src, tgt = random_ids(config)
        model = build(config)
        want = _loss_and_gradients(model, src, tgt)
        model.use_fused_blocks()
        got = _loss_and_gradients(model, src, tgt)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert got[0].dtype == tf.float32  # logits stay float32
    tolerance = {"float32": 1e-5, "mixed_bfloat16": 5e-2}[policy]
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=tolerance)
    assert len(got[2]) == len(want[2]) and all(g is not None for g in got[2])
    got, want = ([tf.convert_to_tensor(g).numpy() for g in grads] for grads in (got[2], want[2]))
    scale = max(np.abs(b).max() for b in want)  # (some are ~0 by symmetry: the key bias's)
    for variable, a, b in zip(model.trainable_variables, got, want):
        np.testing.assert_allclose(a / scale, b / scale, atol=3 * tolerance, err_msg=variable.path)


def test_softmax_dropout_uses_one_mask_forward_and_backward():
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(8, 4, 16, 16)), tf.float32)
    causal = np.tril(np.ones((16, 16), bool))
    bias = tf.constant(np.where(causal, 0.0, -1e9)[np.newaxis, np.newaxis], tf.float32)
    upstream = tf.constant(rng.normal(size=logits.shape), tf.float32)
    seed, rate = tf.constant([3, 7], tf.int32), 0.25
    with tf.GradientTape() as tape:
        tape.watch(logits)
        dropped, probs = softmax_dropout(logits, bias, seed, rate)
        loss = tf.reduce_sum(dropped * upstream)
    grad = tape.gradient(loss, logits).numpy()
    dropped, probs = dropped.numpy(), probs.numpy()
    np.testing.assert_allclose(probs, tf.nn.softmax(logits + bias).numpy(), atol=1e-6)
    assert np.all(probs[..., ~causal] == 0)  # masked keys get no weight
    kept = dropped != 0
    attended = np.broadcast_to(causal, kept.shape)
    assert abs(1 - kept[attended].mean() - rate) < 0.02  # the rate, on 8·4·136 attended weights
    np.testing.assert_allclose(dropped[kept], probs[kept] / (1 - rate), rtol=1e-6)
    # d loss / d logits through softmax, with the forward's mask: p · (g − Σ g·p)
    g = np.where(kept, upstream.numpy() / (1 - rate), 0.0)
    want = probs * (g - (g * probs).sum(-1, keepdims=True))
    np.testing.assert_allclose(grad, want, atol=1e-5)
    again, _ = softmax_dropout(logits, bias, seed, rate)
    np.testing.assert_array_equal(again.numpy(), dropped)  # stateless: the seed decides


def test_residual_norm_drops_the_update_and_its_gradient_alike():
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(6, 5, 32)), tf.float32)
    update = tf.constant(rng.normal(size=(6, 5, 32)), tf.float32)
    gamma = tf.constant(rng.normal(1.0, 0.3, 32), tf.float32)
    beta = tf.constant(rng.normal(0.0, 0.3, 32), tf.float32)
    seed, rate, epsilon = tf.constant([1, 2], tf.int32), 0.3, 1e-3
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, update])
        y = residual_norm(x, update, gamma, beta, seed, rate, epsilon)
        loss = tf.reduce_sum(y * tf.range(32, dtype=tf.float32))
    d_x, d_update = (t.numpy() for t in tape.gradient(loss, [x, update]))
    # The dropped elements of the update: where its gradient is exactly 0; the rest scaled.
    kept = d_update != 0
    assert abs(1 - kept.mean() - rate) < 0.05
    np.testing.assert_allclose(d_update[kept], d_x[kept] / (1 - rate), rtol=1e-5)
    total = x.numpy() + np.where(kept, update.numpy() / (1 - rate), 0.0)
    mean, var = total.mean(-1, keepdims=True), total.var(-1, keepdims=True)
    want = (total - mean) / np.sqrt(var + epsilon) * gamma.numpy() + beta.numpy()
    np.testing.assert_allclose(y.numpy(), want, atol=1e-5)
