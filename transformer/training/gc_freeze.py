"""`FreezeLongLived`: keeps Python's full garbage collections short during `fit`.

Tracing the train step (and, at the first evaluation, the greedy decoder) creates a large
number of long-lived Python objects (graphs, ops, their metadata). Every full (generation 2)
collection scans all of them, between steps: about a second each even for a tiny model on
the shared 2-core AMD EPYC. `gc.freeze()` moves the objects that exist at that moment into
a permanent generation that collections no longer scan (objects freed by reference counting
are still freed). This callback freezes after the first training step (traced by then) and
after each step that ran an evaluation (the report gained one), and unfreezes when
training ends.
"""

from __future__ import annotations

import gc

import keras


class FreezeLongLived(keras.callbacks.Callback):
    """`gc.freeze()` after the first step of `fit` and after steps that evaluated.

    Args:
        report: StepTimeReport or None. A new entry in its `evaluations` triggers a freeze.
    """

    def __init__(self, report=None):
        super().__init__()
        self.report = report
        self.freezes = 0
        self._seen = None  # evaluations seen at the last freeze

    def _evaluations(self) -> int:
        return len(self.report.evaluations) if self.report is not None else 0

    def on_train_begin(self, logs=None):
        self._seen = None

    def on_train_batch_end(self, batch, logs=None):
        if self._seen is None or self._evaluations() != self._seen:  # first step, or it evaluated
            gc.freeze()
            self.freezes += 1
            self._seen = self._evaluations()

    def on_train_end(self, logs=None):
        if self.freezes:
            gc.unfreeze()  # collections after training see everything again
