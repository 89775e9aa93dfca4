"""Step-time report: one JSON per training run plus a per-step CSV beside it.

Units: seconds (s), bytes, tokens/s, examples/s, FLOPs, FLOP/s; shares are percentages.

`report.json` holds the environment (library versions, device, CPU, `nvidia-smi`), the
caller's free-form `run` description (precision, XLA, pipeline, batching, model...), the
state of the run ("running", "completed", "crashed", "interrupted", "diverged"), the error if any,
a steady-state `summary`, and `compile`: whether XLA was on, the length grid, per compiled step
(`train`, `evaluate`) the batch shapes it met, its XLA compilations, tracing count and the
seconds of the steps that met a new shape, and XLA's persistent cache (`persistent_cache`:
directory, entries before and after the run); `report_steps.csv` holds one row per recorded step (one row per
Keras execution when `steps_per_execution > 1`; `batches` says how many steps it covers).

Steady state: the first `warmup_steps` rows (trace/compile) are left out of every
aggregate; the first one is reported on its own as `first_step_s`. Rates are ratios of
sums (total tokens ÷ total time), not means of per-step rates.

Both files are written atomically (temp file + `os.replace`), so a reader never sees a
half-written report. Wrap training in `with report.guard():` so the report is written with
the right state however the run ends:

    report = StepTimeReport("runs/a/report.json", run={"precision": "float32"})
    with report.guard():
        model.fit(dataset, callbacks=[BatchTimer(report)])
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import io
import json
import traceback
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from transformer.base import atomic
from transformer.base.errors import InputError, MissingFileError
from transformer.measure.environment import capture_environment
from transformer.measure.step_stats import STEP_COLUMNS, StepRecord, summarize, total

SCHEMA_VERSION = 1
STATES = ("running", "completed", "crashed", "interrupted", "diverged")
REQUIRED_KEYS = (
    "schema_version",
    "environment",
    "run",
    "steps_planned",
    "steps_done",
    "state",
    "error",
    "summary",
    "steps_csv",
)


# ---------------------------------------------------------------------------- files


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _jsonable(value: Any) -> Any:
    """`json.dumps` fallback for what callers put in `run`: dataclasses, paths, numpy."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def steps_csv_path(json_path: str | Path) -> Path:
    """`dir/name.json` → `dir/name_steps.csv`."""
    json_path = Path(json_path)
    return json_path.with_name(f"{json_path.stem}_steps.csv")


def error_info(err: BaseException, max_frames: int = 12) -> dict:
    """Type, message and the last frames of the traceback of an exception."""
    import tensorflow as tf

    lines = traceback.format_exception(type(err), err, err.__traceback__)
    message = str(err)
    return {
        "type": type(err).__name__,
        "message": message[:4000],
        "out_of_memory": isinstance(err, tf.errors.ResourceExhaustedError)
        or "out of memory" in message.lower(),
        "traceback": "".join(lines[-max_frames:])[-8000:],
    }


