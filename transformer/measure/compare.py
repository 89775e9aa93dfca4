"""Compare step-time reports: a Markdown table, speed-ups vs the first run, verdicts, a plot.

Units: seconds (s), target tokens/s (non-pad), data-wait share in % of step time.

Every figure is a steady-state one from the report's `summary` (warm-up steps excluded).
Speed-ups are relative to the FIRST report given: by real target tokens/s (run ÷ first,
fair across batch sizes) and by mean s/step (first ÷ run, meaningful only when the runs
use the same batches). A run is "input-bound" when more than `threshold_pct` of its step
time was spent waiting for the next batch, else "compute-bound".

The last two columns say what a run achieved: target tokens trained on (`tokens_seen`) and
the best validation BLEU logged during training (`evaluations`, see validation_bleu.py).

The device column names the GPU, or the CPU with its identity (`device_label`). The run
columns come from the report's `run` dict keys `label`, `precision`, `xla`,
`pipeline` and `batching` (missing ones show as "—"); the label falls back to the file name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from matplotlib.figure import Figure

from transformer.measure.reports import load_report, load_steps

DEFAULT_THRESHOLD_PCT = 10.0
MISSING = "—"


@dataclass(frozen=True)
class Run:
    """One loaded report: its label, JSON dict and per-step rows."""

    path: Path
    label: str
    report: dict
    steps: list

    @property
    def summary(self) -> dict:
        return self.report["summary"]


def _default_label(path: Path, report: dict) -> str:
    if report["run"].get("label"):
        return str(report["run"]["label"])
    # runs/<name>/report.json → <name>; runs/<name>.json → <name>
    return path.parent.name if path.stem == "report" and path.parent.name else path.stem


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Loads reports and their step rows; duplicate labels get a `#n` suffix."""
    runs, seen = [], {}
    for path in map(Path, paths):
        report = load_report(path)
        label = _default_label(path, report)
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        runs.append(Run(path=path, label=label, report=report, steps=load_steps(path, report)))
    return runs


def speedups(run: Run, base: Run) -> tuple[Optional[float], Optional[float]]:
    """(real target tokens/s of run ÷ base, mean s/step of base ÷ run); None if unknown."""

    def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
        return None if num is None or not den else num / den

    by_tokens = ratio(run.summary.get("tgt_tokens_per_s"), base.summary.get("tgt_tokens_per_s"))
    by_step = ratio(base.summary.get("mean_step_s"), run.summary.get("mean_step_s"))
    return by_tokens, by_step


