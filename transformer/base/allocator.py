"""TensorFlow's CPU allocator for training: a caching (BFC) allocator instead of malloc per tensor.

    use_caching_allocator()      # a training command, after parsing its flags, before importing TensorFlow
    allocator_state()            # {"allocator": "bfc", "env": "true", "limit_mb": 24045} for reports

By default TensorFlow's CPU device allocates every tensor with the C library's `malloc` and
frees it after its last use. glibc serves a large block (above a threshold that starts at
128 KiB) with a fresh `mmap` and returns it with `munmap`, so a training step's activations
and gradients are new pages every step: the kernel zeroes each 4 KiB page on its first touch
(a page fault), inside whichever op writes it first. TensorFlow's best-fit-with-coalescing
allocator (the one it uses for GPU memory; for the CPU behind `TF_CPU_ALLOCATOR_USE_BFC`) keeps
freed blocks and hands them out again: no page faults once the process has reached its peak.

Measured on a 2-core AMD EPYC Zen 3 (avx2, no BF16), 2026-11-26, README's default model,
`scripts/train.py --data ../shared/data/bible-pt-en --epochs 1 --steps-per-epoch 50`, float32,
three pairs of processes alternated: page faults 1.83-2.00 M → 0.34 M per run, system time
10.4-10.9 → 4.3-4.9 s, target tokens/s 1,447 / 1,515 / 1,406 → 1,560 / 1,668 / 1,565 (+9.7%),
peak RSS 1.58-1.61 → 1.54 GB. Decoding did not gain (the float32 export against CTranslate2 in
the same process, two pairs: 0.84× / 0.92× with malloc, 0.74× / 0.87× with it), so the
decoding commands and the server keep TensorFlow's default (docs/speed.md, "The CPU allocator").

The variable is TensorFlow's: a user who set it keeps their value (`false`: malloc). The BFC
allocator's cap (`TF_CPU_BFC_MEM_LIMIT_IN_MB`, TensorFlow's default 64 GiB) is set to the
machine's physical memory unless the user set it, so it never refuses memory the machine has.
TensorFlow reads both when it creates its CPU device (its first op); set later they change
nothing. `allocator_state` reports the variables as they are (the step-time report's
`environment.cpu_allocator` adds what TensorFlow runs with, `running`).

TensorFlow-free at import.
"""

from __future__ import annotations

import os

USE_BFC_VAR = "TF_CPU_ALLOCATOR_USE_BFC"
LIMIT_VAR = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
TRUE_VALUES = ("1", "true")  # what TensorFlow's ReadBoolFromEnvVar reads as true (lower-cased)


def _reads_true(value: str | None) -> bool:
    """Whether TensorFlow reads the variable's value as true (unset: false, its default)."""
    return value is not None and value.strip().lower() in TRUE_VALUES


def physical_memory_mb() -> int | None:
    """The machine's physical memory in MiB, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (AttributeError, ValueError, OSError):
        return None


def use_caching_allocator(environ=None) -> bool:
    """Asks TensorFlow (not yet started) for its caching CPU allocator unless the user chose (`TF_CPU_ALLOCATOR_USE_BFC`).

    Args:
        environ: the environment to set (default `os.environ`).

    Returns:
        Whether the BFC allocator is asked for (False where the user set the variable to false).
    """
    environ = os.environ if environ is None else environ
    use_bfc = _reads_true(environ.setdefault(USE_BFC_VAR, "true"))
    memory = physical_memory_mb()
    if use_bfc and memory:
        environ.setdefault(LIMIT_VAR, str(memory))
    return use_bfc


def allocator_state(environ=None) -> dict:
    """For reports: {"allocator": "bfc" or "malloc", "env": the variable or None, "limit_mb": the BFC cap or None}."""
    environ = os.environ if environ is None else environ
    value = environ.get(USE_BFC_VAR)
    use_bfc = _reads_true(value)
    limit = environ.get(LIMIT_VAR)
    return {"allocator": "bfc" if use_bfc else "malloc", "env": value,
            "limit_mb": int(limit) if use_bfc and limit and limit.isdigit() else None}
