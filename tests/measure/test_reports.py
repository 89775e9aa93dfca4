"""StepTimeReport: summary arithmetic, atomic JSON + CSV files, crash-safe states, loading."""

import json

import pytest
import tensorflow as tf

from transformer.measure.reports import (
    REQUIRED_KEYS,
    STEP_COLUMNS,
    StepRecord,
    StepTimeReport,
    capture_environment,
    load_report,
    load_steps,
)

ENV = {"device": "CPU"}  # capture_environment is tested once; the rest skip its cost


def record(step: int, time_s: float, wait_s: float = 0.01) -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        batches=1,
        time_s=time_s,
        data_wait_s=wait_s,
        instrument_s=0.0,
        examples=8,
        src_tokens=60,
        src_padded=80,
        tgt_tokens=30,
        tgt_padded=40,
        flops=1e9,
        rss_bytes=1000 + step,
        loss=2.0,
    )


def report_with_steps(path, times=(5.0, 0.1, 0.2, 0.3), **kwargs) -> StepTimeReport:
    report = StepTimeReport(path, run={"precision": "float32"}, environment=ENV, **kwargs)
    for step, time_s in enumerate(times):
        report.add_step(record(step, time_s))
    return report


def test_summary_keeps_first_step_apart_and_uses_ratios_of_sums():
    report = report_with_steps(None, steps_planned=10)
    report.peak_flops = 1e11
    summary = report.summary()
    assert summary["first_step_s"] == 5.0
    assert summary["steady_steps"] == 3
    assert summary["mean_step_s"] == pytest.approx(0.2)
    assert summary["median_step_s"] == pytest.approx(0.2)
    assert summary["p90_step_s"] == pytest.approx(0.28)
    assert summary["tgt_tokens_per_s"] == pytest.approx(90 / 0.6)
    assert summary["tgt_padded_tokens_per_s"] == pytest.approx(120 / 0.6)
    assert summary["examples_per_s"] == pytest.approx(24 / 0.6)
    assert summary["padding_fraction"] == pytest.approx(1 - 90 / 120)
    assert summary["data_wait_pct"] == pytest.approx(100 * 0.03 / 0.6)
    assert summary["utilisation"] == pytest.approx(3e9 / 0.6 / 1e11)
    assert summary["peak_rss_bytes"] == 1003  # over every step, warm-up included
    assert summary["gpu_peak_bytes"] is None


def test_warmup_steps_is_configurable_and_missing_counts_stay_none():
    report = StepTimeReport(None, warmup_steps=2, environment=ENV)
    for step, time_s in enumerate((3.0, 1.0, 0.5)):
        report.add_step(StepRecord(step=step, epoch=0, batches=1, time_s=time_s))
    summary = report.summary()
    assert summary["steady_steps"] == 1 and summary["mean_step_s"] == 0.5
    assert summary["data_wait_pct"] is None and summary["tgt_tokens_per_s"] is None


def test_capture_environment_names_versions_and_device():
    env = capture_environment()
    assert env["tensorflow"] == tf.__version__
    for key in ("tensorflow_text", "keras", "python", "device", "cpu_model", "cpu_count_logical"):
        assert env[key], key
    assert "hostname" in env
    assert "nvidia_smi" in env
    if "cpu family" in open("/proc/cpuinfo").read():  # x86 Linux: the CPU's identity beside its model name
        assert env["cpu_id"].startswith("family ") and " model " in env["cpu_id"]


def test_capture_environment_before_the_first_op_leaves_tensorflow_unstarted():
    """A report is made before a multi-worker strategy, which must configure TensorFlow's devices
    itself: capturing the environment (the CPU allocator included) must not create them."""
    import os
    import subprocess
    import sys

    program = ("import json, tensorflow as tf\n"
               "from tensorflow.python.eager import context\n"
               "from transformer.measure.environment import capture_environment\n"
               "env = capture_environment()\n"
               "started = context.context()._initialized\n"
               "tf.constant(1.0) + 1.0\n"
               "print(json.dumps([started, env['cpu_allocator'], capture_environment()['cpu_allocator']]))\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CPU_ALLOCATOR_USE_BFC": "true"})
    assert out.returncode == 0, out.stderr[-2000:]
    started, before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert started is False
    assert before["running"] == after["running"] == "bfc"  # predicted from the variable, then asked of TensorFlow


