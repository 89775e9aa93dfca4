"""Where the step time goes: a TensorFlow profiler trace of steps A..B and its op breakdown.

`--profile-steps A:B` (1-based training steps, inclusive, counted over the whole run) starts
the TensorFlow profiler before step A and stops it after step B (`StepProfiler`, a Keras
callback). The trace lands in the run's TensorBoard directory
(`<run>/tensorboard/plugins/profile/<timestamp>/<host>.xplane.pb`, TensorBoard's Profile tab
reads it) and `op_breakdown` turns it into the report's `profile` section; `per_target_token`
adds each category's device time per real target token of the profiled steps (the token
counts come from the step-time report's rows), the unit in which step costs compare across
batch sizes and machines.

How time is counted. Inside a compiled (non-XLA) train step every TensorFlow op runs as a
kernel on an executor thread and the profiler records one event per op execution, named
`<name scope>/<op name>:<op type>`. "Device time" is the sum of these events' *self* time
(an event's duration minus the op events nested in it) over all threads: the CPU (or GPU
host-side) time spent in kernels. Ops on parallel inter-op threads overlap, so device time
can exceed the steps' wall time; the shares are of device time. Overlapping ops also share
the cores, so each one's span stretches: with `TF_NUM_INTEROP_THREADS=1` ops run one at a
time and each category's figure is its own cost (on a 2-core EPYC Zen 4, the default model's
bfloat16 step at 3 layers: 326 µs per real target token with the default pools, 214 with one thread,
docs/speed.md). Ops of the input pipeline
(tf.data threads, e.g. tokenization while the cache fills) are left out: the step-time
report measures the input wait. With `--xla` the step is one
XLA program and the breakdown shows it as `xla`: profile without XLA.

On a GPU the op events above are the host's side of each op: TensorFlow traces the launch of
a GPU kernel as a cheap op, and a GPU step's host plane holds little more than its `_Send` /
`_HostSend` events (measured on an H100 at host tracer levels 2 and 3, 2026-11-27). What the GPU
did is in the trace's `/device:GPU:N` planes, one line per CUDA stream, one event per kernel or
copy. `gpu_breakdown` adds the report's `profile.gpu`: kernels launched per step, the time the
GPU was busy (union of its kernel intervals) against the span from first to last kernel, hence
the idle share (the gaps the host leaves between kernels: launch and dispatch overhead), and
kernel time by the same categories, read from each kernel's `tf_op` stat. With a GPU plane the
device is the GPU: `profile_breakdown` takes `device_time_s`, `categories` and the per-token
figures from its kernels and keeps the host's op events under `profile.host`.

Categories (first rule that matches wins; `CATEGORIES` keeps this order):
    optimizer    ops under the optimizer's scope (`adam/`, `loss_scale_optimizer/`...)
    loss         the loss and its gradient (`compile_loss/`, softmax cross-entropy ops)
    matmul       MatMul / BatchMatMul / Einsum / Conv kernels (oneDNN `_Mkl*`, fused and the fused
                 kernels' `SmallBatchMatMul` too)
    cast         Cast ops anywhere (mixed precision's conversions)
    dropout      dropout scopes and random-number ops
    softmax      attention scores: scale, mask, softmax and their gradients (other
                 elementwise ops of an attention layer, outside its projections)
    layer_norm   ops under a `*norm*` scope (the model's LayerNorm and its `layer_norm_grad`)
    embedding    embedding scopes and gather / segment-sum ops
    xla          XLA programs inside a non-XLA step (a `tf.function(jit_compile=True)` it calls):
                 their `CpuExecutable` / `ThunkExecutor` events, which name no op
    other        everything else (bias, residual adds, activations, transposes, reshapes...)
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional

import keras

log = logging.getLogger(__name__)

CATEGORIES = ("matmul", "softmax", "layer_norm", "dropout", "cast", "embedding", "loss", "optimizer", "xla",
              "other")
TOP_OPS = 15

_OP_EVENT = re.compile(r"^(?P<name>[A-Za-z0-9_.>/\-]+):(?P<type>[A-Za-z0-9_]+)$")
_MATMUL_TYPES = re.compile(r"^_?(Mkl|Fused|MklFused|MklNative|MklNativeFused|Small)*(MatMul|BatchMatMul(V2|V3)?|Einsum|Conv\w*)$")
_OPTIMIZER_SCOPES = ("adam", "adamw", "sgd", "optimizer", "loss_scale_optimizer", "apply_gradients")
_PROJECTIONS = ("query", "key", "value", "attention_output")
# An XLA program run by a non-XLA step (`XlaLaunch`) leaves no `name:type` op event: its time is
# in these events, on the executor's thread and on the worker threads that run its pieces.
_XLA_EVENTS = ("CpuExecutable::ExecuteAsyncOnStream", "ThunkExecutor::Execute")
XLA_OP_TYPE = "XlaProgram"


def _scope(name: str) -> list[str]:
    """Scope components of an op name, Keras' `_1` call-suffixes stripped (`query_1` → `query`)."""
    return [re.sub(r"(_\d+)+$", "", part) for part in name.split("/")[:-1]]


