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

Then, when TensorFlow first lists its devices (its first op, or `tf.config.list_physical_devices`),
it writes `E0000 … failed call to cuInit: … UNKNOWN ERROR (303)`. Listing them inside the import
would be simpler, but TensorFlow would then read `TF_XLA_FLAGS` before the commands set it (the
XLA program cache, tests/training/test_xla_shapes.py). So where the import said there is no
driver, the first listing runs inside `filtered_stderr` too (`_hide_first_device_listing`): its
two entry points in `pywrap_tfe` are wrapped until one of them has run. The cuInit line is
dropped only where the import said "Could not find cuda drivers": where a driver fails, it is
the diagnosis, and nothing is wrapped.
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


class Caught:
    """What a `filtered_stderr` block saw: `no_driver` once it has ended."""

    def __init__(self, no_driver: bool):
        self.no_driver = no_driver


@contextlib.contextmanager
def filtered_stderr(no_driver: bool = False):
    """Catches file descriptor 2 for the block, then writes back every line but the chatter above
    (the cuInit failure too when the block, or before it the import (`no_driver`), said there is
    no driver). Yields a `Caught`."""
    sys.stderr.flush()
    saved = os.dup(2)
    caught = Caught(no_driver)
    with tempfile.TemporaryFile() as written:
        os.dup2(written.fileno(), 2)
        try:
            yield caught
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            written.seek(0)
            lines = written.readlines()
            caught.no_driver = no_driver or any(NO_DRIVER in line for line in lines)
            for line in lines:
                if not any(text in line for text in CHATTER) and not (caught.no_driver and CUINIT_FAILED in line):
                    os.write(2, line)


def _hide_first_device_listing() -> None:
    """Runs TensorFlow's first device listing inside `filtered_stderr(no_driver=True)`: the eager
    context's creation (`TFE_NewContext`, at the first op) or the physical devices' listing
    (`TF_ListPhysicalDevices`), whichever comes first; then both are TensorFlow's own again.
    Called once TensorFlow is imported (this layer imports no TensorFlow: it takes the module
    the import loaded, and leaves TensorFlow as it is if there is none)."""
    pywrap_tfe = sys.modules.get("tensorflow.python.pywrap_tfe")
    if pywrap_tfe is None:
        return
    originals = {name: getattr(pywrap_tfe, name) for name in ("TFE_NewContext", "TF_ListPhysicalDevices")}

    def restore() -> None:
        for name, function in originals.items():
            setattr(pywrap_tfe, name, function)

    def quiet(name):
        def call(*args, **kwargs):
            restore()
            with filtered_stderr(no_driver=True):
                return originals[name](*args, **kwargs)
        return call

    for name in originals:
        setattr(pywrap_tfe, name, quiet(name))


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
                with filtered_stderr() as caught:
                    exec_module(module)
                if caught.no_driver:
                    _hide_first_device_listing()

            spec.loader.exec_module = quiet_exec_module
        return spec


def hide_on_import() -> None:
    """Hides the chatter of the next `import tensorflow` in this process (nothing if it is imported)."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())
