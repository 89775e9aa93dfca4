"""Training batches planned per epoch (transformer/data/epoch_plan.py): the batches the streaming
bucketer makes, from ids in memory, with each part's share per epoch."""

from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from transformer.base.config import CorpusSpec, DataConfig, PipelineConfig
from transformer.data.corpora import load_corpus
from transformer.data.epoch_plan import PairIds, bucket_batches, epoch_order, planned_batches
from transformer.data.pipeline import bucket_boundaries, length_grid, make_batches, pair_ids, rows_per_batch, tokenize_pairs

GRID, ROWS = [4, 8, 12, 16], [6, 3, 2, 1]


def test_bucket_batches_are_the_batches_and_order_of_bucket_by_sequence_length():
    lengths = np.random.default_rng(0).integers(1, 17, size=300).astype(np.int32)
    positions, counts, padded = (t.numpy() for t in bucket_batches(tf.constant(lengths), GRID, ROWS))
    stream = tf.data.Dataset.from_tensor_slices((tf.range(300), lengths)).bucket_by_sequence_length(
        element_length_func=lambda position, length: length,
        bucket_boundaries=bucket_boundaries(16, 4, GRID), bucket_batch_sizes=ROWS + [ROWS[-1]],
        drop_remainder=True)
    expected = [(list(batch.numpy()), int(max(length.numpy()))) for batch, length in stream]
    got = [(list(row[:count]), int(lengths[row[:count]].max())) for row, count in zip(positions, counts)]
    assert got == expected and len(got) > 20
    assert (positions[np.arange(len(counts)), counts - 1] == sorted(positions[np.arange(len(counts)), counts - 1])).all()
    for row, count, length in zip(positions, counts, padded):
        assert count == ROWS[GRID.index(length)] and (row[count:] == -1).all()
        longest = lengths[row[:count]].max()
        assert longest <= length and (length == GRID[0] or longest > GRID[GRID.index(length) - 1])


def test_epoch_order_draws_each_part_its_share():
    sizes, shares = (10, 4, 6), (10, 8, 3)  # weight 1, 2 and 0.5
    order = epoch_order(tf.constant(7, tf.int64), sizes, shares).numpy()
    counts = Counter(order.tolist())
    assert len(order) == 21
    assert all(counts[i] == 1 for i in range(10))
    assert all(counts[i] == 2 for i in range(10, 14))
    picked = [i for i in range(14, 20) if counts[i]]
    assert len(picked) == 3 and all(counts[i] == 1 for i in picked)
    again = epoch_order(tf.constant(7, tf.int64), sizes, shares).numpy()
    other = epoch_order(tf.constant(8, tf.int64), sizes, shares).numpy()
    assert (order == again).all() and not (order == other).all()
    assert sorted(order[:10]) != list(range(10))  # parts mixed, not one after the other


def _ids(rng, pairs=120):
    def ragged(lengths):
        return tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(3, 50, size=int(sum(lengths))), tf.int32), tf.constant(lengths, tf.int64))
    src_len = rng.integers(1, 17, size=pairs)
    tgt_len = rng.integers(2, 18, size=pairs)
    return PairIds(ragged(src_len), ragged(tgt_len), (pairs,), (pairs,))


def test_planned_batches_hold_each_pair_once_padded_and_shifted():
    ids = _ids(np.random.default_rng(1))
    src, tgt = ids.src.to_list(), ids.tgt.to_list()
    tf.random.set_seed(0)
    dataset = planned_batches(ids, GRID, ROWS, seed=3)
    epoch = list(dataset.as_numpy_iterator())
    seen = []
    for (batch_src, tgt_in), tgt_out in epoch:
        rows, length = batch_src.shape
        assert (rows, length) == (ROWS[GRID.index(length)], length) and tgt_in.shape == tgt_out.shape == (rows, length)
        for r in range(rows):  # find the pair by its ids: source, target shifted by one
            match = [i for i in range(len(src)) if src[i] == [int(x) for x in batch_src[r] if x] and
                     tgt[i][:-1] == [int(x) for x in tgt_in[r] if x] and tgt[i][1:] == [int(x) for x in tgt_out[r] if x]]
            assert match, "a row that is no pair's padded ids"
            seen.append(match[0])
            assert max(len(src[match[0]]), len(tgt[match[0]]) - 1) <= length
    assert len(seen) == len(set(seen))  # no pair twice in an epoch
    assert len(seen) > len(src) - sum(ROWS)  # at most one partial batch per length dropped
    second = list(dataset.as_numpy_iterator())
    assert [b[0][0].tolist() for b in second] != [b[0][0].tolist() for b in epoch]  # a new plan each epoch
    tf.random.set_seed(0)
    replay = list(planned_batches(ids, GRID, ROWS, seed=3).as_numpy_iterator())
    assert [b[0][0].tolist() for b in replay] == [b[0][0].tolist() for b in epoch]  # the seed fixes the epochs


