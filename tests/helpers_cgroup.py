"""cgroups for tests: a fake `/` holding /proc/self and cgroup files, and a real child cgroup to run a process in."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from transformer.base.cgroups import cgroup_dirs

V2_HOST = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"  # mountinfo: cgroup v2 at /sys/fs/cgroup


def fake_cgroup_root(root: Path, cgroup: str, mountinfo: str, files: dict) -> Path:
    """`root` standing for `/`: proc/self/{cgroup,mountinfo} and the cgroup files `files` ({path: text})."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def child_cgroup(controller: str, limits: dict):
    """Yields the cgroup.procs file of a new child of this process's `controller` cgroup whose files
    `limits[version]` ({file: text}, written in order) are set; removes it after. Skips without one
    (needs root, and cgroup v1 or a delegated v2 subtree). For a pytest fixture: `yield from`."""
    for version, _, directory in cgroup_dirs(controller):
        child = directory / f"pytest-{controller}-{uuid.uuid4().hex[:8]}"
        try:
            child.mkdir()
        except OSError:
            continue
        try:
            for name, text in limits[version].items():
                (child / name).write_text(text)
        except OSError:
            child.rmdir()
            continue
        yield child / "cgroup.procs"
        child.rmdir()  # its processes have exited
        return
    pytest.skip(f"no writable cgroup {controller} controller (needs root; cgroup v1, or a delegated v2 subtree)")


def run_in_cgroup(procs: Path, *command: str, env: dict, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """Runs `command` as a process that first joins the cgroup of `procs` (its cgroup.procs file)."""
    shell = f'echo $$ > "{procs}" && exec "$@"'
    return subprocess.run(["sh", "-c", shell, "sh", *command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def clean_env(*drop: str) -> dict:
    """This process's environment without `drop`, TensorFlow's C++ logs quiet."""
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "TF_CPP_MIN_LOG_LEVEL": "3"}
