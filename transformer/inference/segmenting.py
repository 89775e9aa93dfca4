"""Long sources: cut into sentences (and clauses where the model needs), their translations joined.

    pieces, rows = split_for_model(tokenizers.src.tokenize, sentences, max_length=128,
                                   cut_over=40)                                     # [P], [P]
    translations = join_pieces(piece_translations, rows, batch)                     # [batch]

The model has `max_length` positions, so a source over `max_length - 2` tokens (a paragraph
on one line, a whole news article) would otherwise be truncated and its end never
translated; and it learnt from verses of 1-3 sentences, so it translates a long line of
several sentences worse than those sentences one by one. A row over `sentences_over` tokens
(`DecodeConfig.cut_over`) is cut after each sentence end (`.`, `!`, `?`, `;`, `:` or `…`,
closing quotes or brackets included, then white space; not after an abbreviation such as
"Sr." or an initial); a piece still over `max_tokens` is
cut after each comma. Each piece is translated on its own and the row's translations are
joined with a space, in order. A shorter row is one piece, untouched. A clause over
`max_tokens` with no comma is still truncated.

All in TensorFlow ops (tf.strings, ragged tensors), so an export does the same.
"""

from __future__ import annotations

import tensorflow as tf

from transformer.inference import casing

# Where a too-long piece is cut, tried in this order: after a sentence end, then after a comma.
# Group 1 is the text kept at the end of the piece; the white space after it is dropped.
CUT_PATTERNS = (r"([.!?;:…][\"'”’»)\]]*)\s+", r"(,)\s+")
# Put where a cut goes, then split on: a byte that sanitized (valid UTF-8) text never holds.
_MARK = b"\xff"
# A period that ends an abbreviation or an initial ("Sr. Silva", "J. K. Rowling", "p. 5") is no
# sentence end: the space after it is held by another such byte while the row is cut. The
# abbreviations in any case ("SR. SILVA", and "sr. silva" once `casing` lower-cased a line in
# capitals); an initial is a capital letter only (a lower-case one is a word: "vi-o.").
ABBREVIATION = (r"\b((?:[A-Z]|(?i:Sr|Sra|Srs|Sras|Dr|Dra|Drs|Dras|Prof|Profa|Profs|Exmo|Exma|Ilmo|Ilma|"
                r"Av|Pe|Sto|Sta|Mr|Mrs|Ms|St|Jr|Lda|Ltda|Cia|art|arts|cap|caps|fig|pág|págs|p|pp|n|nº|núm|vol|vols|"
                r"ed|cf|ex))\.)\s+")
_HELD = b"\xfe"


def sanitize(sentences: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string → the same with invalid UTF-8 replaced by U+FFFD (as the tokenizers expect)."""
    return tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)


def cut_limit(cut_over: int, max_length: int) -> int:
    """Tokens a source may have before it is cut at sentence ends: `cut_over` (DecodeConfig; 0 = the
    model's) capped at the model's `max_length - 2` (its positions less [START] and [END])."""
    return min(cut_over, max_length - 2) if cut_over > 0 else max_length - 2


def split_for_model(tokenize, sentences: tf.Tensor, max_length: int, cut_over: int) -> tuple[tf.Tensor, tf.Tensor]:
    """`split_long_sources` for a model of `max_length` positions and `DecodeConfig.cut_over`:
    rows over `cut_limit(cut_over, max_length)` tokens cut at sentence ends, pieces over
    `max_length - 2` then at commas. What the Translator, its export and the CTranslate2 wrapper cut.
    Runs of words in capitals are lower-cased first (`casing`; `join_for_model` gives a line in
    capitals back in capitals)."""
    sentences = sanitize(sentences)
    sentences = casing.fold(sentences)
    return split_long_sources(tokenize, sentences, max_length - 2, cut_limit(cut_over, max_length))


def split_long_sources(tokenize, sentences: tf.Tensor, max_tokens: int,
                       sentences_over: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """`[n]` tf.string → (pieces `[p]` tf.string (sanitized), rows `[p]` int64: each piece's input row).

    `tokenize`: `[n]` tf.string → ragged int64 `[n, (tokens)]` with [START] … [END] (the source
    tokenizer's `tokenize`). A row over `sentences_over` tokens (without [START]/[END]; default
    `max_tokens`) is cut after its sentence ends; a piece still over `max_tokens`, after its
    commas (`CUT_PATTERNS` in order). Other rows are one piece each. Pieces come in row order,
    then text order; every row has at least one.
    """
    pieces = sanitize(sentences)
    rows = tf.range(tf.shape(pieces, out_type=tf.int64)[0])
    limits = (max_tokens if sentences_over is None else sentences_over, max_tokens)
    for pattern, limit, hold in zip(CUT_PATTERNS, limits, (ABBREVIATION, None)):  # abbreviations: sentence ends only
        too_long = tokenize(pieces).row_lengths() - 2 > limit
        text = pieces if hold is None else tf.strings.regex_replace(pieces, hold, b"\\1" + _HELD)
        marked = tf.where(too_long, tf.strings.regex_replace(text, pattern, b"\\1" + _MARK), pieces)
        parts = tf.strings.split(marked, _MARK)  # [pieces, (parts)]: one part where nothing was marked
        pieces = parts.flat_values if hold is None else tf.strings.reduce_join(
            tf.strings.split(parts.flat_values, _HELD), axis=-1, separator=" ")
        rows = tf.gather(rows, parts.value_rowids())
    return pieces, rows


def join_texts(translations) -> str:
    """A row's piece translations (Python str, in order) → its translation: the non-empty ones
    joined by a space, as `join_pieces` joins them in the graph."""
    return " ".join(t for t in translations if t)


def join_pieces(translations: tf.Tensor, rows: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """`[p]` piece translations, `[p]` int64 rows (ascending) → `[n]` tf.string: each row's
    non-empty translations joined by a space, in order."""
    n = tf.cast(n, tf.int64)
    segments = tf.where(tf.strings.length(translations) > 0, rows, n)  # empty ones: to a segment dropped
    return tf.strings.unsorted_segment_join(translations, segments, n + 1, separator=" ")[:n]


def shouted_lines(sentences: tf.Tensor) -> tf.Tensor:
    """`[n]` tf.string as given (any bytes) → `[n]` bool: the lines in capitals, whose translations
    `join_for_model` upper-cases (`casing.shouted` of the sanitized text: on invalid UTF-8 the pattern itself never matches)."""
    return casing.shouted(sanitize(sentences))


def join_for_model(translations: tf.Tensor, rows: tf.Tensor, sentences: tf.Tensor) -> tf.Tensor:
    """`join_pieces` for the pieces of `split_for_model(…, sentences, …)`: `[n]` tf.string, the
    translation of a line written in capitals upper-cased (`casing.restore`)."""
    joined = join_pieces(translations, rows, tf.shape(sentences)[0])
    return casing.restore(joined, shouted_lines(sentences))


def sum_pieces(values: tf.Tensor, rows: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """`[p]` numbers per piece, `[p]` int64 rows → `[n]` their sums per row."""
    return tf.math.unsorted_segment_sum(values, rows, tf.cast(n, tf.int64))
