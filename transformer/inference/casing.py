"""Lines typed in capitals: translated in lower case, their translations given back in capitals.

    shouted = casing.shouted(sentences)                 # [n] bool
    sources = casing.fold(sentences, shouted)           # those rows lower-cased
    translations = casing.restore(translations, shouted)

The model learns from cased text in which a whole line in capitals does not occur (not one of
the shared corpus' 88,940 Portuguese lines); WordPiece cuts words in capitals into pieces it
hardly saw, and such a line came out as noise. README's 30-minute model (AMD EPYC Zen 4,
2026-12-02): "TODA PALAVRA DE DEUS É PURA. …" → "TES THE PES THE THE PES …", where the same line
in lower case gave "All the word of god is pure. He is a shield to those who take refuge in
him."; the validation verses in capitals scored 0.5 case-insensitive BLEU as typed, 26.0 this
way (two models; docs/serving.md, "Lines in capitals").
So a line with no lower-case letter and at least two runs of two or more capitals separated
by white space (`SHOUTED`: a heading, a caps-lock line; not "ONU" or "OK" alone) is lower-cased
before it is translated (Unicode case mapping, `tf.strings.lower`), and its translation
upper-cased. Every other line is translated as typed. All TensorFlow ops: an export does the same.
"""

from __future__ import annotations

import tensorflow as tf

# No lower-case letter anywhere, and two words (runs of ≥ 2 capitals) apart.
NO_LOWER_CASE = r"(?s)[^\p{Ll}]*"
TWO_WORDS_IN_CAPITALS = r"(?s).*\p{Lu}{2,}.*\s.*\p{Lu}{2,}.*"


def shouted(sentences: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string (valid UTF-8) → `[n]` bool: the line is written in capitals (see the module)."""
    return tf.logical_and(tf.strings.regex_full_match(sentences, NO_LOWER_CASE),
                          tf.strings.regex_full_match(sentences, TWO_WORDS_IN_CAPITALS))


def fold(sentences: tf.Tensor, is_shouted: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string (valid UTF-8), `[n]` bool → the rows in `is_shouted` lower-cased, the others unchanged."""
    return tf.where(is_shouted, tf.strings.lower(sentences, encoding="utf-8"), sentences)


def restore(translations: tf.Tensor, is_shouted: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string translations, `[n]` bool → the rows in `is_shouted` upper-cased, the others unchanged."""
    return tf.where(is_shouted, tf.strings.upper(translations, encoding="utf-8"), translations)
