"""Translator: robustness to bad input, input validation, order, chunking, attention output."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from helpers_translation import BAD_INPUTS, SHOUTED_INPUTS, SPAN_INPUTS, fold_reference, tiny_translator

from transformer.inference.translator import DecodeConfig

MAX_LENGTH = 24


@pytest.fixture(scope="module")
def translator():
    return tiny_translator(DecodeConfig(chunk_size=4), max_length=MAX_LENGTH)


def test_bad_inputs_give_one_row_each(translator):
    out = translator(tf.constant(BAD_INPUTS))
    assert out.dtype == tf.string and out.shape == (len(BAD_INPUTS),)
    texts = [t.decode("utf-8") for t in out.numpy()]
    assert texts[1] == texts[2] == texts[3] == ""  # empty and whitespace-only → empty translation
    for i in (0, 4, 5, 6, 7, 8, 9):  # real text, other scripts, emoji, invalid UTF-8 → some output
        assert texts[i], f"row {i} ({BAD_INPUTS[i]!r}) gave an empty translation"


def test_a_line_in_capitals_is_translated_as_folded_and_given_back_in_capitals(translator):
    folded = [fold_reference(s) for s in SHOUTED_INPUTS]
    expected = translator.translate(folded)
    assert all(any(c.islower() for c in t) for t in expected)  # else upper-casing could not show
    assert translator.translate(SHOUTED_INPUTS) == [t.upper() for t in expected]
    assert translator.with_config(beam_size=2).translate(SHOUTED_INPUTS[:1]) == [
        t.upper() for t in translator.with_config(beam_size=2).translate(folded[:1])]
    details = translator.attention(SHOUTED_INPUTS)  # the attention plot's path: same texts, pieces too
    assert [t.decode() for t in details["line_translations"]] == [t.upper() for t in expected]
    assert len(details["translations"]) > 2 and all(t.decode() == t.decode().upper() for t in details["translations"])


def test_a_run_in_capitals_inside_a_line_is_translated_as_folded_and_not_upper_cased(translator):
    folded = [fold_reference(s) for s in SPAN_INPUTS]
    assert folded != SPAN_INPUTS  # the split_for_model test shows the pieces are the folded text
    expected = translator.translate(folded)
    assert all(any(c.islower() for c in t) for t in expected)  # else upper-casing could not show
    assert translator.translate(SPAN_INPUTS) == expected
    assert [t.decode() for t in translator.attention(SPAN_INPUTS)["line_translations"]] == expected


def test_rows_are_translated_independently_of_batch_order_and_chunks(translator):
    sentences = ["Deus é amor.", "No princípio era o Verbo.", "", "E disse Deus: Haja luz.", "Jesus chorou.", "a b c"]
    together = translator.translate(sentences)
    alone = [translator.translate([s])[0] for s in sentences]
    assert together == alone
    assert translator.translate(sentences[::-1]) == together[::-1]


def test_long_input_is_truncated_to_max_length(translator):
    details = translator.attention(["palavra " * 1250])  # 10,000 characters
    assert details["source_lengths"][0] == MAX_LENGTH
    tokens = [t.decode() for t in details["source_tokens"][0]]
    assert tokens[0] == "[START]" and tokens[MAX_LENGTH - 1] == "[END]"
    assert details["target_lengths"][0] <= MAX_LENGTH


def test_empty_batch(translator):
    assert translator.translate([]) == []
    assert translator(tf.zeros([0], tf.string)).shape == (0,)


@pytest.mark.parametrize("bad, error, message", [
    ("uma frase", ValueError, "got a single str"),
    (tf.constant("uma frase"), ValueError, "rank 0"),
    (tf.constant([["a", "b"]]), ValueError, "rank 2"),
    ([["a"], ["b"]], ValueError, "nested list"),
    (tf.constant([1, 2]), TypeError, "dtype int32"),
    ([1.5], TypeError, "float"),
    (np.array([3, 4]), TypeError, "dtype int64"),
])
def test_wrong_type_or_rank_is_a_clear_error(translator, bad, error, message):
    with pytest.raises(error, match=message) as info:
        translator(bad)
    assert "expected a 1-D batch of strings" in str(info.value)


def test_attention_details_shapes(translator):
    details = translator.attention(["Deus é amor.", ""])
    heads = translator.model.config.num_heads
    batch, steps = details["target_ids"].shape
    assert batch == 2
    assert details["attention"].shape == (2, heads, steps, details["source_tokens"].shape[1])
    assert details["target_lengths"][1] == 0 and details["translations"][1] == b""
    length = details["target_lengths"][0]
    weights = details["attention"][0, :, :length, : details["source_lengths"][0]]
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-4)  # softmax over the real source tokens
    assert details["translations"][0] == translator.translate(["Deus é amor."])[0].encode()


def test_attention_heatmap_is_written(translator, tmp_path):
    from transformer.measure.attention_plot import attention_for_sentence, plot_attention

    weights, source, target, _ = attention_for_sentence(translator.attention(["Deus é amor."]), 0)
    assert weights.shape == (len(target), len(source))
    path = plot_attention(weights, source, target, tmp_path / "attention.png", title="test")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="expected"):
        plot_attention(weights[:, :-1], source, target, tmp_path / "bad.png")


def test_beam_and_xla_translators_handle_bad_inputs(translator):
    # chunk_size 16: one chunk, so XLA compiles one program
    for config in (DecodeConfig(beam_size=3, chunk_size=4), DecodeConfig(jit_compile=True, chunk_size=16)):
        other = translator.with_config(**config.to_dict())
        texts = other.translate(BAD_INPUTS)
        assert len(texts) == len(BAD_INPUTS) and texts[1] == texts[2] == ""


def test_lengths_count_generated_tokens(translator):
    texts, lengths = translator.translate_with_lengths(["Deus é amor.", "   "])
    assert lengths[1] == 0 and 1 <= lengths[0] <= MAX_LENGTH
    assert texts == translator.translate(["Deus é amor.", "   "])


@pytest.fixture(scope="module")
def with_streams(translator):
    """`streams` → the module translator with that many decoding loops, built once per module
    (each Translator traces its own decode loop, seconds apiece)."""
    return functools.cache(lambda streams: translator.with_config(streams=streams))


@pytest.mark.parametrize("streams, batch", [(2, 9), (3, 10), (2, 3), (3, 0)])
def test_streams_give_the_one_loop_translations_in_input_order(with_streams, streams, batch):
    # chunk_size 4: 9 sentences are chunks 4 + 4 + 1 over 2 loops; 3 sentences leave the second loop idle
    sentences = (BAD_INPUTS + ["Jesus chorou.", "E disse Deus: Haja luz."])[:batch]
    texts, lengths = with_streams(1).translate_with_lengths(sentences)
    streamed = with_streams(streams)
    assert streamed.translate_with_lengths(sentences)[0] == texts
    np.testing.assert_array_equal(streamed.translate_with_lengths(sentences)[1], lengths)
    assert streamed.translate(sentences[::-1]) == texts[::-1]


def test_streams_of_beam_search_give_its_one_loop_translations(translator):
    beam = translator.with_config(beam_size=2, streams=1)
    assert beam.with_config(streams=2).translate(BAD_INPUTS) == beam.translate(BAD_INPUTS)


def test_decode_config_reaches_the_decoder(translator, monkeypatch):
    from transformer.inference import decoding

    seen = []
    original = decoding.greedy_translate
    monkeypatch.setattr(decoding, "greedy_translate",
                        lambda *a, **k: seen.append(k["drop_finished"]) or original(*a, **k))
    translator.with_config(drop_finished=0.5).translate(["Deus é amor."])
    assert seen == [0.5]


def test_streams_must_be_positive():
    with pytest.raises(ValueError, match="streams must be >= 1, got 0"):
        DecodeConfig(streams=0).validate()
