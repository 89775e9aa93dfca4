"""`--max-tokens auto`: the tokens per batch, decided for the device like the precision.

`decide_max_tokens(...)` returns a `BatchDecision` (the resolved `max_tokens`, what was
requested, why, and the probe's figures), which training logs in one line and writes to
report.json as `run.batch_decision`. Explicit values always win; "auto" decides:

* CPU: `RECIPE_MAX_TOKENS` (2048), the batch the default recipe was measured and tuned with
  on CPU (docs/recipes.md); no probe, so CPU runs are what they were.
* GPU: a short probe (`probe_max_tokens`): a few timed train steps of the real model at
  2048, 4096, … tokens up to `PROBE_CAP`, every batch at the longest padded length (the
  worst case for memory). It stops at the first out-of-memory error
  (`tf.errors.ResourceExhaustedError`) or when tokens/s gains less than `MIN_GAIN` over the
  previous budget, and keeps the last budget that fitted and still paid. Measured on an H100
  (bf16, no XLA): 2,048 tokens → 45,252 target tokens/s, 16,384 → 273,220: the CPU's batch
  leaves most of a GPU idle. `PROBE_CAP` is 16,384 (8× the recipe's batch) because tokens/s is
  not what a run is judged by: on the H100 (2026-11-26) the probe up to 65,536 chose 65,536
  (467k padded tokens/s against 299k at 16,384), and README's command with `--time-budget 3`
  then made 1,488 updates, 86 M target tokens, validation BLEU 25.13, where 16,384 tokens had
  reached 29.17 with 46 M (an earlier build, one run each): on this corpus (1.8 M target
  tokens an epoch) a 3-minute GPU run is limited by its updates, not its tokens.
* TPU and the naive pipeline: `RECIPE_MAX_TOKENS`, no probe (the naive pipeline batches
  `--batch-size` sentences; TPU batches are static and not probed).

The probe's answer is cached (a failed probe is not) in a JSON file beside the precision
cache (`batch.json` next to `precision.cache_path()`, or `$TRANSFORMER_BATCH_CACHE`), keyed by
GPU name and memory, model dimensions, precision, XLA, TensorFlow version and the probe's
settings. Delete the file to re-measure. The learning rate follows the resolved batch
(transformer/model/schedule.py `scale_for_batch`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

from transformer.base import atomic
from transformer.base.config import AUTO, RECIPE_MAX_TOKENS
from transformer.runtime import precision

log = logging.getLogger(__name__)

PROBE_START = RECIPE_MAX_TOKENS  # first budget the probe times (tokens per batch)
PROBE_CAP = 16384  # largest budget it tries (8× the recipe's; see above)
MIN_GAIN = 0.10  # a doubled budget must raise tokens/s by at least this fraction to be kept
PROBE_VERSION = 2  # bump when the probe changes: older cache entries are then ignored
CACHE_ENV = "TRANSFORMER_BATCH_CACHE"

StepTimer = Callable[[int], float]  # max_tokens → seconds per train step; raises ResourceExhaustedError


@dataclass(frozen=True)
class ProbeTrial:
    """One budget the probe tried: its batch's padded tokens and step time, or the error."""

    max_tokens: int
    tokens: int  # padded tokens per side in the probe's batch: (max_tokens // length) · length
    step_s: Optional[float] = None  # seconds per train step (None: it failed)
    error: Optional[str] = None  # "out of memory: …" or another failure

    @property
    def tokens_per_s(self) -> Optional[float]:
        return None if self.step_s is None else self.tokens / self.step_s


@dataclass(frozen=True)
class BatchProbe:
    """What `probe_max_tokens` measured and chose (`chosen` None: nothing fitted)."""

    trials: tuple[ProbeTrial, ...]
    chosen: Optional[int]
    stop: str  # why it stopped: out of memory, small gain, cap, failure
    seconds: float  # wall time the probe took
    failed: bool = False  # an error other than out of memory, or nothing fitted: used, not cached

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "stop": self.stop, "seconds": round(self.seconds, 2), "failed": self.failed,
                "trials": [{**dataclasses.asdict(t), "tokens_per_s": None if t.tokens_per_s is None
                            else round(t.tokens_per_s, 1)} for t in self.trials]}

    @classmethod
    def from_dict(cls, values: dict) -> "BatchProbe":
        trials = tuple(ProbeTrial(**{k: v for k, v in t.items() if k != "tokens_per_s"}) for t in values["trials"])
        return cls(trials, values["chosen"], values["stop"], values["seconds"], values.get("failed", False))


