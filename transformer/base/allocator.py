"""TensorFlow's CPU allocator for training: a caching (BFC) allocator instead of malloc per tensor.

    use_caching_allocator()      # a training command, after parsing its flags, before importing TensorFlow
    allocator_state()            # {"allocator": "bfc", "env": "true", "limit_mb": 24045, "limit_from": …} for reports

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
machine's physical memory unless the user set it, so it never refuses memory the machine has;
in a container with a memory limit (`docker run --memory`, Kubernetes `limits.memory`;
`base.cgroups.memory_limit`), to that limit less `min(1 GiB, limit / 4)` for the rest of the
process. Without that, a batch too big for the container is not an error TensorFlow raises but
the kernel's OOM killer: SIGKILL, no error line, the report left `running`, nothing for
`--auto-batch` to catch. Measured on a 2-core AMD EPYC Zen 4, 2026-12-02, README's default model
at `--max-tokens 32768` in a cgroup v1 of 3 GiB: killed after 108 s (exit 137); with the cap
(2,304 MiB) TensorFlow raised `ResourceExhaustedError`, and with `--auto-batch` the run went on
at 16,384 and then 8,192 tokens and finished (docs/reliability.md, "Out of memory in a container").
TensorFlow reads both when it creates its CPU device (its first op); set later they change
nothing. `allocator_state` reports the variables as they are (the step-time report's
`environment.cpu_allocator` adds what TensorFlow runs with, `running`).

TensorFlow-free at import.
"""

from __future__ import annotations

import os

from transformer.base.cgroups import memory_limit

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


MAX_HEADROOM_MB = 1024  # a container's memory limit keeps min(this, limit / 4) for the process outside the allocator


def memory_budget_mb(root="/") -> tuple[int | None, str]:
    """(MiB the CPU allocator may hold, where that comes from): physical memory, or a cgroup memory limit
    less headroom for the rest of the process, whichever is smaller; (None, …) where neither is known."""
    physical = physical_memory_mb()
    limit, source = memory_limit(root)
    if limit is None:
        return physical, "physical memory"
    limit_mb = limit >> 20
    cap = limit_mb - min(MAX_HEADROOM_MB, limit_mb // 4)
    if physical is not None and physical <= cap:
        return physical, "physical memory"
    return cap, f"the cgroup memory limit {limit_mb:,} MiB of {source} less {limit_mb - cap:,} MiB"


def use_caching_allocator(environ=None) -> bool:
    """Asks TensorFlow (not yet started) for its caching CPU allocator unless the user chose (`TF_CPU_ALLOCATOR_USE_BFC`).

    Args:
        environ: the environment to set (default `os.environ`).

    Returns:
        Whether the BFC allocator is asked for (False where the user set the variable to false).
    """
    environ = os.environ if environ is None else environ
    use_bfc = _reads_true(environ.setdefault(USE_BFC_VAR, "true"))
    memory, _ = memory_budget_mb()
    if use_bfc and memory:
        environ.setdefault(LIMIT_VAR, str(memory))
    return use_bfc


def allocator_state(environ=None) -> dict:
    """For reports: {"allocator": "bfc" or "malloc", "env": the variable or None, "limit_mb": the BFC cap or None,
    "limit_from": what set the cap (`memory_budget_mb`'s reason, else the variable's name) or None}."""
    environ = os.environ if environ is None else environ
    value = environ.get(USE_BFC_VAR)
    use_bfc = _reads_true(value)
    limit = environ.get(LIMIT_VAR)
    limit_mb = int(limit) if use_bfc and limit and limit.isdigit() else None
    limit_from = None
    if limit_mb is not None:
        budget, reason = memory_budget_mb()
        limit_from = reason if limit_mb == budget else LIMIT_VAR
    return {"allocator": "bfc" if use_bfc else "malloc", "env": value, "limit_mb": limit_mb, "limit_from": limit_from}
