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

`cpu_budget()` reads the quota the way Go's automaxprocs and the JVM do: the process's cgroup
from `/proc/self/cgroup`, the cgroup file system's mount from `/proc/self/mountinfo` (v2
`cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), each level from the process's own
cgroup up to the mount's root, the smallest limit winning. The budget rounds down (7.6 CPUs of
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

LIMIT_FILES = {"v2": "cpu.max", "v1": "cpu.cfs_quota_us"}  # v1's period: cpu.cfs_period_us


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
    quota, source = cgroup_cpu_quota(root)
    return CpuBudget(affinity=len(affinity_cpus()), quota=quota, quota_file=source)


def cgroup_cpu_quota(root: str | Path = "/") -> tuple[Optional[float], Optional[str]]:
    """(CPUs the cgroup quota allows, the file that says so), or (None, None) without a quota.

    The smallest limit over the process's cgroup and its ancestors up to the mount's root,
    cgroup v2 and v1's `cpu` controller. Unreadable or malformed files count as no limit.
    """
    root = Path(root)
    found = []
    for version, mount, directory in cpu_cgroups(root):
        while True:
            limit = _read_limit(directory, version)
            if limit is not None:
                found.append((limit, str(Path("/") / directory.relative_to(root) / LIMIT_FILES[version])))
            if directory == mount or directory == directory.parent:
                break
            directory = directory.parent
    if not found:
        return None, None
    limit, source = min(found)
    return round(limit, 3), source


def cpu_cgroups(root: str | Path = "/") -> list[tuple[str, Path, Path]]:
    """(version "v1" | "v2", the mount's directory, this process's cgroup directory under it) for each
    mounted cgroup hierarchy that may hold a CPU controller; [] where /proc cannot tell."""
    root = Path(root)
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    paths_v1, path_v2 = {}, None
    for line in memberships:  # "0::/path" (v2) or "4:cpu,cpuacct:/path" (v1)
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            path_v2 = path
        for controller in controllers.split(","):
            paths_v1[controller] = path
    found = []
    for line in mounts:  # "36 25 0:30 /root /mount/point rw,... - cgroup2 cgroup2 rw,..."
        fields, _, tail = line.partition(" - ")
        fields, tail = fields.split(), tail.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, mount_point, fs_type, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fs_type == "cgroup2" and path_v2 is not None:
            version, path = "v2", path_v2
        elif fs_type == "cgroup" and "cpu" in options and "cpu" in paths_v1:
            version, path = "v1", paths_v1["cpu"]
        else:
            continue
        mount = root / mount_point.lstrip("/")
        found.append((version, mount, mount / _below(path, mount_root).lstrip("/")))
    return found


def _below(path: str, mount_root: str) -> str:
    """`path` relative to a mount of `mount_root` ("/" when the mount shows only a subtree above it)."""
    if mount_root in ("/", "") or path == mount_root:
        return "/" if path == mount_root else path
    return path[len(mount_root):] if path.startswith(mount_root + "/") else "/"


def _read_limit(directory: Path, version: str) -> Optional[float]:
    """CPUs the quota in `directory` allows, or None (no file, no limit, unreadable)."""
    try:
        if version == "v2":
            quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
            if quota == "max":
                return None
            quota, period = int(quota), int(period or 100000)
        else:
            quota = int((directory / "cpu.cfs_quota_us").read_text().strip())
            period = int((directory / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