class StepTimeReport:
    """Per-step timings of one training run and their steady-state summary.

    Args:
        path: str, Path or None. Where to write the JSON; the CSV goes to
            `<stem>_steps.csv` beside it. None keeps the report in memory (`write` is a no-op).
        run: mapping or None. Free-form description of the run (precision, xla, pipeline,
            batching, dataset, model config...). `compare` reads the keys `label`,
            `precision`, `xla`, `pipeline` and `batching` if present.
        steps_planned: int or None. Steps the run intends to do.
        warmup_steps: int. Leading rows left out of the summary. Defaults to `1`.
        environment: dict or None. None captures this process's environment.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        run: Optional[Mapping[str, Any]] = None,
        steps_planned: Optional[int] = None,
        warmup_steps: int = 1,
        environment: Optional[dict] = None,
    ):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.path = Path(path) if path is not None else None
        self.run = dict(run or {})
        self.steps_planned = steps_planned
        self.warmup_steps = warmup_steps
        self.environment = environment if environment is not None else capture_environment()
        self.records: list[StepRecord] = []
        self.evaluations: list[dict] = []  # validation BLEU records (transformer/training/validation_bleu.py)
        self.profile: Optional[dict] = None  # op breakdown of profiled steps (transformer/training/profiling.py)
        # batch shapes and XLA compilations per compiled step (transformer/training/timing.py `ShapeLog`), the
        # length grid, and XLA's persistent cache (transformer/training/trainer.py)
        self.compile: dict = {}
        self.peak_flops: Optional[float] = None
        self.train_wall_s: Optional[float] = None
        self.state = "running"
        self.error: Optional[dict] = None
        self.created_at = _now()
        self.finished_at: Optional[str] = None
        self.guarded = False  # inside `guard()`: the guard, not `BatchTimer`, sets the end state
        # Per-step costs independent of the run's length: rows are frozen and only appended, so
        # the step count and the CSV lines of rows already seen are kept (reset if `records`
        # is replaced or shrinks, or the warm-up / peak FLOP/s that a CSV line depends on change).
        self._counted: tuple[int, list, int] = (0, [], 0)  # (rows counted, records list, their batches)
        self._csv_lines: tuple[tuple, list[str]] = ((None, None), [])  # ((records list, (warmup, peak)), rows)

    @property
    def steps_csv(self) -> Optional[Path]:
        return steps_csv_path(self.path) if self.path is not None else None

    @property
    def steps_done(self) -> int:
        rows, counted_list, batches = self._counted
        if counted_list is not self.records or rows > len(self.records):
            rows, batches = 0, 0
        batches += sum(r.batches for r in self.records[rows:])
        self._counted = (len(self.records), self.records, batches)
        return batches

    def continue_from_disk(self) -> int:
        """Loads the rows and evaluations of an earlier report at `path` (a resumed run).

        The resumed run then appends to them (step numbers continue) instead of overwriting
        the earlier attempt's measurements; the earlier end state is kept in `run["attempts"]`.
        Returns the number of rows loaded (0 when there is no readable earlier report).
        """
        if self.path is None or not self.path.exists():
            return 0
        try:
            earlier = load_report(self.path)
            rows = load_steps(self.path, earlier)
        except (OSError, ValueError) as err:
            print(f"warning: not continuing unreadable step-time report {self.path}: {err}")
            return 0
        fields = {f.name for f in dataclasses.fields(StepRecord)}
        self.records = [StepRecord(**{k: v for k, v in row.items() if k in fields}) for row in rows]
        self.evaluations = list(earlier.get("evaluations") or [])
        self.peak_flops = self.peak_flops or earlier["summary"].get("peak_flops")
        self.train_wall_s = earlier["summary"].get("total_wall_s")
        self.created_at = earlier.get("created_at", self.created_at)
        attempts = list(earlier.get("run", {}).get("attempts") or [])
        attempts.append({"state": earlier["state"], "steps_done": earlier["steps_done"],
                         "finished_at": earlier.get("finished_at"),
                         "error": (earlier.get("error") or {}).get("type")})
        self.run["attempts"] = attempts
        return len(self.records)

    def add_step(self, record: StepRecord) -> None:
        self.records.append(record)

    def tokens_seen(self) -> dict:
        """Non-pad source/target tokens and examples trained on so far (None if not measured)."""
        return {name: (int(count) if (count := total(self.records, name)) is not None else None)
                for name in ("examples", "src_tokens", "tgt_tokens")}

    def summary(self) -> dict:
        return summarize(
            self.records,
            warmup_steps=self.warmup_steps,
            peak_flops=self.peak_flops,
            train_wall_s=self.train_wall_s,
        )

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "environment": self.environment,
            "run": self.run,
            "steps_planned": self.steps_planned,
            "steps_done": self.steps_done,
            "state": self.state,
            "error": self.error,
            "summary": self.summary(),
            "tokens_seen": self.tokens_seen(),
            "evaluations": self.evaluations,
            "profile": self.profile,
            "compile": self.compile or None,
            "steps_csv": self.steps_csv.name if self.steps_csv else None,
            "created_at": self.created_at,
            "updated_at": _now(),
            "finished_at": self.finished_at,
        }

    def steps_csv_text(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=STEP_COLUMNS, lineterminator="\n")
        writer.writeheader()
        (rendered, settings), lines = self._csv_lines
        key = (self.records, (self.warmup_steps, self.peak_flops))
        if rendered is not self.records or settings != key[1] or len(lines) > len(self.records):
            lines = []
        line = io.StringIO()
        row_writer = csv.DictWriter(line, fieldnames=STEP_COLUMNS, lineterminator="\n")
        for i in range(len(lines), len(self.records)):  # only rows not rendered before
            line.seek(0)
            line.truncate()
            row_writer.writerow(self.records[i].row(warmup=i < self.warmup_steps, peak_flops=self.peak_flops))
            lines.append(line.getvalue())
        self._csv_lines = (key, lines)
        return out.getvalue() + "".join(lines)

    def write(self) -> Optional[Path]:
        """Writes the CSV, then the JSON (both atomically); returns the JSON path."""
        if self.path is None:
            return None
        atomic.write_text(self.steps_csv, self.steps_csv_text())
        text = json.dumps(self.to_dict(), indent=2, default=_jsonable)
        atomic.write_text(self.path, text + "\n")
        return self.path

    def finish(self, state: str, error: Optional[BaseException] = None) -> None:
        """Sets the final state (and error) and writes the report."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        self.state = state
        self.error = error_info(error) if error is not None else None
        self.finished_at = _now()
        self.write()

    @contextlib.contextmanager
    def guard(self) -> Iterator["StepTimeReport"]:
        """Marks the run completed / interrupted (Ctrl-C) / crashed, writes it, re-raises."""
        self.state = "running"
        self.guarded = True
        self.write()
        try:
            yield self
        except KeyboardInterrupt as err:
            self._finish_quietly("interrupted", err)
            raise
        except Exception as err:  # an error may name its own state (faults.TrainingDiverged: "diverged")
            self._finish_quietly(getattr(err, "report_state", "crashed"), err)
            raise
        except BaseException as err:  # SystemExit, GeneratorExit: stopped, not failed
            self._finish_quietly("interrupted", err)
            raise
        else:
            self.finish("completed")
        finally:
            self.guarded = False

    def _finish_quietly(self, state: str, err: BaseException) -> None:
        """`finish` that never hides the training error behind a write error."""
        try:
            self.finish(state, err)
        except Exception as write_err:  # noqa: BLE001 - reported, then the original re-raised
            print(f"warning: could not write step-time report {self.path}: {write_err!r}")