def verdict(summary: dict, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> str:
    """'input-bound: N% of step time waiting for data' above the threshold, else 'compute-bound'."""
    if not summary.get("steady_steps"):
        return "no steady-state steps"
    wait = summary.get("data_wait_pct")
    if wait is None:
        return "unknown: input wait not measured"
    if wait > threshold_pct:
        return f"input-bound: {wait:.0f}% of step time waiting for data"
    return "compute-bound"


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "on" if value else "off"
    return format(value, spec)


def _fmt_times(ratio: Optional[float]) -> str:
    return MISSING if ratio is None else f"{ratio:.2f}x"


def device_label(environment: dict) -> str:
    """The machine a report ran on: a GPU's name, or the CPU named by model, identity and
    usable CPUs ('AMD EPYC (family 25 model 17 stepping 1), 2 CPUs'), since cloud VMs give
    CPU generations of different speed one model name."""
    device = environment.get("device")
    if device != "CPU" or not environment.get("cpu_model"):
        return _fmt(device)
    cpus = (environment.get("cpu_budget") or {}).get("cpus") or environment.get("cpu_count_usable")
    identity = f" ({environment['cpu_id']})" if environment.get("cpu_id") else ""
    return f"{environment['cpu_model']}{identity}" + (f", {cpus} CPU{'s' * (cpus != 1)}" if cpus else "")


def _row(run: Run, base: Run, threshold_pct: float) -> list[str]:
    info, summary = run.report["run"], run.summary
    by_tokens, by_step = speedups(run, base)
    return [
        run.label,
        device_label(run.report["environment"]),
        _fmt(info.get("precision")),
        _fmt(info.get("xla")),
        _fmt(info.get("pipeline")),
        _fmt(info.get("batching")),
        f"{run.report['steps_done']}/{_fmt(run.report['steps_planned'])}",
        _fmt(summary.get("total_wall_s"), ".1f"),
        _fmt(summary.get("mean_step_s"), ".4f"),
        _fmt(summary.get("tgt_tokens_per_s"), ",.0f"),
        _fmt(summary.get("data_wait_pct"), ".1f"),
        _fmt_times(by_tokens),
        _fmt_times(by_step),
        run.report["state"],
        verdict(summary, threshold_pct),
        _fmt((run.report.get("tokens_seen") or {}).get("tgt_tokens"), ",d"),
        _fmt(best_bleu(run.report), ".2f"),
    ]


def best_bleu(report: dict) -> Optional[float]:
    """Highest validation BLEU logged during the run (`evaluations`), or None."""
    scores = [e["bleu"] for e in report.get("evaluations") or [] if e.get("bleu") is not None]
    return max(scores) if scores else None


HEADER = [
    "Run",
    "Device",
    "Precision",
    "XLA",
    "Pipeline",
    "Batching",
    "Steps done/planned",
    "Total (s)",
    "s/step",
    "Tgt tokens/s (real)",
    "Data wait (%)",
    "Speed-up (tokens/s)",
    "Speed-up (s/step)",
    "State",
    "Verdict",
    "Tgt tokens seen",
    "Best val BLEU",
]


def markdown_table(runs: Sequence[Run], threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> str:
    """The comparison as Markdown: one row per run, speed-ups relative to `runs[0]`."""
    if not runs:
        raise ValueError("markdown_table needs at least one run")
    lines = [
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
        *("| " + " | ".join(_row(run, runs[0], threshold_pct)) + " |" for run in runs),
        "",
        f"Steady state (warm-up steps excluded). Speed-ups vs `{runs[0].label}`: tokens/s is "
        "run ÷ first (fair across batch sizes); s/step is first ÷ run (same batches only). "
        f"Input-bound: data wait > {threshold_pct:g}% of step time. Tokens seen and best validation "
        "BLEU (on the run's fixed sample) say what the run achieved, not only how fast it went.",
    ]
    return "\n".join(lines) + "\n"


def profile_table(runs: Sequence[Run]) -> str:
    """Markdown: each profiled run's device time by op category (% of device time), or "".

    Reads the report's `profile` section (`--profile-steps`, transformer/training/profiling.py).
    """
    profiled = [run for run in runs if (run.report.get("profile") or {}).get("categories")]
    if not profiled:
        return ""
    categories = list(profiled[0].report["profile"]["categories"])  # profiling.CATEGORIES, in order
    header = ["Run", "Steps", "Device s/step", *(f"{c} %" for c in categories), "Top op type"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for run in profiled:
        profile = run.report["profile"]
        first, last = profile["steps"]
        steps = profile.get("steps_profiled") or (last - first + 1)
        shares = [_fmt(100 * profile["categories"].get(c, {}).get("share", 0.0), ".1f") for c in categories]
        top = (profile.get("top_types") or [{}])[0]
        top_text = f"{top['type']} ({100 * top['share']:.0f}%)" if top else MISSING
        lines.append("| " + " | ".join([run.label, f"{first}-{last}", _fmt(profile["device_time_s"] / steps, ".3f"),
                                         *shares, top_text]) + " |")
    lines += ["", "Where the step time goes (`--profile-steps`): the profiled steps' kernel time by op "
                  "category, in % of device time (transformer/training/profiling.py says what each category holds)."]
    return "\n".join(lines) + "\n"


def plot_speed(runs: Sequence[Run], path: str | Path) -> Path:
    """Saves a PNG: real target tokens/s per step (top) and step time (bottom), one line per run.

    Tokens/s is the comparable figure when runs use different batch sizes; step time alone
    would favour the smaller batch. Warm-up steps are left out.
    """
    fig = Figure(figsize=(9, 7), layout="constrained")  # no pyplot: no global backend state
    rate_ax, time_ax = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    for run in runs:
        rows = [row for row in run.steps if not row.get("warmup")]
        steps = [row["step"] for row in rows]
        rates = [row.get("tgt_tokens_per_s") for row in rows]
        rate_ax.plot(steps, [float("nan") if r is None else r for r in rates], label=run.label, lw=1)
        time_ax.plot(steps, [row["step_s"] for row in rows], label=run.label, lw=1)
    medians = [m for m in (run.summary.get("median_step_s") for run in runs) if m]
    if medians and max(medians) > 10 * min(medians):
        time_ax.set_yscale("log")  # runs an order of magnitude apart stay readable
    rate_ax.set_ylabel("real target tokens/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.set_title("Training speed per step (warm-up steps excluded)")
    time_ax.set_ylabel("step time (s)")
    time_ax.set_xlabel("step")
    for ax in (rate_ax, time_ax):
        ax.grid(alpha=0.3)
    rate_ax.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def compare(
    paths: Sequence[str | Path],
    *,
    plot: str | Path | None = None,
    markdown: str | Path | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
) -> str:
    """Loads 1+ reports, returns the Markdown table; optionally saves it and the PNG plot."""
    if not paths:
        raise ValueError("compare needs at least 1 report")
    runs = load_runs(paths)
    table = markdown_table(runs, threshold_pct)
    breakdown = profile_table(runs)
    if breakdown:
        table += "\n" + breakdown
    if markdown is not None:
        Path(markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown).write_text(table, encoding="utf-8")
    if plot is not None:
        plot_speed(runs, plot)
    return table