def probe_max_tokens(time_step: StepTimer, length: int, start: int = PROBE_START, cap: int = PROBE_CAP,
                     min_gain: float = MIN_GAIN) -> BatchProbe:
    """Doubles the budget from `start` up to `cap` while it fits and tokens/s gains ≥ `min_gain`.

    Args:
        time_step: max_tokens → seconds per train step of batches `[max_tokens // length, length]`;
            raises `tf.errors.ResourceExhaustedError` when that batch does not fit.
        length: the padded length the batches are timed at (the longest: worst case for memory).
    Returns the trials and the chosen budget: the last that fitted and still paid; None when
    the first budget failed. A probe stopped by an error other than out of memory (or with
    nothing chosen) is marked `failed`: its choice is used for this run but not cached.
    """
    import tensorflow as tf

    started = time.perf_counter()
    trials: list[ProbeTrial] = []
    chosen, best_rate, stop, failed = None, None, f"cap {cap} tokens reached", False
    budget = start
    while budget <= cap:
        tokens = max(1, budget // length) * length
        try:
            step_s = float(time_step(budget))
        except tf.errors.ResourceExhaustedError as err:
            trials.append(ProbeTrial(budget, tokens, error=f"out of memory: {_first_line(err)}"))
            stop = f"out of memory at {budget} tokens"
            break
        except Exception as err:  # a probe must never stop training: fall back to what is known
            trials.append(ProbeTrial(budget, tokens, error=f"{type(err).__name__}: {_first_line(err)}"))
            stop, failed = f"probe failed at {budget} tokens ({type(err).__name__})", True
            break
        trial = ProbeTrial(budget, tokens, step_s)
        trials.append(trial)
        if best_rate is not None and trial.tokens_per_s < best_rate * (1.0 + min_gain):
            stop = (f"{budget} tokens gained {trial.tokens_per_s / best_rate - 1:+.0%} tokens/s "
                    f"(< {min_gain:.0%}) over {chosen}")
            break
        chosen, best_rate = budget, trial.tokens_per_s
        budget *= 2
    if chosen is None:
        stop, failed = f"no budget fitted: {stop}", True
    return BatchProbe(tuple(trials), chosen, stop, time.perf_counter() - started, failed)


def _first_line(err: BaseException) -> str:
    text = str(getattr(err, "message", None) or err).strip()
    return (text.splitlines() or [""])[0][:200]


# --- the cache ------------------------------------------------------------------------------

def cache_path() -> Path:
    """`$TRANSFORMER_BATCH_CACHE`, else `batch.json` beside the precision probe's cache."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return precision.cache_path().with_name("batch.json")


def cache_key(fields: dict) -> str:
    """A short hash of `fields` (GPU, model dimensions, precision, XLA, …) + TF version + probe settings."""
    import tensorflow as tf

    fields = {**fields, "tensorflow": tf.__version__, "probe": [PROBE_VERSION, PROBE_START, PROBE_CAP, MIN_GAIN]}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_probe(key_fields: dict, run_probe: Callable[[], BatchProbe]) -> tuple[BatchProbe, bool]:
    """(probe, from cache?): the cached probe for `key_fields`, else `run_probe()`, cached unless it failed."""
    path, key = cache_path(), cache_key(key_fields)
    entries = precision.read_cache(path, "batch-size")
    entry = entries.get(key)
    if isinstance(entry, dict):
        try:
            return BatchProbe.from_dict(entry["probe"]), True
        except (KeyError, TypeError):
            log.warning("ignoring a malformed entry in the batch-size cache %s", path)
    result = run_probe()
    if result.failed:
        log.warning("batch-size probe failed (%s): not cached", result.stop)
        return result, False
    entries[key] = {"key": key_fields, "probe": result.to_dict()}
    try:
        atomic.write_json(path, entries, sort_keys=True, default=str)
    except (OSError, TypeError) as err:
        log.warning("could not cache the batch-size probe in %s (%s)", path, err)
    return result, False


# --- the decision ---------------------------------------------------------------------------

def gpu_facts() -> dict:
    """{"name", "memory_mib"} of the first visible GPU ({} without one); memory from nvidia-smi, else None."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return {}
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name)
    memory = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        memory = int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    return {"name": name, "memory_mib": memory}


