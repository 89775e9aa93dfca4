"""`BatchTimer`: a Keras callback that times every training step and the input wait in it.

Units: seconds (s), tokens/s, examples/s, FLOPs, FLOP/s, bytes.

Per step it records wall time (device synced), time blocked waiting for the next batch,
examples and source/target tokens (non-pad and padded), estimated FLOPs, host RSS and the
GPU allocator peak; rates, padding fraction, data-wait share and utilisation (achieved
FLOP/s ÷ a peak probed once with `flops.measure_peak_flops`) are derived in `reports.py`.

How the input wait is measured. Keras 3 (TF backend, `keras/src/backend/tensorflow/
trainer.py`) runs `fit` as: `make_train_function()`, `callbacks.on_train_begin()`, then per
execution `on_train_batch_begin(step)`, `logs = self.train_function(iterator)`,
`on_train_batch_end(step, logs)`. `train_function` fetches the batch *inside* a compiled
function when `iterator` is a `tf.data.Iterator`, where no Python clock can see it. For any
other Python iterable it runs `for _, data in zip(range(steps_per_execution), iterator):
outputs = one_step_on_data(data)`, where `one_step_on_data` is the same compiled step. So
in `on_train_begin` we replace `model.train_function` with a wrapper that hands the original
a small Python iterator whose `__next__` times `next(tf_iterator)`: that duration is the
time the step was blocked on the input pipeline. The wrapper fetches the first batch before
calling the original (an exhausted iterator would otherwise make Keras' zip loop fail with
`UnboundLocalError`) and raises `StopIteration`, which `fit` handles, when there is none.
With `steps_per_execution = N` the original pulls N batches from the wrapper in one call;
their waits, tokens and FLOPs are summed into one row with `batches = N`. The original
`train_function` is restored in `on_train_end` (and un-wrapped on the next `on_train_begin`
if a crash skipped `on_train_end`).

What the measurement changes: each batch goes through Keras' Python-iterator path, i.e.
one call of the compiled step per batch instead of one in-graph `tf.while_loop` over N
batches (identical work for N = 1). Eager batches have concrete shapes, which would make
the compiled step retrace on every new padded shape, so on the first call we trace it once
for the dataset's `element_spec` (unknown dims), as the fast path does. The step is synced
every time (`float(logs["loss"])`, which Keras already does for non-async callbacks), so
steps do not overlap on the device. `measure_input_wait=False` leaves `train_function`
untouched (no wait, no token counts, no FLOPs), to check the overhead.

Compilations. The compiled step is traced once (above), and with XLA (`jit_compile`) that one
trace compiles an XLA program for every new input shape it meets: the distinct batch shapes
*are* the XLA compilations. The timer records them per step function in the report's
`compile` section (`ShapeLog`): the shapes, the tracing count of the step's `tf.function`,
and the seconds of the steps that met a new shape. Evaluation inside `fit` (Keras'
`test_function`) is wrapped the same way from `on_test_begin` to `on_test_end`, so its
shapes are counted too (its batches then also go one call per batch through the step).

Size: over ~350 lines on purpose: the timed iterator, the execution bookkeeping and the
callback are one mechanism (Keras internals it wraps are documented here once).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable, Iterator, Optional

import keras
import numpy as np
import psutil
import tensorflow as tf

from transformer.base.config import UNBOUNDED_EPOCHS
from transformer.measure.reports import StepTimeReport
from transformer.measure.step_stats import StepRecord
from transformer.runtime.flops import TransformerDims, measure_peak_flops

_ORIGINAL = "_batch_timer_original"
_STEP_FUNCTIONS = {"train": "train_function", "evaluate": "test_function"}  # report name → Keras attribute


@dataclasses.dataclass(frozen=True)
class BatchCounts:
    """Sizes of one `((src_ids, tgt_in_ids), tgt_out_ids)` batch."""

    examples: int
    src_len: int  # padded length
    tgt_len: int
    src_tokens: int  # non-pad
    tgt_tokens: int  # non-pad labels

    @property
    def src_padded(self) -> int:
        return self.examples * self.src_len

    @property
    def tgt_padded(self) -> int:
        return self.examples * self.tgt_len


def _count_nonpad(ids: Any, pad_id: int) -> int:
    return int(np.count_nonzero(np.asarray(ids) != pad_id))


def batch_counts(batch: Any, pad_id: int = 0) -> Optional[BatchCounts]:
    """Counts a `((src [B, S], tgt_in [B, T]), tgt_out [B, T])` batch; None for other layouts."""
    try:
        (src, _tgt_in), tgt_out = batch[0], batch[1]
        (examples, src_len), (_, tgt_len) = src.shape, tgt_out.shape
    except (TypeError, ValueError, LookupError, AttributeError):
        return None
    return BatchCounts(
        examples=int(examples),
        src_len=int(src_len),
        tgt_len=int(tgt_len),
        src_tokens=_count_nonpad(src, pad_id),
        tgt_tokens=_count_nonpad(tgt_out, pad_id),
    )


@dataclasses.dataclass
class _Execution:
    """What the timed iterator saw during one `train_function` call."""

    batches: int = 0
    wait_s: float = 0.0
    instrument_s: float = 0.0
    counts: list = dataclasses.field(default_factory=list)  # BatchCounts or None per batch

    def total(self, name: str) -> Optional[int]:
        if not self.counts or any(c is None for c in self.counts):
            return None
        return sum(getattr(c, name) for c in self.counts)


class _TimedIterator:
    """Python iterator over a tf.data iterator; times each `next` and counts the batch."""

    def __init__(self, inner: Iterator, execution: _Execution, count: Callable[[Any], Any]):
        self._inner = inner
        self._execution = execution
        self._count = count
        self._first = self._fetch()  # raises StopIteration on an exhausted iterator
        self._first_pending = True

    def _fetch(self) -> Any:
        start = time.perf_counter()
        batch = next(self._inner)
        fetched = time.perf_counter()
        self._execution.wait_s += fetched - start
        self._execution.batches += 1
        self._execution.counts.append(self._count(batch))
        self._execution.instrument_s += time.perf_counter() - fetched
        return batch

    def __iter__(self) -> "_TimedIterator":
        return self

    def __next__(self) -> Any:
        if self._first_pending:
            batch, self._first, self._first_pending = self._first, None, False
            return batch
        return self._fetch()


@dataclasses.dataclass
class ShapeLog:
    """The distinct batch shapes one compiled step function met (one XLA program each with XLA)."""

    first_s: dict = dataclasses.field(default_factory=dict)  # (rows, src_len, tgt_len) → s of its first step

    def add(self, counts: list, seconds: float) -> bool:
        """Records the shapes of one execution's batches; True (and `seconds` kept) if one was new."""
        shapes = [(c.examples, c.src_len, c.tgt_len) for c in counts if c is not None]
        new = [shape for shape in dict.fromkeys(shapes) if shape not in self.first_s]
        for shape in new:
            self.first_s[shape] = seconds / len(new)
        return bool(new)

    def to_dict(self, xla: bool, traces: Optional[int]) -> dict:
        """Report entry: shapes `[rows, src_len, tgt_len]`, XLA compilations (one per shape of the one
        trace; an upper bound, shapes × traces, if the step was retraced; 0 without XLA), the tracing
        count, and wall seconds of the steps that met a new shape (compiling and running)."""
        return {"shapes": sorted(list(shape) for shape in self.first_s),
                "compilations": len(self.first_s) * max(traces or 1, 1) if xla else 0,
                "traces": traces,
                "new_shape_steps_s": round(sum(self.first_s.values()), 3)}