def test_pair_ids_are_the_streamed_ids_of_every_part(bible_tokenizers, tmp_path):
    main, extra = tmp_path / "main", tmp_path / "extra"
    for directory, (first, last) in ((main, (0, 30)), (extra, (30, 40))):
        directory.mkdir()
        pairs = list(bible_tokenizers.corpus.train.skip(first).take(last - first).as_numpy_iterator())
        (directory / "train.pt").write_text("\n".join(p.decode() for p, _ in pairs) + "\n")
        (directory / "train.en").write_text("\n".join(e.decode() for _, e in pairs) + "\n")
    corpus = load_corpus(DataConfig(corpora=(CorpusSpec(str(main)), CorpusSpec(str(extra), 0.5))))
    tokenizers = bible_tokenizers.tokenizers
    ids = pair_ids(corpus.training_pairs, tokenizers, max_length=12)
    assert ids.sizes == (30, 10) and ids.shares == (30, 5)
    assert all(t.device.endswith("CPU:0") for t in (ids.src.flat_values, ids.src.row_splits, ids.tgt.flat_values))
    streamed = [(list(s), list(t)) for part in corpus.training_pairs.parts
                for s, t in tokenize_pairs(part.pairs, tokenizers, 12).as_numpy_iterator()]
    assert list(zip(ids.src.to_list(), ids.tgt.to_list())) == streamed
    assert max(len(s) for s, _ in streamed) <= 12 and max(len(t) for _, t in streamed) <= 13
    config = PipelineConfig(max_tokens=96, length_buckets="geometric")
    batches = list(make_batches(corpus.training_pairs, tokenizers, config, 12, training=True, seed=0, tokenized=ids))
    grid = length_grid(config, 12)
    rows = rows_per_batch(config, grid)
    assert {src.shape for (src, _), _ in batches} <= {(r, n) for r, n in zip(rows, grid)}
    with pytest.raises(ValueError, match="evaluation batches stream"):
        make_batches(corpus.training_pairs, tokenizers, config, 12, training=False, tokenized=ids)


def test_training_batches_choose_the_planned_or_the_streamed_form(bible_tokenizers, tmp_path):
    from transformer.base.cli import run_config_from_args
    from transformer.commands.train import parse_args
    from transformer.training.training_data import tokenized_training_pairs

    planned = run_config_from_args(parse_args([]))
    streamed = run_config_from_args(parse_args(["--training-batches", "streamed"]))
    assert planned.pipeline.training_batches == "planned" and streamed.pipeline.training_batches == "streamed"
    with pytest.raises(SystemExit):
        parse_args(["--training-batches", "shuffled"])
    with pytest.raises(ValueError, match="training_batches"):
        PipelineConfig(training_batches="shuffled").validate()
    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    ids = tokenized_training_pairs(corpus, tokenizers, planned)
    assert isinstance(ids, PairIds)
    stream = tokenized_training_pairs(corpus, tokenizers, streamed)
    assert isinstance(stream, tf.data.Dataset)
    first = [(list(s), list(t)) for s, t in stream.take(5).as_numpy_iterator()]
    assert first == list(zip(ids.src[:5].to_list(), ids.tgt[:5].to_list()))  # the same ids, in corpus order