@dataclass(frozen=True)
class BatchDecision:
    """The resolved tokens per batch, with what was requested and why (report.json `run.batch_decision`)."""

    requested: Union[int, str, None]  # "auto", a number of tokens, or None (sentences)
    max_tokens: Optional[int]  # what training uses (None: --batch-size sentences)
    reason: str
    device: str
    gpu: dict = field(default_factory=dict)
    probe: Optional[BatchProbe] = None
    probe_cached: Optional[bool] = None  # None: no probe was needed
    schedule: dict = field(default_factory=dict)  # the learning-rate scaling applied (filled by training)

    def summary(self) -> str:
        """The one log line."""
        batch = "--batch-size sentences" if self.max_tokens is None else f"{self.max_tokens} tokens"
        return f"batch {batch}: {self.reason}" + (f"; {self.schedule['reason']}" if self.schedule else "")

    def to_dict(self) -> dict:
        return {"requested": self.requested, "max_tokens": self.max_tokens, "reason": self.reason,
                "device": self.device, "gpu": self.gpu or None,
                "probe": None if self.probe is None else self.probe.to_dict(),
                "probe_cached": self.probe_cached, "schedule": self.schedule or None}


def decide_max_tokens(requested: Union[int, str, None], device: str, pipeline_kind: str = "optimized", *,
                      time_step: Optional[StepTimer] = None, length: int = 128, key_fields: Optional[dict] = None,
                      gpu: Optional[dict] = None) -> BatchDecision:
    """Resolves `--max-tokens` ("auto", an int, or None) for `device` (cpu | gpu | tpu).

    `time_step` (needed only to probe a GPU) times a train step at a budget; `length` is the
    padded length it times; `key_fields` identify model, precision and XLA for the cache;
    `gpu` ({"name", "memory_mib"}) is read from the machine when None.
    """
    if requested != AUTO:
        reason = ("requested --max-tokens 0: batches of --batch-size sentences" if requested is None
                  else f"requested --max-tokens {requested}")
        return BatchDecision(requested, requested, reason, device)
    if pipeline_kind != "optimized":
        return BatchDecision(requested, RECIPE_MAX_TOKENS, "naive pipeline: batches of --batch-size sentences, "
                             "--max-tokens unused", device)
    if device == "cpu":
        return BatchDecision(requested, RECIPE_MAX_TOKENS, f"CPU: the recipe's {RECIPE_MAX_TOKENS} tokens, "
                             "the batch it was measured and tuned with on CPU (no probe)", device)
    if device != "gpu" or time_step is None:
        return BatchDecision(requested, RECIPE_MAX_TOKENS, f"{device.upper()}: not probed, the recipe's "
                             f"{RECIPE_MAX_TOKENS} tokens", device)
    gpu = gpu_facts() if gpu is None else gpu
    fields = {"gpu": gpu, "length": length, **(key_fields or {})}
    probe, cached = cached_probe(fields, lambda: probe_max_tokens(time_step, length))
    if probe.chosen is None:
        return BatchDecision(requested, RECIPE_MAX_TOKENS, f"GPU probe failed ({probe.stop}): the recipe's "
                             f"{RECIPE_MAX_TOKENS} tokens", device, gpu, probe, cached)
    rates = ", ".join(f"{t.max_tokens}: {t.tokens_per_s:,.0f}" if t.step_s is not None else f"{t.max_tokens}: OOM"
                      for t in probe.trials if t.step_s is not None or t.error.startswith("out of memory"))
    reason = (f"{gpu.get('name') or 'GPU'} probe at length {length} (padded tokens/s {rates}"
              f"{', cached' if cached else ''}): {probe.stop} → {probe.chosen}")
    return BatchDecision(requested, probe.chosen, reason, device, gpu, probe, cached)
