"""`BudgetProgress`: the progress display of a time-budgeted run, instead of Keras' bar.

Under `--time-budget` Keras' bar knows neither the number of epochs (`Epoch 2/1000000`) nor
the steps of an epoch of a bucketed dataset (`N/Unknown`). This callback shows progress
against the budget instead:

    budget 12.3/30.0 min (train) · step 812 · epoch 2 · 4,812 tgt tok/s · loss 4.231 · ETA 19 min (05:12)

* minutes spent / budget, on the budget's clock (`train` or `wall`, see budget.py);
* tokens/s: real (non-pad) target tokens per second of the last 50 steps (step-time report);
* ETA: when the run should end, in wall time: with the wall clock, the budget left; with
  the train clock, the training time left plus the evaluations still to come (scheduled
  ones and the final one, each as long as the longest so far) and the final checkpoint.

verbose 1 rewrites one line in place (at most once a second) on a terminal or in a notebook;
verbose 2, or output to a file, prints a line every `every_s` seconds (default 60) and at
each epoch end, for logs.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

import keras

from transformer.training.budget import TrainingClock


def dynamic_display(stream: Optional[TextIO] = None) -> bool:
    """True when a line can be rewritten in place (`\\r`): a terminal or a Jupyter kernel."""
    stream = stream or sys.stdout
    return "ipykernel" in sys.modules or (hasattr(stream, "isatty") and stream.isatty())


class BudgetProgress(keras.callbacks.Callback):
    """Progress against the time budget (see the module docstring).

    Args:
        clock: TrainingClock with a budget.
        report: StepTimeReport or None (tokens/s); None shows no throughput.
        evaluator: ValidationBleu or None. Its `fractions` and past evaluations feed the ETA.
        in_place: bool. Rewrite one line (`\\r`) instead of printing lines.
        every_s: float or None. Seconds between updates (default 1 in place, 60 otherwise).
        stream: text stream (default sys.stdout).
    """

    def __init__(self, clock: TrainingClock, report=None, evaluator=None, *, in_place: bool = True,
                 every_s: Optional[float] = None, stream: Optional[TextIO] = None):
        super().__init__()
        if clock.budget_s is None:
            raise ValueError("BudgetProgress needs a clock with a time budget")
        self.clock, self.report, self.evaluator = clock, report, evaluator
        self.in_place = in_place
        self.every_s = every_s if every_s is not None else (1.0 if in_place else 60.0)
        self.stream = stream or sys.stdout
        self._epoch = 0
        self._last_print = float("-inf")
        self._width = 0
        self._loss: Optional[float] = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])
        now = time.perf_counter()
        if now - self._last_print >= self.every_s:
            self._last_print = now
            self._show(self.line())

    def on_epoch_end(self, epoch, logs=None):
        if not self.in_place:
            self._show(self.line() + f" · epoch {epoch + 1} done")

    def on_train_end(self, logs=None):
        self._show(self.line())
        if self.in_place:
            self.stream.write("\n")
            self.stream.flush()

    def line(self) -> str:
        """The current status line."""
        clock = self.clock
        parts = [f"budget {clock.current_s() / 60:.1f}/{clock.budget_s / 60:.1f} min ({'wall' if clock.wall else 'train'})",
                 f"step {self._step():,}", f"epoch {self._epoch + 1}"]
        rate = self._tokens_per_s()
        if rate is not None:
            parts.append(f"{rate:,.0f} tgt tok/s")
        if self._loss is not None:
            parts.append(f"loss {self._loss:.3f}")
        eta = self.eta_s()
        parts.append(f"ETA {_minutes(eta)} ({time.strftime('%H:%M', time.localtime(time.time() + eta))})")
        return " · ".join(parts)

    def eta_s(self) -> float:
        """Wall seconds until the run should end (the final evaluation and checkpoint included)."""
        clock = self.clock
        if clock.wall:  # the run ends when its budget does
            return max(0.0, clock.budget_s - clock.current_s())
        left = clock.remaining_s() or 0.0
        end_costs = dict(clock.end_costs)
        evaluation = end_costs.pop("evaluation", 0.0)
        evaluations_left = 0
        if self.evaluator is not None:
            evaluations_left = 1  # the final one
            fractions = self.evaluator.fractions or []
            evaluations_left += sum(1 for f in fractions if f > clock.fraction_done())
        return left + evaluations_left * evaluation + sum(end_costs.values())

    def _step(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        return int(optimizer.iterations.numpy()) if optimizer is not None else 0

    def _tokens_per_s(self) -> Optional[float]:
        records = getattr(self.report, "records", None)
        if not records:
            return None
        steady = records[getattr(self.report, "warmup_steps", 0):]  # not the first step's compilation
        recent = [r for r in steady[-50:] if r.tgt_tokens is not None]
        seconds = sum(r.time_s for r in recent)
        return sum(r.tgt_tokens for r in recent) / seconds if recent and seconds > 0 else None

    def _show(self, text: str) -> None:
        if self.in_place:
            padding = " " * max(0, self._width - len(text))
            self.stream.write("\r" + text + padding)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _minutes(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
