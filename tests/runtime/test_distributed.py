"""tf.distribute strategies, fault tolerance (BackupAndRestore, atomic saves) and --auto-batch.

Tests that need a fresh TensorFlow (logical devices, a cluster, SIGKILL) run
tests/distributed_worker.py in subprocesses with bounded timeouts; what comes after a kill
(the resumed run, the last verification) runs in this process. They share one tiny
synthetic corpus and its tokenizers, built once per module.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from distributed_worker import progress_callback, verify_saved
from helpers_model import moves_in_training

from transformer.base.config import RunConfig
from transformer.runtime import distribute

WORKER = Path(__file__).resolve().parents[1] / "distributed_worker.py"
REPO_ROOT = Path(__file__).resolve().parents[2]

PT = "casa cão gato livro água sol lua rio mar pão vinho terra céu fogo pedra árvore flor homem mulher rei".split()
EN = "house dog cat book water sun moon river sea bread wine earth sky fire stone tree flower man woman king".split()


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """A 300-pair word-for-word synthetic corpus and its tokenizers (built once)."""
    from transformer.base.config import DataConfig, TokenizerConfig
    from transformer.data.corpora import load_corpus
    from transformer.data.tokenizer import build_or_load_tokenizers

    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for split, count in (("train", 300), ("validation", 16)):
        src, tgt = [], []
        for _ in range(count):
            words = rng.integers(0, len(PT), rng.integers(2, 12))
            src.append(" ".join(PT[w] for w in words))
            tgt.append(" ".join(EN[w] for w in words))
        (root / f"{split}.pt").write_text("\n".join(src) + "\n", encoding="utf-8")
        (root / f"{split}.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    data, tokenizer = DataConfig(data_dir=str(root)), TokenizerConfig(vocab_size=120, root=str(root / "tokenizers"))
    build_or_load_tokenizers(load_corpus(data), tokenizer)  # later runs reuse this directory
    return {"data": {"data_dir": str(root)}, "tokenizer": {"vocab_size": 120, "root": str(root / "tokenizers")}}


def run_config(corpus: dict, output_dir: Path, max_length: int = 16, **train) -> dict:
    """A tiny training run (1 layer, d_model 16) as a RunConfig dict."""
    return RunConfig.from_dict({
        **corpus,
        "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "dropout_rate": 0.0,
                  "max_length": max_length},
        "pipeline": {"max_tokens": 64, "bucket_width": 8, "shuffle_buffer": 100},
        "train": {"epochs": 2, "steps_per_epoch": 3, "validation_steps": 1, "warmup_steps": 10, "verbose": 0,
                  "bleu_sentences": 0,  # validation loss only: no untrained model decoding to max_length
                  "probe_peak": False, "device": "cpu", "output_dir": str(output_dir), **train},
    }).validate().to_dict()


def worker_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO_ROOT), **extra)
    return env


def start_worker(*args, env=None, log: Path | None = None, stderr: Path | None = None) -> subprocess.Popen:
    """Starts tests/distributed_worker.py; output to `log` (else a pipe), stderr too unless `stderr`."""
    out = open(log, "w") if log is not None else subprocess.PIPE
    err = open(stderr, "w") if stderr is not None else subprocess.STDOUT
    return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], cwd=REPO_ROOT,
                            env=env or worker_env(), stdout=out, stderr=err, text=True)


def finish(process: subprocess.Popen, timeout: float, log: Path | None = None) -> str:
    """Waits for `process`, returns its output; fails (after killing it) on timeout or error."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"worker timed out after {timeout} s: {process.args}\n{log.read_text()[-3000:] if log else ''}")
    output = output or (log.read_text() if log else "")
    assert process.returncode == 0, f"worker failed ({process.returncode}):\n{output[-4000:]}"
    return output


def read_line(process: subprocess.Popen, timeout: float) -> str:
    """The next stdout line of `process`, failing after `timeout` s instead of blocking forever."""
    result: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: result.put(process.stdout.readline()), daemon=True).start()
    try:
        return result.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        pytest.fail(f"no output from {process.args} within {timeout} s")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# ---------------------------------------------------------------------------- unit