def categorize(op_name: str, op_type: str) -> str:
    """The category (one of `CATEGORIES`) of one op, from its name scope and type."""
    scope = _scope(op_name)
    kind = op_type.lstrip("_")
    if op_type == XLA_OP_TYPE:
        return "xla"
    if any(part in _OPTIMIZER_SCOPES for part in scope) or kind.startswith("ResourceApply"):
        return "optimizer"
    if "compile_loss" in scope or "CrossEntropyWithLogits" in kind:
        return "loss"
    if _MATMUL_TYPES.match(op_type):
        return "matmul"
    if kind == "Cast":
        return "cast"
    if any("dropout" in part for part in scope) or "Random" in kind:
        return "dropout"
    attention = [i for i, part in enumerate(scope) if part.endswith("attention")]
    if attention and not any(part in _PROJECTIONS for part in scope[attention[-1] + 1:]):
        return "softmax"
    if "Softmax" in kind:
        return "softmax"
    if any("norm" in part for part in scope):
        return "layer_norm"
    if any("embedding" in part for part in scope) or kind.startswith(("Gather", "ResourceGather", "UnsortedSegment")):
        return "embedding"
    return "other"


def _op_events(xspace) -> Iterable[tuple[str, str, int]]:
    """(op name, op type, self time in picoseconds) of every op event in an XSpace."""
    for plane in xspace.planes:
        if _is_gpu_plane(plane):  # kernels, not op events: gpu_breakdown
            continue
        metadata = plane.event_metadata
        for line in plane.lines:
            if line.name.startswith("tf_data"):  # input-pipeline threads: not the step's work
                continue
            ops, xla_end = [], -1
            for event in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):
                name = metadata[event.metadata_id].name
                match = _OP_EVENT.match(name)
                if match:
                    ops.append((event.offset_ps, event.duration_ps, match["name"], match["type"]))
                elif name in _XLA_EVENTS and event.offset_ps >= xla_end:  # outermost XLA events only
                    xla_end = event.offset_ps + event.duration_ps
                    ops.append((event.offset_ps, event.duration_ps, f"xla/{line.name}", XLA_OP_TYPE))
            stack: list[list] = []  # [end, self_ps, name, type] of open (enclosing) op events
            for start, duration, name, op_type in ops:
                while stack and stack[-1][0] <= start:
                    _, self_ps, done_name, done_type = stack.pop()
                    yield done_name, done_type, self_ps
                if stack:
                    stack[-1][1] -= duration  # nested: not the parent's own time
                stack.append([start + duration, duration, name, op_type])
            while stack:
                _, self_ps, done_name, done_type = stack.pop()
                yield done_name, done_type, self_ps


