"""A matrix of short training runs, one step-time report per cell, and their comparison.

Each cell is one training command (`transformer.commands.train`) run in its own process (so precision policy, XLA
caches and memory never leak between cells, and one crashing cell does not stop the
matrix), with the same data, model and number of steps. Cells differ only in the levers:
pipeline (naive/optimized) × precision (auto/off/bfloat16/float16) × XLA (auto/off/on) ×
batch × model width.

"batch" means sentences per batch for the naive pipeline and padded tokens per batch
(per side) for the optimized one. A width `d_model` sets `--d-model d_model --dff 4·d_model`
(the paper's and the tutorial's ratio), so the sweep scales every matmul together; with the
paper's heads the width must divide by `--num-heads`. "auto" cells show what the run
resolved to (transformer/runtime/precision.py) in the Precision / XLA columns.

`sweep_table` is the "how cost grows" view: real target tokens/s, model FLOP/s and
utilisation (of the matmul peak in the cell's precision, measured by each run's probe)
against width and batch, to see where the machine saturates.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from transformer.base import cli
from transformer.base.errors import ProjectError
from transformer.measure.compare import Run, compare, load_runs

XLA_ARGS = {True: ["--xla"], False: ["--no-xla"], None: ["--xla", "auto"]}
XLA_LABELS = {True: "xla", False: "noxla", None: "xlaauto"}


@dataclass(frozen=True)
class Cell:
    """One benchmark configuration."""

    pipeline: str  # naive | optimized
    precision: str  # auto | off | bfloat16 | float16
    xla: Optional[bool]  # None: auto
    batch: int  # sentences (naive) or tokens per batch (optimized)
    d_model: Optional[int] = None  # None: the model flags' width; else d_model, dff = 4·d_model

    @property
    def label(self) -> str:
        unit = "sent" if self.pipeline == "naive" else "tok"
        width = f"-d{self.d_model}" if self.d_model else ""
        return f"{self.pipeline}-{self.precision}-{XLA_LABELS[self.xla]}-{self.batch}{unit}{width}"

    def train_args(self) -> list[str]:
        args = ["--pipeline", self.pipeline, "--mixed-precision", self.precision, *XLA_ARGS[self.xla]]
        if self.pipeline == "naive":
            args += ["--batch-size", str(self.batch)]
        else:
            args += ["--max-tokens", str(self.batch)]
        if self.d_model:
            args += ["--d-model", str(self.d_model), "--dff", str(4 * self.d_model)]
        return args


def make_cells(pipelines: Sequence[str], precisions: Sequence[str], xla: Sequence[Optional[bool]],
               naive_batches: Sequence[int], token_batches: Sequence[int],
               d_models: Sequence[Optional[int]] = (None,)) -> list[Cell]:
    """The cross product; batch sizes apply to the pipeline they fit (see module docstring)."""
    cells = []
    for pipeline, precision, use_xla, d_model in itertools.product(pipelines, precisions, xla, d_models):
        for batch in (naive_batches if pipeline == "naive" else token_batches):
            cells.append(Cell(pipeline, precision, use_xla, batch, d_model))
    return cells


def run_cell(cell: Cell, output_root: Path, common_args: Sequence[str], timeout_s: Optional[float] = None) -> Path:
    """Runs one cell's training in a subprocess; returns its report path (written even on failure)."""
    output = output_root / cell.label
    command = cli.command_line("train", *common_args, *cell.train_args(),
                               "--output", str(output), "--label", cell.label, "--epochs", "1", "--verbose", "0")
    output.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(output / "train.log", "w") as log_file:
        try:
            result = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout_s,
                                    env=cli.subprocess_env())
            status = f"exit {result.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {timeout_s:.0f} s"
    print(f"{cell.label}: {status} in {time.perf_counter() - started:.0f} s", flush=True)
    return output / "report.json"


def run_matrix(cells: Sequence[Cell], output_root: Path, common_args: Sequence[str],
               timeout_s: Optional[float] = None) -> str:
    """Runs every cell, then writes comparison.md, comparison.png, sweep.md and matrix.json in output_root.

    Returns the comparison table followed by the sweep table. One cell is enough (its table
    has a single row); no report at all is a ProjectError.
    """
    output_root.mkdir(parents=True, exist_ok=True)
    reports = [run_cell(cell, output_root, common_args, timeout_s) for cell in cells]
    present = [path for path in reports if path.exists()]
    (output_root / "matrix.json").write_text(json.dumps(
        {"common_args": list(common_args), "cells": [cell.label for cell in cells],
         "reports": [str(path) for path in present]}, indent=2) + "\n")
    if not present:
        raise ProjectError(f"no cell produced a report; see the train.log files in {output_root}")
    table = compare(present, plot=output_root / "comparison.png", markdown=output_root / "comparison.md")
    sweep = sweep_table(load_runs(present))
    (output_root / "sweep.md").write_text(sweep, encoding="utf-8")
    return table + "\n" + sweep


SWEEP_HEADER = ["Run", "d_model", "Batching", "Precision", "XLA", "s/step", "Tgt tokens/s (real)",
                "Model FLOP/s", "Utilisation", "Data wait (%)"]


def _giga(value: Optional[float]) -> str:
    return "—" if value is None else f"{value / 1e9:,.0f} G"


def sweep_table(runs: Sequence[Run]) -> str:
    """Markdown: tokens/s, model FLOP/s and utilisation per run, sorted by width then batch."""

    def key(run: Run):
        model = run.report["run"].get("config", {}).get("model", {})
        return (model.get("d_model") or 0, run.report["run"].get("pipeline") or "", run.summary.get("mean_step_s") or 0)

    lines = ["| " + " | ".join(SWEEP_HEADER) + " |", "|" + "|".join("---" for _ in SWEEP_HEADER) + "|"]
    for run in sorted(runs, key=key):
        info, summary = run.report["run"], run.summary
        utilisation = summary.get("utilisation")
        cells = [run.label, str(key(run)[0] or "—"), str(info.get("batching") or "—"), str(info.get("precision") or "—"),
                 {True: "on", False: "off"}.get(info.get("xla"), "—"),
                 "—" if summary.get("mean_step_s") is None else f"{summary['mean_step_s']:.3f}",
                 "—" if summary.get("tgt_tokens_per_s") is None else f"{summary['tgt_tokens_per_s']:,.0f}",
                 _giga(summary.get("flops_per_s")),
                 "—" if utilisation is None else f"{100 * utilisation:.0f}% of {_giga(summary.get('peak_flops'))}",
                 "—" if summary.get("data_wait_pct") is None else f"{summary['data_wait_pct']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Utilisation: model FLOP/s (matmuls of the padded batch, 3 × forward) ÷ the matmul peak "
              "measured in the run's own precision. Where tokens/s stops growing with batch or width, "
              "the machine is saturated."]
    return "\n".join(lines) + "\n"
