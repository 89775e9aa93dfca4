"""Words written in capitals: which runs and lines count, and the folding and restoring of their case."""

import random

import pytest
import tensorflow as tf
from helpers_translation import fold_reference

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


@pytest.mark.parametrize("line, folded", [
    ("Ele disse: NÃO FAÇAS ISSO AGORA", "Ele disse: não faças isso agora"),  # a run inside a line
    ("ÁGUA É VIDA, SÃO JOÃO.", "Água é vida, são joão."),  # a line in capitals is one run
    ("  \"NÃO FAÇAS ISSO.\" ELE FOI EMBORA, disse.", "  \"Não faças isso.\" Ele foi embora, disse."),  # sentence starts
    ("SAIU. «ÁGUA VIVA» É BOA! 3 ÉÉ", "Saiu. «Água viva» é boa! 3 éé"),
    ("JOÃO  3:16\t— O AMOR", "João  3:16\t— o amor"),  # white space kept byte for byte
    ("x ÉÉ ÉÉ y ÉÉ z ÀÀ ÀÀ", "x éé éé y ÉÉ z àà àà"),  # each run on its own: one word is not a run
    ("o SENHOR DEUS disse", "o senhor deus disse"),
    ("eu vi J. K. ROWLING ONTEM", "eu vi J. K. Rowling ontem"),  # initials kept, the cut at sentence ends skips them
    ("ASSIM É. DEPOIS SAIU.", "Assim é. Depois saiu."),  # "É." is a word at a sentence end, not an initial
    ("O SENHOR disse a Moisés", "O SENHOR disse a Moisés"),  # one word in capitals: as typed
    ("a ONU e a OTAN", "a ONU e a OTAN"),  # acronyms apart
    ("  A B C", "  A B C"),  # no word of two capitals
    ("Deus é amor.", "Deus é amor."),
    ("", ""),
])
def test_fold_lower_cases_runs_of_words_in_capitals_and_keeps_sentence_starts(line, folded):
    assert texts(casing.fold(tf.constant([line]))) == [folded] == [fold_reference(line)]


def test_fold_equals_its_rules_written_in_python_on_random_lines():
    words = ["ÁGUA", "ÉÉ", "SÃO", "OK", "A", "É", "Ç", "ça", "deus", "Ele", "x", "3:16", "—", "«", "»", '"', ".", "!",
             "?", "…", ",", ":", "J.", "(Á.", "x.", "\u00a0", "ß", "Ǆ", "ǅ"]  # ǅ: a title-case letter, neither Lu nor Ll
    spaces = [" ", " ", " ", "  ", "\t", "\n", ""]
    rng = random.Random(0)
    lines = ["".join(rng.choice(words if i % 2 else spaces) for i in range(rng.randint(0, 20))) for _ in range(600)]
    got = texts(casing.fold(tf.constant(lines)))
    assert got == [fold_reference(line) for line in lines]
    assert sum(g != line for g, line in zip(got, lines)) > 40  # the rule was exercised (56 lines change)


def test_restore_upper_cases_only_the_flagged_rows_with_unicode_case_mapping():
    translations = tf.constant(["water is life, çà", "water is life, çà"])
    assert texts(casing.restore(translations, tf.constant([True, False]))) == ["WATER IS LIFE, ÇÀ", "water is life, çà"]


def test_split_for_model_folds_shouted_lines_and_join_for_model_restores_them():
    def tokenize(strings):  # [START], one id per word, [END]: no line here is long enough to be cut
        words = tf.strings.split(strings)
        ends = tf.zeros([words.nrows(), 1], tf.int64)
        return tf.concat([ends, words.with_flat_values(tf.zeros_like(words.flat_values, tf.int64)), ends], axis=1)

    lines = tf.constant(["DEUS É AMOR.", "Deus é amor.", b"INV\xffLIDO TEXTO", "Ele disse: NÃO FAÇAS ISSO."])
    assert segmenting.shouted_lines(lines).numpy().tolist() == [True, False, True, False]  # invalid UTF-8 replaced first
    pieces, rows = segmenting.split_for_model(tokenize, lines, max_length=24, cut_over=0)
    assert texts(pieces) == ["Deus é amor.", "Deus é amor.", "Inv\ufffdlido texto",  # sanitized, then folded
                             "Ele disse: não faças isso."]
    joined = segmenting.join_for_model(tf.constant(["god is love.", "God is love.", "invalid text", "He said: don't."]),
                                       rows, lines)
    assert texts(joined) == ["GOD IS LOVE.", "God is love.", "INVALID TEXT", "He said: don't."]  # a run: as translated