def load_xspace(path: str | Path):
    """Parses an `.xplane.pb` trace file (the profiler's XSpace protobuf)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xspace = xplane_pb2.XSpace()
    xspace.ParseFromString(Path(path).read_bytes())
    return xspace


def op_breakdown(xspace, top: int = TOP_OPS) -> dict:
    """Device time of an XSpace by category, plus the top ops and op types.

    Returns a JSON-ready dict: `device_time_s`, `categories` {name: {"seconds", "share"}}
    (every category of `CATEGORIES`, shares of device time summing to 1), `top_ops` and
    `top_types` (lists of {"name" and "category", or "type"; "seconds", "share"}, largest first).
    """
    by_category: dict[str, float] = defaultdict(float)
    by_op: dict[tuple[str, str], float] = defaultdict(float)
    by_type: dict[str, float] = defaultdict(float)
    for name, op_type, self_ps in _op_events(xspace):
        seconds = max(self_ps, 0) * 1e-12
        by_category[categorize(name, op_type)] += seconds
        by_op[(name, op_type)] += seconds
        by_type[op_type] += seconds
    total = sum(by_category.values())

    def share(seconds: float) -> float:
        return seconds / total if total else 0.0

    def ranked(table: dict, key: str) -> list[dict]:
        rows = sorted(table.items(), key=lambda item: -item[1])[:top]
        return [{key: k, "seconds": v, "share": share(v)} if key == "type"
                else {key: f"{k[0]}:{k[1]}", "category": categorize(*k), "seconds": v, "share": share(v)}
                for k, v in rows]

    return {
        "device_time_s": total,
        "categories": {c: {"seconds": by_category.get(c, 0.0), "share": share(by_category.get(c, 0.0))}
                       for c in CATEGORIES},
        "top_ops": ranked(by_op, "name"),
        "top_types": ranked(by_type, "type"),
    }


_GPU_PLANE = re.compile(r"^/device:GPU:\d+$")


def _is_gpu_plane(plane) -> bool:
    return bool(_GPU_PLANE.match(plane.name))


def _stat_text(plane, stat) -> str:
    """A string stat's value (inline, or by reference to the plane's stat metadata)."""
    if stat.WhichOneof("value") == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    return stat.str_value if stat.WhichOneof("value") == "str_value" else ""


def gpu_breakdown(xspace, steps: int) -> Optional[dict]:
    """What the GPUs did in a trace of `steps` training steps, or None without a GPU plane.

    Counts the kernel and copy events of every `Stream` line of each `/device:GPU:N` plane.
    Returns a JSON-ready dict: `kernels` and `kernels_per_step`, `busy_s` (union of the event
    intervals, summed over GPUs), `span_s` (first event start to last event end, summed over
    GPUs), `idle_share` (1 − busy/span: the GPU waiting for the host), `kernel_time_s` (sum of
    event durations; > busy when streams overlap) and `categories` {name: {"seconds", "share"}}
    of kernel time by the kernel's `tf_op` stat (`categorize`; kernels without one: "other").
    """
    kernels, busy_ps, span_ps = 0, 0, 0
    by_category: dict[str, float] = defaultdict(float)
    found = False
    for plane in xspace.planes:
        if not _is_gpu_plane(plane):
            continue
        found = True
        tf_op_ids = {key for key, meta in plane.stat_metadata.items() if meta.name == "tf_op"}
        intervals = []
        for line in plane.lines:
            if not line.name.startswith("Stream"):  # derived lines repeat the stream events
                continue
            base_ps = line.timestamp_ns * 1000
            for event in line.events:
                start = base_ps + event.offset_ps
                intervals.append((start, start + event.duration_ps))
                tf_op = next((_stat_text(plane, stat) for stat in event.stats if stat.metadata_id in tf_op_ids), "")
                match = _OP_EVENT.match(tf_op)
                category = categorize(match["name"], match["type"]) if match else "other"
                by_category[category] += event.duration_ps * 1e-12
        if not intervals:
            continue
        intervals.sort()
        kernels += len(intervals)
        span_ps += intervals[-1][1] - intervals[0][0]
        end = intervals[0][0]
        for start, stop in intervals:  # union of intervals
            busy_ps += max(0, stop - max(start, end))
            end = max(end, stop)
    if not found:
        return None
    kernel_time = sum(by_category.values())
    return {
        "kernels": kernels,
        "kernels_per_step": kernels / steps if steps else None,
        "busy_s": busy_ps * 1e-12,
        "span_s": span_ps * 1e-12,
        "idle_share": 1 - busy_ps / span_ps if span_ps else None,
        "kernel_time_s": kernel_time,
        "categories": {c: {"seconds": by_category.get(c, 0.0),
                           "share": by_category.get(c, 0.0) / kernel_time if kernel_time else 0.0}
                       for c in CATEGORIES},
    }


def latest_trace(log_dir: str | Path, since: float = 0.0) -> Optional[Path]:
    """Newest `.xplane.pb` under `log_dir/plugins/profile/` modified after `since`, or None."""
    traces = [p for p in Path(log_dir).glob("plugins/profile/*/*.xplane.pb") if p.stat().st_mtime >= since]
    return max(traces, key=lambda p: p.stat().st_mtime) if traces else None


def profile_breakdown(xspace, steps: int) -> dict:
    """The report's breakdown of a trace of `steps` steps: `op_breakdown`, and with a GPU plane
    `gpu` (`gpu_breakdown`), whose kernel time by category becomes `device_time_s` / `categories`
    (the host's op events, kernel launches there, move to `host`). `top_ops` / `top_types` are
    the host's op events either way."""
    result = op_breakdown(xspace)
    gpu = gpu_breakdown(xspace, steps)
    if gpu is not None:
        result["host"] = {"device_time_s": result["device_time_s"], "categories": result["categories"]}
        result.update(gpu=gpu, device_time_s=gpu["kernel_time_s"], categories=gpu["categories"])
    return result


class StepProfiler(keras.callbacks.Callback):
    """Profiles training steps `first..last` (1-based, inclusive) into `log_dir`.

    At the end of step `last` (or of training, if it ends earlier) the trace is parsed and
    `report.profile` is set to `op_breakdown(...)` plus the steps, their wall time and the
    trace path; the report is written. Place it after `BatchTimer`, which syncs each step.

    Args:
        first, last: int. Steps to profile (see `config.parse_profile_steps`).
        log_dir: str or Path. The run's TensorBoard directory.
        report: `StepTimeReport` or None. Where the breakdown goes.
    """

    def __init__(self, first: int, last: int, log_dir: str | Path, report=None):
        super().__init__()
        self.first, self.last = first, last
        self.log_dir = Path(log_dir)
        self.report = report
        self.result: Optional[dict] = None
        self._step = 0
        self._active = False
        self._started_at = 0.0
        self._started_wall = 0.0
        self._profiled = 0
        self._records_before = 0  # the report's step rows written before step `first`

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        if self._step == self.first and self.result is None:
            import tensorflow as tf

            self._records_before = len(self.report.records) if self.report is not None else 0

            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._started_wall = time.time()
            tf.profiler.experimental.start(str(self.log_dir))
            self._active = True
            self._started_at = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._active:
            self._profiled += 1
            if self._step >= self.last:
                self._stop()

    def on_train_end(self, logs=None):
        if self._active:
            self._stop()

    def _stop(self) -> None:
        import tensorflow as tf

        wall_s = time.perf_counter() - self._started_at
        tf.profiler.experimental.stop()
        self._active = False
        trace = latest_trace(self.log_dir, since=self._started_wall - 1)
        if trace is None:
            self.result = {"steps": [self.first, self.first + self._profiled - 1], "error": "no trace written"}
        else:
            self.result = {
                "steps": [self.first, self.first + self._profiled - 1],
                "steps_profiled": self._profiled,
                "wall_s": wall_s,
                "trace": str(trace.relative_to(self.log_dir.parent)) if self.log_dir.parent in trace.parents
                else str(trace),
            }
            self.result.update(profile_breakdown(load_xspace(trace), self._profiled))
            self.result.update(per_target_token(self.result, self._profiled_tokens()))
        if "categories" in self.result:
            log.info("profile of steps %d-%d (%s): %s time %.2f s: %s", *self.result["steps"],
                     "GPU kernel" if "gpu" in self.result else "device",
                     self.result["trace"], self.result["device_time_s"], format_breakdown(self.result))
            if self.result.get("non_matmul_us_per_tgt_token") is not None:
                log.info("per real target token (%d tokens): device %.1f µs, outside matmul %.1f µs",
                         self.result["tgt_tokens"], self.result["device_us_per_tgt_token"],
                         self.result["non_matmul_us_per_tgt_token"])
        if "gpu" in self.result:
            gpu = self.result["gpu"]
            log.info("profile on the GPU: %d kernels (%.0f per step), busy %.3f s of %.3f s (%.0f%% idle): %s",
                     gpu["kernels"], gpu["kernels_per_step"] or 0, gpu["busy_s"], gpu["span_s"],
                     100 * (gpu["idle_share"] or 0), format_breakdown(gpu))
        if self.report is not None:
            self.report.profile = self.result
            self.report.write()

    def _profiled_tokens(self) -> Optional[int]:
        """Real (non-pad) target tokens of the profiled steps, from the report's step rows."""
        if self.report is None:
            return None
        rows = self.report.records[self._records_before:]
        if len(rows) != self._profiled or any(row.tgt_tokens is None for row in rows):
            return None
        return sum(row.tgt_tokens for row in rows)


def per_target_token(breakdown: dict, tgt_tokens: Optional[int]) -> dict:
    """Device time per real target token: comparable across batch sizes, models' steps and CPUs.

    Returns `tgt_tokens` (real target tokens of the profiled steps), `device_us_per_tgt_token`,
    `non_matmul_us_per_tgt_token` (device time outside `matmul`) and
    `us_per_tgt_token` {category: microseconds}; all None without a token count.
    """
    if not tgt_tokens:
        return {"tgt_tokens": tgt_tokens, "device_us_per_tgt_token": None, "non_matmul_us_per_tgt_token": None,
                "us_per_tgt_token": None}
    per_token = {name: 1e6 * value["seconds"] / tgt_tokens for name, value in breakdown["categories"].items()}
    return {
        "tgt_tokens": tgt_tokens,
        "device_us_per_tgt_token": 1e6 * breakdown["device_time_s"] / tgt_tokens,
        "non_matmul_us_per_tgt_token": sum(v for name, v in per_token.items() if name != "matmul"),
        "us_per_tgt_token": per_token,
    }


def format_breakdown(profile: dict) -> str:
    """One line: `matmul 41% · softmax 12% · ...` (largest first), for logs."""
    categories = sorted(profile["categories"].items(), key=lambda item: -item[1]["share"])
    return " · ".join(f"{name} {100 * value['share']:.0f}%" for name, value in categories)
