"""Per-step records and their steady-state statistics (the step-time report's `summary`).

Units: seconds (s), bytes, tokens/s, examples/s, FLOPs, FLOP/s; shares are percentages.
The first `warmup_steps` records (trace/compile) are left out of every aggregate; the first
one is reported on its own as `first_step_s`. Rates are ratios of sums (total tokens ÷ total
time), not means of per-step rates.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return None if num is None or not den else num / den


def _pct(num: Optional[float], den: Optional[float]) -> Optional[float]:
    ratio = _ratio(num, den)
    return None if ratio is None else 100.0 * ratio


def total(records: Sequence[StepRecord], name: str) -> Optional[float]:
    """Sum of one field over records; None if any record lacks it (no silent gaps)."""
    values = [getattr(r, name) for r in records]
    return None if not values or any(v is None for v in values) else float(sum(values))


def _padding_fraction(records: Sequence[StepRecord]) -> Optional[float]:
    real = [total(records, "src_tokens"), total(records, "tgt_tokens")]
    padded = [total(records, "src_padded"), total(records, "tgt_padded")]
    if None in real or None in padded or not sum(padded):
        return None
    return 1.0 - sum(real) / sum(padded)


def _max(records: Sequence[StepRecord], name: str) -> Optional[float]:
    values = [getattr(r, name) for r in records if getattr(r, name) is not None]
    return max(values) if values else None


def _rates(records: Sequence[StepRecord], peak_flops: Optional[float]) -> dict:
    """Throughput of `records` as ratios of sums: tokens/s, examples/s, FLOP/s, shares."""
    time_s = total(records, "time_s")
    flops_per_s = _ratio(total(records, "flops"), time_s)
    return {
        "data_wait_pct": _pct(total(records, "data_wait_s"), time_s),
        "examples_per_s": _ratio(total(records, "examples"), time_s),
        "src_tokens_per_s": _ratio(total(records, "src_tokens"), time_s),
        "src_padded_tokens_per_s": _ratio(total(records, "src_padded"), time_s),
        "tgt_tokens_per_s": _ratio(total(records, "tgt_tokens"), time_s),
        "tgt_padded_tokens_per_s": _ratio(total(records, "tgt_padded"), time_s),
        "padding_fraction": _padding_fraction(records),
        "flops_per_s": flops_per_s,
        "utilisation": _ratio(flops_per_s, peak_flops),
    }


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """Raw measurements of one step (or one execution of `batches` steps).

    Counts are None when they could not be measured (e.g. input-wait measurement off).
    """

    step: int  # global index of the first step in this row, from 0
    epoch: int
    batches: int  # steps in this row (> 1 only with steps_per_execution > 1)
    time_s: float  # wall time of the row, device synced
    data_wait_s: Optional[float] = None  # time blocked in next(iterator)
    instrument_s: Optional[float] = None  # time spent counting tokens (measurement overhead)
    examples: Optional[int] = None
    src_tokens: Optional[int] = None  # non-pad
    src_padded: Optional[int] = None  # batch × padded length
    tgt_tokens: Optional[int] = None
    tgt_padded: Optional[int] = None
    flops: Optional[float] = None  # estimated model FLOPs (padded shapes)
    rss_bytes: Optional[int] = None  # host resident set size after the step
    gpu_peak_bytes: Optional[int] = None  # GPU:0 allocator peak so far
    loss: Optional[float] = None

    @property
    def step_s(self) -> float:
        return self.time_s / self.batches

    def row(self, *, warmup: bool, peak_flops: Optional[float]) -> dict:
        """The CSV row: raw fields plus this step's rates."""
        return {
            **dataclasses.asdict(self),
            "warmup": warmup,
            "step_s": self.step_s,
            **_rates([self], peak_flops),
        }


# CSV header: the raw fields, then the derived ones, in `StepRecord.row` order.
STEP_COLUMNS: tuple[str, ...] = tuple(
    StepRecord(step=0, epoch=0, batches=1, time_s=1.0).row(warmup=False, peak_flops=None)
)


def summarize(
    records: Sequence[StepRecord],
    *,
    warmup_steps: int,
    peak_flops: Optional[float] = None,
    train_wall_s: Optional[float] = None,
) -> dict:
    """Steady-state statistics (rows after the first `warmup_steps` rows)."""
    steady = list(records[warmup_steps:])
    time_s = total(steady, "time_s")
    batches = total(steady, "batches")
    step_times = np.array([r.step_s for r in steady]) if steady else None
    return {
        "first_step_s": records[0].time_s if records else None,
        "warmup_steps": warmup_steps,
        "steady_steps": int(batches or 0),
        "total_wall_s": train_wall_s,
        "steps_time_s": total(records, "time_s"),
        "mean_step_s": _ratio(time_s, batches),
        "median_step_s": float(np.median(step_times)) if steady else None,
        "p90_step_s": float(np.percentile(step_times, 90)) if steady else None,
        **_rates(steady, peak_flops),
        "instrument_pct": _pct(total(steady, "instrument_s"), time_s),
        "flops_per_step": _ratio(total(steady, "flops"), batches),
        "peak_flops": peak_flops,
        "peak_rss_bytes": _max(records, "rss_bytes"),
        "gpu_peak_bytes": _max(records, "gpu_peak_bytes"),
    }