# ---------------------------------------------------------------------------- reading


class ReportError(InputError, ValueError):
    """A file given as a step-time report is not one; the message names it."""

    hint = "pass the report.json that scripts/train.py wrote in the run directory"


def load_report(path: str | Path) -> dict:
    """Reads a report JSON and checks it has every required key; errors name the file."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFileError(f"step-time report not found: {path}", hint=ReportError.hint) from None
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(report, dict):
        raise ReportError(f"{path}: not a step-time report (expected a JSON object)")
    missing = [key for key in REQUIRED_KEYS if key not in report]
    if missing:
        raise ReportError(f"{path}: not a step-time report, missing keys {missing}")
    if report["state"] not in STATES:
        raise ReportError(f"{path}: state must be one of {STATES}, got {report['state']!r}")
    return report


def _parse_cell(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return float(text)


def load_steps(json_path: str | Path, report: Optional[dict] = None) -> list[dict]:
    """The per-step rows of a report, numbers parsed, missing values as None."""
    json_path = Path(json_path)
    report = report if report is not None else load_report(json_path)
    if not report["steps_csv"]:
        return []
    csv_path = json_path.parent / report["steps_csv"]
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            return [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]
    except FileNotFoundError:
        raise MissingFileError(f"{json_path}: per-step CSV not found: {csv_path}") from None
