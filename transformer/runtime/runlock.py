"""One writer per run directory: a lock file holding the owner's pid and host.

`RunLock(run_dir)` creates `run_dir/run.lock` with O_CREAT|O_EXCL (atomic on local and
NFS v3+ filesystems); a second process on the same `--output` gets a `RunLockedError`
naming the owner. A lock whose process is gone (same host, pid not running, or a pid
reused by a process that started after the lock) is stale: it is replaced, with a log line.
A lock from another host cannot be checked: the message says how to remove it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Optional

from transformer.base.errors import RunDirError

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"


class RunLockedError(RunDirError):
    """Another process is writing the run directory."""


def make_run_dir(path: str | Path) -> Path:
    """`mkdir -p path`, or RunDirError naming the path and why it cannot be created."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"cannot create the run directory {path}: {err.strerror or err}",
                          hint="choose a writable --output") from err
    if not os.access(path, os.W_OK):
        raise RunDirError(f"the run directory {path} is not writable", hint="choose a writable --output")
    return path


def _process_start(pid: int) -> Optional[float]:
    """Start time (epoch s) of a running process, None when there is no such process."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied, psutil absent
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0.0
        return 0.0


def owner_alive(owner: dict) -> bool:
    """Whether the lock's owner may still run (True when it cannot be checked: another host)."""
    if owner.get("host") != socket.gethostname():
        return True
    start = _process_start(int(owner.get("pid", -1)))
    if start is None:
        return False
    return not (start and owner.get("started") and start > float(owner["started"]) + 1)  # pid reused later


class RunLock:
    """Context manager holding `run_dir/run.lock` while a process writes the run directory."""

    def __init__(self, run_dir: str | Path, purpose: str = "train"):
        self.path = Path(run_dir) / LOCK_FILE
        self.purpose = purpose
        self.held = False

    def owner(self) -> Optional[dict]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def acquire(self) -> "RunLock":
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "purpose": self.purpose}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.owner()
                if owner is not None and owner_alive(owner):
                    raise RunLockedError(
                        f"{self.path.parent} is in use by pid {owner.get('pid')} on {owner.get('host')} "
                        f"({owner.get('purpose', 'train')}, since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(owner.get('started', 0)))})",
                        hint=f"wait for it or stop it, or choose another --output; if that process is gone "
                             f"(e.g. another machine crashed), delete {self.path}") from None
                log.warning("removing the stale lock %s of %s", self.path, owner or "an unreadable owner")
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self.held = True
            return self
        raise RunLockedError(f"could not take the lock {self.path} (another process took it meanwhile)")

    def release(self) -> None:
        if self.held:
            owner = self.owner()
            if owner is None or owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
