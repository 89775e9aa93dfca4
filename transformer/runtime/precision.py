"""`--mixed-precision auto` and `--xla auto`: the precision policy and XLA, decided per machine.

XLA's persistent program cache (`--xla-cache`) is `transformer.runtime.xla_cache`.

`decide_precision(...)` returns a `PrecisionDecision`: the mode (off | float16 | bfloat16),
its Keras policy, XLA on/off, and the reasons, which training logs in one line and writes
to report.json as `run.precision_decision`. Explicit values always win; "auto" decides:

* GPU (rules, no probe; untested here: no GPU): compute capability >= 8.0 (A100, L4, H100)
  → bfloat16; 7.x (V100, T4) → float16, which Keras's `compile` wraps in a
  `LossScaleOptimizer` (dynamic loss scaling); older or unknown → float32.
* CPU: bfloat16 only when the CPU has BF16 instructions (/proc/cpuinfo flags avx512_bf16,
  amx_bf16, or aarch64's bf16) *and* a short probe shows bf16 matmuls at least
  `MIN_BF16_SPEEDUP` × as fast as float32 ones; otherwise float32. Without the flags
  there is no probe: bf16 is emulated there, several times slower.
* TPU (`--strategy tpu`, untested here): bfloat16, XLA on.
* XLA on a GPU with the optimized pipeline: on only when the run is long enough to repay its
  compilations (`XlaWorkload`). XLA compiles one program per batch shape (train step, and
  evaluation step when fit validates). Measured on an H100 (default model, bfloat16, 16,384
  tokens per batch, 2026-11-26): a compilation takes 22-24 s with the GPU flags training sets
  (`transformer.runtime.xla_flags`; 47-52 s with XLA's own), and then a step takes 13-16 ms
  against 48.7 ms without XLA. In README's command with `--time-budget 5` the 6 programs took
  191 s in-run, one after the other (~32 s each). Compiled all at once before the first step
  (`training/xla_warmup.py`, 16 host cores) they took 44.7 s, and the run then trained 687k real
  target tokens/s against 293k without XLA (2.3×: the coarser grid pads 22% against 10%;
  2026-11-27). Rule: on when the tokens XLA trains after compiling, (planned time − compile
  time) × `GPU_XLA_SPEEDUP`, are at least `MIN_XLA_GAIN` × what the run trains without it. The
  compile time: `GPU_XLA_WARMUP_ROUND_S` per round of `compile_threads` programs compiled at once
  with the warm-up, else `GPU_XLA_COMPILE_S` per program; the planned time is the time budget,
  else planned steps × the measured non-XLA H100 step time. With the warm-up's 8 threads and the 7
  programs of the grid that is from a ~1.6-minute budget on (one after the other: ~8.2 minutes).
  Off for the naive pipeline (a new shape almost every batch) and on CPU (measured
  on a 2-core Xeon: 3× fewer tokens/s, one compilation per new bucket shape).

The probe (`probe_bf16_speedup`, about 1 s) times alternating chains of 1024² matmuls in both
dtypes and keeps the best time of each. Best-of does not survive a competing process: on a
2-core Intel Xeon (AMX) one busy thread beside the probe halved float32 (395 → 202 GFLOP/s:
one of its two matmul threads waits for a CPU), and on an Intel Xeon with avx512_bf16 but no
AMX a probe under load recorded bf16 1.34× float32 where idle it measures 0.63×. So the
probe also records whether it had the CPUs (`ProbeResult.busy`):

* its CPU share: the process's CPU time during the timed loops ÷ (wall time × matmul
  threads), the direct sign of starvation. On the 2-core AMX Xeon: 0.93-0.97 idle, 0.50
  beside one busy thread. Busy below `MIN_CPU_SHARE` (0.8). The matmul threads are the
  intra-op pool, at most the CPUs of `runtime.cpu_budget` (a cgroup CPU quota caps them).
* the other processes' share of its CPUs during the timed loops (`others_share`, Linux:
  `/proc/stat`'s busy time of the CPUs this process may use, steal included, less this
  process's CPU time, in CPUs; what the CPUs the matmul threads leave idle cannot hold,
  ÷ the matmul threads). On a 2-core EPYC Zen 4 (2026-12-02): 0.00-0.04 idle, 0.41-0.49
  beside one busy thread. Busy above `MAX_OTHERS_SHARE` (0.2).
* where `/proc/stat` cannot be read, the 1-minute load average at its start and end instead:
  busy when either exceeds cpus − 0.5. It lags both ways: it read 0.3-0.7 beside that busy
  thread, and it stays above 1.5 for a minute after a job on both CPUs has ended, which made
  every cell of a benchmark after the first look busy (three probes, nothing cached). It is
  still recorded.

A busy probe is taken again, up to `BUSY_PROBES` probes in all (about 1 s each), and the
first one that is not busy decides; when all are busy, the one with the largest CPU share
(the least starved) does. On a shared 2-core EPYC Zen 4 (2026-12-02) a single busy probe
(CPU share 65%) put bf16 at 1.2× float32 and chose float32, where the run's other probes,
at shares 68-93%, measured 1.9-2.3×.

Erring towards "busy" only costs a re-probe at the next run; a busy verdict kept would decide
every later run. A result is cached only when it is not busy and has these fields, in a JSON
file keyed by CPU model + identity (x86 family/model/stepping: a cloud VM's "AMD EPYC"
names Zen 3, 4 and 5 alike) + CPU flags + TensorFlow version + device + `PROBE_VERSION` + the CPU
budget (`runtime.cpu_budget`: the affinity mask capped by a cgroup quota):
`$TRANSFORMER_PRECISION_CACHE`, else `$XDG_CACHE_HOME/transformer-nmt/precision.json`
(default `~/.cache/...`); a cached entry that is busy or lacks the fields is probed again.
The decision's reason says whether the figures are fresh or cached, with the conditions they
were taken in. Delete the file to re-measure.

`$TRANSFORMER_AUTO_PRECISION` (off | float16 | bfloat16) pins what "auto" resolves to on a
machine, without probing (the test suite pins `off` so runs are the same on every CPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from transformer.base import atomic
from transformer.base.constants import PRECISION_MODES, PRECISIONS, one_of, user_cache_dir
from transformer.runtime.cpu_budget import affinity_cpus, cpu_budget

log = logging.getLogger(__name__)

POLICIES = {"off": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX-512 BF16, aarch64
REPORTED_CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f", "bf16")
MIN_BF16_SPEEDUP = 1.5  # bf16/fp32 matmul FLOP/s ratio needed to pick bfloat16 on CPU
MIN_CPU_SHARE = 0.8  # below: the probe was starved of CPU time (idle 0.93-0.97, one competing thread 0.50)
MAX_OTHERS_SHARE = 0.2  # above: other processes ran on the probe's CPUs (idle 0.00-0.04, one busy thread 0.41-0.49)
LOAD_MARGIN = 0.5  # without /proc/stat: busy when the 1-minute load average exceeds cpus - LOAD_MARGIN
BUSY_PROBES = 3  # probes at most while they come out busy (see the module docstring)
PROBE_VERSION = 2  # bump when the probe changes: older cache entries are then ignored
CACHE_ENV = "TRANSFORMER_PRECISION_CACHE"
PIN_ENV = "TRANSFORMER_AUTO_PRECISION"


@dataclass(frozen=True)
class DeviceFacts:
    """What the decision depends on, read once (`device_facts`) or injected by tests."""

    device: str  # "cpu" | "gpu" | "tpu"
    cpu_model: str = ""
    cpu_flags: tuple = ()  # the REPORTED_CPU_FLAGS the CPU has, sorted
    cpu_id: str = ""  # family / model / stepping (x86) or implementer / part / variant (Arm): `parse_cpu_id`
    gpu_capability: Optional[tuple] = None  # lowest (major, minor) over the visible GPUs

    @property
    def bf16_flags(self) -> tuple:
        return tuple(flag for flag in BF16_CPU_FLAGS if flag in self.cpu_flags)


@dataclass(frozen=True)
class ProbeResult:
    """bf16 vs float32 matmul speed on this CPU (GFLOP/s, best of several timings)."""

    float32_gflops: float
    bfloat16_gflops: float
    size: int
    seconds: float  # wall time the probe took
    load: Optional[float] = None  # 1-minute load average when it started
    cpus: Optional[int] = None  # CPUs this process may use
    load_end: Optional[float] = None  # 1-minute load average when it ended
    cpu_share: Optional[float] = None  # CPU time ÷ (wall time × matmul threads) over the timed loops
    taken_at: Optional[str] = None  # UTC, ISO 8601
    others_share: Optional[float] = None  # other processes' CPUs beyond the idle ones ÷ matmul threads, timed loops

    @property
    def speedup(self) -> float:
        return self.bfloat16_gflops / self.float32_gflops

    @property
    def busy(self) -> bool:
        """Other work competed for the CPUs (see the module docstring): used, never cached."""
        starved = self.cpu_share is not None and self.cpu_share < MIN_CPU_SHARE
        if self.others_share is not None:  # measured during the probe: the lagging load average is not needed
            return starved or self.others_share > MAX_OTHERS_SHARE
        loads = [load for load in (self.load, self.load_end) if load is not None]
        loaded = self.cpus is not None and any(load > self.cpus - LOAD_MARGIN for load in loads)
        return starved or loaded

    @property
    def cacheable(self) -> bool:
        """Taken idle, and measured with what shows it (CPU share, CPU count)."""
        return self.cpu_share is not None and self.cpus is not None and not self.busy

    def conditions(self) -> str:
        """What is known of the conditions: 'CPU share 95%, others 1%, load 0.3→0.4 on 2 CPUs'."""
        parts = [f"CPU share {self.cpu_share:.0%}"] if self.cpu_share is not None else []
        if self.others_share is not None:
            parts.append(f"others {self.others_share:.0%}")
        loads = "→".join(f"{load:.1f}" for load in (self.load, self.load_end) if load is not None)
        if loads:
            parts.append(f"load {loads}" + (f" on {self.cpus} CPUs" if self.cpus else ""))
        return ", ".join(parts) or "load not measured"


@dataclass(frozen=True)
class PrecisionDecision:
    """The resolved precision and XLA, with what was requested and why."""

    requested_precision: str  # auto | off | float16 | bfloat16
    requested_xla: Optional[bool]  # None: auto
    mixed_precision: str  # off | float16 | bfloat16 (what training uses)
    xla: bool
    reason: str
    xla_reason: str
    facts: DeviceFacts
    probe: Optional[ProbeResult] = None
    probe_cached: Optional[bool] = None  # None: no probe was needed

    @property
    def policy(self) -> str:
        """The Keras dtype policy name (float32 | mixed_float16 | mixed_bfloat16)."""
        return POLICIES[self.mixed_precision]

    @property
    def loss_scaling(self) -> bool:
        """Keras `compile` wraps the optimizer in a LossScaleOptimizer under mixed_float16."""
        return self.mixed_precision == "float16"

    def summary(self) -> str:
        """The one log line: policy, XLA and both reasons."""
        return f"precision {self.policy}, XLA {'on' if self.xla else 'off'}: {self.reason}; {self.xla_reason}"

    def to_dict(self) -> dict:
        """JSON-ready, for report.json's `run.precision_decision`."""
        return {
            "requested": {"mixed_precision": self.requested_precision,
                          "xla": "auto" if self.requested_xla is None else self.requested_xla},
            "mixed_precision": self.mixed_precision,
            "policy": self.policy,
            "loss_scaling": self.loss_scaling,
            "xla": self.xla,
            "reason": self.reason,
            "xla_reason": self.xla_reason,
            "device": dataclasses.asdict(self.facts),
            "probe": None if self.probe is None else {**dataclasses.asdict(self.probe),
                                                      "speedup": round(self.probe.speedup, 3),
                                                      "busy": self.probe.busy},
            "probe_cached": self.probe_cached,
        }