def test_strategy_names_and_roles_come_from_tf_config():
    cluster = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}}
    assert distribute.resolve_strategy_name("auto", cluster) == "multi-worker"
    assert distribute.resolve_strategy_name("auto", {}) == distribute.DEFAULT  # no GPU here
    assert distribute.resolve_strategy_name("mirrored", cluster) == "mirrored"
    assert distribute.task_role("multi-worker", cluster) == distribute.TaskRole("worker", 1, False)
    first = {**cluster, "task": {"type": "worker", "index": 0}}
    assert distribute.task_role("multi-worker", first).is_chief
    with_chief = {"cluster": {**cluster["cluster"], "chief": ["127.0.0.1:3"]}, "task": {"type": "worker", "index": 0}}
    assert not distribute.task_role("multi-worker", with_chief).is_chief
    assert distribute.task_role("mirrored", cluster).is_chief  # TF_CONFIG only matters for multi-worker
    with pytest.raises(distribute.DistributeError, match="not valid JSON"):
        distribute.read_tf_config({"TF_CONFIG": "{oops"})
    with pytest.raises(ValueError, match="--strategy must be one of"):
        distribute.resolve_strategy_name("horovod")


def test_non_chief_writes_to_a_temp_dir_that_cleanup_removes(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    chief, other = distribute.TaskRole(), distribute.TaskRole("worker", 1, False)
    assert chief.write_dir(run_dir) == run_dir
    temp = other.write_dir(run_dir)
    assert temp != run_dir and temp.is_dir()
    (temp / "report.json").write_text("{}")
    other.cleanup(temp, run_dir)
    chief.cleanup(run_dir, run_dir)  # never deletes the run directory
    assert not temp.exists() and run_dir.is_dir()


def test_tpu_strategy_fails_with_a_clear_error_without_a_tpu():
    # "" fails before connecting (a remote address would make this process retry for minutes).
    with pytest.raises(distribute.DistributeError, match="no TPU reachable.*--strategy mirrored"):
        distribute.tpu_strategy("")


def test_tpu_batches_have_static_shapes():
    import tensorflow as tf

    pairs = tf.data.Dataset.range(5).map(lambda _: (tf.constant([2, 5, 3]), tf.constant([2, 7, 8, 3])))
    batches = distribute.tpu_batches(pairs, batch_size=2, max_length=6, training=False)
    (src, tgt_in), tgt_out = batches.element_spec
    assert src.shape == tgt_in.shape == tgt_out.shape == (2, 6)
    assert len(list(batches)) == 2  # 5 sentences: the remainder is dropped


def test_halved_pipeline_stops_at_the_floor():
    from transformer.base.config import PipelineConfig
    from transformer.training.auto_batch import AUTO_BATCH_FLOOR_TOKENS, halved_pipeline

    assert halved_pipeline(PipelineConfig(max_tokens=1000)).max_tokens == 500
    assert halved_pipeline(PipelineConfig(max_tokens=300)).max_tokens == AUTO_BATCH_FLOOR_TOKENS
    assert halved_pipeline(PipelineConfig(max_tokens=AUTO_BATCH_FLOOR_TOKENS)) is None
    assert halved_pipeline(PipelineConfig(kind="naive", batch_size=64), floor=20).batch_size == 32
    assert halved_pipeline(PipelineConfig(kind="naive", batch_size=30), floor=20).batch_size == 20
    assert halved_pipeline(PipelineConfig(kind="naive", batch_size=20), floor=20) is None


def test_cli_flags_reach_the_config():
    import argparse

    from transformer.base import cli

    parser = argparse.ArgumentParser()
    cli.add_train_args(parser)
    args = parser.parse_args(["--strategy", "multi-worker", "--backup-every-steps", "50", "--auto-batch",
                              "--auto-batch-floor", "512"])
    train = cli.run_config_from_args(args).train
    assert (train.strategy, train.backup_every_steps, train.auto_batch, train.auto_batch_floor) == (
        "multi-worker", 50, True, 512)
    assert cli.run_config_from_args(parser.parse_args([])).train.strategy == "auto"
    with pytest.raises(ValueError, match="backup_every_steps must be > 0"):
        RunConfig().replace(train={"backup_every_steps": 0}).validate()
    with pytest.raises(ValueError, match="train.strategy must be one of"):
        RunConfig().replace(train={"strategy": "horovod"}).validate()


def test_input_is_global_batches_with_an_explicit_shard_policy(corpus, tmp_path):
    """Per-replica batch × replicas; TPU batches fully static; auto-shard policy DATA."""
    import tensorflow as tf

    from transformer.data.corpora import load_corpus
    from transformer.data.tokenizer import build_or_load_tokenizers
    from transformer.training.training_data import make_datasets

    config = RunConfig.from_dict(run_config(corpus, tmp_path / "run", max_length=8))
    data = load_corpus(config.data)
    tokenizers, _ = build_or_load_tokenizers(data, config.tokenizer)
    train_one, _ = make_datasets(data, tokenizers, config, distribute.DEFAULT, replicas=1)
    train_two, _ = make_datasets(data, tokenizers, config, "mirrored", replicas=2)
    # max_length 8 → one bucket of length 8: 64 tokens per replica = 8 sentences.
    assert {len(b[1]) for b in train_one.take(3).as_numpy_iterator()} == {8}
    assert {len(b[1]) for b in train_two.take(3).as_numpy_iterator()} == {16}
    assert train_two.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA

    train_tpu, val_tpu = make_datasets(data, tokenizers, config, "tpu", replicas=2)
    for batches in (train_tpu, val_tpu):
        (src, tgt_in), tgt_out = batches.element_spec
        assert src.shape == tgt_in.shape == tgt_out.shape == (16, 8)


def test_validation_reads_the_same_first_batches_at_every_evaluation(corpus, tmp_path):
    """--validation-steps N: the first N batches, from the start each time (losses compare
    across epochs); unset: the whole split."""
    from transformer.data.corpora import load_corpus
    from transformer.data.tokenizer import build_or_load_tokenizers
    from transformer.training.training_data import make_datasets

    config = RunConfig.from_dict(run_config(corpus, tmp_path / "run", max_length=16))
    data = load_corpus(config.data)
    tokenizers, _ = build_or_load_tokenizers(data, config.tokenizer)
    _, whole = make_datasets(data, tokenizers, config.replace(train={"validation_steps": None}), distribute.DEFAULT, 1)
    _, first = make_datasets(data, tokenizers, config, distribute.DEFAULT, 1)  # validation_steps 1
    every = [b[1] for b in whole.as_numpy_iterator()]
    assert len(every) > 1
    for _ in range(2):
        (batch,) = [b[1] for b in first.as_numpy_iterator()]
        np.testing.assert_array_equal(batch, every[0])


# ---------------------------------------------------------------------------- MirroredStrategy


def test_mirrored_two_replicas_match_one_device_on_the_same_global_batch(tmp_path):
    """Halves with 2 vs 6 target tokens per sentence: loss and applied gradient must match."""
    out = tmp_path / "out.json"
    finish(start_worker("equivalence", out), timeout=240)
    result = json.loads(out.read_text())
    assert result["replicas"] == 2

    masked = result["masked"]
    assert masked["mirrored"]["loss"] == pytest.approx(masked["one_device"]["loss"], rel=1e-5)
    assert masked["mirrored"]["accuracy"] == pytest.approx(masked["one_device"]["accuracy"], rel=1e-6)
    assert masked["max_delta_diff"] < 1e-5 * max(1.0, masked["one_device"]["delta_norm"])
    # The control: dividing by each replica's own token count gives another gradient than the
    # same one-device step (and one ~2x too large), so the comparison above can fail.
    control = result["per_replica_mean"]
    assert control["max_delta_diff"] > 1e-2 * control["one_device"]["delta_norm"]
    assert control["mirrored"]["delta_norm"] > 1.3 * control["one_device"]["delta_norm"]


def test_train_with_mirrored_strategy_on_two_logical_cpus(corpus, tmp_path):
    """train() end to end with --strategy mirrored; BatchTimer still measures every step; the moving
    average of the weights (--ema-decay) is kept on both replicas and saved as ema/."""
    run_dir = tmp_path / "run"
    config = tmp_path / "config.json"
    # max_length 8: the validation split is one global batch, read again at the second epoch's end
    # (once a bare StopIteration from Keras' distributed input iterator).
    config.write_text(json.dumps(run_config(corpus, run_dir, max_length=8, strategy="mirrored", ema_decay=0.9,
                                            ema_every=2)))
    finish(start_worker("train", config, "--logical-cpus", 2), timeout=240)

    report = json.loads((run_dir / "report.json").read_text())
    assert report["state"] == "completed"
    assert report["run"]["distribution"]["replicas"] == 2
    assert report["run"]["distribution"]["class"] == "MirroredStrategy"
    assert "× 2 replicas" in report["run"]["batching"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["optimizer_steps"] == 6 and np.isfinite(summary["train_loss"])
    assert summary["ema"]["step"] == 6
    from transformer.inference.rundir import load_trained_model

    averaged, latest = load_trained_model(run_dir, "ema")[0].weights, load_trained_model(run_dir)[0].weights
    assert all(np.isfinite(a.numpy()).all() for a in averaged)
    trained = [(a, b) for a, b in zip(averaged, latest) if moves_in_training(b)]
    assert sum(not np.array_equal(a.numpy(), b.numpy()) for a, b in trained) == len(trained) > 0
    from transformer.measure.reports import load_steps

    rows = load_steps(run_dir / "report.json", report)
    assert len(rows) == 6
    # The input wait is measured through the DistributedIterator and both halves are counted.
    assert all(row["data_wait_s"] is not None and row["data_wait_s"] >= 0 for row in rows)
    assert all(row["examples"] and row["examples"] % 2 == 0 and row["tgt_tokens"] > 0 for row in rows)
    assert all(row["flops"] and row["flops"] > 0 for row in rows)


# ---------------------------------------------------------------------------- multi-worker


def test_multi_worker_replicas_end_identical_and_only_the_chief_writes(corpus, tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    run_dir = tmp_path / "run"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(run_config(corpus, run_dir, strategy="multi-worker", epochs=1, steps_per_epoch=4,
                                            backup_every_steps=2)))
    workers, temps = [], []
    try:
        for index in range(2):
            temp = tmp_path / f"tmp{index}"
            temp.mkdir()
            temps.append(temp)
            env = worker_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
                             TMPDIR=str(temp))
            workers.append(start_worker("train", config, "--weights", tmp_path / f"w{index}.npz", env=env,
                                        log=tmp_path / f"worker{index}.log"))
        for index, process in enumerate(workers):
            finish(process, timeout=240, log=tmp_path / f"worker{index}.log")
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait(10)

    first, second = np.load(tmp_path / "w0.npz"), np.load(tmp_path / "w1.npz")
    assert len(first.files) == len(second.files) > 0
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name])
    report = json.loads((run_dir / "report.json").read_text())
    assert report["state"] == "completed"
    assert report["run"]["distribution"] == {"strategy": "multi-worker", "class": "CollectiveAllReduceStrategy",
                                             "replicas": 2, "workers": 2, "task": "worker:0", "is_chief": True}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["optimizer_steps"] == 4
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoints", "config.json", "report.json", "report_steps.csv", "summary.json", "tensorboard", "tokenizers"]
    # Worker 1 wrote its checkpoints under its TMPDIR, and that directory is gone.
    assert f"checkpoint {temps[1]}/run-worker1-" in (tmp_path / "worker1.log").read_text()
    assert not any(any(temp.iterdir()) for temp in temps), "a worker left temporary files behind"
    assert "worker1" not in " ".join(str(p) for p in run_dir.rglob("*"))


