"""Transformer invariants: causality, padding invariance, cached decoding == full pass,
config / Keras-file round trips, mixed precision."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import (
    SRC_LEN,
    TGT_LEN,
    NonCausalTransformer,
    build,
    cached_logits,
    different_ids,
    future_leak,
    random_ids,
)

from transformer.base.constants import PAD_ID
from transformer.model.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from transformer.model.schedule import WarmupInverseSqrt
from transformer.model.transformer import Transformer


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_decoder_is_causal_with_dropout_configured(tiny_model_config, head_width):
    config = tiny_model_config(dropout_rate=0.3, head_width=head_width)
    model = build(config)
    src, tgt = random_ids(config)
    tgt[:] = different_ids(tgt, config.tgt_vocab_size, seed=5)  # no target padding: every position real
    assert future_leak(model, src, tgt) < 1e-6

    # The check is not vacuous: information does flow forward (an earlier token changes the
    # logits after it), and the same weights without the causal mask are caught leaking.
    changed = tgt.copy()
    changed[:, 0] = different_ids(tgt, config.tgt_vocab_size)[:, 0]
    base = model((src, tgt), training=False).numpy()
    after = model((src, changed), training=False).numpy()
    assert np.abs(after[:, 1:] - base[:, 1:]).min(axis=-1).max() > 1e-4

    leaky = NonCausalTransformer.from_model_config(config)
    leaky.build()
    leaky.set_weights(model.get_weights())
    assert future_leak(leaky, src, tgt) > 1e-3


def test_model_config_keeps_both_head_widths_apart(tiny_model_config):
    tutorial = build(tiny_model_config(head_width="tutorial", num_heads=4))
    paper = build(tiny_model_config(head_width="paper", num_heads=4))
    assert tutorial.decoder_layers[0].self_attention.key_dim == 16  # d_model per head
    assert paper.decoder_layers[0].self_attention.key_dim == 4  # d_model / heads
    assert tutorial.count_params() > paper.count_params()


def test_encoder_ignores_appended_source_padding(tiny_model_config):
    config = tiny_model_config(dropout_rate=0.3)
    model = build(config)
    src, _ = random_ids(config)
    padded = np.pad(src, [[0, 0], [0, 5]])
    memory, mask = model.encode(src)
    memory_padded, mask_padded = model.encode(padded)
    real = src != PAD_ID
    np.testing.assert_array_equal(mask.numpy(), real)
    np.testing.assert_array_equal(mask_padded.numpy()[:, :SRC_LEN], real)
    np.testing.assert_allclose(memory_padded.numpy()[:, :SRC_LEN][real], memory.numpy()[real], atol=1e-5, rtol=0)


def test_decoder_ignores_appended_target_padding(tiny_model_config):
    config = tiny_model_config(dropout_rate=0.3)
    model = build(config)
    src, tgt = random_ids(config)
    logits = model((src, tgt), training=False).numpy()
    logits_padded = model((src, np.pad(tgt, [[0, 0], [0, 4]])), training=False).numpy()
    real = tgt != PAD_ID
    np.testing.assert_allclose(logits_padded[:, :TGT_LEN][real], logits[real], atol=1e-5, rtol=0)


def test_model_ignores_source_padding(tiny_model_config):
    """Cross-attention must not look at source pads: extra pads leave every logit unchanged."""
    config = tiny_model_config(dropout_rate=0.3)
    model = build(config)
    src, tgt = random_ids(config)
    logits = model((src, tgt), training=False).numpy()
    logits_padded = model((np.pad(src, [[0, 0], [0, 6]]), tgt), training=False).numpy()
    real = tgt != PAD_ID
    np.testing.assert_allclose(logits_padded[real], logits[real], atol=1e-5, rtol=0)

    # Non-vacuous: changing the *content* at those pad positions (making them real tokens)
    # does change the logits.
    unpadded = np.where(src == PAD_ID, 5, src)
    changed = model((unpadded, tgt), training=False).numpy()
    assert np.abs(changed[2] - logits[2]).max() > 1e-4


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_cached_decoding_equals_full_pass(tiny_model_config, head_width):
    config = tiny_model_config(dropout_rate=0.3, head_width=head_width)
    model = build(config)
    src, tgt = random_ids(config)
    full = model((src, tgt), training=False).numpy()
    real = tgt != PAD_ID  # pads only at the end: every real position precedes them
    one_by_one = cached_logits(model, src, tgt, [1] * TGT_LEN, config.max_length)
    np.testing.assert_allclose(one_by_one[real], full[real], atol=1e-5, rtol=0)
    prompt_then_steps = cached_logits(model, src, tgt, [3, 1, 2], config.max_length)
    np.testing.assert_allclose(prompt_then_steps[real], full[real], atol=1e-5, rtol=0)


def test_cached_decoding_in_tf_function(tiny_model_config):
    """decode_step traced once with a tensor index (as a generation loop would use it)."""
    config = tiny_model_config()
    model = build(config)
    src, tgt = random_ids(config)
    full = model((src, tgt), training=False).numpy()
    memory, src_mask = model.encode(src)
    cache = model.init_cache(memory, src_mask, config.max_length)
    step = tf.function(model.decode_step, reduce_retracing=True)
    outputs = []
    for i in range(TGT_LEN):
        logits, cache, _ = step(tf.constant(tgt[:, i: i + 1]), tf.constant(i), src_mask, cache)
        outputs.append(logits.numpy())
    real = tgt != PAD_ID
    np.testing.assert_allclose(np.concatenate(outputs, axis=1)[real], full[real], atol=1e-5, rtol=0)
    assert step.experimental_get_tracing_count() == 1


def test_config_round_trip_rebuilds_the_same_model(tiny_model_config):
    config = tiny_model_config(head_width="paper", dropout_rate=0.2)
    model = build(config)
    src, tgt = random_ids(config)
    clone = Transformer.from_config(model.get_config())
    clone.build()
    assert clone.config == model.config == config
    assert clone.get_config() == model.get_config()
    assert [(w.path, w.shape) for w in clone.weights] == [(w.path, w.shape) for w in model.weights]
    assert not np.allclose(clone((src, tgt)).numpy(), model((src, tgt)).numpy())  # fresh weights differ
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone((src, tgt)).numpy(), model((src, tgt)).numpy())


def test_keras_file_round_trip(tiny_model_config, tmp_path):
    config = tiny_model_config(dropout_rate=0.1)
    model = build(config)
    src, tgt = random_ids(config)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, Transformer)
    assert loaded.config == config
    np.testing.assert_array_equal(loaded((src, tgt)).numpy(), model((src, tgt)).numpy())


def test_keras_file_round_trip_of_a_compiled_model(tiny_model_config, tmp_path):
    """The project's loss, metric and schedule deserialize with the model."""
    config = tiny_model_config(num_layers=1)
    model = build(config)
    model.compile(optimizer=keras.optimizers.Adam(WarmupInverseSqrt(config.d_model, 30)),
                  loss=MaskedSparseCrossEntropy(label_smoothing=0.1), metrics=[MaskedAccuracy()])
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(3)  # optimizer state travels with the file
    path = tmp_path / "compiled.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.loss, MaskedSparseCrossEntropy) and loaded.loss.label_smoothing == 0.1
    schedule = loaded.optimizer.get_config()["learning_rate"]
    assert schedule["class_name"] == "WarmupInverseSqrt" and schedule["config"]["warmup_steps"] == 30
    assert int(loaded.optimizer.iterations.numpy()) == 3
    src, tgt = random_ids(config)
    np.testing.assert_array_equal(loaded((src, tgt)).numpy(), model((src, tgt)).numpy())


