"""tf.data input pipelines: string pairs → `((src_ids, tgt_in_ids), tgt_out_ids)` batches.

Batches hold int32 ids `[batch, src_len]`, `[batch, tgt_len]`, `[batch, tgt_len]`, pad 0;
`tgt_in` is the target without its last token, `tgt_out` without its first ([START]).
Sequences are truncated to `max_length` tokens.

`optimized_pipeline` (the default), in order:
  1. tokenize once, in batches of 1024 sentences with parallel map, and cache the ids
     (memory, or a file for corpora that don't fit);
  2. shuffle with a bounded buffer (training only), reshuffled each epoch;
  3. bucket by length with a token budget: every batch is padded to a multiple of
     `bucket_width` tokens and holds about `max_tokens` padded tokens per side, so there are
     only `max_length / bucket_width` distinct padded lengths (XLA compiles a few programs,
     not one per batch); training batches drop the remainder so batch sizes are fixed too;
  4. prefetch (AUTOTUNE).

`naive_pipeline` reproduces the TF tutorial's design for A/B comparisons: shuffle →
batch `batch_size` sentences → tokenize on every step → pad to the batch max → prefetch.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from transformer.config import PipelineConfig

AUTOTUNE = tf.data.AUTOTUNE


def make_batches(pairs: tf.data.Dataset, tokenizers, config: PipelineConfig, max_length: int,
                 training: bool, seed: Optional[int] = None) -> tf.data.Dataset:
    """Dispatches on `config.kind`; see the module docstring."""
    if config.kind == "naive":
        return naive_pipeline(pairs, tokenizers, config.batch_size, max_length, training, config.shuffle_buffer, seed)
    return optimized_pipeline(pairs, tokenizers, config, max_length, training, seed)


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


def bucket_boundaries(max_length: int, bucket_width: int) -> list[int]:
    """Upper bounds (exclusive) of the length buckets: width, 2·width, … ≥ max_length + 1."""
    top = max_length + 1  # target carries one extra token before the in/out split
    return list(range(bucket_width + 1, top + bucket_width + 1, bucket_width))


def optimized_pipeline(pairs, tokenizers, config: PipelineConfig, max_length: int, training: bool,
                       seed: Optional[int] = None, tokenized: Optional[tf.data.Dataset] = None) -> tf.data.Dataset:
    """Tokenize-once, cached, length-bucketed batches with a token budget."""
    if tokenized is None:
        tokenized = tokenize_pairs(pairs, tokenizers, max_length, config.cache)
    if training:
        tokenized = tokenized.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    boundaries = bucket_boundaries(max_length, config.bucket_width)
    padded_lengths = [b - 1 for b in boundaries]
    if config.max_tokens is None:
        batch_sizes = [config.batch_size] * (len(boundaries) + 1)
    else:
        batch_sizes = [max(1, config.max_tokens // length) for length in padded_lengths]
        batch_sizes.append(batch_sizes[-1])
    batched = tokenized.bucket_by_sequence_length(
        element_length_func=lambda src, tgt: tf.maximum(tf.shape(src)[0], tf.shape(tgt)[0]),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=batch_sizes,
        pad_to_bucket_boundary=True,
        drop_remainder=training,
    )
    return batched.map(_split_target, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
