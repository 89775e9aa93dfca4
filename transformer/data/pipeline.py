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
     to the same length, a multiple of `bucket_width` capped at `max_length` (see
     `padded_lengths`), and a batch holds at most `max_tokens` padded tokens per side, so
     there are only about `max_length / bucket_width` distinct shapes (XLA compiles a few
     programs, not one per batch); training batches drop the remainder so batch sizes are
     fixed too;
  5. prefetch (AUTOTUNE).

`naive_pipeline` reproduces the TF tutorial's design for A/B comparisons: shuffle →
batch `batch_size` sentences → tokenize on every step → pad to the batch max → prefetch.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from transformer.base.config import PipelineConfig
from transformer.data.mixing import Mixture

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
    """
    if config.kind == "naive":
        if isinstance(pairs, Mixture):
            pairs = pairs.epoch(seed, shuffle_buffer=config.shuffle_buffer)
        return naive_pipeline(pairs, tokenizers, config.batch_size * replicas, max_length, training,
                              config.shuffle_buffer, seed)
    return optimized_pipeline(pairs, tokenizers, config, max_length, training, seed, tokenized=tokenized,
                              replicas=replicas)


def _split_target(src, tgt):
    return (src, tgt[:, :-1]), tgt[:, 1:]


def naive_pipeline(pairs, tokenizers, batch_size: int, max_length: int, training: bool,
                   shuffle_buffer: int = 20000, seed: Optional[int] = None) -> tf.data.Dataset:
    """The TF tutorial's pipeline: tokenizes every batch on every epoch."""

    def prepare_batch(src, tgt):
        src = tokenizers.src.tokenize(src)[:, :max_length].to_tensor()
        tgt = tokenizers.tgt.tokenize(tgt)[:, : max_length + 1].to_tensor()
        return _split_target(tf.cast(src, tf.int32), tf.cast(tgt, tf.int32))

    if training:
        pairs = pairs.shuffle(shuffle_buffer, seed=seed)
    return pairs.batch(batch_size).map(prepare_batch, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


def tokenize_pairs(pairs: tf.data.Dataset, tokenizers, max_length: int, cache: str = "memory") -> tf.data.Dataset:
    """Tokenizes once → dataset of (src_ids [src_len], tgt_ids [tgt_len]) int32, cached.

    Target keeps max_length + 1 tokens so tgt_in / tgt_out are max_length long.
    """

    def tokenize(src, tgt):  # ragged → dense + lengths, so unbatch yields plain tensors
        src_ids = tokenizers.src.tokenize(src)[:, :max_length]
        tgt_ids = tokenizers.tgt.tokenize(tgt)[:, : max_length + 1]
        return (tf.cast(src_ids.to_tensor(), tf.int32), tf.cast(src_ids.row_lengths(), tf.int32),
                tf.cast(tgt_ids.to_tensor(), tf.int32), tf.cast(tgt_ids.row_lengths(), tf.int32))

    def trim(src, src_len, tgt, tgt_len):
        return src[:src_len], tgt[:tgt_len]

    tokenized = pairs.batch(1024).map(tokenize, num_parallel_calls=AUTOTUNE).unbatch().map(trim)
    return tokenized.cache("" if cache == "memory" else cache)


def tokenize_mixture(mixture: Mixture, tokenizers, config: PipelineConfig, max_length: int,
                     seed: Optional[int] = None) -> tf.data.Dataset:
    """Each part tokenized and cached once (`tokenize_pairs`), then mixed: one epoch of ids per pass."""

    def tokenize_part(index, part_pairs):
        cache = config.cache if config.cache == "memory" else f"{config.cache}.part{index}"
        return tokenize_pairs(part_pairs, tokenizers, max_length, cache)

    return mixture.epoch(seed, per_part=tokenize_part, shuffle_buffer=config.shuffle_buffer)


def padded_lengths(max_length: int, bucket_width: int) -> list[int]:
    """The padded sequence lengths of optimized batches: width, 2·width, … capped at max_length.

    Every length is ≤ `max_length`, so a padded batch always fits the model's position table.
    """
    lengths = list(range(bucket_width, max_length, bucket_width))
    return lengths + [max_length]


def bucket_boundaries(max_length: int, bucket_width: int) -> list[int]:
    """Upper bounds (exclusive) of the length buckets: each padded length + 1.

    A sequence of length n goes to the first bucket whose boundary exceeds n and is padded to
    that boundary − 1. The last boundary is max_length + 1, above every (truncated) length.
    """
    return [length + 1 for length in padded_lengths(max_length, bucket_width)]


def optimized_pipeline(pairs, tokenizers, config: PipelineConfig, max_length: int, training: bool,
                       seed: Optional[int] = None, tokenized: Optional[tf.data.Dataset] = None,
                       replicas: int = 1) -> tf.data.Dataset:
    """Tokenize-once, cached, length-bucketed batches with a token budget.

    `tokenized`: optional output of `tokenize_pairs` (to share one cache between runs).
    """
    if tokenized is None and isinstance(pairs, Mixture):
        tokenized = tokenize_mixture(pairs, tokenizers, config, max_length, seed)
    elif tokenized is None:
        tokenized = tokenize_pairs(pairs, tokenizers, max_length, config.cache)
    if training:
        tokenized = tokenized.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    split = tokenized.map(lambda src, tgt: ((src, tgt[:-1]), tgt[1:]),  # each ≤ max_length tokens
                          num_parallel_calls=AUTOTUNE)
    lengths = padded_lengths(max_length, config.bucket_width)
    if config.max_tokens is None:
        batch_sizes = [config.batch_size] * len(lengths)
    else:
        batch_sizes = [max(1, config.max_tokens // length) for length in lengths]
    batch_sizes = [replicas * size for size in batch_sizes]  # per replica → global
    batched = split.bucket_by_sequence_length(
        element_length_func=lambda inputs, tgt_out: tf.maximum(tf.shape(inputs[0])[0], tf.shape(inputs[1])[0]),
        bucket_boundaries=bucket_boundaries(max_length, config.bucket_width),
        bucket_batch_sizes=batch_sizes + [batch_sizes[-1]],  # + the (never used) overflow bucket
        pad_to_bucket_boundary=True,
        drop_remainder=training,
    )
    return batched.prefetch(AUTOTUNE)
