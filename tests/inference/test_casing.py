"""Lines written in capitals: which lines count, and the folding and restoring of their case."""

import pytest
import tensorflow as tf

from transformer.inference import casing, segmenting


def texts(tensor) -> list[str]:
    return [t.decode("utf-8") for t in tensor.numpy()]


@pytest.mark.parametrize("line, shouted", [
    ("DEUS É AMOR.", True),
    ("ÁGUA E VINHO", True),  # accented capitals are capitals
    ("JOÃO 3:16 — O AMOR", True),  # digits and punctuation have no case
    ("SÃO PAULO\nRIO", True),  # any white space separates the words
    ("Deus é amor.", False),
    ("DEUS é AMOR", False),  # one lower-case letter: as typed
    ("ONU", False),  # one word in capitals (an acronym, a heading word)
    ("OK", False),
    ("A B C", False),  # capitals, but no run of two
    ("", False),
    ("123 456", False),
    ("你好，世界", False),  # letters without case
])
def test_a_line_is_shouted_when_it_has_no_lower_case_letter_and_two_words_in_capitals(line, shouted):
    assert casing.shouted(tf.constant([line])).numpy().tolist() == [shouted]


def test_fold_and_restore_change_only_the_flagged_rows_with_unicode_case_mapping():
    lines = tf.constant(["ÁGUA É VIDA, SÃO JOÃO.", "ÁGUA É VIDA, SÃO JOÃO."])
    flags = tf.constant([True, False])
    assert texts(casing.fold(lines, flags)) == ["água é vida, são joão.", "ÁGUA É VIDA, SÃO JOÃO."]
    translations = tf.constant(["water is life, çà", "water is life, çà"])
    assert texts(casing.restore(translations, flags)) == ["WATER IS LIFE, ÇÀ", "water is life, çà"]


def test_split_for_model_folds_shouted_lines_and_join_for_model_restores_them():
    def tokenize(strings):  # [START], one id per word, [END]: no line here is long enough to be cut
        words = tf.strings.split(strings)
        ends = tf.zeros([words.nrows(), 1], tf.int64)
        return tf.concat([ends, words.with_flat_values(tf.zeros_like(words.flat_values, tf.int64)), ends], axis=1)

    lines = tf.constant(["DEUS É AMOR.", "Deus é amor.", b"INV\xffLIDO TEXTO"])
    assert segmenting.shouted_lines(lines).numpy().tolist() == [True, False, True]  # invalid UTF-8 replaced first
    pieces, rows = segmenting.split_for_model(tokenize, lines, max_length=24, cut_over=0)
    assert texts(pieces) == ["deus é amor.", "Deus é amor.", "inv\ufffdlido texto"]  # sanitized, then folded
    joined = segmenting.join_for_model(tf.constant(["god is love.", "God is love.", "invalid text"]), rows, lines)
    assert texts(joined) == ["GOD IS LOVE.", "God is love.", "INVALID TEXT"]
