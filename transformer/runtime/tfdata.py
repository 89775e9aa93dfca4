"""The tf.data options every input pipeline of the project runs under: no autotuning thread.

With autotuning on (tf.data's default), each iterator runs a *model thread* that re-tunes
parallelism and buffer sizes on a period that doubles from 10 ms up to 60 s. Dropping the
iterator (the end of an epoch in `fit`, each evaluation, a counting pass, a garbage
collection) cancels that thread and waits for it to end. In TensorFlow 2.21 the wake-up can
be lost: `CancellationManager::StartCancel` runs the thread's wake-up callback *before* it
marks itself cancelled, so the woken thread can see "not cancelled" and sleep out the rest
of its period, up to 60 s. The thread that waits is the Python thread that dropped the
iterator, and it holds the GIL there: the whole process stops, CPU idle.

Measured on a 2-core AMD EPYC Zen 3 (no avx512_bf16 / amx_bf16), 2026-11-28: a map + prefetch pipeline read for 5 s,
left idle, then collected: 0.3 s or 5.5 s (the rest of its 10.2-s period), at random; with
the thread off, 0.3 s every time. In the test suite (2 workers) single tests stood still for
45-150 s in these destructors (gdb: `RootDataset::Iterator::~Iterator` →
`LogicalThreadWrapper` waiting; `Model::OptimizeLoop` asleep on its condition variable).

`with_pipeline_options(dataset)` sets `Options.autotune.enabled = False`. `AUTOTUNE`
parallelism is then tf.data's default, min(16, usable cores) (a 50-ms map probe ran at the
same rate as with autotuning on 2 cores), and `prefetch(AUTOTUNE)` buffers still grow on
demand (that tuner lives inside the prefetch iterator, no thread); `benchmark_pipeline.py`
measured no loss (docs/speed.md). Options set on the last stage apply to the whole pipeline
and to the datasets made from it (`take`, `repeat`; `with_options` merges).

Under a cgroup CPU quota below the affinity mask (`runtime.cpu_budget`) tf.data would still
count the host's cores for `AUTOTUNE` maps and its thread pool; the options then give it a
private pool of one thread per CPU of the quota, which also bounds those maps.
"""

from __future__ import annotations

import tensorflow as tf

from transformer.runtime.cpu_budget import cpu_budget


def pipeline_options() -> tf.data.Options:
    """tf.data options: the autotuning model thread off; a quota-sized pool (module docstring)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    budget = cpu_budget()
    if budget.limited:
        options.threading.private_threadpool_size = budget.cpus
    return options


def with_pipeline_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` under `pipeline_options()`; merges with options set before."""
    return dataset.with_options(pipeline_options())
