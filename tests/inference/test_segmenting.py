"""Sources over the model's length: cut at sentence ends, then commas; translations joined.

A row that fits is never cut (its translation is what it was); a row that does not is cut
where a sentence or clause ends, each piece translated alone, the pieces' translations
joined in order. The export, the continuous decoder and the CTranslate2 wrapper decode the
same pieces (tests/helpers_translation.py's BAD_INPUTS holds such a row for their tests).
"""

import re

import numpy as np
import pytest
import tensorflow as tf
from helpers_translation import shared_tokenizers, tiny_translator

from transformer.inference.segmenting import CUT_PATTERNS, cut_limit, split_long_sources
from transformer.inference.translator import DecodeConfig

PARAGRAPH = ("No princípio criou Deus os céus e a terra. A terra era sem forma e vazia; havia trevas sobre a face "
             "do abismo, e o Espírito de Deus pairava sobre as águas. Disse Deus: «Haja luz.» E houve luz 3.5 vezes!")
SHORT = "Deus é amor. Jesus chorou."
RUN_ON = "palavra " * 30  # over the limit, no punctuation: one piece (truncated later)


@pytest.fixture(scope="module")
def src_tokenizer():
    return shared_tokenizers()[0].src


def count_tokens(tokenizer, texts):
    return (tokenizer.tokenize(tf.constant(texts)).row_lengths() - 2).numpy()


def split(tokenizer, rows, max_tokens):
    pieces, piece_rows = split_long_sources(tokenizer.tokenize, tf.constant(rows, tf.string), max_tokens)
    return [p.decode() for p in pieces.numpy()], piece_rows.numpy().tolist()


def test_only_rows_over_the_limit_are_cut_and_where_a_sentence_or_clause_ends(src_tokenizer):
    rows = [SHORT, PARAGRAPH, "", RUN_ON]
    limit = int(count_tokens(src_tokenizer, [SHORT])[0])  # SHORT fits exactly
    pieces, piece_rows = split(src_tokenizer, rows, limit)
    assert piece_rows == sorted(piece_rows) and set(piece_rows) == {0, 1, 2, 3}
    by_row = [[p for p, r in zip(pieces, piece_rows) if r == row] for row in range(len(rows))]
    assert by_row[0] == [SHORT] and by_row[2] == [""] and by_row[3] == [RUN_ON]
    cut = by_row[1]
    assert " ".join(cut) == PARAGRAPH  # nothing lost or reordered: only the spaces at the cuts
    assert cut[:4] == ["No princípio criou Deus os céus e a terra.", "A terra era sem forma e vazia;",
                       "havia trevas sobre a face do abismo,", "e o Espírito de Deus pairava sobre as águas."]
    assert "«Haja luz.»" in cut and "E houve luz 3.5 vezes!" in cut  # closing quotes stay; no cut inside 3.5
    for piece, tokens in zip(cut, count_tokens(src_tokenizer, cut)):
        # a piece over the limit is one no pattern can cut further
        assert tokens <= limit or not any(re.search(p, piece) for p in CUT_PATTERNS), piece


def test_a_comma_is_a_cut_only_inside_a_sentence_still_too_long(src_tokenizer):
    sentence = "havia trevas sobre a face do abismo, e o Espírito de Deus pairava sobre as águas."
    tokens = int(count_tokens(src_tokenizer, [sentence])[0])
    assert split(src_tokenizer, [sentence], tokens)[0] == [sentence]
    assert split(src_tokenizer, [sentence], tokens - 1)[0] == [
        "havia trevas sobre a face do abismo,", "e o Espírito de Deus pairava sobre as águas."]


def test_below_the_model_limit_sources_are_cut_at_sentence_ends_only(src_tokenizer):
    sentence = "havia trevas sobre a face do abismo, e o Espírito de Deus pairava sobre as águas."
    rows = [sentence + " " + SHORT, sentence]
    pieces, piece_rows = split_long_sources(src_tokenizer.tokenize, tf.constant(rows), 1000, sentences_over=3)
    assert [p.decode() for p in pieces.numpy()] == [sentence, "Deus é amor.", "Jesus chorou.", sentence]
    assert piece_rows.numpy().tolist() == [0, 0, 0, 1]


def test_abbreviations_and_initials_are_no_sentence_ends(src_tokenizer):
    row = "O Sr. Silva leu a p. 5 com J. K. Rowling. Depois saiu."
    pieces, _ = split_long_sources(src_tokenizer.tokenize, tf.constant([row]), 1000, sentences_over=1)
    assert [p.decode() for p in pieces.numpy()] == ["O Sr. Silva leu a p. 5 com J. K. Rowling.", "Depois saiu."]


