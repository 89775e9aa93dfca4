"""Fused CPU kernels for the training step, compiled on this machine on first use.

    state = enable_fused_kernels("auto", device="cpu", xla=False)  # the trainer, before the first step is traced
    ops = active_kernels()   # a layer, while tracing a training call: the op library, or None

On a CPU without XLA, TensorFlow runs a layer norm or an attention softmax as a chain of small
element-wise and reduction kernels, each a pass over memory: on an AMX Xeon those passes were
most of the mixed-precision step's time outside matrix products (docs/speed.md). `fused_kernels.cc`
does each in one pass forward and one back: `FusedLayerNorm` (and its gradient),
`FusedAttentionSoftmax` (mask, float32 softmax and dropout; its gradient recomputes the dropout
mask from the seed), `FusedBiasRelu` (a bfloat16 product's bias, ReLU and dropout, so that the
product runs alone: oneDNN's AMX matmul; its gradient sums the bias gradient in the same pass) and
`FusedCrossEntropy` (the label-smoothed loss; its gradient recomputes the softmax). Where
TensorFlow's oneDNN ops are off (its default on AVX2-only CPUs such as an AMD EPYC Zen 3), the
attention's per-(row, head) float32 products run as `SmallBatchMatMul` too (`small_product_kernels`):
TensorFlow's own BatchMatMul there computes each small matrix as an Eigen tensor contraction at a
few GFLOP/s. The model's
`LayerNorm`, attention and `affine` layers (the FFN's dropout too) use them in training calls while
they are enabled (`active_kernels`), the loss in every call then; inference (BLEU, the translator,
every export) keeps TensorFlow's own ops, so a SavedModel never needs this library.

The library is built with the machine's C++ compiler (`$CXX`, else `g++`/`c++`) against the installed
TensorFlow's headers (`tf.sysconfig`), `-O3 -march=native`, into
`$XDG_CACHE_HOME/transformer-nmt/kernels/<key>/` (default `~/.cache/...`; key: the source,
TensorFlow's version, the compiler and the machine, as the XLA cache's `machine_key`): about 10 s,
once per machine. `auto` (the default) uses them for a CPU run without XLA when the build
succeeds, and otherwise says why not (no compiler, a GPU, XLA) and trains with TensorFlow's ops;
`on` makes a failed build an error; `off` never builds them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from transformer.base.constants import user_cache_dir
from transformer.base.errors import ConfigError
from transformer.runtime.onednn import onednn_enabled
from transformer.runtime.xla_cache import machine_key

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fused_kernels.cc")
LIBRARY_NAME = "fused_kernels.so"
CACHE_ENV = "TRANSFORMER_KERNEL_CACHE"  # a directory for the built library (default: under XDG_CACHE_HOME)
# -march=native on a CPU with AVX512-FP16 makes Eigen's headers (TF 2.21) fail to compile: that
# extension is turned off first; a compiler too old to know the flag gets the next set.
_ARCH_FLAGS = (["-march=native", "-mno-avx512fp16"], ["-march=native"], [])
_COMPILE_FLAGS = ["-shared", "-fPIC", "-O3", "-fopenmp-simd", "-fno-math-errno", "-w"]

_active = None  # the loaded op library while enabled
_small_products = False  # whether the attention's batched products use it too (oneDNN's ops off)
_loaded = None  # (op library, path): the one library this process loaded


class KernelsUnavailable(ConfigError):
    """The fused kernels cannot be used here; the message says why (for the log and `--fused-kernels on`)."""


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise KernelsUnavailable("no C++ compiler found (install g++, or set CXX)")
    return compiler


def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        raise KernelsUnavailable(f"C++ compiler {compiler!r} does not run: {err}") from err
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else ""


def kernel_cache_dir() -> Path:
    """Where built libraries are kept: `$TRANSFORMER_KERNEL_CACHE`, else `$XDG_CACHE_HOME/transformer-nmt/kernels`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return user_cache_dir() / "kernels"


