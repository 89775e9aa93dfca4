"""Training batches planned one whole epoch at a time from in-memory ids.

The streaming form of the optimized pipeline (`pipeline.optimized_pipeline` over a tf.data
cache: mixture sampling → shuffle buffer → `bucket_by_sequence_length`) handles every pair in
sequential tf.data stages, one element at a time. On an H100 with XLA (a 16,384-token step in
~16 ms, ~64 batches/s) that stream could not keep up: the step waited for data 29% of the time.
Here the ids of every training pair are held as two ragged tensors (`PairIds`) and each epoch
is planned with a few vectorized ops:

  1. the epoch's pairs: each part's share (weight × size) from fresh random permutations of
     that part (weight < 1: a random subset, drawn anew each epoch; > 1: whole passes plus a
     random subset), then all of them shuffled together (a full permutation, not a buffer);
  2. each pair goes to the first length of the grid that holds it (max(source, target − 1));
  3. each length's pairs are cut, in shuffled order, into batches of that length's rows, the
     remainder dropped; a batch is complete at its last pair, and batches are emitted in that
     order: the batches `bucket_by_sequence_length(drop_remainder=True)` makes from the same
     stream, in the same order (`bucket_batches`; tested);
  4. a parallel map gathers each batch's ids and pads them to `[rows, length]`:
     `((src, tgt_in), tgt_out)` int32, pad 0, as the streaming pipeline's batches.

Used for training batches when the ids are cached in memory without subword sampling
(`pair_ids`); evaluation batches, file caches and sampled segmentations keep the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tensorflow as tf

from transformer.runtime.tfdata import with_pipeline_options

AUTOTUNE = tf.data.AUTOTUNE
TOKENIZE_BATCH = 4096  # sentences per tokenizer call while building `PairIds`


@dataclass(frozen=True)
class PairIds:
    """Token ids of every training pair, part after part.

    src: [pairs, (src_len ≤ max_length)] int32. tgt: [pairs, (tgt_len ≤ max_length + 1)] int32,
    with [START] and [END] (tgt_in / tgt_out are its first / last tgt_len − 1 ids).
    sizes: pairs of each part, in order. shares: pairs of each part in one epoch.
    """

    src: tf.RaggedTensor
    tgt: tf.RaggedTensor
    sizes: tuple[int, ...]
    shares: tuple[int, ...]

    @property
    def lengths(self) -> tf.Tensor:
        """[pairs] int32: the padded length each pair needs, max(src_len, tgt_len − 1), on the host."""
        with tf.device("/CPU:0"):
            return tf.cast(tf.maximum(self.src.row_lengths(), self.tgt.row_lengths() - 1), tf.int32)


def tokenize_part(pairs: tf.data.Dataset, segment_src, segment_tgt, max_length: int) -> list[tuple]:
    """(src, tgt) ragged int32 ids of a dataset of (src, tgt) string pairs, one tuple per
    `TOKENIZE_BATCH` pairs, truncated as the stream pipeline truncates (`max_length` source
    tokens, `max_length + 1` target tokens).

    segment_*: [batch] tf.string → [batch, (tokens)] ids (a tokenizer's `tokenize`).
    """
    def tokenize(src, tgt):
        return (tf.cast(segment_src(src)[:, :max_length], tf.int32),
                tf.cast(segment_tgt(tgt)[:, : max_length + 1], tf.int32))

    return list(with_pipeline_options(pairs.batch(TOKENIZE_BATCH).map(tokenize, num_parallel_calls=AUTOTUNE)))


def join_parts(pieces: list[tuple]) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    """(src, tgt) of all `tokenize_part` pieces, in order, in host memory (where tf.data reads
    them; eager ops would otherwise pick a GPU)."""
    with tf.device("/CPU:0"):
        if not pieces:
            empty = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), tf.zeros([0], tf.int64))
            return empty, empty
        return tf.concat([src for src, _ in pieces], axis=0), tf.concat([tgt for _, tgt in pieces], axis=0)


def epoch_order(seed: tf.Tensor, sizes: tuple[int, ...], shares: tuple[int, ...]) -> tf.Tensor:
    """[sum(shares)] int32 indices into the concatenated parts: one epoch's pairs, shuffled.

    seed: int64 scalar; the same seed gives the same epoch.
    """
    picked, offset = [], 0
    for part, (size, share) in enumerate(zip(sizes, shares)):
        passes = -(-share // size)
        perms = [tf.argsort(tf.random.stateless_uniform([size], seed=tf.stack([seed, tf.constant(2 * part + 1000 * p + 1,
                                                                                                    tf.int64)])))
                 for p in range(passes)]
        picked.append(tf.concat(perms, axis=0)[:share] + offset)
        offset += size
    chosen = tf.concat(picked, axis=0)
    mixed = tf.argsort(tf.random.stateless_uniform([sum(shares)], seed=tf.stack([seed, tf.constant(0, tf.int64)])))
    return tf.cast(tf.gather(chosen, mixed), tf.int32)


def bucket_batches(lengths: tf.Tensor, grid: list[int], rows: list[int]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Cuts a stream of pairs into full batches per grid length, in the order they complete.

    lengths: [n] int32, each pair's needed length (≤ grid[-1]), in stream order.
    grid: padded lengths, ascending; rows: rows of a batch at each length.
    Returns (positions [batches, max(rows)] int32 stream positions, -1 past a batch's rows;
    row counts [batches] int32; padded lengths [batches] int32).
    """
    bucket = tf.searchsorted(tf.constant(grid, tf.int32), lengths, side="left")
    width = max(rows)
    batches, ends, counts, padded = [], [], [], []
    for index, (length, count) in enumerate(zip(grid, rows)):
        positions = tf.cast(tf.where(tf.equal(bucket, index))[:, 0], tf.int32)
        full = tf.size(positions) // count
        cut = tf.reshape(positions[: full * count], [full, count])
        batches.append(tf.pad(cut, [[0, 0], [0, width - count]], constant_values=-1))
        ends.append(cut[:, count - 1])
        counts.append(tf.fill([full], count))
        padded.append(tf.fill([full], length))
    order = tf.argsort(tf.concat(ends, axis=0))
    return tuple(tf.gather(tf.concat(parts, axis=0), order) for parts in (batches, counts, padded))


def planned_batches(ids: PairIds, grid: list[int], rows: list[int], seed: Optional[int] = None) -> tf.data.Dataset:
    """One epoch of `((src, tgt_in), tgt_out)` batches per iteration, planned anew each time.

    grid / rows: the padded lengths and rows per batch (`pipeline.length_grid`,
    `pipeline.rows_per_batch`). seed: with the global seed, fixes the sequence of epochs.
    """
    lengths = ids.lengths

    def plan(epoch_seed):
        order = epoch_order(epoch_seed, ids.sizes, ids.shares)
        positions, counts, padded = bucket_batches(tf.gather(lengths, order), grid, rows)
        pairs = tf.where(positions >= 0, tf.gather(order, tf.maximum(positions, 0)), -1)
        return tf.data.Dataset.from_tensor_slices((pairs, counts, padded))

    def assemble(pairs, count, length):
        chosen = pairs[:count]
        shape = tf.stack([count, length])
        src, tgt = tf.gather(ids.src, chosen), tf.gather(ids.tgt, chosen)
        return ((src.to_tensor(shape=shape), tgt[:, :-1].to_tensor(shape=shape)), tgt[:, 1:].to_tensor(shape=shape))

    epochs = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
    return epochs.flat_map(plan).map(assemble, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
