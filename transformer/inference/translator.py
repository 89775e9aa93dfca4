"""Translator: Portuguese strings in, English strings out (a `tf.Module`, exportable).

    translator = Translator(tokenizers, model)                  # greedy, cached
    translator(["olá mundo", "bom dia"])                        # → tf.string [2]
    translator.translate(sentences)                             # → list[str]
    translator.attention(["olá mundo"])                         # tokens + cross-attention

What one call does, all in one TensorFlow graph (so the SavedModel does the same):
  1. sanitise: invalid UTF-8 is replaced by U+FFFD (`unicode_transcode(errors="replace")`);
  2. cut a source over `cut_over` tokens (40; a paragraph on one line) into pieces after its
     sentence ends, and a piece over `max_length - 2` after its commas
     (transformer/inference/segmenting.py), each piece then translated as a sentence; tokenize
     every piece, [START] + tokens + [END]; a piece still too long (a clause with no comma)
     keeps its first `max_length - 2` tokens;
  3. sort the batch by source length and decode it in chunks of `chunk_size` sentences
     (cached greedy or beam search, transformer/inference/decoding.py), `streams` chunks at
     once (chunk k by loop k mod streams); a sentence's output is bounded by
     `min(max_length, ceil(max_output_ratio * source_tokens) + max_output_extra)` tokens;
  4. detokenize, every row in input order (a cut row's pieces joined by spaces). A row whose
     source has no tokens (empty or whitespace-only input) gets an empty translation.
A line written in capitals is translated in lower case and its translation upper-cased
(transformer/inference/casing.py).
Any string content gives one output row per input row. Only a wrong dtype or rank is an
error; from Python (`__call__`, `translate`) it is a TypeError/ValueError saying what was
expected.

With `jit_compile=True` the decode loop (encoder, cache and the whole while loop) is
compiled by XLA. Batches are padded to a few shapes first (batch 1, 4, 16, 64 … up to chunk_size;
source length a multiple of `length_bucket`) so XLA compiles a bounded number of programs;
each new shape costs one compilation (seconds) on first use.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from transformer.base.config import DecodeConfig
from transformer.base.constants import END_ID, PAD_ID, START_ID
from transformer.inference import casing, decoding, segmenting

SENTENCES_SPEC = tf.TensorSpec([None], tf.string, name="sentences")


def as_string_batch(sentences) -> tf.Tensor:
    """Python input → `[batch]` tf.string tensor, or a TypeError/ValueError naming what was expected."""
    expected = "a 1-D batch of strings (list of str, or a tf.string tensor of shape [batch])"
    if isinstance(sentences, (str, bytes)):
        raise ValueError(f"expected {expected}; got a single {type(sentences).__name__} — wrap it in a list")
    if isinstance(sentences, (list, tuple)) and not all(isinstance(s, (str, bytes)) for s in sentences):
        bad = next(s for s in sentences if not isinstance(s, (str, bytes)))
        if isinstance(bad, (list, tuple)):
            raise ValueError(f"expected {expected}; got a nested list (rank ≥ 2)")
        raise TypeError(f"expected {expected}; got an element of type {type(bad).__name__}: {bad!r}")
    if isinstance(sentences, (list, tuple)) and not sentences:
        return tf.zeros([0], tf.string)
    try:
        tensor = tf.convert_to_tensor(sentences)
    except (TypeError, ValueError) as err:
        raise TypeError(f"expected {expected}; got {type(sentences).__name__} ({err})") from None
    if tensor.dtype != tf.string:
        raise TypeError(f"expected {expected}; got dtype {tensor.dtype.name}")
    if tensor.shape.rank != 1:
        raise ValueError(f"expected {expected}; got rank {tensor.shape.rank} with shape {tensor.shape}")
    return tensor


def tokenize_sources(tokenize, sentences, max_length: int):
    """Steps 1-2 of a translation: `[batch]` strings → source ids.

    Invalid UTF-8 is replaced, then `tokenize` (the source tokenizer's: `[batch]` tf.string →
    ragged int64 with [START] … [END]), at most `max_length` ids per row ([START], the first
    `max_length - 2` tokens, [END]).

    Returns:
        (ragged int64 `[batch, (src_len)]`, has_tokens bool `[batch]`: the row has a token
        besides [START]/[END]).
    """
    ids = tokenize(segmenting.sanitize(sentences))  # [B, (S)] with [START] … [END]
    body = ids[:, 1:-1][:, : max_length - 2]
    batch = tf.shape(sentences, out_type=tf.int64)[0]
    start = tf.fill([batch, 1], tf.constant(START_ID, tf.int64))
    end = tf.fill([batch, 1], tf.constant(END_ID, tf.int64))
    return tf.concat([start, body, end], axis=1), body.row_lengths() > 0


def _round_up(x: tf.Tensor, multiple: int) -> tf.Tensor:
    return (x + multiple - 1) // multiple * multiple


class _NotExported:
    """Holds a `tf.function` that an export keeps only inside the functions calling it."""

    def __init__(self, function):
        self.function = function


# The outputs of `Translator.serve_attention` (the export's "attention" signature).
ATTENTION_OUTPUTS = ("rows", "line_translations", "translations", "source_tokens", "source_lengths", "target_ids",
                     "target_tokens", "target_lengths", "attention")


class Translator(tf.Module):
    """Tokenizers + Transformer + a decoding strategy.

    Args:
        tokenizers: the `PairTokenizers` module (`.src.tokenize`, `.tgt.detokenize`, `.lookup`).
        model: a built `transformer.model.transformer.Transformer` with trained weights.
        config: `DecodeConfig`. Defaults to cached greedy without XLA.

    Call arguments (`__call__`, `translate_strings`):
        sentences: `[batch]` tf.string (or a list of str from Python).

    Returns:
        `[batch]` tf.string translations (`translate` returns a list of str).
    """

    def __init__(self, tokenizers, model, config: DecodeConfig = DecodeConfig(), name=None):
        super().__init__(name=name)
        self.tokenizers = tokenizers
        self.model = model
        self.config = config.validate()
        self.max_length = int(model.config.max_length)
        if self.max_length < 3:
            raise ValueError(f"model max_length must be >= 3, got {self.max_length}")
        src_vocab, tgt_vocab = int(tokenizers.src.get_vocab_size()), int(tokenizers.tgt.get_vocab_size())
        if (src_vocab, tgt_vocab) != (model.config.src_vocab_size, model.config.tgt_vocab_size):
            raise ValueError(
                f"tokenizer vocab sizes (src {src_vocab}, tgt {tgt_vocab}) do not match the model's "
                f"(src {model.config.src_vocab_size}, tgt {model.config.tgt_vocab_size})")
        # One trace for every loop and signature. Held outside the module's attributes: `tf.saved_model.save`
        # would otherwise also export it on its own, tracing it again at the top level (~3 s per export).
        # Called, not inlined (`_noinline`): TensorFlow optimises its graph once at the first call instead
        # of once per decoding loop (a loaded export's first sentence: 4.4-5.5 s → 2.7-3.0 s, docs/speed.md).
        self._decode = _NotExported(tf.function(self._decode_ids_impl, jit_compile=config.jit_compile, autograph=False,
                                                 experimental_attributes={"_noinline": True}))
        # Called three times by one translation (twice to measure the pieces of long sources, once for
        # their ids): one function, optimised once, as `_decode` (a loaded export's first sentence,
        # three alternated pairs: 2.60-3.19 s, against 2.63-3.63 s with the tokenizer inlined thrice).
        self._tokenize = _NotExported(tf.function(lambda strings: tokenizers.src.tokenize(strings), autograph=False,
                                                   input_signature=[SENTENCES_SPEC],
                                                   experimental_attributes={"_noinline": True}))

    def with_config(self, **changes) -> "Translator":
        """A Translator sharing this one's model and tokenizers with some DecodeConfig fields changed."""
        return Translator(self.tokenizers, self.model, dataclasses.replace(self.config, **changes))

    # ---- Python API ------------------------------------------------------------------
    def __call__(self, sentences) -> tf.Tensor:
        """`[batch]` strings → `[batch]` tf.string translations (validates dtype and rank)."""
        return self.translate_strings(as_string_batch(sentences))

    def translate(self, sentences) -> list[str]:
        """Like `__call__`, returning a list of Python str."""
        return [t.decode("utf-8", "replace") for t in self(sentences).numpy()]

    def translate_with_lengths(self, sentences) -> tuple[list[str], np.ndarray]:
        """(translations, generated target tokens per sentence, [END] included)."""
        out = self.translate_lengths(as_string_batch(sentences))
        return [t.decode("utf-8", "replace") for t in out["translations"].numpy()], out["num_tokens"].numpy()

    def attention(self, sentences) -> dict:
        """`serve_attention` on validated Python input → dict of numpy arrays."""
        return {k: v.numpy() for k, v in self.serve_attention(as_string_batch(sentences)).items()}

    # ---- graph functions (saved with an export) ----------------------------------------
    @tf.function(input_signature=[SENTENCES_SPEC], autograph=False)
    def translate_lengths(self, sentences):
        """→ {"translations": [batch] tf.string, "num_tokens": [batch] int32}."""
        return self._translate(sentences)

    # The two below call `translate_lengths` (a function call in their graphs): an export traces
    # and stores the decoding graph once, not once per signature.
    @tf.function(input_signature=[SENTENCES_SPEC], autograph=False)
    def translate_strings(self, sentences):
        return self.translate_lengths(sentences)["translations"]

    @tf.function(input_signature=[SENTENCES_SPEC], autograph=False)
    def serve(self, sentences):
        """The `serving_default` signature: {"translations": [batch] tf.string}."""
        return {"translations": self.translate_lengths(sentences)["translations"]}

    @tf.function(input_signature=[SENTENCES_SPEC], autograph=False)
    def serve_attention(self, sentences):
        """Greedy translation with tokens and cross-attention, for plots (no chunking, no XLA). Long
        sources are cut into pieces as `translate` cuts them (`pieces`): the per-piece outputs have
        one row per piece, `rows` names each piece's sentence.

        Returns a dict:
            rows: `[pieces]` int64, the input sentence of each piece (ascending).
            line_translations: `[batch]` tf.string, each sentence's translation (its pieces' joined),
                what `translate` returns.
            translations: `[pieces]` tf.string.
            source_tokens: `[pieces, src_len]` tf.string wordpieces ([START] … [END], "[PAD]" after).
            source_lengths: `[pieces]` int32.
            target_ids: `[pieces, steps]` int32 generated ids ([END] included, 0 after).
            target_tokens: `[pieces, steps]` tf.string.
            target_lengths: `[pieces]` int32.
            attention: `[pieces, heads, steps, src_len]` float32, last decoder layer's
                cross-attention while generating each target token.
        """
        pieces, rows = self.pieces(sentences)
        src, has_tokens = self.source_ids(pieces)
        src_ids = src.to_tensor()  # [B, S]
        result = decoding.greedy_translate(self.model, tf.cast(src_ids, tf.int32), self._max_steps(tf.shape(src_ids)[1]),
                                           max_lengths=self._row_limits(src_ids), return_attention=True,
                                           return_log_probs=False)
        ids = result.ids
        lengths = tf.where(has_tokens, result.lengths, 0)
        ids = tf.where(tf.range(tf.shape(ids)[1])[tf.newaxis] < lengths[:, tf.newaxis], ids, PAD_ID)
        translations = self.texts(ids, has_tokens)
        return {
            "rows": rows,
            "line_translations": segmenting.join_for_model(translations, rows, sentences),
            "translations": casing.restore(translations, tf.gather(segmenting.shouted_lines(sentences), rows)),
            "source_tokens": self.tokenizers.src.lookup(src_ids),
            "source_lengths": tf.cast(src.row_lengths(), tf.int32),
            "target_ids": ids,
            "target_tokens": self.tokenizers.tgt.lookup(tf.cast(ids, tf.int64)),
            "target_lengths": lengths,
            "attention": tf.transpose(result.attention, [0, 2, 1, 3]),  # [B, heads, T, S]
        }

    # ---- the pipeline ------------------------------------------------------------------
    def source_ids(self, sentences):
        """`[batch]` strings → (ragged int64 `[batch, (src_len)]` ≤ max_length, has_tokens bool `[batch]`)."""
        return tokenize_sources(self._tokenize.function, sentences, self.max_length)

    def pieces(self, sentences):
        """`[batch]` strings → (pieces `[p]` tf.string, rows `[p]` int64): sources over `cut_over` tokens
        (0: `max_length - 2`) cut at sentence ends, pieces over `max_length - 2` then at commas
        (segmenting.split_for_model); the others whole."""
        return segmenting.split_for_model(self._tokenize.function, sentences, self.max_length, self.config.cut_over)

    def _translate(self, sentences):
        """Cut long sources → sort the pieces by length → decode the chunks in `streams` concurrent
        loops → detokenize in input order → join each row's pieces."""
        pieces, rows = self.pieces(sentences)
        src, has_tokens = self.source_ids(pieces)
        order = tf.argsort(tf.cast(src.row_lengths(), tf.int32), stable=True)
        # Independent loops (no data or control edge between them): TensorFlow runs them at once.
        streams = [self._decode_stream(src, order, first) for first in range(self.config.streams)]
        ids = tf.add_n([ids for ids, _ in streams])  # rows are disjoint, [PAD] (0) in the other streams'
        num_tokens = tf.add_n([lengths for _, lengths in streams])
        # Detokenizing inside a loop would serialise the loops: the tokenizer's table export is a
        # resource write for TensorFlow's automatic control dependencies.
        n = tf.shape(sentences)[0]
        return {"translations": segmenting.join_for_model(self.texts(ids, has_tokens), rows, sentences),
                "num_tokens": segmenting.sum_pieces(tf.where(has_tokens, num_tokens, 0), rows, n)}

    def _decode_stream(self, src, order, first: int):
        """Decodes chunks `first`, `first + streams`, … of the length-sorted batch, one after another.

        Returns:
            (ids int32 `[batch, max_length]`, [PAD] after [END]; lengths int32 `[batch]`), with
            [PAD] and 0 at the rows of the other streams' chunks.
        """
        n, chunk = tf.shape(order)[0], self.config.chunk_size
        num_chunks = (n + chunk - 1) // chunk

        def body(i, ids, lengths):
            rows = order[i * chunk: tf.minimum((i + 1) * chunk, n)]  # [b]
            src_ids = tf.cast(tf.gather(src, rows).to_tensor(), tf.int32)  # [b, S]
            chunk_ids, chunk_lengths = self._decode_chunk(src_ids)  # [b, T], [b]
            chunk_ids = tf.pad(chunk_ids, [[0, 0], [0, self.max_length - tf.shape(chunk_ids)[1]]])
            rows = rows[:, tf.newaxis]
            return (i + self.config.streams, tf.tensor_scatter_nd_update(ids, rows, chunk_ids),
                    tf.tensor_scatter_nd_update(lengths, rows, chunk_lengths))

        _, ids, lengths = tf.while_loop(
            lambda i, *_: i < num_chunks, body,
            (tf.constant(first), tf.fill([n, self.max_length], PAD_ID), tf.zeros([n], tf.int32)))
        return ids, lengths

    def _decode_chunk(self, src_ids):
        """`[b, S]` int32 → (ids `[b, T]` int32, lengths `[b]` int32); pads shapes for XLA."""
        if not self.config.jit_compile:
            return self._decode.function(src_ids)
        b, length = tf.shape(src_ids)[0], tf.shape(src_ids)[1]
        sizes = sorted({min(4 ** i, self.config.chunk_size) for i in range(12)})  # 1, 4, 16, 64, …, chunk
        padded_b = tf.gather(sizes, tf.reduce_sum(tf.cast(tf.constant(sizes) < b, tf.int32)))
        padded_len = tf.minimum(_round_up(length, self.config.length_bucket), self.max_length)
        padded_len = tf.maximum(padded_len, length)
        src_ids = tf.pad(src_ids, [[0, padded_b - b], [0, padded_len - length]])
        ids, lengths = self._decode.function(src_ids)
        return ids[:b], lengths[:b]

    def _decode_ids_impl(self, src_ids):
        """`[B, S]` int32 source ids → (best ids `[B, T]` int32, lengths `[B]` int32)."""
        max_steps = self._max_steps(tf.shape(src_ids)[1])
        limits = self._row_limits(src_ids)
        lean = not self.config.jit_compile  # growing caches: not for XLA's static shapes
        if self.config.beam_size == 1:
            result = decoding.greedy_translate(self.model, src_ids, max_steps, max_lengths=limits, lean=lean,
                                               drop_finished=self.config.drop_finished,
                                               projection_dtype=self.config.projection_dtype, return_log_probs=False)
            return result.ids, result.lengths
        result = decoding.beam_translate(self.model, src_ids, self.config.beam_size, max_steps,
                                         alpha=self.config.alpha, max_lengths=limits, lean=lean,
                                         drop_finished=self.config.drop_finished,
                                         projection_dtype=self.config.projection_dtype)
        return result.ids[:, 0], result.lengths[:, 0]

    def _output_bound(self, source_tokens):
        """Most tokens generated for `source_tokens` (without [START]/[END]) source tokens."""
        ratio, extra = self.config.max_output_ratio, self.config.max_output_extra
        bound = tf.cast(tf.math.ceil(ratio * tf.cast(source_tokens, tf.float32)), tf.int32) + extra
        return tf.clip_by_value(bound, 1, self.max_length)

    def _max_steps(self, src_len):
        return self._output_bound(src_len - 2)

    def _row_limits(self, src_ids):
        return self._output_bound(tf.reduce_sum(tf.cast(tf.not_equal(src_ids, PAD_ID), tf.int32), axis=1) - 2)

    def detokenize(self, ids):
        """`[B, T]` int32 ids → `[B]` tf.string (reserved tokens dropped)."""
        return self.tokenizers.tgt.detokenize(tf.cast(ids, tf.int64))

    def texts(self, ids, has_tokens):
        """`[B, T]` int32 ids, `[B]` bool → `[B]` tf.string: the detokenized ids, "" where the source had
        no token besides [START]/[END] (an empty line translates to "", not to what the model says)."""
        return tf.where(has_tokens, self.detokenize(ids), "")
