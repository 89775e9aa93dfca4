"""BatchTimer on a tiny Keras model with the `((src, tgt_in), tgt_out)` batch layout."""

import math
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.measure.reports import StepTimeReport, load_report, load_steps
from transformer.runtime.flops import TransformerDims, measure_peak_flops, transformer_train_flops
from transformer.training.timing import BatchTimer, batch_counts

VOCAB = 16
BATCH, SRC_LEN, TGT_LEN = 4, 6, 5
DIMS = TransformerDims(num_layers=1, d_model=8, dff=16, num_heads=2, key_dim=8, tgt_vocab_size=VOCAB)


def make_batches(num_batches: int) -> list:
    """Batches whose last source column and last target column are padding."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(num_batches):
        src = rng.integers(1, VOCAB, (BATCH, SRC_LEN)).astype("int32")
        tgt = rng.integers(1, VOCAB, (BATCH, TGT_LEN + 1)).astype("int32")
        src[:, -1] = 0
        tgt[:, -1] = 0
        batches.append(((src, tgt[:, :-1]), tgt[:, 1:]))
    return batches


def make_dataset(num_batches: int, sleep_s: float = 0.0) -> tf.data.Dataset:
    """One element per batch; with `sleep_s`, a Python stage sleeps that long per batch."""
    batches = make_batches(num_batches)
    src, tgt_in, tgt_out = (np.stack(part) for part in zip(*[(s, ti, to) for (s, ti), to in batches]))
    ds = tf.data.Dataset.from_tensor_slices(((src, tgt_in), tgt_out))
    if sleep_s:

        def sleep(ids):
            time.sleep(sleep_s)
            return ids

        def slow(inputs, tgt_out):
            src, tgt_in = inputs
            src = tf.py_function(sleep, [src], tf.int32)
            src.set_shape([BATCH, SRC_LEN])
            return (src, tgt_in), tgt_out

        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # tf.data adds one by default
        ds = ds.map(slow).with_options(options)  # no prefetch: every step waits `sleep_s`
    return ds


def make_model(steps_per_execution: int = 1) -> keras.Model:
    src = keras.Input((None,), dtype="int32")
    tgt_in = keras.Input((None,), dtype="int32")
    embed = keras.layers.Embedding(VOCAB, 8)
    context = keras.ops.mean(embed(src), axis=1, keepdims=True)  # [batch, 1, 8]
    logits = keras.layers.Dense(VOCAB)(embed(tgt_in) + context)  # [batch, tgt_len, vocab]
    model = keras.Model((src, tgt_in), logits)
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def fit(model: keras.Model, dataset: tf.data.Dataset, timer: BatchTimer, **kwargs) -> None:
    model.fit(dataset, callbacks=[timer], verbose=0, shuffle=False, **kwargs)


def test_transformer_flops_match_hand_count():
    # 1 layer, d_model 4, dff 8, 2 heads of key_dim 4 (tutorial width: 2*4 = 8), vocab 10.
    S, T, B = 3, 2, 5
    enc = (2 * S * 4 * 8) * 3 + 2 * 2 * S * S * 4 * 2 + 2 * S * 8 * 4 + 2 * S * 4 * 8 * 2
    dec_self = (2 * T * 4 * 8) * 3 + 2 * 2 * T * T * 4 * 2 + 2 * T * 8 * 4
    dec_cross = 2 * T * 4 * 8 + (2 * S * 4 * 8) * 2 + 2 * 2 * T * S * 4 * 2 + 2 * T * 8 * 4
    dec_ffn = 2 * T * 4 * 8 * 2
    vocab = 2 * T * 4 * 10
    expected = 3 * B * (enc + dec_self + dec_cross + dec_ffn + vocab)
    dims = TransformerDims(num_layers=1, d_model=4, dff=8, num_heads=2, key_dim=4, tgt_vocab_size=10)
    assert dims.train_flops(B, S, T) == expected
    assert transformer_train_flops(**vars(dims), batch_size=B, src_len=S, tgt_len=T) == expected


def test_measure_peak_flops_is_positive_and_finite():
    peak = measure_peak_flops(seconds=0.05, size=128)
    assert peak > 0 and math.isfinite(peak)


def test_batch_counts_separate_real_and_padded_tokens():
    counts = batch_counts(make_batches(1)[0])
    assert (counts.examples, counts.src_len, counts.tgt_len) == (BATCH, SRC_LEN, TGT_LEN)
    assert counts.src_tokens == BATCH * (SRC_LEN - 1)
    assert counts.tgt_tokens == BATCH * (TGT_LEN - 1)
    assert (counts.src_padded, counts.tgt_padded) == (BATCH * SRC_LEN, BATCH * TGT_LEN)
    assert batch_counts({"not": "the layout"}) is None


def test_timer_records_every_step_and_restores_train_function():
    model = make_model()
    model.make_train_function()
    original = model.train_function
    timer = BatchTimer(dims=DIMS, peak_flops=1e9, write_every_s=None)
    fit(model, make_dataset(5), timer, epochs=1)

    records = timer.records
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert all(r.batches == 1 and r.examples == BATCH for r in records)
    assert all(r.src_tokens == BATCH * (SRC_LEN - 1) and r.src_padded == BATCH * SRC_LEN for r in records)
    assert all(r.flops == DIMS.train_flops(BATCH, SRC_LEN, TGT_LEN) for r in records)
    assert all(0 <= r.data_wait_s < r.time_s for r in records)
    assert model.train_function is original

    summary = timer.summary()
    assert summary["steady_steps"] == 4  # the first (trace) step is kept apart
    assert summary["first_step_s"] == records[0].time_s
    assert summary["padding_fraction"] == pytest.approx(1 - (5 + 4) / (6 + 5))
    assert summary["utilisation"] == pytest.approx(summary["flops_per_s"] / 1e9)
    assert timer.report.steps_planned == 5
    assert timer.report.state == "completed"  # no guard: the timer closes the report


def test_steps_per_execution_rows_sum_their_batches():
    timer = BatchTimer(probe_peak=False, write_every_s=None)
    fit(make_model(steps_per_execution=2), make_dataset(5), timer, epochs=1)
    assert [r.batches for r in timer.records] == [2, 2, 1]
    assert [r.examples for r in timer.records] == [2 * BATCH, 2 * BATCH, BATCH]
    assert timer.report.steps_done == 5


def test_slow_input_shows_up_as_data_wait():
    """A producer that sleeps 0.1 s per batch shows up as ≥ 0.09 s of wait per step, and as
    several times the wait of an instant producer. Compared in seconds, not as shares of the
    step: on a loaded machine the tiny model's step is so short that scheduling delays alone
    make up a large share of it (CI once measured 33% for the instant producer)."""
    sleep_s = 0.1
    mean_wait, shares = {}, {}
    for sleep in (0.0, sleep_s):
        timer = BatchTimer(probe_peak=False, write_every_s=None)
        fit(make_model(), make_dataset(5, sleep_s=sleep), timer, epochs=1)
        steady = timer.records[1:]  # the first step traces
        mean_wait[sleep] = sum(r.data_wait_s for r in steady) / len(steady)
        shares[sleep] = timer.summary()["data_wait_pct"]
    assert all(r.data_wait_s >= sleep_s * 0.9 for r in timer.records)
    assert shares[sleep_s] > 50.0
    assert mean_wait[sleep_s] > 3 * mean_wait[0.0]


def test_crash_in_fit_keeps_rows_and_unwraps_on_next_fit(tmp_path):
    class FailAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    model = make_model()
    report = StepTimeReport(tmp_path / "report.json", run={"label": "crash"})
    timer = BatchTimer(report, probe_peak=False)
    with pytest.raises(tf.errors.ResourceExhaustedError), report.guard():
        model.fit(make_dataset(6), callbacks=[timer, FailAfter()], verbose=0, shuffle=False)

    saved = load_report(tmp_path / "report.json")
    assert saved["state"] == "crashed"
    assert saved["error"]["type"] == "ResourceExhaustedError" and saved["error"]["out_of_memory"]
    assert [row["step"] for row in load_steps(tmp_path / "report.json")] == [0, 1, 2]

    # on_train_end never ran, so the wrapper is still there; the next fit must not stack another.
    again = BatchTimer(probe_peak=False, write_every_s=None)
    fit(model, make_dataset(2), again, epochs=1)
    assert [r.batches for r in again.records] == [1, 1]
    assert not hasattr(model.train_function, "_batch_timer_original")