def unwrapped(train_function: Callable) -> Callable:
    while hasattr(train_function, _ORIGINAL):
        train_function = getattr(train_function, _ORIGINAL)
    return train_function


def compiled_step(train_function: Callable) -> Optional[Any]:
    """Keras' compiled `one_step_on_data` from `train_function`'s closure, or None.

    Private Keras structure (checked in 3.15); when it is not found we simply skip the
    pre-trace and the step may retrace once per new batch shape.
    """
    code, closure = getattr(train_function, "__code__", None), getattr(train_function, "__closure__", None)
    if code is None or closure is None or "one_step_on_data" not in code.co_freevars:
        return None
    step = closure[code.co_freevars.index("one_step_on_data")].cell_contents
    step = getattr(step, "__wrapped__", step)  # under Keras' `_autoconvert_optionals`
    return step if hasattr(step, "get_concrete_function") else None


def _pretrace(train_function: Callable, iterator: Any) -> None:
    """Traces the compiled step once for the dataset's `element_spec` (unknown dims).

    Keras' fast path traces with the iterator's `element_spec`, so one trace serves every
    batch shape; eager batches of concrete shapes would instead retrace on a new shape.
    """
    step, spec = compiled_step(train_function), getattr(iterator, "element_spec", None)
    if step is None or spec is None:
        return
    try:
        step.get_concrete_function(spec)
    except (TypeError, ValueError) as err:  # e.g. a distribution strategy's per-replica specs
        warnings.warn(f"BatchTimer: could not pre-trace the train step ({err}); it may retrace")


