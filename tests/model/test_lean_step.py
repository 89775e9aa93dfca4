"""The lean mixed-precision training step keeps the model's invariants under bfloat16:
causality, padding invariance, cached decoding == full pass, float32 logits, a decreasing loss."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import build, cached_logits, different_ids, future_leak, random_ids

from transformer.base.constants import PAD_ID
from transformer.model.dropout import FastDropout, fast_dropout
from transformer.model.losses import MaskedSparseCrossEntropy


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_fast_dropout_drops_at_the_rate_and_rescales(dtype, rate):
    x = tf.ones([64, 8, 31, 33], dtype)  # odd size: the last uint32 is split across the end
    generator = keras.random.SeedGenerator(3)
    first = fast_dropout(x, rate, generator).numpy().astype(np.float32)
    assert first.shape == tuple(x.shape) and fast_dropout(x, rate, generator).dtype == dtype
    dropped = (first == 0).mean()
    assert abs(dropped - rate) < 0.005, dropped  # 540k elements: σ ≈ 0.0007
    np.testing.assert_allclose(first[first != 0], 1 / (1 - rate), rtol=1e-2)  # bf16 rounding
    second = fast_dropout(x, rate, generator).numpy()
    assert ((first == 0) != (second == 0)).mean() > 0.05  # a new mask per call
    again = fast_dropout(x, rate, keras.random.SeedGenerator(3)).numpy().astype(np.float32)
    np.testing.assert_array_equal(again, first)  # seeded: reproducible


def test_fast_dropout_gradient_is_its_mask_times_the_scale():
    x = tf.random.normal([16, 9, 24]) + 3.0  # no zeros of its own
    upstream = tf.random.normal(x.shape)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fast_dropout(x, 0.25, keras.random.SeedGenerator(7))
    kept = (y.numpy() != 0).astype(np.float32)
    assert 0.2 < 1 - kept.mean() < 0.3
    np.testing.assert_allclose(y.numpy(), x.numpy() * kept / 0.75, rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(y, x, upstream).numpy(), upstream.numpy() * kept / 0.75, rtol=1e-6)


def test_fast_dropout_layer_is_identity_at_inference_and_keeps_keras_config():
    layer = FastDropout(0.3, seed=1)
    x = tf.random.normal([4, 5])
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    assert 0 < float(tf.reduce_mean(tf.cast(layer(tf.ones([100, 100]), training=True) == 0, tf.float32))) < 0.4
    assert isinstance(layer, keras.layers.Dropout)
    assert FastDropout.from_config(layer.get_config()).rate == 0.3


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_bfloat16_model_is_causal_and_padding_invariant(tiny_model_config, bfloat16_policy, head_width):
    config = tiny_model_config(dropout_rate=0.3, head_width=head_width)
    model = build(config)
    src, tgt = random_ids(config)
    logits = model((src, tgt), training=False)
    assert logits.dtype == tf.float32
    full_tgt = different_ids(tgt, config.tgt_vocab_size, seed=5)  # no target padding
    assert future_leak(model, src, full_tgt) == 0.0  # masked weights are exactly 0 in bfloat16 too

    real = tgt != PAD_ID
    padded = model((np.pad(src, [[0, 0], [0, 6]]), np.pad(tgt, [[0, 0], [0, 4]])), training=False).numpy()
    np.testing.assert_allclose(padded[:, :tgt.shape[1]][real], logits.numpy()[real], atol=2e-2, rtol=0)


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_bfloat16_cached_decoding_equals_full_pass(tiny_model_config, bfloat16_policy, head_width):
    config = tiny_model_config(dropout_rate=0.3, head_width=head_width)
    model = build(config)
    src, tgt = random_ids(config)
    full = model((src, tgt), training=False).numpy()
    real = tgt != PAD_ID
    one_by_one = cached_logits(model, src, tgt, [1] * tgt.shape[1], config.max_length)
    # bfloat16 keeps 8 mantissa bits: a different summation order moves logits by ~1e-2.
    np.testing.assert_allclose(one_by_one[real], full[real], atol=5e-2, rtol=0)


def test_bfloat16_training_step_loss_is_finite_and_decreasing(tiny_model_config, bfloat16_policy):
    config = tiny_model_config(dropout_rate=0.1, num_layers=1)
    model = build(config)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=MaskedSparseCrossEntropy())
    src, tgt = random_ids(config)
    full_tgt = np.pad(tgt, [[0, 0], [0, 1]])
    x, y = (src, full_tgt[:, :-1]), full_tgt[:, 1:]
    losses = [float(model.train_on_batch(x, y)) for _ in range(8)]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
