"""XLA's persistent program cache (`--xla-cache`): where compiled programs are kept across runs.

`enable_xla_cache`: training names a directory in `$TF_XLA_FLAGS`
(`--tf_xla_persistent_cache_directory`) unless `--xla off`; XLA writes one file per compiled
program there and a later run that traces the same step loads it instead of
compiling (`xla_cache_dir` says when that is). Measured on a busy 2-core Intel Xeon with AMX
(load 5-7), default model in float32, the 7 shapes of the geometric grid: 109 s compiling
without the cache (12-20 s per shape), 104 s while writing it, 33 s when loading it (lowering
to XLA still runs per shape). A program of the default model takes ~9 MB; beyond
`XLA_CACHE_MAX_BYTES` (4 GiB) the oldest are deleted when a run starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from transformer.base.constants import user_cache_dir
from transformer.runtime.precision import cpu_facts, cpu_id, cpuinfo_text

XLA_CACHE_ENV = "TRANSFORMER_XLA_CACHE"
XLA_CACHE_FLAG = "--tf_xla_persistent_cache_directory"
XLA_CACHE_MAX_BYTES = 4 << 30  # older programs are deleted beyond this (~9 MB per program: default model, CPU)


def machine_key() -> str:
    """Identifies this machine's compiled code: CPU model, family/model/stepping and every CPU
    flag, TF version, GPU names.

    Compiled XLA programs are machine code: a cache on a home directory shared by several
    machines must not hand one machine's programs to another. Cloud VMs name several CPU
    generations alike ('AMD EPYC' for Zen 4 and Zen 5), so the CPU's identity is in the key too.
    """
    import tensorflow as tf

    text = cpuinfo_text()  # read once: the model, the identity and the flags come from it
    flags = ""
    for line in text.splitlines():
        if line.split(":")[0].strip().lower() in ("flags", "features"):
            flags = " ".join(sorted(line.partition(":")[2].split()))
            break
    fields = {"cpu_model": cpu_facts(text)[0], "cpu_id": cpu_id(text), "cpu_flags": flags,
              "tensorflow": tf.__version__, "gpus": _gpu_names()}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _gpu_names() -> list[str]:
    """GPU names from `nvidia-smi` (without starting TensorFlow's devices); [] without one."""
    import shutil
    import subprocess

    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        done = subprocess.run([binary, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(line.strip() for line in done.stdout.splitlines() if line.strip())


def xla_cache_dir(setting: str) -> Optional[Path]:
    """The directory of XLA's persistent cache for `--xla-cache` (auto | off | DIR); None: off.

    auto: `$TRANSFORMER_XLA_CACHE` (a directory, or off), else
    `$XDG_CACHE_HOME/transformer-nmt/xla/<machine_key()>` (default `~/.cache/...`): shared by
    the runs of this machine, so a program compiled once is loaded, not compiled, by later runs
    that trace the same step (same model, batch shapes, and start-up: TensorFlow names a traced
    function by a process-wide counter, which is part of the cache key, so a run that first
    learns its tokenizers keys its programs apart from the runs that load them).
    """
    if setting == "auto":
        setting = os.environ.get(XLA_CACHE_ENV, "").strip() or "auto"
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting)
    return user_cache_dir() / "xla" / machine_key()


def _xla_cache_files(directory: Optional[Path]) -> list[Path]:
    if directory is None or not directory.is_dir():
        return []
    return [path for path in directory.iterdir() if path.name.startswith("xla_compile_cache")]


def xla_cache_entries(directory: Optional[Path]) -> int:
    """Programs stored in an XLA persistent cache directory (0 when absent)."""
    return len(_xla_cache_files(directory))


def prune_xla_cache(directory: Path, max_bytes: int = XLA_CACHE_MAX_BYTES) -> int:
    """Deletes the oldest programs (by write time) until the cache holds ≤ max_bytes; returns how many."""
    files = []
    for path in _xla_cache_files(directory):
        try:
            stat = path.stat()
        except OSError:  # removed meanwhile (another run pruning)
            continue
        files.append((stat.st_mtime, stat.st_size, path))
    total, pruned = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files, key=lambda item: item[0]):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total, pruned = total - size, pruned + 1
    return pruned


def enable_xla_cache(setting: str) -> Optional[dict]:
    """Names the persistent cache directory in `$TF_XLA_FLAGS`; returns its report entry, or None.

    TensorFlow reads `$TF_XLA_FLAGS` once, when it first lists its devices, so this must run
    before that; later it has no effect (nothing is written while programs compile: training
    then warns). A directory already named in `$TF_XLA_FLAGS` wins. Prunes it first
    (`prune_xla_cache`). Entry: directory, entries_before, pruned.
    """
    flags = os.environ.get("TF_XLA_FLAGS", "")
    given = [item.partition("=")[2] for item in flags.split() if item.startswith(XLA_CACHE_FLAG + "=")]
    directory = Path(given[-1]) if given else xla_cache_dir(setting)
    if directory is None:
        return None
    if not given:
        os.environ["TF_XLA_FLAGS"] = f"{flags} {XLA_CACHE_FLAG}={directory}".strip()
    pruned = prune_xla_cache(directory)
    return {"directory": str(directory), "entries_before": xla_cache_entries(directory), "pruned": pruned}
