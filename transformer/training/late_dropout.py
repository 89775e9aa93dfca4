"""`LateDropout`: no dropout in the first epochs of a run, the model's rates after (`--dropout-from-epoch`).

Dropout regularises against overfitting, which a run far from it does not need yet: in the
first passes over the data it only slows learning (each step fits a thinned network) and
costs time (its random numbers were the largest non-matmul cost of the CPU step,
docs/speed.md). "Late dropout" (Liu et al. 2023, *Dropout Reduces Underfitting*) trains
without it first and turns it on once more passes over the same pairs start to overfit.

    switch = late_dropout_switch(model, config.train.dropout_from_epoch)   # under the strategy scope
    callbacks.append(LateDropout(switch, config.train.dropout_from_epoch))

Epochs are Keras' (a pass over the training split, or `--steps-per-epoch` steps), counted from
1 as the logs show them; a resumed run sets the switch for the epoch it resumes in. The
switch is a variable the traced step reads (`transformer.model.dropout.DropoutSwitch`), so
turning it on retraces nothing; checkpoints do not hold it.
"""

from __future__ import annotations

import logging
from typing import Optional

import keras

from transformer.model.dropout import DropoutSwitch, attach_dropout_switch, dropout_sites

log = logging.getLogger(__name__)


def late_dropout_switch(model: keras.Model, from_epoch: int) -> Optional[DropoutSwitch]:
    """A switch (off) attached to every dropout site of `model`, or None when dropout starts
    at epoch 1 or the model has no dropout site with a rate > 0 (nothing to switch)."""
    if from_epoch <= 1 or not dropout_sites(model):
        return None
    switch = DropoutSwitch(on=False)
    attach_dropout_switch(model, switch)
    return switch


class LateDropout(keras.callbacks.Callback):
    """Sets `switch` at each epoch's start: off before epoch `from_epoch` (1-based), on from it."""

    def __init__(self, switch: DropoutSwitch, from_epoch: int):
        super().__init__()
        self.switch, self.from_epoch = switch, from_epoch
        self._on: Optional[bool] = None

    def on_epoch_begin(self, epoch, logs=None):
        on = epoch + 1 >= self.from_epoch
        if on != self._on:
            self.switch.set(on)
            log.info("epoch %d: dropout %s (--dropout-from-epoch %d)", epoch + 1, "on" if on else "off",
                     self.from_epoch)
        self._on = on
