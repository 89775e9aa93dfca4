"""The XLA warm-up: which batch shapes a run compiles before its first step, and that running the
steps for them, all at once, leaves the run exactly as it was (every variable put back, one trace).

Here the step is the model's train step without `jit_compile` (the warm-up's bookkeeping does not
depend on XLA, and tracing is cheap); tests/training/test_xla_shapes.py runs a whole epoch with
XLA, where the warm-up compiles the programs the run then uses.
"""

import numpy as np
import pytest
import tensorflow as tf

from transformer.base.config import ModelConfig, RunConfig, TrainConfig
from transformer.data.epoch_plan import PairIds
from transformer.inference.rundir import build_model
from transformer.model.optimizer import compile_model
from transformer.training.timing import compiled_step
from transformer.training.xla_warmup import (
    BATCH_SPEC,
    compile_concurrently,
    dummy_batch,
    grid_shapes,
    planned_shapes,
    state_variables,
    worth_warming,
)

GRID = [16, 24, 32]


def pair_ids(lengths: list[int]) -> PairIds:
    """PairIds whose pairs need these padded lengths (source of that length, target one shorter + 1)."""
    src = tf.ragged.constant([[5] * n for n in lengths], dtype=tf.int32)
    tgt = tf.ragged.constant([[5] * (n // 2 + 1) for n in lengths], dtype=tf.int32)
    return PairIds(src=src, tgt=tgt, sizes=(len(lengths),), shares=(len(lengths),))


def test_training_warms_the_lengths_its_pairs_fill_evaluation_every_length_they_use():
    rows = [4, 3, 2]  # rows per batch at 16, 24, 32 tokens
    ids = pair_ids([3] * 4 + [17] * 2 + [30] * 5)  # 4 pairs → 16, 2 → 24 (fewer than its 3 rows), 5 → 32
    assert ids.lengths.numpy().tolist() == [3] * 4 + [17] * 2 + [30] * 5
    shapes = planned_shapes(ids, GRID, rows, [8, 6, 4], validates=True)
    assert shapes.train == ((4, 16), (2, 32))  # a training epoch drops remainders: no 24-token batch
    assert shapes.evaluate == ((8, 16), (6, 24), (4, 32))  # evaluation pads rows: every length with a pair
    assert planned_shapes(ids, GRID, rows, [8, 6, 4], validates=False).evaluate == ()
    lengths = tf.constant([16, 16, 16, 16, 17])  # 16 fits 16; 17 needs 24
    assert grid_shapes(GRID, rows, lengths, at_least=rows) == ((4, 16),)
    assert grid_shapes(GRID, rows, lengths) == ((4, 16), (3, 24))
    # ids not in memory (a streamed pipeline): every length of the grid
    streamed = planned_shapes(None, GRID, rows, [8, 6, 4], validates=True)
    assert streamed.train == ((4, 16), (3, 24), (2, 32)) and streamed.evaluate == ((8, 16), (6, 24), (4, 32))


def test_a_run_too_short_to_meet_its_shapes_is_not_warmed():
    shapes = planned_shapes(None, GRID, [4, 3, 2], [8, 6, 4], validates=True)  # 3 train shapes
    assert worth_warming(shapes, None)  # a time budget, or a length not known: assumed long
    assert worth_warming(shapes, 30) and not worth_warming(shapes, 29)  # 10 steps per train shape
    assert not worth_warming(planned_shapes(pair_ids([3]), GRID, [4, 3, 2], [8, 6, 4], True), None)  # nothing fills a batch


def test_dummy_batches_have_the_pipelines_layout():
    (src, tgt_in), tgt_out = dummy_batch(3, 24)
    assert src.shape == tgt_in.shape == tgt_out.shape == (3, 24) and src.dtype == tf.int32
    assert "CPU" in src.device and tf.reduce_all(src > 0)  # on the host, as tf.data's; no pad
    assert tf.nest.assert_same_structure(((src, tgt_in), tgt_out), BATCH_SPEC) is None


@pytest.fixture
def trained_step():
    """A tiny model with dropout, fused Adam and metrics, after one real step (optimizer moments ≠ 0)."""
    config = ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.3, max_length=32,
                         src_vocab_size=40, tgt_vocab_size=40)
    tf.keras.utils.set_random_seed(0)
    model = build_model(config)
    compile_model(model, RunConfig(model=config, train=TrainConfig(xla=False, lr_schedule="inverse-sqrt",
                                                                  warmup_steps=10)))
    model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    step = compiled_step(model.train_function)
    step.get_concrete_function(BATCH_SPEC)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 40, (4, 12)).astype("int32")
    step(((tf.constant(ids), tf.constant(ids)), tf.constant(ids)))
    return model, step


def every_value(model) -> list[np.ndarray]:
    return [v.numpy().copy() for v in [*model.variables, *model.optimizer.variables, *model.metrics_variables]]


def test_warmup_puts_back_every_variable_and_keeps_one_trace(trained_step):
    model, step = trained_step
    before = every_value(model)
    variables = state_variables(model, step)
    paths = {v.name for v in variables}
    assert any("momentum" in p for p in paths) and any("seed_generator_state" in p for p in paths)
    assert any(p.startswith("loss/") for p in paths)
    entry = compile_concurrently([("train", step, (8, 16)), ("train", step, (4, 32)), ("train", step, (2, 24))],
                                 variables, threads=3)
    assert entry["train"] == {"shapes": [[2, 24], [4, 32], [8, 16]], "failed": {}} and entry["threads"] == 3
    assert entry["variables_restored"] == len(variables)
    after = every_value(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(model.optimizer.iterations.numpy()) == 1  # not 4
    assert step.experimental_get_tracing_count() == 1  # every shape ran through the one trace

    # without the restore the same steps would have changed the weights and moments: the check can fail
    for shape in ((8, 16), (4, 32)):
        step(dummy_batch(*shape))
    assert not all(np.array_equal(a, b) for a, b in zip(before, every_value(model)))


def test_a_shape_out_of_memory_is_left_to_the_run_and_the_rest_still_put_back(trained_step):
    model, step = trained_step
    before = every_value(model)

    def out_of_memory(batch):
        step(batch)  # changes the variables first, as a step that fails late would
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    entry = compile_concurrently([("train", step, (8, 16)), ("train", out_of_memory, (4, 32))],
                                 state_variables(model, step), threads=2)
    assert entry["train"] == {"shapes": [[8, 16]], "failed": {"4x32": "ResourceExhaustedError"}}
    assert all(np.array_equal(a, b) for a, b in zip(before, every_value(model)))

    def broken(batch):
        raise ValueError("not an out-of-memory error")

    with pytest.raises(ValueError, match="not an out-of-memory"):  # a real bug is not hidden
        compile_concurrently([("train", broken, (8, 16))], state_variables(model, step), threads=1)
    assert all(np.array_equal(a, b) for a, b in zip(before, every_value(model)))