# --- device facts -------------------------------------------------------------------------

def parse_cpuinfo(text: str) -> tuple[str, tuple]:
    """(CPU model name, the REPORTED_CPU_FLAGS present) from /proc/cpuinfo text (x86 or aarch64)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    return model, tuple(sorted(flag for flag in REPORTED_CPU_FLAGS if flag in flags))


CPU_ID_FIELDS = (("cpu family", "family"), ("model", "model"), ("stepping", "stepping"),  # x86
                 ("cpu implementer", "implementer"), ("cpu part", "part"), ("cpu variant", "variant"))  # Arm


def parse_cpu_id(text: str) -> str:
    """The first CPU's identity from /proc/cpuinfo text: 'family 25 model 17 stepping 1' on x86,
    'implementer 0x41 part 0xd4f variant 0x0' on Arm; '' where none is given. Cloud VMs often
    show a generic model name ('AMD EPYC') for CPU generations that differ in speed."""
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "processor" and fields:
            break  # the first CPU's block only
        fields.setdefault(key, value.strip())
    return " ".join(f"{name} {fields[key]}" for key, name in CPU_ID_FIELDS if fields.get(key))


def cpuinfo_text() -> str:
    """/proc/cpuinfo's text; '' where it cannot be read (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def cpu_id(text: Optional[str] = None) -> str:
    """This machine's `parse_cpu_id` (of `text`, /proc/cpuinfo already read, if given); '' where
    /proc/cpuinfo is absent."""
    return parse_cpu_id(cpuinfo_text() if text is None else text)


