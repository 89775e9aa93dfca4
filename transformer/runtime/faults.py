"""Faults during training that must not lose work: divergence, interruption, a full disk.

* Divergence. `DivergenceGuard` (first in the callback list, so no checkpoint or backup of
  that step is written) stops training at the first NaN/Inf loss with `TrainingDiverged`;
  the report's state becomes "diverged" and `run.divergence` holds the step, the last
  finite loss, the learning rate, the precision policy and (mixed float16) the loss-scale
  history. Every save also checks the weights are finite (`check_finite_weights`), so the
  last checkpoint is a good one.
* Interruption. `InterruptHandler` turns SIGINT (Ctrl-C) and SIGTERM (Colab, schedulers)
  into: finish the current step, save (backup snapshot if there is one, else a checkpoint),
  then raise `Interrupted` — the report's state is "interrupted" and `--resume` continues.
  A second signal stops at once; a signal before `fit` starts stops at once (nothing to save).
* Disk full. `saving(...)` turns ENOSPC/EDQUOT during a save into `DiskFullError` saying
  which earlier checkpoint is still intact (TensorFlow's CheckpointManager and the backup
  write new files before switching to them, so the previous save stays readable).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import signal
import threading
from typing import Callable, Iterator, Optional

import keras
import numpy as np
import tensorflow as tf

from transformer.base.errors import EXIT_RUNTIME, Interrupted, ProjectError

log = logging.getLogger(__name__)

REMEDIES = ("lower --peak-lr (or raise --warmup-steps), add --label-smoothing, or use --mixed-precision "
            "bfloat16/off instead of float16; then --resume from the last good checkpoint")
LOSS_SCALE_HISTORY = 200  # changes of the float16 loss scale kept in the report


class TrainingDiverged(ProjectError):
    """The loss (or the weights) became NaN/Inf; `details` is what the report records."""

    exit_status = EXIT_RUNTIME
    report_state = "diverged"
    hint = REMEDIES

    def __init__(self, message: str, details: Optional[dict] = None):
        super().__init__(message)
        self.details = details or {}


class DiskFullError(ProjectError, OSError):
    """A save failed for lack of space; the message says what is still intact."""

    exit_status = EXIT_RUNTIME
    hint = "free space (or move --output), then run the same command with --resume"


def _is_disk_full(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return isinstance(err, (OSError, tf.errors.OpError)) and ("No space left on device" in text
                                                               or "Disk quota exceeded" in text)


@contextlib.contextmanager
def saving(what: str, intact: Callable[[], Optional[str]]) -> Iterator[None]:
    """Converts a disk-full error inside the block to DiskFullError naming `intact()` (the kept save)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised unless it is a full disk
        if not _is_disk_full(err):
            raise
        kept = intact()
        raise DiskFullError(f"disk full while saving {what} ({err}); "
                            + (f"the previous save {kept} is intact" if kept else "no earlier save exists")) from err


def nonfinite_weights(model: keras.Model) -> list[str]:
    """Names of the model's variables holding NaN or Inf."""
    return [v.path for v in model.variables
            if "float" in str(v.dtype) and not bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))))]


def check_finite_weights(model: keras.Model, what: str) -> None:
    """Raises TrainingDiverged (and saves nothing) when a weight is NaN/Inf."""
    bad = nonfinite_weights(model)
    if bad:
        step = int(model.optimizer.iterations.numpy()) if model.optimizer is not None else None
        raise TrainingDiverged(f"weights became NaN/Inf by step {step} ({', '.join(bad[:3])}"
                               f"{', …' if len(bad) > 3 else ''}); {what} not saved",
                               {"step": step, "nonfinite_weights": bad[:20]})


def _learning_rate(optimizer) -> Optional[float]:
    try:
        return float(np.asarray(optimizer.learning_rate))
    except Exception:  # noqa: BLE001 - a schedule that cannot be read eagerly
        return None


class DivergenceGuard(keras.callbacks.Callback):
    """Stops `fit` with TrainingDiverged at the first non-finite loss; records the details in `report.run`."""

    def __init__(self, report=None):
        super().__init__()
        self.report = report
        self.last_finite_loss: Optional[float] = None
        self.last_finite_step: Optional[int] = None
        self.loss_scale_history: list[list] = []

    def _loss_scale(self) -> Optional[float]:
        scale = getattr(self.model.optimizer, "dynamic_scale", None)
        return None if scale is None else float(np.asarray(scale))

    def on_train_begin(self, logs=None):
        self._step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        # Batches run, not optimizer.iterations: a float16 step skipped for Inf gradients does not count there.
        self._step = step = getattr(self, "_step", 0) + 1
        scale = self._loss_scale()
        if scale is not None and (not self.loss_scale_history or self.loss_scale_history[-1][1] != scale):
            self.loss_scale_history = (self.loss_scale_history + [[step, scale]])[-LOSS_SCALE_HISTORY:]
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(np.asarray(loss))
        if math.isfinite(loss):
            self.last_finite_loss, self.last_finite_step = loss, step
            return
        details = {
            "step": step,
            "loss": repr(loss),
            "last_finite_loss": self.last_finite_loss,
            "last_finite_step": self.last_finite_step,
            "learning_rate": _learning_rate(self.model.optimizer),
            "precision_policy": keras.mixed_precision.global_policy().name,
            "loss_scale_history": self.loss_scale_history if scale is not None else None,
        }
        if self.report is not None:
            self.report.run["divergence"] = details
        raise TrainingDiverged(
            f"training diverged: the loss is {loss} at step {step} (last finite: {self.last_finite_loss} at step "
            f"{self.last_finite_step}; learning rate {details['learning_rate']}, policy "
            f"{details['precision_policy']}); nothing from this step on is saved (the last checkpoint, if any, "
            "is older)", details)


class InterruptHandler(keras.callbacks.Callback):
    """SIGINT/SIGTERM → save at the end of the current step, then raise `Interrupted` (see module docstring).

    Use as a context manager around the whole run (installs the handlers in the main
    thread, restores the previous ones on exit) and as a callback of `fit`. `save()` returns
    a description of what it saved.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, save: Optional[Callable[[], str]] = None):
        super().__init__()
        self.save = save
        self.pending: Optional[int] = None
        self.in_fit = False
        self._previous: dict = {}

    def __enter__(self) -> "InterruptHandler":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.in_fit and self.pending is None and self.save is not None:
            self.pending = signum
            log.warning("%s: finishing this step, saving, then stopping (send it again to stop at once)", name)
            return
        self._restore()
        raise Interrupted(signum, f"interrupted by {name} " + ("again: stopped without saving" if self.pending
                                                               else "before training started"),
                          hint="the last checkpoint/backup is kept; continue with --resume")

    def on_train_begin(self, logs=None):
        self.in_fit = True

    def on_train_end(self, logs=None):
        self.in_fit = False

    def _stop_if_asked(self) -> None:
        if self.pending is None:
            return
        signum = self.pending
        step = int(self.model.optimizer.iterations.numpy())
        saved = self.save()
        self.in_fit = False
        self._restore()
        raise Interrupted(signum, f"interrupted by {signal.Signals(signum).name} at step {step}; saved {saved}",
                          hint="continue with the same command plus --resume")

    def on_train_batch_end(self, batch, logs=None):
        self._stop_if_asked()

    def on_test_batch_end(self, batch, logs=None):
        self._stop_if_asked()