def sync_logs(logs: Optional[dict]) -> Optional[float]:
    """Waits for the step's outputs (converting the loss to a float); returns the loss."""
    logs = logs or {}
    for value in logs.values():  # all of them: any output pending on the device
        if tf.is_tensor(value):
            np.asarray(value)
    return float(logs["loss"]) if "loss" in logs else None


def _gpu_peak_bytes() -> int:
    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


class BatchTimer(keras.callbacks.Callback):
    """Times every training step of `model.fit` into a `StepTimeReport`.

    Args:
        report: `StepTimeReport` or None. Where rows go; None creates an in-memory one.
        dims: `TransformerDims` or None. Architecture for the FLOP estimate; None: no FLOPs.
        warmup_steps: int or None. Overrides `report.warmup_steps` (rows left out of the
            steady-state summary). Defaults to the report's (1).
        peak_flops: float or None. Known peak FLOP/s of the device; skips the probe.
        probe_peak: bool. Probe the peak with `measure_peak_flops` once at the first
            `on_train_begin` (in the model's compute dtype, on the device holding its
            weights) when `peak_flops` is None.
            Defaults to `True`.
        measure_input_wait: bool. Wrap `model.train_function` to time `next(iterator)` and
            count tokens (see the module docstring). Defaults to `True`.
        pad_id: int. Token id of padding. Defaults to `0`.
        write_every_s: float or None. Rewrite the report files at most this often while
            training, so a killed run leaves recent rows on disk. Defaults to `30.0`.

    Example:

    >>> report = StepTimeReport("runs/a/report.json", run={"precision": "float32"})
    >>> timer = BatchTimer(report, dims=TransformerDims.from_config(config.model))
    >>> with report.guard():
    ...     model.fit(train_ds, epochs=1, callbacks=[timer])
    >>> timer.summary()["tgt_tokens_per_s"]
    """

    def __init__(
        self,
        report: Optional[StepTimeReport] = None,
        *,
        dims: Optional[TransformerDims] = None,
        warmup_steps: Optional[int] = None,
        peak_flops: Optional[float] = None,
        probe_peak: bool = True,
        measure_input_wait: bool = True,
        pad_id: int = 0,
        write_every_s: Optional[float] = 30.0,
    ):
        super().__init__()
        self.report = report if report is not None else StepTimeReport()
        if warmup_steps is not None:
            if warmup_steps < 0:
                raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
            self.report.warmup_steps = warmup_steps
        if peak_flops is not None:
            self.report.peak_flops = float(peak_flops)
        self.dims = dims
        self.probe_peak = probe_peak
        self.measure_input_wait = measure_input_wait
        self.pad_id = pad_id
        self.write_every_s = write_every_s
        self._process = psutil.Process()
        self._epoch = 0
        self._has_gpu = False
        self._execution = _Execution()
        self._test_execution = _Execution()
        self._shapes = {"train": ShapeLog(), "evaluate": ShapeLog()}
        self._test_start = 0.0
        self._batch_index = 0
        self._step_start = 0.0
        self._train_start = 0.0
        self._wall_before = 0.0  # train wall time of earlier fit() calls
        self._last_write = 0.0

    # ------------------------------------------------------------------ public

    def summary(self) -> dict:
        """Steady-state statistics so far (see `reports.summarize`)."""
        return self.report.summary()

    @property
    def records(self) -> list[StepRecord]:
        return self.report.records

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None):
        epochs = int(self.params.get("epochs", 1))
        if self.report.steps_planned is None and self.params.get("steps") and epochs < UNBOUNDED_EPOCHS:
            self.report.steps_planned = int(self.params["steps"]) * epochs
        if self.report.peak_flops is None and self.probe_peak:
            self.report.peak_flops = measure_peak_flops(dtype=self._compute_dtype(), device=self._model_device())
        self._has_gpu = bool(tf.config.list_logical_devices("GPU"))
        if self._has_gpu:
            tf.config.experimental.reset_memory_stats("GPU:0")
        if self.measure_input_wait:
            self._wrap(_STEP_FUNCTIONS["train"], "_execution")
        self._wall_before = self.report.train_wall_s or 0.0
        self._train_start = self._last_write = time.perf_counter()
        self.report.write()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._execution = _Execution()
        self._batch_index = batch
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        loss = sync_logs(logs)
        now = time.perf_counter()
        self.report.add_step(self._record(now - self._step_start, batch, loss))
        if self._shapes["train"].add(self._execution.counts, now - self._step_start):
            self._report_shapes("train")
        self.report.train_wall_s = self._wall_before + (now - self._train_start)
        if self.write_every_s is not None and now - self._last_write >= self.write_every_s:
            self.report.write()
            self._last_write = time.perf_counter()

    def on_test_begin(self, logs=None):
        if self.measure_input_wait:
            self._wrap(_STEP_FUNCTIONS["evaluate"], "_test_execution")

    def on_test_batch_begin(self, batch, logs=None):
        self._test_execution = _Execution()
        self._test_start = time.perf_counter()

    def on_test_batch_end(self, batch, logs=None):
        sync_logs(logs)
        if self._shapes["evaluate"].add(self._test_execution.counts, time.perf_counter() - self._test_start):
            self._report_shapes("evaluate")

    def on_test_end(self, logs=None):
        self._report_shapes("evaluate")
        self._restore(_STEP_FUNCTIONS["evaluate"])

    def on_train_end(self, logs=None):
        self._report_shapes("train")
        self._restore(_STEP_FUNCTIONS["train"])
        self.report.train_wall_s = self._wall_before + (time.perf_counter() - self._train_start)
        if self.report.guarded:
            self.report.write()  # the guard sets the final state
        else:
            self.report.finish("completed")

    # ------------------------------------------------------------------ internals

    def _model_device(self) -> Optional[str]:
        """The GPU or CPU holding the model's first weight (where the steps run); None: not known."""
        weights = getattr(self.model, "weights", None) or []
        device = getattr(getattr(weights[0], "value", None), "device", "") if weights else ""
        return device if "GPU" in device.upper() or "CPU" in device.upper() else None

    def _compute_dtype(self) -> str:
        policy = getattr(self.model, "dtype_policy", None)
        return getattr(policy, "compute_dtype", None) or "float32"

    def _count(self, batch: Any) -> Optional[BatchCounts]:
        return batch_counts(batch, self.pad_id)

    def _wrap(self, name: str, execution: str) -> None:
        """Replaces `model.<name>` (train_function | test_function) by the timed wrapper.

        `execution`: the attribute holding the `_Execution` of the current step.
        """
        if getattr(self.model, name, None) is None:  # not the TF trainer's fit(): nothing to wrap
            warnings.warn(f"BatchTimer: model.{name} is not built; input wait not measured")
            return
        original = unwrapped(getattr(self.model, name))
        timer = self
        pretraced = False

        def timed_function(iterator):
            nonlocal pretraced
            if not pretraced:
                _pretrace(original, iterator)
                pretraced = True
            return original(_TimedIterator(iterator, getattr(timer, execution), timer._count))

        setattr(timed_function, _ORIGINAL, original)
        setattr(self.model, name, timed_function)

    def _restore(self, name: str) -> None:
        if self.model is not None and getattr(self.model, name, None) is not None:
            setattr(self.model, name, unwrapped(getattr(self.model, name)))

    def _report_shapes(self, step: str) -> None:
        """Writes the shapes met by `step` (train | evaluate) into the report's `compile` section."""
        log = self._shapes[step]
        if not log.first_s:
            return
        function = getattr(self.model, _STEP_FUNCTIONS[step], None)
        compiled = compiled_step(unwrapped(function)) if function is not None else None
        traces = compiled.experimental_get_tracing_count() if compiled is not None else None
        self.report.compile[step] = log.to_dict(bool(getattr(self.model, "jit_compile", False)), traces)

    def _record(self, time_s: float, end_batch: int, loss: Optional[float]) -> StepRecord:
        execution = self._execution
        measured = execution.batches > 0
        batches = execution.batches if measured else end_batch - self._batch_index + 1
        flops = None
        if self.dims is not None and measured and None not in execution.counts:
            flops = sum(
                self.dims.train_flops(c.examples, c.src_len, c.tgt_len) for c in execution.counts
            )
        return StepRecord(
            step=self.report.steps_done,
            epoch=self._epoch,
            batches=batches,
            time_s=time_s,
            data_wait_s=execution.wait_s if measured else None,
            instrument_s=execution.instrument_s if measured else None,
            examples=execution.total("examples"),
            src_tokens=execution.total("src_tokens"),
            src_padded=execution.total("src_padded"),
            tgt_tokens=execution.total("tgt_tokens"),
            tgt_padded=execution.total("tgt_padded"),
            flops=flops,
            rss_bytes=self._process.memory_info().rss,
            gpu_peak_bytes=_gpu_peak_bytes() if self._has_gpu else None,
            loss=loss,
        )