def cpu_facts(text: Optional[str] = None) -> tuple[str, tuple]:
    """This machine's (CPU model, relevant flags), from `text` (/proc/cpuinfo already read) if
    given; flags are empty where /proc/cpuinfo is absent."""
    model, flags = parse_cpuinfo(cpuinfo_text() if text is None else text)
    return model or platform.processor() or platform.machine(), flags


def gpu_capability() -> Optional[tuple]:
    """Lowest compute capability over the visible GPUs, or None (untested here: no GPU)."""
    import tensorflow as tf

    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability:
            capabilities.append(tuple(int(part) for part in capability))
    return min(capabilities) if capabilities else None


def device_facts(device: str) -> DeviceFacts:
    """Facts for `device` ("cpu" or "gpu", as returned by `devices.select_device`)."""
    model, flags = cpu_facts()
    return DeviceFacts(device=device, cpu_model=model, cpu_flags=flags, cpu_id=cpu_id(),
                       gpu_capability=gpu_capability() if device == "gpu" else None)


# --- the probe and its cache --------------------------------------------------------------

def _busy_cpu_seconds(cpus: set) -> Optional[float]:
    """Seconds the CPUs `cpus` (indices) have spent busy since boot, steal included (Linux `/proc/stat`), or None."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        ticks = 0
        for line in lines:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
                ticks += user + nice + system + irq + softirq + steal
        return ticks / os.sysconf("SC_CLK_TCK") if ticks else None
    except (OSError, ValueError):
        return None


def _competing_share(others_cpus: float, cpus: int, threads: int) -> float:
    """Of `others_cpus` CPUs' worth of other work on the `cpus` CPUs, the share of the probe's
    `threads` it took: only what the CPUs the probe leaves idle (cpus − threads) cannot hold."""
    return max(0.0, others_cpus - (cpus - threads)) / threads


def _load_average() -> Optional[float]:
    """The 1-minute load average, or None where the OS has none."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def probe_threads() -> int:
    """The threads the probe's matmuls run on: TensorFlow's intra-op pool (0: one per CPU), capped
    by the CPUs this process may use (a cgroup CPU quota included)."""
    import tensorflow as tf

    usable = cpu_budget().cpus
    return min(usable, tf.config.threading.get_intra_op_parallelism_threads() or usable)


