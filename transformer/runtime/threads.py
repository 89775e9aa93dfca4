"""TensorFlow's CPU thread pools: chosen for decoding, set once per process before its first op.

    used = configure_threads(decoding_threads(streams=3))   # before TensorFlow runs an op

TensorFlow runs a graph's ops on its inter-op pool and splits a large op over its intra-op
pool (default: one thread per core each). An exported Translator decodes `streams` loops at
once, and a decoder step is a few hundred small kernels: with the default intra-op pool every
kernel is handed to the pool's threads, with one intra-op thread it runs inline on the thread
that scheduled it, and the loops themselves fill the cores. On a 2-core Xeon that took the
float32 export from 153 to 223 sentences/s with 3 loops (docs/speed.md, "Thread settings").
So the commands that decode (translate, evaluate, serve and the decoding benchmarks) take
`decoding_threads` unless told otherwise (`--intra-op-threads`, `--inter-op-threads`), or
unless TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS are set, which always win.

Training keeps TensorFlow's defaults, except in a container whose cgroup CPU quota allows
fewer CPUs than its affinity mask shows (`runtime.cpu_budget`): TensorFlow would size its
pools to the host's cores and be throttled, so `training_threads` gives both pools one thread
per CPU of the quota (a 2-core EPYC Zen 4 under a 1-CPU quota: 1.19× `auto`, 1.22× float32). Decoding counts the
same budget as its cores.

TensorFlow fixes its pools when its runtime starts (the first op, a SavedModel load); a later
change raises RuntimeError. `configure_threads` then keeps what runs and says so once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import tensorflow as tf

from transformer.runtime.cpu_budget import CpuBudget, cpu_budget

log = logging.getLogger(__name__)

ENV_VARS = {"intra_op": "TF_NUM_INTRAOP_THREADS", "inter_op": "TF_NUM_INTEROP_THREADS"}


@dataclass(frozen=True)
class Threads:
    """Thread counts of TensorFlow's two CPU pools; 0 = TensorFlow's default (one per core)."""

    intra_op: int = 0
    inter_op: int = 0

    def to_dict(self) -> dict:
        """For JSON reports: {"intra_op": n, "inter_op": m}, 0 = TensorFlow's default."""
        return {"intra_op": self.intra_op, "inter_op": self.inter_op}

    def describe(self) -> str:
        def count(n):
            return str(n) if n else "default"
        return f"intra-op {count(self.intra_op)}, inter-op {count(self.inter_op)}"


def current_threads() -> Threads:
    """The pools' settings: TensorFlow's, else its environment variables' (0 where it picks its default)."""
    def setting(field, getter):
        return getter() or int(os.environ.get(ENV_VARS[field], "0") or 0)
    return Threads(setting("intra_op", tf.config.threading.get_intra_op_parallelism_threads),
                   setting("inter_op", tf.config.threading.get_inter_op_parallelism_threads))


def usable_cores() -> int:
    """CPUs worth a thread each: the affinity mask, capped by a cgroup CPU quota (`cpu_budget`)."""
    return cpu_budget().cpus


def training_threads(budget: CpuBudget | None = None) -> Threads:
    """Pools for training: TensorFlow's defaults, or one thread per CPU of `budget` in each
    pool when a cgroup quota caps it below the affinity mask (module docstring)."""
    budget = budget or cpu_budget()
    return Threads(intra_op=budget.cpus, inter_op=budget.cpus) if budget.limited else Threads()


def configure_training_threads() -> Threads:
    """The pools in effect after `configure_threads(training_threads())`; logs a capped budget."""
    budget = cpu_budget()
    used = configure_threads(training_threads(budget))
    if budget.limited:
        log.info("CPU budget %s: TensorFlow's pools %s (TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS win)",
                 budget.describe(), used.describe())
    return used


def decoding_threads(streams: int, cores: int | None = None, *, intra_op: int | None = None,
                     inter_op: int | None = None) -> Threads:
    """Pools for a process that decodes with `streams` concurrent loops on `cores` CPUs.

    Several loops: one inter-op thread per loop and the cores shared among them for each op
    (`cores // streams`, at least 1: on 2 cores, 1 intra-op thread, each kernel inline). One
    loop: TensorFlow's defaults. `intra_op` / `inter_op` (flags; 0 = TensorFlow's default)
    replace the choice. Measured on 2 cores only (docs/speed.md, "Thread settings"): with
    3 loops, inter-op 3 beat 2 and 4.
    """
    chosen = Threads()
    if streams > 1:
        cores = cores or usable_cores()
        chosen = Threads(intra_op=max(1, cores // streams), inter_op=streams)
    return Threads(chosen.intra_op if intra_op is None else intra_op,
                   chosen.inter_op if inter_op is None else inter_op)


def configure_threads(wanted: Threads) -> Threads:
    """Sets the pools to `wanted` (0 fields left alone) where TensorFlow still allows it.

    An environment variable (TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS) wins over
    `wanted`. Returns the settings in effect; when TensorFlow's runtime has already started,
    those it runs with, and a warning says the request was not applied.
    """
    setters = {"intra_op": tf.config.threading.set_intra_op_parallelism_threads,
               "inter_op": tf.config.threading.set_inter_op_parallelism_threads}
    before = current_threads()
    try:
        for field, setter in setters.items():
            value = getattr(wanted, field)
            if value and not os.environ.get(ENV_VARS[field]) and value != getattr(before, field):
                setter(value)
    except RuntimeError:
        log.warning("TensorFlow's thread pools had already started (%s); %s not applied: set them before "
                    "TensorFlow runs its first op", before.describe(), wanted.describe())
        return before
    return current_threads()
