"""TensorFlow's start-up chatter on a machine without an NVIDIA driver, hidden.

TensorFlow's Linux wheel probes for CUDA while it is imported and says so on file descriptor
2 before its logging is set up, so `TF_CPP_MIN_LOG_LEVEL` cannot hide it: on every CPU-only
machine each command would start with

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 … cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    (the same two lines again)

`hide_on_import()` (called by `cli.start()`) catches what is written to file descriptor 2
while `tensorflow` is imported, then writes it back without those lines. Everything else
written meanwhile (Python warnings, other TensorFlow lines, an import error) comes back.

Left: `E0000 … failed call to cuInit: … UNKNOWN ERROR (303)`, written when TensorFlow first
lists its devices. Listing them inside the import would hide it too, but then TensorFlow reads
`TF_XLA_FLAGS` before the commands set it (the XLA program cache,
tests/training/test_xla_shapes.py). `filtered_stderr` drops that line only after "Could not
find cuda drivers" (no driver); where a driver fails it is the diagnosis.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile

NO_DRIVER = b"Could not find cuda drivers on your machine"
CHATTER = (b"All log messages before absl::InitializeLog() is called are written to STDERR", NO_DRIVER)
CUINIT_FAILED = b"failed call to cuInit"


@contextlib.contextmanager
def filtered_stderr():
    """Catches file descriptor 2 for the block, then writes back every line but the chatter above."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.readlines()
            no_driver = any(NO_DRIVER in line for line in lines)
            for line in lines:
                if not any(text in line for text in CHATTER) and not (no_driver and CUINIT_FAILED in line):
                    os.write(2, line)


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, with a loader that imports it inside `filtered_stderr`."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # one import; and importlib.util.find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def quiet_exec_module(module):
                with filtered_stderr():
                    exec_module(module)

            spec.loader.exec_module = quiet_exec_module
        return spec


def hide_on_import() -> None:
    """Hides the chatter of the next `import tensorflow` in this process (nothing if it is imported)."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())