def probe_bf16_speedup(size: int = 1024, budget_s: float = 0.5, device: str = "/CPU:0") -> ProbeResult:
    """Times alternating float32 / bfloat16 matmul chains for about `budget_s`; best of each.

    Also records the load average at start and end, and the CPU share of the timed loops and
    the other processes' share of this process's CPUs during them (see the module docstring).
    """
    import time

    from transformer.runtime.flops import matmul_chain_timer

    load = _load_average()
    allowed = affinity_cpus()
    cpus, threads = len(allowed), probe_threads()
    started = time.perf_counter()
    timers = {dtype: matmul_chain_timer(dtype, device, size) for dtype in ("float32", "bfloat16")}
    iters = {dtype: max(1, int(0.03 / max(timed(2) / 2, 1e-6))) for dtype, timed in timers.items()}  # ~30 ms runs
    best = {dtype: float("inf") for dtype in timers}
    rounds = 0
    loops_started, cpu_started, busy_started = time.perf_counter(), time.process_time(), _busy_cpu_seconds(allowed)
    while rounds < 3 or (time.perf_counter() - started < budget_s and rounds < 20):
        for dtype, timed in timers.items():
            best[dtype] = min(best[dtype], timed(iters[dtype]) / iters[dtype])
        rounds += 1
    own, wall, busy_ended = time.process_time() - cpu_started, time.perf_counter() - loops_started, _busy_cpu_seconds(allowed)
    cpu_share = own / (wall * threads)
    others = (None if busy_started is None or busy_ended is None
              else round(_competing_share((busy_ended - busy_started - own) / wall, cpus, threads), 3))
    gflops = {dtype: 2.0 * size**3 / seconds / 1e9 for dtype, seconds in best.items()}
    return ProbeResult(round(gflops["float32"], 1), round(gflops["bfloat16"], 1), size,
                       round(time.perf_counter() - started, 3), load, cpus, _load_average(),
                       round(cpu_share, 3), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), others)


