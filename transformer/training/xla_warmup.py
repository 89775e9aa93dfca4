"""`XlaWarmup`: a run's XLA programs compiled at its start, all at once, one thread per shape.

With XLA (`jit_compile`) the train step compiles one program per batch shape, when that shape
first arrives: on an H100 ~32 s each, one after the other (6 programs: 191-212 s of a run).
TensorFlow compiles the programs of one traced `tf.function` concurrently when different
threads call it with different shapes: those 6 programs took 44.7 s at once on the H100's
16-core host, 2 programs 18.1 s instead of 35.0 s on 2 cores (docs/gpu.md). So before the first
step this callback

  1. traces the compiled step once for batches of unknown dims, the trace `BatchTimer` and
     Keras' fast path use (XLA keys a program by the traced function as well as the shapes);
  2. copies every variable a step may change to the host (weights, optimizer moments and step,
     metrics, dropout seed states: `state_variables`);
  3. calls the step on a dummy batch of every planned shape, from up to min(8, usable CPUs: `runtime.cpu_budget`)
     threads at once, and waits;
  4. assigns the copies back, so the run trains exactly as it would have without the warm-up.

The same for the evaluation step when `fit` validates. A run planning fewer than 10 steps per
train shape skips the warm-up (`worth_warming`). A shape the warm-up could not run (e.g.
out of GPU memory with many steps at once) compiles when the run first meets it, as without a
warm-up. The seconds spent are charged to the run's training clock, as in-run compilations
are, and recorded in the report (`compile.warmup`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from transformer.base.config import RunConfig
from transformer.data.epoch_plan import PairIds
from transformer.data.pipeline import length_grid, rows_per_batch
from transformer.measure.reports import StepTimeReport
from transformer.runtime.cpu_budget import cpu_budget
from transformer.training.budget import TrainingClock
from transformer.training.timing import compiled_step, sync_logs, unwrapped
from transformer.training.train_step import BATCH_SPEC
from transformer.training.training_data import update_rows

log = logging.getLogger(__name__)

MAX_THREADS = 8  # steps in flight at once (each holds its activations on the device)
MIN_STEPS_PER_SHAPE = 10  # a shorter run may never meet some shapes: it compiles those it meets, as they come
WARMUP_TOKEN_ID = 4  # any non-pad id below every vocabulary size: only the shape matters


@dataclass(frozen=True)
class WarmupShapes:
    """Batch shapes `(rows, length)` to compile before training, per compiled step."""

    train: tuple[tuple[int, int], ...]
    evaluate: tuple[tuple[int, int], ...] = ()


def grid_shapes(grid: list[int], rows: list[int], lengths: Optional[tf.Tensor] = None,
                at_least: Optional[list[int]] = None) -> tuple[tuple[int, int], ...]:
    """The `(rows, length)` batches of the grid that the data fills.

    grid, rows: the padded lengths and rows per batch (`pipeline.length_grid`, `rows_per_batch`).
    lengths: [pairs] int32, each pair's padded length need (`PairIds.lengths`); None: every length.
    at_least: pairs a length needs to count (training drops the remainder: its rows); default 1.
    """
    if lengths is None:
        return tuple(zip(rows, grid))
    with tf.device("/CPU:0"):
        buckets = tf.searchsorted(tf.constant(grid, tf.int32), tf.cast(lengths, tf.int32), side="left")
        counts = np.bincount(buckets.numpy(), minlength=len(grid))
    needed = at_least or [1] * len(grid)
    return tuple((r, g) for r, g, n, k in zip(rows, grid, counts, needed) if n >= k)


def planned_shapes(tokenized: Any, grid: list[int], train_rows: list[int], eval_rows: list[int],
                   validates: bool) -> WarmupShapes:
    """The warm-up of a run: train batches the training pairs fill, and when `fit` validates, evaluation
    batches of every length some training pair has (every grid length when the ids are not in memory)."""
    lengths = tokenized.lengths if isinstance(tokenized, PairIds) else None
    train = grid_shapes(grid, train_rows, lengths, at_least=train_rows)
    evaluate = grid_shapes(grid, eval_rows, lengths) if validates else ()
    return WarmupShapes(train=train, evaluate=evaluate)


def worth_warming(shapes: WarmupShapes, planned_steps: Optional[int]) -> bool:
    """False for a run too short to meet every shape (fewer than `MIN_STEPS_PER_SHAPE` planned steps
    per train shape, e.g. a notebook's few-step toggles); a time-budgeted or unknown length: True."""
    return bool(shapes.train) and (planned_steps is None or planned_steps >= MIN_STEPS_PER_SHAPE * len(shapes.train))


def dummy_batch(rows: int, length: int) -> tuple:
    """((src, tgt_in), tgt_out) int32 `[rows, length]` each, on the host (where tf.data's batches are)."""
    with tf.device("/CPU:0"):
        ids = tf.fill([rows, length], tf.constant(WARMUP_TOKEN_ID, tf.int32))
        return (ids, tf.identity(ids)), tf.identity(ids)


def state_variables(model: keras.Model, step: Any) -> list[tf.Variable]:
    """Every variable a step of `model` may change: the model's, the optimizer's (the fused Adam
    update reaches its moments through resource handles, which a trace does not list), the
    metrics', and whatever else the step's trace captures; each once."""
    optimizer = getattr(model, "optimizer", None)
    candidates = [*model.variables, *(optimizer.variables if optimizer is not None else ()),
                  *model.metrics_variables, *step.get_concrete_function(BATCH_SPEC).variables]
    found = {}
    for variable in candidates:
        variable = variable.value if isinstance(variable, keras.Variable) else variable  # → its tf.Variable
        found.setdefault(variable.ref(), variable)
    return list(found.values())


def compile_concurrently(jobs: list[tuple[str, Any, tuple[int, int]]], variables: list[tf.Variable],
                         threads: int) -> dict:
    """Runs each `(name, step, (rows, length))` job once, up to `threads` at once, then assigns
    `variables` (`state_variables`) their values from before. Returns the report entry:
    per name the shapes compiled and those that failed (left to the run), and the seconds.

    step: Keras' compiled `one_step_on_data` (train or test), already traced for `BATCH_SPEC`.
    """
    saved = [v.numpy() for v in variables]
    threads = max(1, min(threads, len(jobs)))
    start = time.perf_counter()

    def run(step: Any, shape: tuple[int, int]) -> float:
        began = time.perf_counter()
        sync_logs(step(dummy_batch(*shape)))  # waits for the device
        return time.perf_counter() - began

    entry = {name: {"shapes": [], "failed": {}} for name, _, _ in jobs}
    longest = 0.0
    try:
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="xla-warmup") as pool:
            futures = {pool.submit(run, step, shape): (name, shape) for name, step, shape in jobs}
            for future in concurrent.futures.as_completed(futures):
                name, (rows, length) = futures[future]
                try:
                    longest = max(longest, future.result())
                    entry[name]["shapes"].append([rows, length])
                except (tf.errors.ResourceExhaustedError, tf.errors.InternalError) as err:
                    entry[name]["failed"][f"{rows}x{length}"] = type(err).__name__
    finally:
        for variable, value in zip(variables, saved):
            variable.assign(value)
    for step_entry in entry.values():
        step_entry["shapes"].sort()
    return {**entry, "threads": threads, "seconds": round(time.perf_counter() - start, 3),
            "longest_step_s": round(longest, 3), "variables_restored": len(variables)}