# ---------------------------------------------------------------------------- fault tolerance


def _progress(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_sigkilled_run_resumes_from_the_backup_and_finishes(corpus, tmp_path):
    """Kill mid-epoch 2; the restart (in this process: only the killed run needs its own)
    continues the step counter, repeating < one interval."""
    from transformer.training.trainer import train

    every, per_epoch, epochs = 3, 9, 2
    run_dir = tmp_path / "run"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(run_config(corpus, run_dir, epochs=epochs, steps_per_epoch=per_epoch,
                                            backup_every_steps=every)))
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    process = start_worker("train", config, "--progress", first, "--sleep", "0.2", log=tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 180
        while not any(step >= per_epoch + every + 1 for step in _progress(first)):
            assert process.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the first run never reached step {per_epoch + every + 1}"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    killed_at = _progress(first)[-1]  # the step may have completed one more unrecorded step
    assert per_epoch < killed_at < epochs * per_epoch
    assert (run_dir / "backup").is_dir()

    train(RunConfig.from_dict(json.loads(config.read_text())), extra_callbacks=(progress_callback(second),))
    report = json.loads((run_dir / "report.json").read_text())
    restored = report["run"]["resumed_from_backup"]
    resumed = _progress(second)
    assert resumed[0] == restored["step"] + 1, "the step counter must continue from the backup"
    assert 0 <= killed_at - restored["step"] <= every, "more than one backup interval was repeated"
    assert restored["step"] % every == 0 and restored["epoch"] == restored["step"] // per_epoch
    assert resumed == list(range(restored["step"] + 1, epochs * per_epoch + 1))  # no step run twice
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["optimizer_steps"] == epochs * per_epoch
    assert report["state"] == "completed" and not (run_dir / "backup").exists()


def test_kills_during_saves_never_leave_the_latest_checkpoint_unreadable(tmp_path):
    """SIGKILL a process in the middle of a backup save, a checkpoint save, a backup save.

    The process saves ~12 MB states (weights = optimizer step = epoch, so a restored state
    proves itself consistent) back to back and announces each save just before it starts;
    the next process must restore the newest complete ones. The state the last kill leaves
    is verified in this process (the same `verify_saved`, no process of its own needed).
    """
    rng = np.random.default_rng(0)
    last = (0, 0)
    for cycle, target in enumerate(["BACKUP", "CHECKPOINT", "BACKUP"]):  # what to kill during
        stderr = tmp_path / f"stderr{cycle}.log"
        process = start_worker("save-loop", tmp_path, stderr=stderr)
        try:
            verified = read_line(process, 120).split()
            assert verified[:1] == ["VERIFIED"], f"cycle {cycle}: {verified} {stderr.read_text()[-3000:]}"
            epoch, step = int(verified[1]), int(verified[2])
            assert epoch >= last[0] + (cycle > 0) and step >= last[1] + (cycle > 0), "no progress restored"
            last = (epoch, step)
            kill_at = last[1] + int(rng.integers(2, 5))
            while read_line(process, 60).split() != [target, str(kill_at)]:
                pass
            process.send_signal(signal.SIGKILL)  # the save of state `kill_at` has just started
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    epoch, step = verify_saved(tmp_path)  # raises if the latest checkpoint or backup is unreadable
    assert epoch >= last[0] + 1 and step >= last[1] + 1, "no progress restored after the last kill"


def test_backup_resumes_mid_epoch_after_each_interruption(tmp_path):
    """Two interruptions, each in the middle of an epoch, then completion: every restart
    continues at the last backup's step and position in the epoch, and the run ends at
    exactly epochs × steps_per_epoch steps."""
    import keras
    import tensorflow as tf

    from transformer.training.backup import StepBackupAndRestore

    data = tf.data.Dataset.from_tensors((np.ones((2, 3), "float32"), np.zeros((2, 1), "float32"))).repeat()

    class Interrupt(keras.callbacks.Callback):
        def __init__(self, at):
            super().__init__()
            self.at, self.steps = at, []

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(int(self.model.optimizer.iterations.numpy()))
            if self.steps[-1] == self.at:
                raise RuntimeError("interrupted")

    def run(interrupt_at):  # a fresh model each time, like a restarted process
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        backup, interrupt = StepBackupAndRestore(tmp_path, save_freq=2, steps_per_epoch=4), Interrupt(interrupt_at)
        try:
            history = model.fit(data, epochs=3, steps_per_epoch=4, callbacks=[backup, interrupt], verbose=0)
        except RuntimeError:
            history = None
        return backup.restored, interrupt.steps, history

    assert run(7)[:2] == (None, [1, 2, 3, 4, 5, 6, 7])
    restored, steps, _ = run(11)
    assert restored == {"epoch": 1, "batches_done": 2, "step": 6} and steps == [7, 8, 9, 10, 11]
    restored, steps, history = run(None)
    assert restored == {"epoch": 2, "batches_done": 2, "step": 10} and steps == [11, 12]
    assert len(history.history["loss"]) == 1 and not tmp_path.exists()  # deleted when fit completes


def test_partially_written_newer_snapshot_and_checkpoint_fall_back_to_the_previous(tmp_path):
    """What a kill mid-save leaves behind (deterministically) must not hide the last good state."""
    import keras
    import tensorflow as tf

    from transformer.inference.rundir import RunCheckpoints
    from transformer.training.backup import METADATA_FILE, WEIGHTS_FILE, StepBackupAndRestore, snapshots

    def make():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(keras.optimizers.Adam(), "mse")
        model.optimizer.build(model.trainable_variables)
        backup = StepBackupAndRestore(tmp_path / "backup", save_freq=1)
        backup.set_model(model)
        return model, backup, RunCheckpoints(tmp_path / "checkpoints", model, model.optimizer)

    model, backup, checkpoints = make()
    for step in (1, 2):
        model.optimizer.iterations.assign(step)
        model.layers[0].kernel.assign(np.full((4, 3), step, "float32"))
        checkpoints.save(step)
        backup._save_snapshot(epoch=step, batches_done=0)
    newest = snapshots(tmp_path / "backup")[0]
    weights = (newest / WEIGHTS_FILE).read_bytes()
    (newest / WEIGHTS_FILE).write_bytes(weights[: len(weights) // 2])  # torn write of the newest
    (tmp_path / "backup" / ".tmp-snapshot-x").mkdir()  # an unfinished snapshot is ignored
    latest = Path(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")))
    data = latest.with_name(latest.name + ".data-00000-of-00001")
    # A kill before the `checkpoint` index is updated leaves ckpt-3 files the index does not name.
    for suffix in (".index", ".data-00000-of-00001"):
        (latest.parent / f"ckpt-3{suffix}").write_bytes(data.read_bytes()[:10])

    model, backup, checkpoints = make()
    assert checkpoints.restore_latest().endswith("ckpt-2")
    assert int(model.optimizer.iterations.numpy()) == 2
    model.optimizer.iterations.assign(0)
    restored = backup._restore()
    assert restored == {"epoch": 1, "batches_done": 0, "step": 1}  # fell back to the previous snapshot
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), np.full((4, 3), 1.0))
    assert (newest / METADATA_FILE).exists()


# ---------------------------------------------------------------------------- --auto-batch


class _InjectedOOM:
    """Raises `ResourceExhaustedError` at every training step from optimizer step `after` on
    while the training pipeline's max_tokens (seen by wrapping `make_batches`) exceeds
    `limit`. Instant, unlike a real allocator OOM (e.g. `tf.zeros([2**42])`), for which
    TensorFlow's allocator retries for ~10 s before raising the same error type."""

    def __init__(self, monkeypatch, limit: int, after: int = 0):
        import keras
        import tensorflow as tf

        import transformer.training.training_data as training_data  # builds the training datasets

        original, seen = training_data.make_batches, {}

        def make_batches(pairs, tokenizers, config, *args, training, **kwargs):
            if training:
                seen["max_tokens"] = config.max_tokens
            return original(pairs, tokenizers, config, *args, training=training, **kwargs)

        class Raiser(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if seen["max_tokens"] > limit and int(self.model.optimizer.iterations.numpy()) >= after:
                    raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")

        monkeypatch.setattr(training_data, "make_batches", make_batches)
        self.callback = Raiser()


def test_auto_batch_halves_the_batch_after_oom_and_finishes(corpus, tmp_path, monkeypatch):
    from transformer.training.trainer import train

    oom = _InjectedOOM(monkeypatch, limit=32, after=4)  # max_tokens 64 fails from step 4 on, 32 fits
    config = RunConfig.from_dict(run_config(corpus, tmp_path / "run", epochs=3, steps_per_epoch=3,
                                            auto_batch=True, auto_batch_floor=16))
    result = train(config, extra_callbacks=(oom.callback,))

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    retries = report["run"]["auto_batch_retries"]
    assert [(r["field"], r["before"], r["after"]) for r in retries] == [("max_tokens", 64, 32)]
    assert retries[0]["error"]["type"] == "ResourceExhaustedError" and retries[0]["error"]["out_of_memory"]
    assert retries[0]["failed_at_step"] == 4
    assert retries[0]["restarted_from_step"] == 3  # the epoch-1 checkpoint
    assert result.summary["optimizer_steps"] == 9 and report["state"] == "completed"
    assert "32 tokens/bucket" in report["run"]["batching"]
    assert RunConfig.load(tmp_path / "run" / "config.json").pipeline.max_tokens == 32


def test_oom_without_auto_batch_or_at_the_floor_is_recorded_and_raised(corpus, tmp_path, monkeypatch):
    from transformer.base.errors import OutOfMemoryError, describe
    from transformer.training.trainer import train

    oom = _InjectedOOM(monkeypatch, limit=16)
    for name, extra in (("plain", {}), ("floor", {"auto_batch": True, "auto_batch_floor": 32})):
        config = RunConfig.from_dict(run_config(corpus, tmp_path / name, **extra))
        with pytest.raises(OutOfMemoryError) as raised:
            train(config, extra_callbacks=(oom.callback,))
        message, hint, status = describe(raised.value)  # the command's `error:` and `hint:` lines, no traceback
        batch = "--max-tokens 32" if name == "floor" else "--max-tokens 64"
        assert message.startswith(f"out of memory at step 0 with {batch} (OOM when allocating tensor (injected))")
        assert status == 1 and ("--auto-batch-floor" in hint if name == "floor" else "add --auto-batch" in hint)
        report = json.loads((tmp_path / name / "report.json").read_text())
        assert report["state"] == "crashed" and report["error"]["out_of_memory"]
        retries = report["run"].get("auto_batch_retries", [])
        assert [(r["before"], r["after"]) for r in retries] == ([(64, 32)] if name == "floor" else [])


def test_max_tokens_auto_resolves_on_cpu_and_auto_batch_and_resume_follow_it(corpus, tmp_path, monkeypatch):
    from transformer.training.trainer import train

    oom = _InjectedOOM(monkeypatch, limit=1024, after=2)  # the CPU's 2048 fails from step 2 on, 1024 fits
    values = run_config(corpus, tmp_path / "run", max_length=8, epochs=2, steps_per_epoch=2, auto_batch=True)
    values["pipeline"]["max_tokens"] = "auto"
    result = train(RunConfig.from_dict(values), extra_callbacks=(oom.callback,))

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    decision = report["run"]["batch_decision"]
    assert (decision["requested"], decision["max_tokens"], decision["probe"]) == ("auto", 2048, None)
    assert decision["reason"].startswith("CPU: the recipe's 2048 tokens")
    assert decision["schedule"]["rule"] == "off" and decision["schedule"]["factor"] == 1.0
    assert [(r["before"], r["after"]) for r in report["run"]["auto_batch_retries"]] == [(2048, 1024)]
    assert result.summary["optimizer_steps"] == 4 and report["state"] == "completed"
    saved = RunConfig.load(tmp_path / "run" / "config.json")
    assert saved.pipeline.max_tokens == 1024  # the retry's batch
    assert (saved.train.lr_scaling, saved.train.lr_batch_factor, saved.train.warmup_steps) == ("off", 1.0, 10)

    values["train"].update(resume=True, epochs=3)  # --resume with --max-tokens auto: the run's batch, no retry
    train(RunConfig.from_dict(values), extra_callbacks=(oom.callback,))
    decision = json.loads((tmp_path / "run" / "report.json").read_text())["run"]["batch_decision"]
    assert decision["max_tokens"] == 1024 and decision["reason"].startswith("--resume: the run's batch")
    resumed = RunConfig.load(tmp_path / "run" / "config.json")
    assert resumed.pipeline.max_tokens == 1024
    schedule = ("lr_scaling", "lr_batch_factor", "warmup_steps", "peak_learning_rate")
    assert [getattr(resumed.train, f) for f in schedule] == [getattr(saved.train, f) for f in schedule]