def build_library(cache_dir: Optional[Path] = None) -> tuple[Path, float]:
    """The built library for this machine: (path, seconds spent compiling, 0 when it was cached).

    Raises:
        KernelsUnavailable: no compiler, or every compile attempt failed (the compiler's last line).
    """
    import tensorflow as tf

    compiler = _compiler()
    source = SOURCE.read_bytes()
    key_text = "\n".join([hashlib.sha256(source).hexdigest(), tf.__version__, _compiler_version(compiler),
                          machine_key(), " ".join(tf.sysconfig.get_compile_flags())])
    directory = (cache_dir or kernel_cache_dir()) / hashlib.sha256(key_text.encode()).hexdigest()[:16]
    library = directory / LIBRARY_NAME
    if library.exists():
        return library, 0.0
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{LIBRARY_NAME}.{os.getpid()}"  # renamed into place: a concurrent build is harmless
    started = time.perf_counter()
    error = ""
    for arch in _ARCH_FLAGS:
        command = [compiler, *_COMPILE_FLAGS, *arch, *tf.sysconfig.get_compile_flags(), str(SOURCE),
                   "-o", str(partial), *tf.sysconfig.get_link_flags()]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            os.replace(partial, library)
            return library, time.perf_counter() - started
        lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or [""]
        error = lines[-1].strip()
    partial.unlink(missing_ok=True)
    raise KernelsUnavailable(f"{compiler} could not build {SOURCE.name}: {error}")


def load_kernels(cache_dir: Optional[Path] = None) -> tuple:
    """(the op library of `tf.load_op_library`, its path, seconds spent building it), built first if needed.

    A process loads one library: TensorFlow registers its kernels globally, and a second library
    with the same ops (another cache directory) would make every later op ambiguous. Later
    calls return the first one (0 s).

    Raises:
        KernelsUnavailable: it cannot be built or loaded.
    """
    global _loaded
    if _loaded is not None:
        return _loaded[0], _loaded[1], 0.0
    import tensorflow as tf

    library, build_s = build_library(cache_dir)
    try:
        module = tf.load_op_library(str(library))
    except (tf.errors.NotFoundError, OSError) as err:
        raise KernelsUnavailable(f"{library} does not load: {err}") from err
    _loaded = (module, library)
    return module, library, build_s


def enable_fused_kernels(mode: str, device: str, xla: Optional[bool]) -> dict:
    """Turns the kernels on or off for this process's training calls, from `--fused-kernels`.

    Args:
        mode: "auto" (on for a CPU run without XLA when they build), "on" (the same, a failure is
            an error) or "off".
        device: the training device ("cpu", "gpu", "tpu").
        xla: whether the train step is compiled with XLA (XLA cannot compile these ops).

    Returns:
        For the step-time report: {"asked", "enabled", "reason", "library", "build_s",
        "small_batch_products" (whether the attention's float32 batched products use the library)}.

    Raises:
        KernelsUnavailable: `on` and they cannot be used (the reason).
    """
    global _active, _small_products
    _active, _small_products = None, False
    state = {"asked": mode, "enabled": False, "reason": "", "library": None, "build_s": None,
             "small_batch_products": False}
    if mode == "off":
        state["reason"] = "--fused-kernels off"
        return state
    try:
        if device != "cpu":
            raise KernelsUnavailable(f"they are CPU kernels and the run trains on {device}")
        if xla:
            raise KernelsUnavailable("XLA compiles the train step and cannot compile them")
        kernels, library, build_s = load_kernels()
    except KernelsUnavailable as err:
        if mode == "on":
            raise KernelsUnavailable(f"--fused-kernels on: {err} (--fused-kernels auto trains without them)") from err
        state["reason"] = str(err)
        log.info("fused CPU kernels off: %s", err)
        return state
    _active, _small_products = kernels, onednn_enabled() is False
    state.update(enabled=True, library=str(library), build_s=round(build_s, 2),
                 reason="a CPU run without XLA", small_batch_products=_small_products)
    log.info("fused CPU kernels on (layer norm, attention softmax + dropout%s)%s",
             ", the attention's float32 batched products: TensorFlow's oneDNN ops are off" if _small_products else "",
             f": built in {build_s:.1f} s" if build_s else "")
    return state


def disable_fused_kernels() -> None:
    """Back to TensorFlow's own ops for every later trace."""
    global _active, _small_products
    _active, _small_products = None, False


def active_kernels():
    """The op library while the kernels are enabled, else None (read while a training call is traced)."""
    return _active


def small_product_kernels():
    """The op library while the kernels are enabled in a process whose TensorFlow runs without its
    oneDNN ops (the attention's float32 batched products then go through `SmallBatchMatMul`), else None."""
    return _active if _small_products else None