def warmup_threads() -> int:
    """Programs the warm-up compiles at once on this machine: one per usable CPU (`cpu_budget`), at most `MAX_THREADS`."""
    return min(MAX_THREADS, cpu_budget().cpus)


class XlaWarmup(keras.callbacks.Callback):
    """Compiles the run's XLA programs at the first `on_train_begin` (module docstring).

    Args:
        shapes: `WarmupShapes`. What to compile.
        report: `StepTimeReport`. Gets `compile.warmup`.
        clock: `TrainingClock` or None. Charged the warm-up's seconds (train clock; the wall
            clock counts them anyway). Place this callback after the clock.
        threads: int or None. Steps at once (at most one per shape); default `warmup_threads()`.
    """

    def __init__(self, shapes: WarmupShapes, report: StepTimeReport, clock: Optional[TrainingClock] = None,
                 threads: Optional[int] = None):
        super().__init__()
        self.shapes = shapes
        self.report = report
        self.clock = clock
        self.threads = threads or warmup_threads()
        self.done = False

    def on_train_begin(self, logs=None):
        if self.done or not getattr(self.model, "jit_compile", False):
            return
        self.done = True  # once: a retry with a smaller batch meets its own shapes in the run
        log.info("XLA warm-up: compiling %d programs before the first step, up to %d at once",
                 len(self.shapes.train) + len(self.shapes.evaluate), self.threads)
        start = time.perf_counter()
        if self.shapes.evaluate:
            self.model.make_test_function()  # fit would make it at its first validation
        jobs, variables = [], {}
        for name, function, shapes in (("train", self.model.train_function, self.shapes.train),
                                       ("evaluate", self.model.test_function, self.shapes.evaluate)):
            step = compiled_step(unwrapped(function)) if function is not None and shapes else None
            if step is None:
                continue
            step.get_concrete_function(BATCH_SPEC)  # the one trace the run's steps then use
            jobs += [(name, step, shape) for shape in shapes]
            variables.update((v.ref(), v) for v in state_variables(self.model, step))
        entry = compile_concurrently(jobs, list(variables.values()), self.threads) if jobs else {}
        seconds = time.perf_counter() - start
        entry["seconds"] = round(seconds, 3)
        self.report.compile["warmup"] = entry
        if self.clock is not None and not self.clock.wall:
            self.clock.add_training_time(seconds)
        log.info("XLA warm-up: %s in %.1f s (%s at once)", ", ".join(
            f"{name} {len(entry[name]['shapes'])} programs"
            + (f" ({len(entry[name]['failed'])} left for the run)" if entry[name]["failed"] else "")
            for name in ("train", "evaluate") if name in entry) or "nothing to compile", seconds,
            entry.get("threads", 0))


def run_warmup(config: RunConfig, tokenized: Any, fit_validates: bool, report: StepTimeReport,
               clock: Optional[TrainingClock]) -> Optional[XlaWarmup]:
    """The warm-up of a single-device XLA run with the optimized pipeline (`config` resolved: grid,
    batch, budget), or None when the run is too short for one (`worth_warming`; the report says so).

    tokenized: the training pairs as `tokenized_training_pairs` gives them (their lengths, when in memory).
    """
    grid = length_grid(config.pipeline, config.model.max_length)
    shapes = planned_shapes(tokenized, grid, rows_per_batch(config.pipeline, grid, update_rows(config, 1)),
                            rows_per_batch(config.pipeline, grid), fit_validates)
    planned = report.steps_planned if config.train.time_budget_minutes is None else None  # the trainer's count
    if not worth_warming(shapes, planned):
        report.compile["warmup"] = {"skipped": f"{planned} planned steps for {len(shapes.train)} train shapes"}
        return None
    return XlaWarmup(shapes, report, clock)
