"""One error path for every script: `error: <message>` + `hint: <one line>`, no traceback.

The project's own errors derive from `ProjectError` (bad input and usage: `InputError`,
exit status 2; failures at run time: exit status 1). `command` wraps a script's
`main(argv)` so that these errors, environment errors that name a file (`OSError` with a
filename: unwritable `--output`, a missing `--file`, a full disk) and interruptions
(Ctrl-C, SIGTERM) end with two lines on stderr and an exit status:

    2    bad input or usage (data, config, flags, device, damaged artifact, locked run)
    1    failure at run time (diverged training, out of memory, disk full)
    130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM (128 + signal number)

Anything else is a bug: its traceback is printed as Python does (exit status 1). `--debug`
(removed from argv before `main` sees it) or `TRANSFORMER_DEBUG=1` re-raises every error
with its traceback. This module imports neither TensorFlow nor the rest of the package.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
from typing import Callable, Optional, Sequence

DEBUG_FLAG = "--debug"
DEBUG_ENV = "TRANSFORMER_DEBUG"
EXIT_RUNTIME = 1
EXIT_USAGE = 2
DEFAULT_HINT = f"run again with {DEBUG_FLAG} (or {DEBUG_ENV}=1) to see the traceback"
_RUNTIME_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


class ProjectError(Exception):
    """An error the user can act on. `hint` is one line saying what to do next."""

    exit_status = EXIT_RUNTIME
    hint: Optional[str] = None

    def __init__(self, message: str = "", hint: Optional[str] = None):
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class InputError(ProjectError):
    """Bad input or usage: data, config, flags, device, artifacts, run directory (exit 2)."""

    exit_status = EXIT_USAGE


class ConfigError(InputError, ValueError):
    """A config value or flag is invalid; the message names the key (and flag)."""

    hint = "see `--help` for the flag's allowed values, or fix the key in config.json"


class RunDirError(InputError):
    """The run directory (--output / --model) cannot be used as asked."""


class OutputExistsError(RunDirError, FileExistsError):
    """The output already exists and would be overwritten; the hint says how to proceed."""


class ArtifactError(InputError):
    """A run directory, tokenizer or export is missing a part or damaged; the hint rebuilds it."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or directory the command needs is absent; the message names it, the hint rebuilds it."""


class OutOfMemoryError(ProjectError, MemoryError):
    """Training ran out of memory and `--auto-batch` could not (or was not asked to) go smaller (exit 1)."""

    hint = ("add --auto-batch (it halves the batch and restarts from the last checkpoint) or lower --max-tokens "
            "(--batch-size with --pipeline naive)")


class Interrupted(KeyboardInterrupt):
    """Stopped by a signal (SIGINT/SIGTERM) after saving what could be saved; see `message`."""

    def __init__(self, signum: int = signal.SIGINT, message: str = "", hint: Optional[str] = None):
        super().__init__(message)
        self.signum = int(signum)
        self.message = message
        self.hint = hint


def debug_requested(argv: Optional[Sequence[str]] = None) -> bool:
    return DEBUG_FLAG in (argv or ()) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def describe(err: BaseException) -> Optional[tuple[str, str, int]]:
    """(message, hint, exit status) for an error the user should see without a traceback, else None."""
    if isinstance(err, Interrupted):
        name = signal.Signals(err.signum).name
        return (err.message or f"interrupted by {name}",
                err.hint or "the run directory holds what was saved; continue with --resume", 128 + err.signum)
    if isinstance(err, KeyboardInterrupt):
        return "interrupted by SIGINT (Ctrl-C)", "nothing was saved past the last checkpoint", 128 + signal.SIGINT
    if isinstance(err, ProjectError):
        return str(err), err.hint or DEFAULT_HINT, err.exit_status
    if isinstance(err, OSError) and (err.filename is not None or err.errno in _RUNTIME_ERRNOS):
        where = f": {err.filename}" if err.filename is not None else ""
        reason = err.strerror or str(err)
        if err.errno in _RUNTIME_ERRNOS:
            return (f"{reason}{where}", "free disk space (or choose another --output) and run again; "
                    "with --resume training continues from the last complete checkpoint", EXIT_RUNTIME)
        return f"{reason}{where}", "check the path and its permissions", EXIT_USAGE
    return None


def report_error(err: BaseException, stream=None) -> int:
    """Prints `error:`/`hint:` for a known error and returns its exit status; re-raises others."""
    described = describe(err)
    if described is None:
        raise err
    message, hint, status = described
    stream = stream or sys.stderr
    print(f"error: {message}", file=stream)
    print(f"hint: {hint}", file=stream)
    return status


def command(main: Callable[[Optional[list]], int]) -> Callable[[Optional[list]], int]:
    """Decorates a script's `main(argv) -> int` with the one error path (see the module docstring)."""

    @functools.wraps(main)
    def wrapped(argv: Optional[Sequence[str]] = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        debug = debug_requested(argv)
        argv = [arg for arg in argv if arg != DEBUG_FLAG]
        try:
            return main(argv)
        except (Exception, KeyboardInterrupt) as err:
            if debug or describe(err) is None:
                raise
            return report_error(err)

    return wrapped
