"""`StepTensorBoard`: Keras' TensorBoard callback without per-step work on steps it does not record.

Keras' `TensorBoard(update_freq=N)` records the batch-level scalars (`batch_loss`, ...) of
every N-th step, but still builds a `summary.scalar` op per log value on *every* step and
lets `record_if` drop it: about 1 ms per step on the 2-core AMD EPYC (docs/recipes.md).
This subclass returns early from `on_train_batch_end` on the steps that would not be
recorded, so what is written is the same, and delegates everything else (epoch summaries,
the graph, profiling) to Keras. It relies on the private attributes `_global_train_batch`,
`_should_write_train_graph` and `_should_trace` (Keras 3.15); without them it behaves as
Keras does.
"""

from __future__ import annotations

import keras


class StepTensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` that skips the unrecorded steps' summaries (same arguments)."""

    def on_train_batch_end(self, batch, logs=None):
        step = getattr(self, "_global_train_batch", None)
        idle = (isinstance(self.update_freq, int) and step is not None and step % self.update_freq != 0
                and not getattr(self, "_should_write_train_graph", True)
                and not getattr(self, "_should_trace", True) and not self.write_steps_per_second)
        if not idle:
            super().on_train_batch_end(batch, logs)
