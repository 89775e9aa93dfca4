"""Recipe knobs of the model and tokenizers (all off by default): pre-norm blocks, tied
embeddings, separate dropout rates, a shared source/target vocabulary. Each keeps the
model's invariants: causality, padding invariance, cached == full decoding, float32 logits,
config round trips, export == in-memory."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import TGT_LEN, build, cached_logits, future_leak, random_ids

from transformer.base import cli
from transformer.base.config import ModelConfig, RunConfig, TokenizerConfig
from transformer.base.constants import PAD_ID
from transformer.model.losses import MaskedSparseCrossEntropy
from transformer.model.tied import TiedLogits
from transformer.model.transformer import Transformer

VARIANTS = {  # each knob once, in few combinations (the suite has a time budget)
    "tied-output": dict(tie_embeddings="output"),  # separate vocabularies (40 / 48), input cache
    "pre-norm-tied-all": dict(layer_norm="pre", tie_embeddings="all", src_vocab_size=48, head_width="paper"),
    "dropouts": dict(attention_dropout=0.2, activation_dropout=0.3),
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, tiny_model_config):
    return tiny_model_config(dropout_rate=0.3, **VARIANTS[request.param])


def test_causal_and_padding_invariant(variant):
    model = build(variant)
    src, tgt = random_ids(variant)
    logits = model((src, tgt), training=False).numpy()
    assert model((src, tgt)).dtype == tf.float32
    real = tgt != PAD_ID
    # Appended source and target padding change no real position's logits.
    padded = model((np.pad(src, [[0, 0], [0, 5]]), np.pad(tgt, [[0, 0], [0, 3]])), training=False).numpy()
    np.testing.assert_allclose(padded[:, :TGT_LEN][real], logits[real], atol=1e-5, rtol=0)
    # Causality: no position sees a later target token.
    full_tgt = np.where(tgt == PAD_ID, 7, tgt)
    assert future_leak(model, src, full_tgt) < 1e-6


def test_cached_decoding_equals_full_pass(variant):
    model = build(variant)
    src, tgt = random_ids(variant)
    full = model((src, tgt), training=False).numpy()
    real = tgt != PAD_ID
    np.testing.assert_allclose(cached_logits(model, src, tgt, [1] * TGT_LEN, variant.max_length)[real], full[real],
                               atol=1e-5, rtol=0)


def test_config_round_trips(variant, tmp_path):
    model = build(variant)
    clone = Transformer.from_config(model.get_config())
    clone.build()
    assert clone.config == variant
    assert [(w.path, w.shape) for w in clone.weights] == [(w.path, w.shape) for w in model.weights]
    config = RunConfig(model=variant, tokenizer=TokenizerConfig(shared_vocab=variant.tie_embeddings == "all"))
    config.save(tmp_path / "config.json")
    assert RunConfig.load(tmp_path / "config.json") == config.validate()


def test_tiny_model_with_every_knob_trains(tiny_model_config):
    """One model with all knobs on (one block, one traced train step: the suite has a time budget)."""
    variant = tiny_model_config(num_layers=1, dropout_rate=0.1, layer_norm="pre", tie_embeddings="all",
                                src_vocab_size=48, attention_dropout=0.2, activation_dropout=0.1)
    keras.utils.set_random_seed(0)
    model = build(variant)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=MaskedSparseCrossEntropy())
    src, tgt = random_ids(variant)
    full = np.pad(tgt, [[0, 0], [0, 1]])
    x, y = (src, full[:, :-1]), full[:, 1:]
    losses = [float(model.train_on_batch(x, y)) for _ in range(8)]
    assert np.isfinite(losses).all() and losses[-1] < 0.9 * losses[0], losses


def test_tied_all_is_one_variable_for_input_output_and_softmax(tiny_model_config, tmp_path):
    config = tiny_model_config(tie_embeddings="all", src_vocab_size=48)
    model = build(config)
    matrix = model.tgt_embedding.embedding.embeddings
    assert model.src_embedding.embedding is model.tgt_embedding.embedding
    assert isinstance(model.final_layer, TiedLogits) and model.final_layer.embedding.embeddings is matrix
    shaped = [w for w in model.weights if tuple(w.shape) in ((48, 16), (16, 48))]
    assert shaped == [matrix]  # no second embedding, no separate projection kernel
    assert len({id(w) for w in model.weights}) == len(model.weights)
    untied = build(tiny_model_config(src_vocab_size=48))
    assert untied.count_params() - model.count_params() == 2 * 48 * 16  # source embedding + projection kernel

    # The one matrix gets gradient from the source side, the target side and the softmax.
    src, tgt = random_ids(config)
    for which in ("src", "tgt", "out"):
        with tf.GradientTape() as tape:
            if which == "src":
                loss = tf.reduce_sum(model.encode(src)[0])
            elif which == "tgt":
                loss = tf.reduce_sum(model.tgt_embedding(tgt))
            else:
                loss = tf.reduce_sum(model.final_layer(tf.ones([1, 1, 16])))
        grad = tape.gradient(loss, matrix)
        assert grad is not None and float(tf.reduce_max(tf.abs(tf.convert_to_tensor(grad)))) > 0, which

    # A checkpoint holds the matrix once and restores it everywhere.
    other = build(config, seed=3)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=other).read(path).assert_consumed()
    np.testing.assert_array_equal(other((src, tgt)).numpy(), model((src, tgt)).numpy())


def test_tied_output_keeps_separate_source_embedding(tiny_model_config):
    model = build(tiny_model_config(tie_embeddings="output"))  # vocabularies 40 / 48
    assert model.src_embedding.embedding is not model.tgt_embedding.embedding
    assert model.final_layer.embedding is model.tgt_embedding.embedding
    assert not any(tuple(w.shape) == (16, 48) for w in model.weights)


def test_tied_logits_are_float32_under_mixed_precision(tiny_model_config):
    config = tiny_model_config(tie_embeddings="all", src_vocab_size=48, layer_norm="pre")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build(config)
        src, tgt = random_ids(config)
        logits = model((src, tgt), training=False)
        assert model.compute_dtype == "bfloat16" and logits.dtype == tf.float32
        assert all(w.dtype == "float32" for w in model.weights)
        memory, src_mask = model.encode(src)
        step, _, _ = model.decode_step(tgt[:, :1], 0, src_mask, model.init_cache(memory, src_mask, 16))
        assert step.dtype == tf.float32
    finally:
        keras.mixed_precision.set_global_policy("float32")
    reference = build(config)
    reference.set_weights(model.get_weights())
    expected = reference((src, tgt), training=False).numpy()
    assert np.abs(logits.numpy() - expected).max() < 0.1 * np.abs(expected).max()


def test_pre_norm_has_final_norms_and_post_norm_none(tiny_model_config):
    pre = build(tiny_model_config(layer_norm="pre"))
    post = build(tiny_model_config())
    assert pre.encoder_norm is not None and pre.decoder_norm is not None
    assert post.encoder_norm is None and post.decoder_norm is None
    assert pre.count_params() - post.count_params() == 2 * 2 * 16


def test_old_config_json_loads_with_the_defaults():
    values = RunConfig().to_dict()
    for key in ("tie_embeddings", "layer_norm", "attention_dropout", "activation_dropout"):
        del values["model"][key]
    del values["tokenizer"]["shared_vocab"]
    assert RunConfig.from_dict(values) == RunConfig()
    assert ModelConfig().tie_embeddings == "none" and ModelConfig().layer_norm == "post"


@pytest.mark.parametrize("values, message", [
    (dict(tie_embeddings="both"), "tie_embeddings"),
    (dict(layer_norm="middle"), "layer_norm"),
    (dict(attention_dropout=1.0), "attention_dropout"),
    (dict(tie_embeddings="all", src_vocab_size=40, tgt_vocab_size=48), "shared-vocab"),
])
def test_bad_knob_values_are_errors(values, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**values).validate()


def test_flags_map_onto_the_config():
    parser = cli.argparse.ArgumentParser()
    cli.add_tokenizer_args(parser)
    cli.add_model_args(parser)
    cli.add_train_args(parser)
    args = parser.parse_args(["--shared-vocab", "--tie-embeddings", "all", "--layer-norm", "pre",
                              "--attention-dropout", "0.2", "--activation-dropout", "0.1"])
    config = cli.run_config_from_args(args)
    assert config.tokenizer.shared_vocab
    assert (config.model.tie_embeddings, config.model.layer_norm) == ("all", "pre")
    assert (config.model.attention_dropout, config.model.activation_dropout) == (0.2, 0.1)
    with pytest.raises(ValueError, match="--shared-vocab"):
        cli.run_config_from_args(parser.parse_args(["--tie-embeddings", "all"]))
    assert cli.run_config_from_args(parser.parse_args([])) == RunConfig()


def test_shared_vocab_tokenizers_and_export_of_a_tied_pre_norm_model(bible_tokenizers, tmp_path):
    """One vocabulary for both languages (own key), a tied pre-norm model on it, exported
    == in memory."""
    from transformer.data.tokenizer import build_or_load_tokenizers, tokenizer_key
    from transformer.inference.export import export_translator, load_exported
    from transformer.inference.rundir import build_model
    from transformer.inference.translator import DecodeConfig, Translator

    corpus = bible_tokenizers.corpus
    config = dataclasses.replace(bible_tokenizers.config, shared_vocab=True, vocab_size=400,
                                 learn_max_examples=800, root=str(tmp_path))
    assert tokenizer_key(corpus, config) != tokenizer_key(corpus, dataclasses.replace(config, shared_vocab=False))
    assert "shared" not in tokenizer_key(corpus, bible_tokenizers.config)
    tokenizers, directory = build_or_load_tokenizers(corpus, config)
    assert (directory / "src_vocab.txt").read_text() == (directory / "tgt_vocab.txt").read_text()
    vocab = int(tokenizers.src.get_vocab_size())
    assert vocab == int(tokenizers.tgt.get_vocab_size())
    english = tokenizers.src.tokenize(["the lord said"]).to_list()[0]
    assert english == tokenizers.tgt.tokenize(["the lord said"]).to_list()[0] and 1 not in english  # no [UNK]

    keras.utils.set_random_seed(0)
    model = build_model(ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, max_length=24,
                                    src_vocab_size=vocab, tgt_vocab_size=vocab, tie_embeddings="all",
                                    layer_norm="pre"))
    translator = Translator(tokenizers, model, DecodeConfig(chunk_size=4))
    sentences = ["No princípio, Deus criou os céus e a terra.", "Deus é amor.", "", "Jesus chorou."]
    path = export_translator(translator, tmp_path / "export")
    assert load_exported(path).translate(sentences) == translator.translate(sentences)
