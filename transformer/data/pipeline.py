"""tf.data input pipelines: string pairs → `((src_ids, tgt_in_ids), tgt_out_ids)` batches.

Batches hold int32 ids `[batch, src_len]`, `[batch, tgt_len]`, `[batch, tgt_len]`, pad 0;
`tgt_in` is the target without its last token, `tgt_out` without its first ([START]).
Sequences are truncated to `max_length` tokens.

`optimized_pipeline` (the default), in order:
  1. tokenize once, in batches of 1024 sentences with parallel map, and cache the ids
     (memory, or a file for corpora that don't fit);
  2. shuffle with a bounded buffer (training only), reshuffled each epoch;
  3. split the target into `tgt_in` / `tgt_out`;
  4. bucket by length with a token budget: src, tgt_in and tgt_out of a batch are all padded
     to the same length, the first of the grid's lengths (`length_grid`) that holds both, and
     a batch holds `max_tokens // length` rows (at most `max_tokens` padded tokens per side),
     so there is one batch shape per length of the grid; training batches drop the remainder
     so batch sizes are fixed. The grid: multiples of `bucket_width` (default 4: ~32 shapes,
     little padding) or, when the train step is XLA-compiled (one program per shape), the
     "geometric" grid 16, 24, 32, 48, 64, 96, 128 (7 shapes); with a grid other than
     "width", evaluation batches (`training=False`) are padded to the same full row count
     with all-pad rows, which the masked loss and metrics ignore, so evaluation adds no
     shapes either;
  5. prefetch (AUTOTUNE).
Every pipeline runs without tf.data's autotuning thread (`runtime.tfdata`: dropping an
iterator could stop the process for up to 60 s).
Training batches from ids held in memory (`pair_ids`, what training builds when the cache is
"memory" and there is no subword sampling) are instead planned a whole epoch at a time
(transformer/data/epoch_plan.py): the same batches from a full shuffle, with vectorized ops
in place of steps 2-4, fast enough for a GPU's compiled steps.

Measured on the bible-pt-en training split (max_length 128, 2048 tokens): the width-8 grid
uses 15 shapes at 14.6% padding, the geometric grid 7 shapes at 20.7%, powers of two
(16, 32, 64, 128) 4 shapes at 33.9% (padding: padded tokens not holding a token, both sides;
src and tgt of a pair share one length).

Subword regularisation (`PipelineConfig.sampling`, SentencePiece tokenizers only): training
batches then get a freshly sampled segmentation of every sentence on each pass, so step 1
caches the strings and tokenizes on every pass (in the same parallel map); evaluation
batches always use the deterministic segmentation.

`naive_pipeline` reproduces the TF tutorial's design for A/B comparisons: shuffle →
batch `batch_size` sentences → tokenize on every step → pad to the batch max → prefetch.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from transformer.base.config import PipelineConfig, parse_length_buckets
from transformer.data.epoch_plan import PairIds, join_parts, planned_batches, tokenize_part
from transformer.data.mixing import Mixture
from transformer.runtime.tfdata import with_pipeline_options

AUTOTUNE = tf.data.AUTOTUNE


def make_batches(pairs: tf.data.Dataset | Mixture, tokenizers, config: PipelineConfig, max_length: int,
                 training: bool, seed: Optional[int] = None, replicas: int = 1,
                 tokenized: Optional[tf.data.Dataset] = None) -> tf.data.Dataset:
    """Dispatches on `config.kind`; see the module docstring.

    `pairs`: (src, tgt) string pairs, or a `mixing.Mixture` of weighted corpora (each epoch a
    fresh draw; the optimized pipeline tokenizes and caches each part once, then mixes).
    `replicas`: batch sizes in `config` are per replica; every batch holds `replicas` times
    as many sentences (a global batch that tf.distribute splits into equal parts).
    `tokenized`: `tokenize_pairs(pairs, …)` built before (optimized pipeline: its cache is shared).
    Every form runs without tf.data's autotuning thread (`runtime.tfdata.with_pipeline_options`).
    """
    if config.kind == "naive":
        if isinstance(pairs, Mixture):
            pairs = pairs.epoch(seed, shuffle_buffer=config.shuffle_buffer)
        batches = naive_pipeline(pairs, tokenizers, config.batch_size * replicas, max_length, training,
                                 config.shuffle_buffer, seed, config.sampling if training else None)
    else:
        batches = optimized_pipeline(pairs, tokenizers, config, max_length, training, seed, tokenized=tokenized,
                                     replicas=replicas)
    return with_pipeline_options(batches)


def _split_target(src, tgt):
    return (src, tgt[:, :-1]), tgt[:, 1:]


def segmenter(tokenizers, sampling: Optional[tuple[int, float]] = None):
    """(language tokenizer, [batch] tf.string) → [batch, (tokens)] ids: `tokenize`, or with
    `sampling` = (nbest, alpha) the SentencePiece tokenizer's `tokenize_sampled` (a new draw per call)."""
    if sampling is None:
        return lambda tokenizer, strings: tokenizer.tokenize(strings)
    if not hasattr(tokenizers.src, "tokenize_sampled"):
        raise ValueError("subword sampling (--subword-alpha) needs SentencePiece tokenizers (--tokenizer "
                         "sentencepiece); these cannot sample segmentations")
    nbest, alpha = tf.constant(sampling[0], tf.int32), tf.constant(sampling[1], tf.float32)
    return lambda tokenizer, strings: tokenizer.tokenize_sampled(strings, nbest, alpha)


