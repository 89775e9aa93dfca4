"""The process's cgroup limits, read from /proc and the cgroup file system: CPU quota, memory limit.

    cpu_quota()        # (2.5, "/sys/fs/cgroup/cpu.max") in a `docker run --cpus 2.5` container, else (None, None)
    memory_limit()     # (4294967296, "/sys/fs/cgroup/memory.max") under `--memory 4g`, else (None, None)

Read as Go's automaxprocs and the JVM do: the process's cgroup from `/proc/self/cgroup`, the
cgroup file system's mounts from `/proc/self/mountinfo` (v2, and v1's `cpu` / `memory`
hierarchies), each level from the process's own cgroup up to the mount's root, the smallest
limit winning. Missing, unlimited or malformed files count as no limit. `root` prefixes /proc
and /sys (tests). What the limits mean for training: `runtime.cpu_budget` (threads) and
`base.allocator` (the CPU allocator's cap). TensorFlow-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

UNLIMITED_BYTES = 1 << 60  # v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712)
LIMIT_FILES = {"cpu": {"v2": "cpu.max", "v1": "cpu.cfs_quota_us"},  # v1's period: cpu.cfs_period_us
               "memory": {"v2": "memory.max", "v1": "memory.limit_in_bytes"}}


def cpu_quota(root: str | Path = "/") -> tuple[Optional[float], Optional[str]]:
    """(CPUs of CPU time per period the tightest quota allows, its file), or (None, None)."""
    return _tightest("cpu", _read_cpu_quota, root, digits=3)


def memory_limit(root: str | Path = "/") -> tuple[Optional[int], Optional[str]]:
    """(bytes the tightest memory limit allows, its file), or (None, None)."""
    return _tightest("memory", _read_memory_limit, root)


def cgroup_dirs(controller: str, root: str | Path = "/") -> list[tuple[str, Path, Path]]:
    """(version "v1" | "v2", the mount's directory, this process's cgroup directory under it) for each
    mounted hierarchy that may hold `controller` ("cpu", "memory"); [] where /proc cannot tell."""
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
        for name in controllers.split(","):
            paths_v1[name] = path
    found = []
    for line in mounts:  # "36 25 0:30 /root /mount/point rw,... - cgroup2 cgroup2 rw,..."
        fields, _, tail = line.partition(" - ")
        fields, tail = fields.split(), tail.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, mount_point, fs_type, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fs_type == "cgroup2" and path_v2 is not None:
            version, path = "v2", path_v2
        elif fs_type == "cgroup" and controller in options and controller in paths_v1:
            version, path = "v1", paths_v1[controller]
        else:
            continue
        mount = root / mount_point.lstrip("/")
        found.append((version, mount, mount / _below(path, mount_root).lstrip("/")))
    return found


def _tightest(controller: str, read: Callable, root, digits: Optional[int] = None):
    """The smallest `read(directory, version)` over the process's cgroups and their ancestors, with its file."""
    root = Path(root)
    found = []
    for version, mount, directory in cgroup_dirs(controller, root):
        while True:
            limit = read(directory, version)
            if limit is not None:
                found.append((limit, str(Path("/") / directory.relative_to(root) / LIMIT_FILES[controller][version])))
            if directory == mount or directory == directory.parent:
                break
            directory = directory.parent
    if not found:
        return None, None
    limit, source = min(found)
    return (round(limit, digits) if digits is not None else limit), source


def _below(path: str, mount_root: str) -> str:
    """`path` relative to a mount of `mount_root` ("/" when the mount shows only a subtree above it)."""
    if mount_root in ("/", "") or path == mount_root:
        return "/" if path == mount_root else path
    return path[len(mount_root):] if path.startswith(mount_root + "/") else "/"


def _read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_cpu_quota(directory: Path, version: str) -> Optional[float]:
    """CPUs the quota in `directory` allows, or None (no file, no limit, unreadable)."""
    try:
        if version == "v2":
            quota, _, period = (_read_text(directory / LIMIT_FILES["cpu"]["v2"]) or "max").partition(" ")
            if quota == "max":
                return None
            quota, period = int(quota), int(period or 100000)
        else:
            quota = int(_read_text(directory / LIMIT_FILES["cpu"]["v1"]) or "-1")
            period = int(_read_text(directory / "cpu.cfs_period_us") or "0")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read_memory_limit(directory: Path, version: str) -> Optional[int]:
    """Bytes the memory limit in `directory` allows, or None (no file, no limit, unreadable)."""
    text = _read_text(directory / LIMIT_FILES["memory"][version])
    try:
        limit = int(text) if text not in (None, "max") else None
    except ValueError:
        return None
    return limit if limit is not None and 0 < limit < UNLIMITED_BYTES else None
