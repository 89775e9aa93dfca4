"""`ReplicaBatchTimer`: step timing under a tf.distribute strategy (see transformer/training/timing.py)."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from transformer.measure.reports import StepTimeReport
from transformer.training.timing import BatchCounts, BatchTimer, batch_counts


class ReplicaBatchTimer(BatchTimer):
    """`BatchTimer` that counts a distributed batch as the sum of this worker's replica parts.

    Under a strategy `model.train_function` receives a `DistributedIterator`; BatchTimer's
    wrapper still times `next()` on it, but the batch it yields holds per-replica values,
    which `batch_counts` cannot read. The parts of one global batch share their padded
    lengths, so their counts add up. In multi-worker training the counts (and FLOPs) are
    this worker's share.
    """

    def __init__(self, report: StepTimeReport, *, strategy: tf.distribute.Strategy, **kwargs):
        super().__init__(report, **kwargs)
        self.strategy = strategy

    def _count(self, batch) -> Optional[BatchCounts]:
        parts = [batch_counts(part, self.pad_id) for part in self.strategy.experimental_local_results(batch)]
        if not parts or None in parts:
            return None
        return BatchCounts(
            examples=sum(p.examples for p in parts),
            src_len=max(p.src_len for p in parts),
            tgt_len=max(p.tgt_len for p in parts),
            src_tokens=sum(p.src_tokens for p in parts),
            tgt_tokens=sum(p.tgt_tokens for p in parts),
        )