def test_write_round_trips_json_and_step_csv(tmp_path):
    path = tmp_path / "run" / "report.json"
    report = report_with_steps(path)
    assert report.write() == path
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json", "report_steps.csv"]  # no temp files

    saved = load_report(path)
    assert set(REQUIRED_KEYS) <= set(saved)
    assert (saved["state"], saved["steps_done"], saved["steps_csv"]) == ("running", 4, "report_steps.csv")
    assert saved["run"] == {"precision": "float32"}
    rows = load_steps(path)
    assert list(rows[0]) == list(STEP_COLUMNS)
    assert [row["step_s"] for row in rows] == [5.0, 0.1, 0.2, 0.3]
    assert [row["warmup"] for row in rows] == [True, False, False, False]
    assert rows[0]["gpu_peak_bytes"] is None and rows[0]["padding_fraction"] == pytest.approx(0.25)


def test_guard_marks_completed(tmp_path):
    report = report_with_steps(tmp_path / "report.json")
    with report.guard():
        assert load_report(tmp_path / "report.json")["state"] == "running"  # written on entry
    saved = load_report(tmp_path / "report.json")
    assert saved["state"] == "completed" and saved["error"] is None and saved["finished_at"]


def test_guard_marks_interrupted_and_reraises(tmp_path):
    report = report_with_steps(tmp_path / "report.json")
    with pytest.raises(KeyboardInterrupt), report.guard():
        raise KeyboardInterrupt
    assert load_report(tmp_path / "report.json")["state"] == "interrupted"


def test_guard_marks_crash_with_error_and_keeps_rows(tmp_path):
    path = tmp_path / "report.json"
    report = StepTimeReport(path, environment=ENV)
    with pytest.raises(tf.errors.ResourceExhaustedError), report.guard():
        report.add_step(record(0, 1.0))
        report.add_step(record(1, 0.5))
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    saved = load_report(path)
    assert saved["state"] == "crashed" and saved["steps_done"] == 2
    assert saved["error"]["type"] == "ResourceExhaustedError"
    assert saved["error"]["out_of_memory"] is True
    assert "OOM when allocating" in saved["error"]["message"] and saved["error"]["traceback"]
    assert [row["step"] for row in load_steps(path)] == [0, 1]


def test_guard_marks_other_errors_crashed_not_oom(tmp_path):
    report = StepTimeReport(tmp_path / "report.json", environment=ENV)
    with pytest.raises(ValueError), report.guard():
        raise ValueError("bad shape")
    error = load_report(tmp_path / "report.json")["error"]
    assert (error["type"], error["out_of_memory"]) == ("ValueError", False)


@pytest.mark.parametrize(
    "content, message",
    [(None, "not found"), ("{not json", "not valid JSON"), ('{"state": "completed"}', "missing keys")],
)
def test_load_report_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises((FileNotFoundError, ValueError), match=message) as err:
        load_report(path)
    assert str(path) in str(err.value)


def test_run_dict_accepts_non_json_values(tmp_path):
    report = StepTimeReport(tmp_path / "r.json", run={"out": tmp_path, "xla": True}, environment=ENV)
    report.write()
    assert json.loads((tmp_path / "r.json").read_text())["run"] == {"out": str(tmp_path), "xla": True}


def full_csv(report: StepTimeReport) -> str:
    """The CSV rendered from scratch (what the incremental rendering must equal)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=STEP_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for i, row in enumerate(report.records):
        writer.writerow(row.row(warmup=i < report.warmup_steps, peak_flops=report.peak_flops))
    return out.getvalue()


def test_incremental_csv_and_step_count_equal_a_full_rendering():
    """Rows already written are not rendered again, but every change that alters them is seen."""
    report = report_with_steps(None, times=(5.0, 0.1))
    assert report.steps_csv_text() == full_csv(report) and report.steps_done == 2
    report.add_step(record(2, 0.3))
    before = report.steps_csv_text()
    assert before == full_csv(report) and report.steps_done == 3
    report.peak_flops = 1e12  # utilisation of every row changes
    report.warmup_steps = 2  # the second row becomes warm-up
    assert report.steps_csv_text() == full_csv(report) != before
    report.records = [record(0, 1.0)]  # replaced (as `continue_from_disk` does)
    assert report.steps_csv_text() == full_csv(report) and report.steps_done == 1
    report.records.append(StepRecord(step=1, epoch=0, batches=4, time_s=0.5))
    assert report.steps_csv_text() == full_csv(report) and report.steps_done == 5
