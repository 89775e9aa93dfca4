"""The CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota.

    budget = cpu_budget()      # CpuBudget(affinity=16, quota=2.0, ...): budget.cpus == 2

A container's CPU limit (`docker run --cpus 2`, a Kubernetes `limits.cpu`) is usually not
an affinity mask but a CFS bandwidth quota: the cgroup may run `quota` µs of CPU time per
`period` µs, spread over every core of the host. `os.cpu_count()` and the affinity mask
still show the host's cores, and TensorFlow sizes its thread pools from them
(tensorflow/tensorflow#17206, open). The kernel then throttles the whole cgroup each time the pools have
spent the period's quota, and threads that wait on each other (an op split over the
intra-op pool) wait out the throttled ones. Measured on a 2-core AMD EPYC Zen 4 (`avx512_bf16`,
no AMX), 2026-12-02, in a cgroup v1 with a 1-CPU quota (`cpu.cfs_quota_us` 100000 of
100000), README's default model, float32, 40 steps: TensorFlow's pools (2 + 2 threads) 1,349
real target tokens/s, 8 + 8 threads (as on an 8-core host) 1,303, pools of 1 thread 1,642
(1.22×) (docs/devices.md, "A container's CPU quota").

`cpu_budget()` reads the quota with `base.cgroups.cpu_quota` (v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`, the tightest of the process's cgroup and its
ancestors). The budget rounds down (7.6 CPUs of
quota → 7 threads; one thread more than the quota can run gets the group throttled), at least 1.
No cgroup, no quota, another OS: the affinity mask alone, as before. Nothing here imports
TensorFlow (the precision probe reads it before TensorFlow starts).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from transformer.base.cgroups import cpu_quota


@dataclass(frozen=True)
class CpuBudget:
    """CPUs of the affinity mask, and the cgroup quota that may cap them."""

    affinity: int  # CPUs in this process's affinity mask (every CPU where the OS has no mask)
    quota: Optional[float] = None  # CPUs of CPU time per period a cgroup allows (quota ÷ period); None: no limit
    quota_file: Optional[str] = None  # the cgroup file that set `quota`

    @property
    def cpus(self) -> int:
        """Threads worth running at once: the affinity mask, capped by the quota rounded down, at least 1."""
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.floor(self.quota)))

    @property
    def limited(self) -> bool:
        """The quota allows fewer CPUs than the affinity mask shows (TensorFlow's pools would oversubscribe)."""
        return self.cpus < self.affinity

    def describe(self) -> str:
        """'2 of 16 CPUs (cgroup quota 2.50 CPUs, /sys/fs/cgroup/cpu.max)' or '2 CPUs'."""
        if self.quota is None:
            return f"{self.affinity} CPUs"
        return f"{self.cpus} of {self.affinity} CPUs (cgroup quota {self.quota:.2f} CPUs, {self.quota_file})"

    def to_dict(self) -> dict:
        """For JSON reports."""
        return {"cpus": self.cpus, "affinity": self.affinity, "quota": self.quota, "quota_file": self.quota_file}


def affinity_cpus() -> set:
    """Indices of the CPUs this process may run on (every CPU where the OS has no affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def cpu_budget(root: str | Path = "/") -> CpuBudget:
    """This process's `CpuBudget` (module docstring); `root` prefixes /proc and /sys (tests)."""
    quota, source = cpu_quota(root)
    return CpuBudget(affinity=len(affinity_cpus()), quota=quota, quota_file=source)
