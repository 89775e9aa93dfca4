"""`TrainingClock`: training time, progress through the planned run, and `--time-budget`.

Two clocks (`--budget-clock`):
  * `train` (default): the budget counts training time only (below);
  * `wall`: the budget counts wall time from the start of `train()` (corpus loading,
    tokenizers, model building, evaluations, checkpoints all included), and training stops
    early enough that the final checkpoint and evaluation end on time: it keeps a reserve of
    1.25 × the longest evaluation and checkpoint save measured so far (before the first
    measurement: 3% of the budget), and the cosine schedule decays over budget − reserve.

Training time is the sum of the training steps' durations (`on_train_batch_begin` →
`on_train_batch_end`, which includes waiting for input and compiling the step, since the
step's result is synced by `BatchTimer` before this callback runs). It excludes what is not
training: start-up, validation, BLEU evaluation and checkpoint writes, so two recipes given
the same budget get the same amount of optimisation time however often they evaluate. The
wall time is reported beside it.

The clock keeps `progress` (a float32 variable, 0 → 1) up to date for schedules that need
the planned length (`schedule.WarmupCosine`): elapsed / budget with a time budget, else
optimizer step / planned steps. `elapsed_s` is saved in the run's checkpoints, so a resumed
run continues its budget instead of starting a new one.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import keras
import tensorflow as tf

log = logging.getLogger(__name__)


class TrainingClock(keras.callbacks.Callback):
    """Measures training time; stops `fit` when `budget_s` is spent.

    Args:
        budget_s: float or None. Seconds allowed; None: no limit.
        total_steps: int or None. Planned optimizer steps (progress without a budget).
        wall: bool. Count wall time since `started` (a `time.perf_counter()` value, default
            now) instead of training steps; `elapsed_s` then holds wall seconds.
    """

    def __init__(self, budget_s: Optional[float] = None, total_steps: Optional[int] = None, *,
                 wall: bool = False, started: Optional[float] = None):
        super().__init__()
        if budget_s is not None and budget_s <= 0:
            raise ValueError(f"time budget must be > 0 seconds, got {budget_s}")
        self.budget_s = budget_s
        self.total_steps = total_steps
        self.wall = wall
        self.elapsed_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="train_elapsed_s")
        self.progress = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="plan_progress")
        self.stopped_by_budget = False
        self.end_costs: dict[str, float] = {}  # longest evaluation / checkpoint save seen (wall reserve)
        self._step_start: Optional[float] = None
        self._progress: Optional[float] = None  # during fit: the last value assigned to `progress`
        self._live: Optional[float] = None  # during fit: `elapsed_s` as a Python float (no read per step)
        self._mark = time.perf_counter() if started is None else started  # wall: counted up to here

    def expect_at_end(self, name: str, seconds: float) -> None:
        """Records the duration of something the run does again at its end (wall clock reserve)."""
        self.end_costs[name] = max(seconds, self.end_costs.get(name, 0.0))

    def reserve_s(self) -> float:
        """Wall clock: seconds kept for the final checkpoint and evaluation; 0 for the train clock."""
        if not self.wall or self.budget_s is None:
            return 0.0
        if not self.end_costs:
            return 0.03 * self.budget_s
        return min(1.25 * sum(self.end_costs.values()), 0.5 * self.budget_s)

    def _tick(self) -> None:
        """Wall clock: adds the time since the last tick (start-up, steps, evaluations, saves)."""
        now = time.perf_counter()
        self._add(now - self._mark)
        self._mark = now

    def _add(self, seconds: float) -> None:
        if self._live is None:
            self.elapsed_s.assign_add(seconds)
        else:  # during fit the clock is the only writer: count in Python, assign the variable
            self._live += seconds
            self.elapsed_s.assign(self._live)

    def add_training_time(self, seconds: float) -> None:
        """Counts `seconds` spent outside the steps as training (e.g. compiling the steps beforehand)."""
        self._add(seconds)

    @property
    def seconds(self) -> float:
        return self._live if self._live is not None else float(self.elapsed_s.numpy())

    def current_s(self) -> float:
        """`seconds` up to this moment (wall clock: including the time since the last step)."""
        return self.seconds + (time.perf_counter() - self._mark if self.wall else 0.0)

    def remaining_s(self) -> Optional[float]:
        """Seconds of the budget left for training (wall clock: minus the end reserve)."""
        return None if self.budget_s is None else max(0.0, self.budget_s - self.reserve_s() - self.seconds)

    def fraction_done(self) -> float:
        """`progress` as a Python float (during fit without reading the variable)."""
        live = self._progress if self._live is not None else None
        return live if live is not None else float(self.progress.numpy())

    def budget_spent(self) -> bool:
        return self.budget_s is not None and self.remaining_s() <= 0.0

    def on_train_begin(self, logs=None):
        self._live = float(self.elapsed_s.numpy())  # as restored from a checkpoint or backup
        self._progress = None
        if self.wall:
            self._tick()  # start-up (or, resumed, this process's start-up) counts
        self._update_progress()

    def on_train_batch_begin(self, batch, logs=None):
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._step_start is None:
            return
        if self.wall:
            self._tick()
        else:
            self._add(time.perf_counter() - self._step_start)
        self._step_start = None
        self._update_progress()
        if self.budget_spent() and not self.stopped_by_budget:
            log.info("time budget spent (%.1f min of %s time%s): stopping after step %d", self.seconds / 60,
                     "wall" if self.wall else "training",
                     f", {self.reserve_s():.0f} s kept for the final evaluation" if self.wall else "",
                     self._iterations())
            self.stopped_by_budget = True
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self._live = None  # the variable is the truth again (restores, resumes)

    def _iterations(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        return int(optimizer.iterations.numpy()) if optimizer is not None else 0

    def _update_progress(self) -> None:
        if self.budget_s is not None:
            done = self.seconds / max(self.budget_s - self.reserve_s(), 1e-9)
        elif self.total_steps:
            done = self._iterations() / self.total_steps
        else:
            return
        self._progress = min(1.0, done)
        self.progress.assign(self._progress)
