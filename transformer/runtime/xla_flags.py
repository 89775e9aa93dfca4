"""XLA's GPU compiler flags for training: compile in half the time and run faster steps.

`enable_fast_gpu_compile()` adds `GPU_XLA_FLAGS` to `$XLA_FLAGS` (flags the user already set
there win, flag by flag). Measured on an NVIDIA H100 80GB, TensorFlow 2.21.0, the default model's
train step in bfloat16 at 16,384 tokens per batch, one shape (`[256, 64]`), 2026-11-26:

| `$XLA_FLAGS` | first step (compiling) | steady step |
|---|---|---|
| none (XLA's defaults) | 47-52 s | 15.5-18.8 ms |
| `--xla_gpu_enable_triton_gemm=false` | 31.5 s | 13.7 ms |
| both flags below | **22-24 s** | **13.3-15.6 ms** |
| `--xla_gpu_autotune_level=0` alone | 21.5 s | 54.1 ms |

XLA's default turns matrix products into Triton kernels and autotunes each one, which is most
of a compilation; with Triton's GEMMs off the products go to cuBLAS, whose heuristics need no
autotuning, and at this model's sizes they run faster too. Autotuning off alone leaves the
Triton kernels untuned: 3.5x slower steps, hence the two together.

XLA reads `$XLA_FLAGS` once, before its first compilation: set it before the first XLA
program of the process (training does, next to the persistent cache). The flags name GPU
passes only: CPU compilations ignore them.
"""

from __future__ import annotations

import os
from typing import Optional

XLA_FLAGS_ENV = "XLA_FLAGS"
GPU_XLA_FLAGS = ("--xla_gpu_enable_triton_gemm=false", "--xla_gpu_autotune_level=0")


def _name(flag: str) -> str:
    return flag.partition("=")[0]


def enable_fast_gpu_compile() -> Optional[str]:
    """Adds each of `GPU_XLA_FLAGS` that `$XLA_FLAGS` does not already name; returns the
    resulting `$XLA_FLAGS` (for the report), or None when nothing was added."""
    current = os.environ.get(XLA_FLAGS_ENV, "")
    named = {_name(item) for item in current.split()}
    added = [flag for flag in GPU_XLA_FLAGS if _name(flag) not in named]
    if not added:
        return None
    os.environ[XLA_FLAGS_ENV] = " ".join([current, *added]).strip()
    return os.environ[XLA_FLAGS_ENV]