def cache_path() -> Path:
    """Where probe results are cached (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return user_cache_dir() / "precision.json"


def cache_key(facts: DeviceFacts) -> str:
    """Identifies the machine for the cache: CPU model + identity + flags + TensorFlow version +
    device + the CPUs the probe's threads may use and how many threads it runs (a container
    with a quota of 1 CPU on a 2-core host, or a process whose intra-op pool was set to one thread, gets
    its own entry: the probe measures what its matmul threads reach there)."""
    import tensorflow as tf

    fields = {"cpu_model": facts.cpu_model, "cpu_id": facts.cpu_id, "cpu_flags": list(facts.cpu_flags),
              "tensorflow": tf.__version__, "device": facts.device, "probe_version": PROBE_VERSION}
    if facts.device == "cpu":
        fields["cpus"], fields["threads"] = cpu_budget().cpus, probe_threads()
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def read_cache(path: Path, what: str) -> dict:
    """The entries of a JSON probe cache (`what`: its name in the warning); {} when absent or unreadable."""
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring unreadable %s cache %s (%s)", what, path, err)
        return {}
    return entries if isinstance(entries, dict) else {}


def _least_busy_probe(probe, attempts: int = BUSY_PROBES) -> ProbeResult:
    """`probe()` until one is not busy, at most `attempts` times: that one, else the busy one
    with the largest CPU share (the least starved; the first when none records a share)."""
    results = []
    for _ in range(attempts):
        results.append(probe())
        if not results[-1].busy:
            return results[-1]
    if len(results) > 1:
        log.info("bf16 probe busy %d times (%s): the least starved decides", len(results),
                 "; ".join(result.conditions() for result in results))
    return max(results, key=lambda result: -1.0 if result.cpu_share is None else result.cpu_share)


def cached_probe(facts: DeviceFacts, probe=probe_bf16_speedup) -> tuple[Optional[ProbeResult], bool]:
    """(probe result, from cache?): the cached result for this machine, else `probe()` (then cached).

    A probe that fails returns (None, False) and caches nothing. A probe taken on a busy
    machine is taken again (`_least_busy_probe`). One still busy, or without the fields that
    show it was not (`ProbeResult.cacheable`), is used for this run but not cached; such a
    cached entry is not used: the probe runs again.
    """
    path, key = cache_path(), cache_key(facts)
    entries = read_cache(path, "precision")
    entry = entries.get(key)
    if isinstance(entry, dict):
        try:
            cached = ProbeResult(**entry["probe"])
        except (KeyError, TypeError):
            log.warning("ignoring a malformed entry in the precision cache %s", path)
        else:
            if cached.cacheable:
                return cached, True
            log.info("cached bf16 probe not used (%s, %s): probing again",
                     "busy machine" if cached.busy else "no CPU share recorded", cached.conditions())
    try:
        result = _least_busy_probe(probe)
    except Exception as err:  # a probe must never stop training: fall back to float32
        log.warning("bf16 probe failed (%s): float32", err)
        return None, False
    if not result.cacheable:
        log.info("bf16 probe %s (%s): not cached", "taken on a busy machine" if result.busy else "without a CPU share",
                 result.conditions())
        return result, False
    entries[key] = {"cpu_model": facts.cpu_model, "cpu_id": facts.cpu_id, "cpu_flags": list(facts.cpu_flags),
                    "device": facts.device, "probe": dataclasses.asdict(result)}
    try:
        atomic.write_json(path, entries, sort_keys=True)
    except OSError as err:
        log.warning("could not cache the precision probe in %s (%s)", path, err)
    return result, False


# --- the decision -------------------------------------------------------------------------

def _auto_gpu(facts: DeviceFacts) -> tuple[str, str]:
    capability = facts.gpu_capability
    if capability is None:
        return "off", "GPU compute capability unknown → float32"
    shown = ".".join(map(str, capability))
    if capability >= (8, 0):
        return "bfloat16", f"GPU compute capability {shown} ≥ 8.0 has bf16 tensor cores → mixed_bfloat16"
    if capability >= (7, 0):
        return "float16", (f"GPU compute capability {shown} has float16 tensor cores but no fast bf16 → "
                           "mixed_float16 with dynamic loss scaling")
    return "off", f"GPU compute capability {shown} < 7.0 has no tensor cores → float32"


def _auto_cpu(facts: DeviceFacts, probe) -> tuple[str, str, Optional[ProbeResult], Optional[bool]]:
    cpu = (facts.cpu_model or "CPU") + (f" ({facts.cpu_id})" if facts.cpu_id else "")
    if not facts.bf16_flags:
        return "off", f"{cpu} has no BF16 instructions ({'/'.join(BF16_CPU_FLAGS)}) → float32", None, None
    flags = "+".join(facts.bf16_flags)
    result, cached = cached_probe(facts, probe)
    if result is None:
        return "off", f"{cpu} has {flags} but the bf16 probe failed → float32", None, False
    if cached:
        source = f"cached probe{f' of {result.taken_at}' if result.taken_at else ''}"
    else:
        source = ("fresh probe on a busy machine, not cached" if result.busy
                  else "fresh probe" if result.cacheable else "fresh probe, not cached")
    measured = (f"bf16 matmul {result.speedup:.1f}× fp32 ({result.bfloat16_gflops:.0f} vs "
                f"{result.float32_gflops:.0f} GFLOP/s; {source}: {result.conditions()})")
    if result.speedup >= MIN_BF16_SPEEDUP:
        return "bfloat16", f"{cpu} has {flags}; {measured} → mixed_bfloat16", result, cached
    return "off", f"{cpu} has {flags} but {measured} < {MIN_BF16_SPEEDUP}× → float32", result, cached


GPU_XLA_COMPILE_S = 32.0  # one XLA program in a training run, H100, xla_flags' GPU flags (6 programs: 191 s in-run)
GPU_XLA_WARMUP_ROUND_S = 45.0  # programs compiled at once by the warm-up, H100 host (6 on 16 cores: 44.7 s)
GPU_XLA_SPEEDUP = 2.3  # XLA ÷ non-XLA real target tokens/s, H100, 16,384 tokens, planned batches (687k ÷ 293k)
GPU_STEP_S = ((2048, 0.0355), (16384, 0.0479))  # (padded tokens per batch, non-XLA step s) on an H100 (measured)
MIN_XLA_GAIN = 1.25  # --xla auto on a GPU: XLA must train at least this many times the tokens, compiling included


def gpu_step_s(tokens_per_batch: int) -> float:
    """Non-XLA train step seconds on an H100 at `tokens_per_batch`: linear through `GPU_STEP_S`."""
    (t0, s0), (t1, s1) = GPU_STEP_S
    return max(s0 + (s1 - s0) * (tokens_per_batch - t0) / (t1 - t0), s0 / 2)


@dataclass(frozen=True)
class XlaWorkload:
    """What `--xla auto` weighs on a GPU: the XLA programs a run compiles against its training time.

    programs: batch shapes the compiled steps meet: the train step's, plus the evaluation
      step's when fit validates (each shape of each step is one XLA compilation).
    budget_s: the time budget in seconds, or None.
    steps: planned optimizer steps (epochs × batches per epoch), or None when not known.
    tokens_per_batch: padded tokens per batch per side, for the step-time estimate.
    compile_threads: programs compiled at once before training (the XLA warm-up's threads);
      1: each compiled when its shape first comes, one after the other.
    """

    programs: int
    budget_s: Optional[float] = None
    steps: Optional[int] = None
    tokens_per_batch: int = 2048
    compile_threads: int = 1

    def compile_s(self) -> float:
        """Seconds the run spends compiling its programs (H100 figures, module docstring)."""
        if self.compile_threads > 1:
            return -(-self.programs // self.compile_threads) * GPU_XLA_WARMUP_ROUND_S
        return self.programs * GPU_XLA_COMPILE_S

    def train_s(self) -> Optional[float]:
        """Planned training seconds: the budget, else steps × `gpu_step_s`; None when unknown."""
        if self.budget_s is not None:
            return self.budget_s
        return None if self.steps is None else self.steps * gpu_step_s(self.tokens_per_batch)


def _auto_xla(device: str, pipeline_kind: str, workload: Optional[XlaWorkload] = None) -> tuple[bool, str]:
    if device == "tpu":
        return True, "XLA on: TPU programs are always compiled"
    if device != "gpu":
        return False, "XLA off on CPU: measured 3× slower there (a compilation per bucket shape, no faster kernels)"
    if pipeline_kind != "optimized":
        return False, "XLA off: the naive pipeline makes a new batch shape (a new compilation) almost every step"
    train_s = workload.train_s() if workload is not None else None
    if train_s is None:
        return True, "XLA on: GPU with bucketed batches (run length not given: assumed long enough to repay compiling)"
    compile_s = workload.compile_s()
    step_ms = gpu_step_s(workload.tokens_per_batch) * 1e3
    planned = (f"the {train_s / 60:.3g}-minute budget" if workload.budget_s is not None
               else f"~{train_s / 60:.1f} min of training ({workload.steps:,} steps × {step_ms:.0f} ms)")
    gain = max(train_s - compile_s, 0.0) * GPU_XLA_SPEEDUP / train_s if train_s > 0 else 0.0
    compiling = (f"{workload.programs} programs compiled {workload.compile_threads} at once (~"
                 f"{GPU_XLA_WARMUP_ROUND_S:.0f} s a round, H100)" if workload.compile_threads > 1 else
                 f"{workload.programs} programs × ~{GPU_XLA_COMPILE_S:.0f} s to compile (H100)")
    cost = (f"{compiling} = {compile_s / 60:.1f} min of {planned}, then ~{GPU_XLA_SPEEDUP:.1f}× the tokens/s: "
            f"{gain:.2f}× the tokens")
    if gain >= MIN_XLA_GAIN:
        return True, f"XLA on: {cost} (≥ {MIN_XLA_GAIN}×)"
    return False, f"XLA off: {cost} (< {MIN_XLA_GAIN}×): too short to repay compiling (--xla on forces it)"


def decide_precision(mixed_precision: str = "auto", xla: Optional[bool] = None, device: str = "cpu",
                     pipeline_kind: str = "optimized", *, facts: Optional[DeviceFacts] = None,
                     probe=probe_bf16_speedup, workload: Optional[XlaWorkload] = None) -> PrecisionDecision:
    """Resolves `--mixed-precision` / `--xla` (possibly "auto" / None) for `device` (cpu | gpu | tpu).

    The one function scripts and notebooks call. `facts` and `probe` are injectable for
    tests; by default they are read from this machine (probe results cached, see
    `cache_path`). `workload`: what the run compiles and how long it trains, for XLA auto on
    a GPU (None: assumed long). Explicit values win; "auto" follows the rules of the module
    docstring.
    """
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"--mixed-precision must be {one_of(PRECISIONS)}, got {mixed_precision!r}")
    facts = facts or device_facts(device)
    result, cached = None, None
    pinned = os.environ.get(PIN_ENV, "").strip()
    if mixed_precision != "auto":
        mode, reason = mixed_precision, f"requested --mixed-precision {mixed_precision}"
    elif pinned:
        if pinned not in PRECISION_MODES:
            raise ValueError(f"${PIN_ENV} must be {one_of(PRECISION_MODES)}, got {pinned!r}")
        mode, reason = pinned, f"auto pinned by ${PIN_ENV}={pinned}"
    elif facts.device == "tpu":
        mode, reason = "bfloat16", "TPU: bfloat16 is its native matmul type → mixed_bfloat16"
    elif facts.device == "gpu":
        mode, reason = _auto_gpu(facts)
    else:
        mode, reason, result, cached = _auto_cpu(facts, probe)
    if xla is None:
        use_xla, xla_reason = _auto_xla(facts.device, pipeline_kind, workload)
    else:
        use_xla, xla_reason = bool(xla), f"requested {'--xla' if xla else '--no-xla'}"
    return PrecisionDecision(mixed_precision, xla, mode, use_xla, reason, xla_reason, facts, result, cached)
