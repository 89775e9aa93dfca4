"""Atomic writes: a reader (or a crash) never sees a half-written file or directory.

    write_text(path, text)            temp file in the same directory, fsync, `os.replace`
    write_json(path, value)           the same for indented JSON (+ newline)
    with open_text(path) as f:        a file written in pieces (streams), renamed into place at the end
    with staged_directory(path) as staging:   build a directory in a temporary sibling;
        ...                                   it is renamed to `path` when the block succeeds
                                              and deleted when it raises
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TextIO


def write_text(path: str | Path, text: str) -> Path:
    """Writes `text` (UTF-8, newlines as given) to `path` in one piece; see `open_text`."""
    with open_text(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | Path, value: Any, *, sort_keys: bool = False, ensure_ascii: bool = True,
               default: Optional[Callable[[Any], Any]] = None) -> Path:
    """Writes `value` as JSON (indent 2, trailing newline) atomically; see `write_text`."""
    text = json.dumps(value, indent=2, sort_keys=sort_keys, ensure_ascii=ensure_ascii, default=default)
    return write_text(path, text + "\n")


def fsync(path: str | Path) -> None:
    """Flushes a file's or a directory's entry to disk (best effort where the OS refuses)."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged_directory(path: str | Path, *, keep_existing: bool = False, prefix: Optional[str] = None,
                     durable: bool = False) -> Iterator[Path]:
    """Yields an empty temporary sibling of `path`; renames it to `path` when the block succeeds.

    Args:
        path: the directory to create.
        keep_existing: if `path` appeared meanwhile (built concurrently), keep it and discard
            the staged copy. Default: replace it.
        prefix: name prefix of the temporary directory (default ".<name>."), so callers can
            recognise and clean up stale ones.
        durable: fsync every staged file, the directory and its parent (crash-safe on power loss).

    On an exception (also KeyboardInterrupt) the staged directory is deleted and `path` is
    left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix or f".{path.name}.", dir=path.parent))
    try:
        yield staging
        if durable:
            for file in sorted(p for p in staging.rglob("*") if p.is_file()):
                fsync(file)
            fsync(staging)
        if path.exists():
            if keep_existing:
                shutil.rmtree(staging)
                return
            shutil.rmtree(path)
        os.rename(staging, path)
        if durable:
            fsync(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def open_text(path: str | Path) -> Iterator[TextIO]:
    """A text file (UTF-8, `\\n` line ends) to write in pieces; it appears at `path` only when the
    block succeeds (temp file in the same directory, fsync, `os.replace`), else it is deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