def test_tf_checkpoint_of_the_model_alone_restores_every_weight(tiny_model_config, tmp_path):
    """`tf.train.Checkpoint(model=...)` (training's checkpoints, load_trained_model) must see
    every sublayer, including the encoder/decoder blocks."""
    config = tiny_model_config()
    model = build(config, seed=0)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    saved = [name for name in tf.train.list_variables(path) if name[0].startswith("model/")]
    assert len(saved) == len(model.weights)

    other = build(config, seed=1)
    tf.train.Checkpoint(model=other).read(path).assert_consumed()
    for a, b in zip(model.weights, other.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


@pytest.fixture(params=["mixed_bfloat16", "mixed_float16"])
def precision_policy(request):
    """Sets a global mixed-precision policy for one test, always restoring float32."""
    keras.mixed_precision.set_global_policy(request.param)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_mixed_precision_runs_and_trains(tiny_model_config, precision_policy):
    config = tiny_model_config(dropout_rate=0.1, num_layers=1)  # 1 layer: tracing the train step dominates
    model = build(config)
    compute = precision_policy.split("_")[1]
    assert model.compute_dtype == compute
    assert all(w.dtype == "float32" for w in model.weights)  # float32 master weights
    src, tgt = random_ids(config)
    logits = model((src, tgt), training=False)
    assert logits.dtype == tf.float32
    assert np.isfinite(logits.numpy()).all()

    # The mixed model computes (approximately) the float32 model's function.
    keras.mixed_precision.set_global_policy("float32")
    reference = build(config)
    keras.mixed_precision.set_global_policy(precision_policy)
    reference.set_weights(model.get_weights())
    expected = reference((src, tgt), training=False).numpy()
    assert np.abs(logits.numpy() - expected).max() < 0.1 * np.abs(expected).max()

    # Cached decoding works with a compute-dtype cache.
    memory, src_mask = model.encode(src)
    cache = model.init_cache(memory, src_mask, config.max_length)
    assert cache["self"][0].dtype == compute
    step_logits, _, _ = model.decode_step(tgt[:, :1], 0, src_mask, cache)
    assert step_logits.dtype == tf.float32

    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=MaskedSparseCrossEntropy())
    model.optimizer.build(model.trainable_variables)  # as optimizer.compile_model: no retrace on step 1
    if precision_policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    full_tgt = np.pad(tgt, [[0, 0], [0, 1]])
    x, y = (src, full_tgt[:, :-1]), full_tgt[:, 1:]
    first = float(model.train_on_batch(x, y))
    for _ in range(4):
        last = float(model.train_on_batch(x, y))
    assert np.isfinite(first) and np.isfinite(last)
    assert last < first
