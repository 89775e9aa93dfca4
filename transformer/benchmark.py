"""A matrix of short training runs, one step-time report per cell, and their comparison.

Each cell is one `scripts/train.py` run in its own process (so precision policy, XLA
caches and memory never leak between cells, and one crashing cell does not stop the
matrix), with the same data, model and number of steps. Cells differ only in the levers:
pipeline (naive/optimized) × precision (off/bfloat16/float16) × XLA (off/on) × batch.

"batch" means sentences per batch for the naive pipeline and padded tokens per batch
(per side) for the optimized one.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from transformer.compare import compare

TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train.py"


@dataclass(frozen=True)
class Cell:
    """One benchmark configuration."""

    pipeline: str  # naive | optimized
    precision: str  # off | bfloat16 | float16
    xla: bool
    batch: int  # sentences (naive) or tokens per batch (optimized)

    @property
    def label(self) -> str:
        unit = "sent" if self.pipeline == "naive" else "tok"
        return f"{self.pipeline}-{self.precision}-{'xla' if self.xla else 'noxla'}-{self.batch}{unit}"

    def train_args(self) -> list[str]:
        args = ["--pipeline", self.pipeline, "--mixed-precision", self.precision,
                "--xla" if self.xla else "--no-xla"]
        if self.pipeline == "naive":
            args += ["--batch-size", str(self.batch)]
        else:
            args += ["--max-tokens", str(self.batch)]
        return args


def make_cells(pipelines: Sequence[str], precisions: Sequence[str], xla: Sequence[bool],
               naive_batches: Sequence[int], token_batches: Sequence[int]) -> list[Cell]:
    """The cross product; batch sizes apply to the pipeline they fit (see module docstring)."""
    cells = []
    for pipeline, precision, use_xla in itertools.product(pipelines, precisions, xla):
        for batch in (naive_batches if pipeline == "naive" else token_batches):
            cells.append(Cell(pipeline, precision, use_xla, batch))
    return cells


def run_cell(cell: Cell, output_root: Path, common_args: Sequence[str], timeout_s: Optional[float] = None) -> Path:
    """Runs one cell's training in a subprocess; returns its report path (written even on failure)."""
    output = output_root / cell.label
    command = [sys.executable, str(TRAIN_SCRIPT), *common_args, *cell.train_args(),
               "--output", str(output), "--label", cell.label, "--epochs", "1", "--verbose", "0"]
    output.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(output / "train.log", "w") as log_file:
        try:
            result = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout_s)
            status = f"exit {result.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {timeout_s:.0f} s"
    print(f"{cell.label}: {status} in {time.perf_counter() - started:.0f} s", flush=True)
    return output / "report.json"


def run_matrix(cells: Sequence[Cell], output_root: Path, common_args: Sequence[str],
               timeout_s: Optional[float] = None) -> str:
    """Runs every cell, then writes comparison.md, comparison.png and matrix.json in output_root."""
    output_root.mkdir(parents=True, exist_ok=True)
    reports = [run_cell(cell, output_root, common_args, timeout_s) for cell in cells]
    present = [path for path in reports if path.exists()]
    (output_root / "matrix.json").write_text(json.dumps(
        {"common_args": list(common_args), "cells": [cell.label for cell in cells],
         "reports": [str(path) for path in present]}, indent=2) + "\n")
    if len(present) < 2:
        raise RuntimeError(f"only {len(present)} cell(s) produced a report; see the train.log files in {output_root}")
    return compare(present, plot=output_root / "comparison.png", markdown=output_root / "comparison.md")
