"""Words typed in capitals: translated in lower case; a whole line's translation given back in capitals.

    sources = casing.fold(sentences)                    # [n] runs of words in capitals lower-cased
    shouted = casing.shouted(sentences)                 # [n] bool: the whole line in capitals
    translations = casing.restore(translations, shouted)

The model learns from cased text in which a line in capitals does not occur (not one of the
shared corpus' 88,940 Portuguese lines; 11 of its 29,431 verses hold two words in capitals
side by side, an inscription such as "O REI DOS JUDEUS"); WordPiece cuts words in capitals
into pieces it hardly saw, and such text came out as noise. README's 30-minute model (AMD
EPYC Zen 4, 2026-12-02): "TODA PALAVRA DE DEUS É PURA. …" → "TES THE PES THE THE PES …",
where the same line in lower case gave "All the word of god is pure. He is a shield to those
who take refuge in him."; the validation verses in capitals scored 0.5 case-insensitive BLEU
as typed, 26.0 this way, and verses with a span in capitals gain the same way
(docs/serving.md, "Lines in capitals").

So a *run in capitals* is lower-cased before it is translated (Unicode case mapping,
`tf.strings.lower`): words (split at white space) with no lower-case letter, side by side,
of which at least two hold two or more capitals in a row ("Ele disse: NÃO FAÇAS ISSO" →
"Ele disse: não faças isso"; not a lone "ONU", "OK" or "SENHOR", nor "A B C"); an initial
(a capital A–Z and a period: "J.", not the word "É.") is kept, a word after a sentence end
keeps its first letter ("VI J. K. ROWLING. ELE" → "Vi J. K. Rowling. Ele"). A line whose
every word is in such a run (`shouted`: a heading, a caps-lock line) also has its
translation upper-cased; a run inside a line is not given back in capitals (no alignment says
which English words it became). A line without such a run is translated byte for byte as
typed. All TensorFlow ops: an export does the same.
"""

from __future__ import annotations

import tensorflow as tf

# No lower-case letter anywhere, and two words (runs of ≥ 2 capitals) apart.
NO_LOWER_CASE = r"(?s)[^\p{Ll}]*"
TWO_WORDS_IN_CAPITALS = r"(?s).*\p{Lu}{2,}.*\s.*\p{Lu}{2,}.*"
# A word that counts towards a run: no lower-case letter, two capitals in a row.
WORD_IN_CAPITALS = r"(?s)[^\p{Ll}]*\p{Lu}{2,}[^\p{Ll}]*"
HAS_LOWER_CASE = r"(?s).*\p{Ll}.*"
# A word that ends a sentence, and a word's first letter (with what comes before it) and the rest.
SENTENCE_END = r"(?s).*[.!?…][\"'”’»)\]]*"
# An initial ("J." of "J. K. ROWLING"), a capital A–Z and a period as segmenting's abbreviations
# read it: kept as typed, so that a cut at sentence ends still skips it. "É." is a word ("ASSIM É.").
INITIAL = r"(?s)\PL*[A-Z]\.\PL*"
FIRST_LETTER = r"(?s)(\PL*\pL)(.*)"
# Put around white space, then split on, so that words and the white space between them come
# apart and join back byte for byte: a byte that valid UTF-8 never holds.
_MARK = b"\xff"


def shouted(sentences: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string (valid UTF-8) → `[n]` bool: the line is written in capitals (see the module)."""
    return tf.logical_and(tf.strings.regex_full_match(sentences, NO_LOWER_CASE),
                          tf.strings.regex_full_match(sentences, TWO_WORDS_IN_CAPITALS))


def fold(sentences: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string (valid UTF-8) → the same with every run in capitals lower-cased (see the
    module); a row without one unchanged. A line in capitals (`shouted`) is one run."""
    # Only a line with two words of two capitals can hold a run: the others skip the split.
    candidate = tf.strings.regex_full_match(sentences, TWO_WORDS_IN_CAPITALS)
    rows = tf.where(candidate)[:, 0]
    lines = tf.gather(sentences, rows)
    tokens = tf.strings.split(tf.strings.regex_replace(lines, r"(\s+)", _MARK + b"\\1" + _MARK), _MARK)
    words = tokens.flat_values  # [t] words and the white space between them, row after row
    lower_case = tf.strings.regex_full_match(words, HAS_LOWER_CASE)
    # A run ends at a word with a lower-case letter and at the end of a line: its id counts them.
    row_start = tf.scatter_nd(tokens.row_starts()[:, None], tf.ones_like(tokens.row_starts(), tf.bool),
                              tf.shape(words, out_type=tf.int64))
    run = tf.cumsum(tf.cast(tf.logical_or(lower_case, row_start), tf.int32)) - 1
    in_capitals = tf.cast(tf.strings.regex_full_match(words, WORD_IN_CAPITALS), tf.int32)
    words_in_run = tf.math.unsorted_segment_sum(in_capitals, run, tf.size(words))
    folded = tf.logical_and(tf.logical_not(tf.logical_or(lower_case, tf.strings.regex_full_match(words, INITIAL))),
                            tf.gather(words_in_run, run) >= 2)
    return tf.tensor_scatter_nd_update(sentences, rows[:, None], tf.strings.reduce_join(
        tokens.with_flat_values(tf.where(folded, _sentence_case(tokens), words)), axis=1))


def _sentence_case(tokens: tf.RaggedTensor) -> tf.Tensor:
    """`[lines, (tokens)]` words with the white space between them (words at even places) →
    `[t]` each lower-cased, but for its first letter where it starts a sentence: the first word
    of a line, or one after a word ending in `.`, `!`, `?` or `…` (closing quotes or brackets
    included): "NÃO FAÇAS ISSO. ELE FOI" → "Não faças isso. Ele foi", as the model read text."""
    words = tokens.flat_values
    place = tf.range(tf.size(words, out_type=tf.int64)) - tf.gather(tokens.row_starts(), tokens.value_rowids())
    previous = tf.gather(words, tf.maximum(tf.range(tf.size(words, out_type=tf.int64)) - 2, 0))
    starts = tf.logical_or(place < 2, tf.logical_or(tf.equal(previous, ""),
                                                    tf.strings.regex_full_match(previous, SENTENCE_END)))
    first_letter = tf.strings.regex_full_match(words, FIRST_LETTER)
    head = tf.strings.regex_replace(words, FIRST_LETTER, b"\\1")
    tail = tf.strings.lower(tf.strings.regex_replace(words, FIRST_LETTER, b"\\2"), encoding="utf-8")
    return tf.where(tf.logical_and(starts, first_letter), head + tail, tf.strings.lower(words, encoding="utf-8"))


def restore(translations: tf.Tensor, is_shouted: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string translations, `[n]` bool → the rows in `is_shouted` upper-cased, the others unchanged."""
    return tf.where(is_shouted, tf.strings.upper(translations, encoding="utf-8"), translations)
