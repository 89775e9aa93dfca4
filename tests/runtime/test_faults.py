"""Faults during training on a tiny model: divergence (NaN), SIGINT, SIGTERM (subprocess), a full
disk during a save, two writers on one run directory. Each checks what is kept and that
`--resume` continues."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.base import allocator, errors
from transformer.base.config import ModelConfig, PipelineConfig, RunConfig, TrainConfig
from transformer.inference.rundir import CHECKPOINT_DIR, build_model
from transformer.runtime.faults import DiskFullError, TrainingDiverged
from transformer.runtime.runlock import LOCK_FILE, RunLock, RunLockedError
from transformer.training.trainer import train

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 3  # per epoch


def tiny_run(bible_tokenizers, output: Path, **train_overrides) -> RunConfig:
    """2 epochs × 3 steps of a 1-layer d_model-16 model, no validation, session tokenizers."""
    root = bible_tokenizers.data_config.data_dir
    data = dataclasses.replace(bible_tokenizers.data_config, data_dir=None, train_src=f"{root}/train.pt",
                               train_tgt=f"{root}/train.en")
    return RunConfig(
        data=data, tokenizer=bible_tokenizers.config,
        model=ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, max_length=32),
        pipeline=PipelineConfig(max_tokens=512),
        train=TrainConfig(**{"epochs": 2, "steps_per_epoch": STEPS, "probe_peak": False, "verbose": 0,
                             "lr_schedule": "inverse-sqrt", "warmup_steps": 10, "bleu_sentences": 0,
                             "mixed_precision": "off", "xla": False,
                             "output_dir": str(output), **train_overrides}),
    )


def load_train_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_script", REPO_ROOT / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AtStep(keras.callbacks.Callback):
    """Calls `action(model)` once, before optimizer step `step` (1-based) runs."""

    def __init__(self, step: int, action):
        super().__init__()
        self.step, self.action = step, action

    def on_train_batch_begin(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step - 1:
            self.action(self.model)


def poison(model):
    variable = model.trainable_variables[0]
    variable.assign(tf.fill(variable.shape, float("nan")))


def latest_checkpoint_state(run_dir: Path) -> tuple[str, int, bool]:
    """(latest checkpoint prefix, its optimizer step, all its model weights finite)."""
    prefix = tf.train.latest_checkpoint(str(run_dir / CHECKPOINT_DIR))
    reader = tf.train.load_checkpoint(prefix)
    names = reader.get_variable_to_shape_map()
    step = max(int(reader.get_tensor(n)) for n in names if n.startswith("optimizer") and "iterations" in n)
    finite = all(np.isfinite(reader.get_tensor(n)).all() for n in names
                 if n.startswith("model/") and reader.get_tensor(n).dtype.kind == "f")
    return prefix, step, finite


def test_nan_loss_stops_as_diverged_and_keeps_the_last_good_checkpoint(bible_tokenizers, tmp_path):
    """Under mixed float16 (loss scaling): a NaN at step 5 → state diverged, report details, ckpt-1 kept."""
    output = tmp_path / "run"
    try:
        with pytest.raises(TrainingDiverged) as info:
            train(tiny_run(bible_tokenizers, output, mixed_precision="float16"),
                  extra_callbacks=(AtStep(STEPS + 2, poison),))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert info.value.exit_status == 1
    assert f"at step {STEPS + 2}" in str(info.value) and "--peak-lr" in info.value.hint
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "diverged" and report["error"]["type"] == "TrainingDiverged"
    divergence = report["run"]["divergence"]
    assert divergence["step"] == STEPS + 2 and divergence["precision_policy"] == "mixed_float16"
    assert np.isfinite(divergence["last_finite_loss"]) and divergence["learning_rate"] > 0
    scales = [scale for _, scale in divergence["loss_scale_history"]]
    assert scales[-1] < scales[0]  # the NaN step halved the loss scale
    prefix, step, finite = latest_checkpoint_state(output)
    assert prefix.endswith("ckpt-1") and step == STEPS and finite


def test_sigint_saves_a_checkpoint_and_resume_continues(bible_tokenizers, tmp_path, capsys):
    output = tmp_path / "run"
    config = tiny_run(bible_tokenizers, output)
    with pytest.raises(errors.Interrupted) as info:
        train(config, extra_callbacks=(AtStep(2, lambda m: os.kill(os.getpid(), signal.SIGINT)),))
    assert errors.report_error(info.value) == 130
    assert "error: interrupted by SIGINT at step 2; saved checkpoint" in capsys.readouterr().err
    assert json.loads((output / "report.json").read_text())["state"] == "interrupted"
    assert latest_checkpoint_state(output)[1:] == (2, True)
    assert not (output / LOCK_FILE).exists()
    assert signal.getsignal(signal.SIGINT) is not None  # the previous handler is back

    result = train(dataclasses.replace(config, train=dataclasses.replace(config.train, resume=True)))
    assert result.summary["optimizer_steps"] == 2 + 2 * STEPS  # the interrupted epoch's data again
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "completed" and report["steps_done"] == 2 + 2 * STEPS


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(bible_tokenizers, tmp_path, monkeypatch):
    """ENOSPC while writing ckpt-2 (a truncated file is left behind): ckpt-1 stays the readable latest."""
    output = tmp_path / "run"
    real_write = tf.train.Checkpoint._write
    calls = []

    def write_until_full(self, prefix, *args, **kwargs):
        calls.append(prefix)
        if len(calls) == 2:
            Path(f"{prefix}.data-00000-of-00001").write_bytes(b"\0" * 10)  # what a full disk leaves
            raise OSError(errno.ENOSPC, "No space left on device", f"{prefix}.data-00000-of-00001")
        return real_write(self, prefix, *args, **kwargs)

    monkeypatch.setattr(tf.train.Checkpoint, "_write", write_until_full)
    with pytest.raises(DiskFullError) as info:
        train(tiny_run(bible_tokenizers, output))
    message = str(info.value)
    assert info.value.exit_status == 1 and "the previous save" in message and "ckpt-1 is intact" in message
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "crashed" and "ckpt-1 is intact" in report["error"]["message"]
    prefix, step, finite = latest_checkpoint_state(output)
    assert prefix.endswith("ckpt-1") and step == STEPS and finite
    model = build_model(RunConfig.load(output / "config.json").model)
    from transformer.runtime.artifacts import restore_model_weights

    restore_model_weights(model, prefix, output)  # readable, and matches config.json


def test_one_writer_per_run_directory(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on {socket.gethostname()}"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_FILE).exists()

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: its lock is stale
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "started": 0}))
    with RunLock(tmp_path) as lock:
        assert lock.owner()["pid"] == os.getpid()

    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": time.time()}))
    with pytest.raises(RunLockedError) as info:
        RunLock(tmp_path).acquire()
    assert str(tmp_path / LOCK_FILE) in info.value.hint  # another host: say how to remove it


def test_sigterm_end_to_end_then_resume(bible_tokenizers, tmp_path):
    """scripts/train.py gets SIGTERM mid-epoch (as Colab/schedulers send): backup + report, exit 143; --resume."""
    data = bible_tokenizers.data_config
    output = tmp_path / "run"
    argv = ["--data", data.data_dir, "--max-train-examples", str(data.max_train_examples),
            "--max-val-examples", str(data.max_val_examples), "--vocab-size", str(bible_tokenizers.config.vocab_size),
            "--lower-case", "--tokenizers-root", bible_tokenizers.config.root,
            "--num-layers", "1", "--d-model", "16", "--num-heads", "2", "--dff", "32", "--max-length", "32",
            "--max-tokens", "512", "--lr-schedule", "inverse-sqrt", "--warmup-steps", "10", "--bleu-sentences", "0",
            "--epochs", "1", "--steps-per-epoch", "300", "--validation-steps", "1", "--backup-every-steps", "2",
            "--device", "cpu", "--mixed-precision", "off", "--no-xla", "--no-probe-peak", "--verbose", "0",
            "--output", str(output)]
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", errors.DEBUG_ENV, allocator.USE_BFC_VAR)}
    process = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *argv],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**env, "PYTHONPATH": str(REPO_ROOT)})
    deadline = time.time() + 120
    while not list((output / "backup").glob("snapshot-*")) and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "error: interrupted by SIGTERM at step" in stderr and "saved backup" in stderr
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "interrupted"
    assert report["environment"]["cpu_allocator"]["running"] == "bfc"  # scripts/train.py asked for it before TF started
    stopped_at = report["steps_done"]
    assert 0 < stopped_at < 300

    # The same command with --resume (a shorter epoch, to keep the test short): continues from the backup.
    short = [("12" if arg == "300" else arg) for arg in argv]
    assert load_train_script().main([*short, "--resume"]) == 0
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "completed" and report["steps_done"] > stopped_at
    assert report["run"]["resumed_from_backup"]["step"] >= stopped_at - 1


def test_disk_full_during_a_backup_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    """ENOSPC in the 2nd backup snapshot: DiskFullError names the 1st, which is intact and alone."""
    from transformer.training.backup import StepBackupAndRestore, read_metadata, snapshots

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    real_save = model.save_weights
    saves = []

    def save_until_full(path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 2:
            Path(path).write_bytes(b"\0" * 10)  # what a full disk leaves behind
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(path, *args, **kwargs)

    monkeypatch.setattr(model, "save_weights", save_until_full)
    backup = StepBackupAndRestore(tmp_path / "backup", save_freq=2, steps_per_epoch=8)
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    with pytest.raises(DiskFullError) as info:
        model.fit(x, y, batch_size=2, epochs=1, steps_per_epoch=8, callbacks=[backup], verbose=0)
    kept = snapshots(tmp_path / "backup")
    assert [read_metadata(s)["step"] for s in kept] == [2]
    assert f"the previous save {kept[0]} is intact" in str(info.value)
    assert not list((tmp_path / "backup").glob(".tmp-*"))  # the half-written snapshot is gone
    model.load_weights(str(kept[0] / "latest.weights.h5"))  # readable