def naive_pipeline(pairs, tokenizers, batch_size: int, max_length: int, training: bool,
                   shuffle_buffer: int = 20000, seed: Optional[int] = None,
                   sampling: Optional[tuple[int, float]] = None) -> tf.data.Dataset:
    """The TF tutorial's pipeline: tokenizes every batch on every epoch."""
    segment = segmenter(tokenizers, sampling)

    def prepare_batch(src, tgt):
        src = segment(tokenizers.src, src)[:, :max_length].to_tensor()
        tgt = segment(tokenizers.tgt, tgt)[:, : max_length + 1].to_tensor()
        return _split_target(tf.cast(src, tf.int32), tf.cast(tgt, tf.int32))

    if training:
        pairs = pairs.shuffle(shuffle_buffer, seed=seed)
    return pairs.batch(batch_size).map(prepare_batch, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


def tokenize_pairs(pairs: tf.data.Dataset, tokenizers, max_length: int, cache: str = "memory",
                   sampling: Optional[tuple[int, float]] = None) -> tf.data.Dataset:
    """Tokenizes once → dataset of (src_ids [src_len], tgt_ids [tgt_len]) int32, cached.

    Target keeps max_length + 1 tokens so tgt_in / tgt_out are max_length long.
    `sampling` (nbest, alpha): the strings are cached instead and every pass samples new
    segmentations (`segmenter`).
    """
    segment = segmenter(tokenizers, sampling)

    def tokenize(src, tgt):  # ragged → dense + lengths, so unbatch yields plain tensors
        src_ids = segment(tokenizers.src, src)[:, :max_length]
        tgt_ids = segment(tokenizers.tgt, tgt)[:, : max_length + 1]
        return (tf.cast(src_ids.to_tensor(), tf.int32), tf.cast(src_ids.row_lengths(), tf.int32),
                tf.cast(tgt_ids.to_tensor(), tf.int32), tf.cast(tgt_ids.row_lengths(), tf.int32))

    def trim(src, src_len, tgt, tgt_len):
        return src[:src_len], tgt[:tgt_len]

    cache_file = "" if cache == "memory" else cache
    if sampling is not None:
        pairs = pairs.cache(cache_file)
    tokenized = pairs.batch(1024).map(tokenize, num_parallel_calls=AUTOTUNE).unbatch().map(trim)
    return tokenized if sampling is not None else tokenized.cache(cache_file)


def pair_ids(pairs: tf.data.Dataset | Mixture, tokenizers, max_length: int) -> PairIds:
    """The ids of every training pair in memory (`epoch_plan.PairIds`), part after part, with
    each part's pairs per epoch (`MixturePart.share`; a plain dataset: all its pairs)."""
    parts = pairs.parts if isinstance(pairs, Mixture) else None
    pieces, sizes, shares = [], [], []
    for index, stream in enumerate([part.pairs for part in parts] if parts else [pairs]):
        part_pieces = tokenize_part(stream, tokenizers.src.tokenize, tokenizers.tgt.tokenize, max_length)
        size = sum(int(src.nrows()) for src, _ in part_pieces)
        pieces += part_pieces
        sizes.append(size)
        shares.append(parts[index].share if parts else size)
    src, tgt = join_parts(pieces)
    return PairIds(src, tgt, tuple(sizes), tuple(shares))


def tokenize_mixture(mixture: Mixture, tokenizers, config: PipelineConfig, max_length: int,
                     seed: Optional[int] = None) -> tf.data.Dataset:
    """Each part tokenized and cached once (`tokenize_pairs`), then mixed: one epoch of ids per pass.

    For training only: with `config.sampling` every pass samples new segmentations."""

    def tokenize_part(index, part_pairs):
        cache = config.cache if config.cache == "memory" else f"{config.cache}.part{index}"
        return tokenize_pairs(part_pairs, tokenizers, max_length, cache, config.sampling)

    return mixture.epoch(seed, per_part=tokenize_part, shuffle_buffer=config.shuffle_buffer)


GEOMETRIC_START = 16  # the shortest padded length of the geometric grid


def geometric_lengths(max_length: int) -> list[int]:
    """16, 24, 32, 48, 64, 96, 128, … (16·2^k and 24·2^k) below max_length, then max_length."""
    lengths, base = [], GEOMETRIC_START
    while base < max_length:
        lengths += [n for n in (base, base * 3 // 2) if n < max_length]
        base *= 2
    return lengths + [max_length]


def resolve_length_buckets(config: PipelineConfig, xla: bool) -> PipelineConfig:
    """`config` with length_buckets "auto" made concrete: geometric with XLA, else width."""
    if config.length_buckets != "auto":
        return config
    return dataclasses.replace(config, length_buckets="geometric" if xla else "width")


def length_grid(config: PipelineConfig, max_length: int) -> list[int]:
    """The padded lengths of optimized batches for `config.length_buckets`, each ≤ max_length.

    "auto" (not yet resolved for XLA) is "width". Explicit lengths above max_length are
    dropped and max_length is added as the last, so every (truncated) sequence has a length.
    """
    explicit = parse_length_buckets(config.length_buckets)
    if explicit is not None:
        return [n for n in explicit if n < max_length] + [max_length]
    if config.length_buckets == "geometric":
        return geometric_lengths(max_length)
    return padded_lengths(max_length, config.bucket_width)


def fixed_rows(config: PipelineConfig) -> bool:
    """Evaluation batches are padded to full rows (with a grid meant for XLA: not "width"/"auto")."""
    return config.length_buckets not in ("auto", "width")


def rows_per_batch(config: PipelineConfig, lengths: list[int], replicas: int = 1) -> list[int]:
    """Rows of a (global) batch for each padded length: `max_tokens // length` (≥ 1), or batch_size."""
    if config.max_tokens is None:
        return [config.batch_size * replicas] * len(lengths)
    return [max(1, config.max_tokens // length) * replicas for length in lengths]


def padded_lengths(max_length: int, bucket_width: int) -> list[int]:
    """The padded sequence lengths of optimized batches: width, 2·width, … capped at max_length.

    Every length is ≤ `max_length`, so a padded batch always fits the model's position table.
    """
    lengths = list(range(bucket_width, max_length, bucket_width))
    return lengths + [max_length]


def bucket_boundaries(max_length: int, bucket_width: int, lengths: Optional[list[int]] = None) -> list[int]:
    """Upper bounds (exclusive) of the length buckets: each padded length + 1.

    A sequence of length n goes to the first bucket whose boundary exceeds n and is padded to
    that boundary − 1. The last boundary is max_length + 1, above every (truncated) length.
    `lengths`: the grid (`length_grid`); default the width grid.
    """
    return [length + 1 for length in (lengths or padded_lengths(max_length, bucket_width))]


def optimized_pipeline(pairs, tokenizers, config: PipelineConfig, max_length: int, training: bool,
                       seed: Optional[int] = None, tokenized: Optional[tf.data.Dataset] = None,
                       replicas: int = 1) -> tf.data.Dataset:
    """Tokenize-once, cached, length-bucketed batches with a token budget.

    `tokenized`: optional output of `tokenize_pairs` (to share one cache between runs), or of
    `pair_ids` (training batches are then planned per epoch, `epoch_plan.planned_batches`).
    """
    lengths = length_grid(config, max_length)
    batch_sizes = rows_per_batch(config, lengths, replicas)  # global batches
    if isinstance(tokenized, PairIds):
        if not training:
            raise ValueError("planned batches are for training; evaluation batches stream")
        return planned_batches(tokenized, lengths, batch_sizes, seed)
    if tokenized is None and isinstance(pairs, Mixture):
        tokenized = tokenize_mixture(pairs, tokenizers, config, max_length, seed)
    elif tokenized is None:
        tokenized = tokenize_pairs(pairs, tokenizers, max_length, config.cache, config.sampling if training else None)
    if training:
        tokenized = tokenized.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    split = tokenized.map(lambda src, tgt: ((src, tgt[:-1]), tgt[1:]),  # each ≤ max_length tokens
                          num_parallel_calls=AUTOTUNE)
    batched = split.bucket_by_sequence_length(
        element_length_func=lambda inputs, tgt_out: tf.maximum(tf.shape(inputs[0])[0], tf.shape(inputs[1])[0]),
        bucket_boundaries=bucket_boundaries(max_length, config.bucket_width, lengths),
        bucket_batch_sizes=batch_sizes + [batch_sizes[-1]],  # + the (never used) overflow bucket
        pad_to_bucket_boundary=True,
        drop_remainder=training,
    )
    if not training and fixed_rows(config):
        batched = batched.map(_pad_rows(lengths, batch_sizes), num_parallel_calls=AUTOTUNE)
    return batched.prefetch(AUTOTUNE)


def _pad_rows(lengths: list[int], batch_sizes: list[int]):
    """Batch map: appends all-pad rows up to the full row count of the batch's length.

    Pad rows hold no target token, so the masked loss and accuracy ignore them.
    """
    lengths_t, rows_t = tf.constant(lengths, tf.int32), tf.constant(batch_sizes, tf.int32)

    def pad(inputs, tgt_out):
        src, tgt_in = inputs
        shape = tf.shape(src)  # [rows, length]
        rows = tf.gather(rows_t, tf.searchsorted(lengths_t, shape[1:2]))[0]
        padding = [[0, rows - shape[0]], [0, 0]]
        return (tf.pad(src, padding), tf.pad(tgt_in, padding)), tf.pad(tgt_out, padding)

    return pad
