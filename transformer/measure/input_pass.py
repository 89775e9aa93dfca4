"""One timed pass over a dataset of training batches: what an input pipeline costs, no model.

`time_pass` reads `((src, tgt_in), tgt_out)` batches to the end and returns wall and process
CPU seconds (all threads: what the pipeline takes from the cores a step would use), the wait
for the first batch, batches, rows, and real and padded target tokens (pad id 0).
"""

from __future__ import annotations

import time

import numpy as np


def time_pass(dataset) -> dict:
    """Reads one pass of `dataset`; seconds, counts and tokens as the module docstring says."""
    wall, cpu = time.perf_counter(), time.process_time()
    first, batches, rows, tokens, padded = None, 0, 0, 0, 0
    for _, tgt_out in dataset.as_numpy_iterator():
        first = time.perf_counter() - wall if first is None else first
        batches, rows = batches + 1, rows + tgt_out.shape[0]
        tokens, padded = tokens + int(np.count_nonzero(tgt_out)), padded + tgt_out.size
    return dict(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu, first_batch_s=first,
                batches=batches, rows=rows, target_tokens=tokens, target_padded=padded)
