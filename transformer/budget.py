"""`TrainingClock`: training time, progress through the planned run, and `--time-budget`.

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
        budget_s: float or None. Training seconds allowed; None: no limit.
        total_steps: int or None. Planned optimizer steps (progress without a budget).
    """

    def __init__(self, budget_s: Optional[float] = None, total_steps: Optional[int] = None):
        super().__init__()
        if budget_s is not None and budget_s <= 0:
            raise ValueError(f"time budget must be > 0 seconds, got {budget_s}")
        self.budget_s = budget_s
        self.total_steps = total_steps
        self.elapsed_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="train_elapsed_s")
        self.progress = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="plan_progress")
        self.stopped_by_budget = False
        self._step_start: Optional[float] = None

    @property
    def seconds(self) -> float:
        return float(self.elapsed_s.numpy())

    def remaining_s(self) -> Optional[float]:
        return None if self.budget_s is None else max(0.0, self.budget_s - self.seconds)

    def budget_spent(self) -> bool:
        return self.budget_s is not None and self.seconds >= self.budget_s

    def on_train_begin(self, logs=None):
        self._update_progress()

    def on_train_batch_begin(self, batch, logs=None):
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._step_start is None:
            return
        self.elapsed_s.assign_add(time.perf_counter() - self._step_start)
        self._step_start = None
        self._update_progress()
        if self.budget_spent() and not self.stopped_by_budget:
            log.info("time budget spent (%.1f min of training): stopping after step %d",
                     self.seconds / 60, self._iterations())
            self.stopped_by_budget = True
            self.model.stop_training = True

    def _iterations(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        return int(optimizer.iterations.numpy()) if optimizer is not None else 0

    def _update_progress(self) -> None:
        if self.budget_s is not None:
            done = self.seconds / self.budget_s
        elif self.total_steps:
            done = self._iterations() / self.total_steps
        else:
            return
        self.progress.assign(min(1.0, done))