def test_abbreviations_hold_in_a_line_in_capitals_and_once_it_is_lower_cased(src_tokenizer):
    """`casing` folds a line in capitals before it is cut: "SR." and "sr." hold as "Sr." does (a word after
    one ending in "." keeps its capital: the fold cannot tell an abbreviation from a sentence end)."""
    from transformer.inference.segmenting import split_for_model

    row = "O SR. SILVA LEU A PÁG. 5. DEPOIS SAIU."
    for text in (row, row.lower()):
        pieces, _ = split_long_sources(src_tokenizer.tokenize, tf.constant([text]), 1000, sentences_over=1)
        assert [p.decode() for p in pieces.numpy()] == [text[:25], text[26:]], text
    pieces, _ = split_for_model(src_tokenizer.tokenize, tf.constant([row]), max_length=1000, cut_over=1)
    assert [p.decode() for p in pieces.numpy()] == ["O sr. Silva leu a pág. 5.", "Depois saiu."]
    pieces, _ = split_for_model(src_tokenizer.tokenize, tf.constant(["ELE VIU J. K. ROWLING. DEPOIS SAIU."]),
                                max_length=1000, cut_over=1)
    assert [p.decode() for p in pieces.numpy()] == ["Ele viu J. K. Rowling.", "Depois saiu."]  # initials kept
    pieces, _ = split_for_model(src_tokenizer.tokenize, tf.constant(["ELE DISSE QUE ASSIM É. DEPOIS SAIU."]),
                                max_length=1000, cut_over=1)
    assert [p.decode() for p in pieces.numpy()] == ["Ele disse que assim é.", "Depois saiu."]  # "É." is a word
    pieces, _ = split_long_sources(src_tokenizer.tokenize, tf.constant(["Eu vi-o. Depois saiu."]), 1000, sentences_over=1)
    assert len(pieces.numpy()) == 2  # a one-letter word in lower case ends a sentence


def test_empty_batch_and_invalid_utf8(src_tokenizer):
    assert split(src_tokenizer, [], 5) == ([], [])
    pieces, rows = split_long_sources(src_tokenizer.tokenize, tf.constant([b"Fim. \xff\xfe " + PARAGRAPH.encode()]), 5)
    assert rows.numpy().tolist() == [0] * len(rows) and pieces.numpy()[0].decode() == "Fim."


def test_a_cut_row_translates_as_its_pieces_each_alone():
    translator = tiny_translator(DecodeConfig(chunk_size=4), max_length=24)
    rows = ["Deus é amor.", PARAGRAPH, "", SHORT]
    texts, lengths = translator.translate_with_lengths(rows)
    pieces, piece_rows = translator.pieces(tf.constant(rows))
    assert int(piece_rows.numpy().tolist().count(1)) > 1  # the paragraph is cut, the others not
    alone = [translator.translate_with_lengths([p]) for p in pieces.numpy()]
    joined = [" ".join(t[0] for (t, _), r in zip(alone, piece_rows.numpy()) if r == row and t[0])
              for row in range(len(rows))]
    assert texts == joined
    np.testing.assert_array_equal(
        lengths, [sum(n[0] for (_, n), r in zip(alone, piece_rows.numpy()) if r == row) for row in range(len(rows))])
    assert translator.translate([SHORT]) == [texts[3]]  # uncut rows as without the others


def test_cut_over_cuts_rows_that_fit_the_model_and_only_those_over_it():
    translator = tiny_translator(DecodeConfig(chunk_size=4), max_length=64)
    rows = [SHORT, "Deus é amor.", ""]
    over = int(translator.source_ids(tf.constant([SHORT]))[0].row_lengths()[0]) - 2 - 1  # SHORT: one token over
    assert translator.pieces(tf.constant(rows))[1].numpy().tolist() == [0, 1, 2]  # default: all fit, none cut
    for cut_over, cut in ((over, True), (over + 1, False), (10_000, False)):
        piece_rows = translator.with_config(cut_over=cut_over).pieces(tf.constant(rows))[1].numpy().tolist()
        assert piece_rows == ([0, 0, 1, 2] if cut else [0, 1, 2]), cut_over
    shorter = translator.with_config(cut_over=over)
    assert shorter.translate(rows) == [" ".join(t for t in shorter.translate(["Deus é amor.", "Jesus chorou."]) if t),
                                       translator.translate(["Deus é amor."])[0], ""]


def test_cut_limit_is_capped_at_the_model_positions():
    assert [cut_limit(n, 128) for n in (0, 1, 64, 126, 127, 10_000)] == [126, 1, 64, 126, 126, 126]
    with pytest.raises(ValueError, match="cut_over must be >= 0"):
        DecodeConfig(cut_over=-1).validate()


def test_the_attention_of_a_cut_row_is_its_pieces_side_by_side():
    """`serve_attention` cuts as `translate` does; the heatmap shows every piece, each in its block."""
    from transformer.measure.attention_plot import attention_for_sentence

    translator = tiny_translator(DecodeConfig(chunk_size=4, cut_over=3), max_length=64)
    rows = ["Deus é amor.", SHORT]
    details = translator.attention(rows)
    assert details["rows"].tolist() == [0, 1, 1]  # SHORT: two sentences over 3 tokens
    assert [t.decode() for t in details["line_translations"]] == translator.translate(rows)
    weights, source, target, translation = attention_for_sentence(details, 1)
    assert translation == translator.translate([SHORT])[0]
    pieces = [attention_for_sentence(translator.attention([p]), 0) for p in ("Deus é amor.", "Jesus chorou.")]
    assert source == pieces[0][1] + pieces[1][1] and target == pieces[0][2] + pieces[1][2]
    (t1, s1) = pieces[0][0].shape
    np.testing.assert_allclose(weights[:t1, :s1], pieces[0][0], atol=1e-5)
    np.testing.assert_allclose(weights[t1:, s1:], pieces[1][0], atol=1e-5)
    assert not weights[:t1, s1:].any() and not weights[t1:, :s1].any()  # a piece sees its own source only
    assert attention_for_sentence(details, 0)[3] == translator.translate(["Deus é amor."])[0]
