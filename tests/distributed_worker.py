"""Subprocess entry points for tests/runtime/test_distributed.py (each needs a fresh TensorFlow).

    python tests/distributed_worker.py equivalence OUT.json
        2 logical CPU devices: one train step of a tiny Transformer on one global batch
        under OneDeviceStrategy and MirroredStrategy (2 replicas) with the project's loss,
        and under MirroredStrategy with a per-replica-mean loss (the control, which must
        differ from the one-device step). Writes the numbers to OUT.json.
    python tests/distributed_worker.py train CONFIG.json [--progress F] [--sleep S] [--weights W.npz]
                                                         [--logical-cpus N]
        `train(RunConfig)`; appends "<iterations>" to F after every step, sleeps S s per
        step, saves the final trainable weights to W.npz. TF_CONFIG comes from the environment.

`train()` runs in its own process: two MirroredStrategy objects in one process reuse
collective instance keys, and a second strategy's all-reduce then fails with "Shape
mismatch in the collective instance".
    python tests/distributed_worker.py save-loop DIR [--verify-only]
        Verifies that DIR's latest epoch checkpoint and latest backup restore and are
        self-consistent, prints "VERIFIED <epoch> <step>", then saves both forever, printing
        "CHECKPOINT i" / "BACKUP i" just before each save (the parent SIGKILLs it on reading
        one, i.e. during that save) unless --verify-only.

`progress_callback` and `verify_saved` are also imported by the test itself, which runs the
steps that need no fresh process (a resumed run, the last verification) in its own process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _logical_cpus(count: int) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


# ---------------------------------------------------------------------------- equivalence


def _global_batch():
    """4 sentences; the first 2 (replica 0's half) are mostly padding, the last 2 are full."""
    import numpy as np

    rng = np.random.default_rng(0)
    src = rng.integers(4, 20, (4, 6)).astype("int32")
    tgt = rng.integers(4, 20, (4, 7)).astype("int32")
    src[:2, 2:] = 0
    tgt[:2, 3:] = 0  # replica 0: 2 target tokens per sentence, replica 1: 6
    return (src, tgt[:, :-1]), tgt[:, 1:]


def _one_step(strategy, loss) -> dict:
    """Loss logged by fit and weight change after one SGD(lr=1) step (= the applied gradient)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from transformer.model.losses import MaskedAccuracy
    from transformer.model.transformer import Transformer

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = Transformer(num_layers=1, d_model=8, num_heads=2, dff=16, dropout_rate=0.0, max_length=8,
                            head_width="tutorial", src_vocab_size=20, tgt_vocab_size=20)
        model.build()
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss, metrics=[MaskedAccuracy()])
    before = [v.numpy() for v in model.trainable_variables]
    history = model.fit(tf.data.Dataset.from_tensors(_global_batch()), epochs=1, verbose=0).history
    deltas = [b - v.numpy() for b, v in zip(before, model.trainable_variables)]
    return {"loss": history["loss"][0], "accuracy": history["masked_accuracy"][0],
            "deltas": [d.tolist() for d in deltas], "delta_norm": float(np.sqrt(sum((d ** 2).sum() for d in deltas)))}


def equivalence(out: Path) -> None:
    _logical_cpus(2)
    import keras
    import numpy as np
    import tensorflow as tf

    from transformer.base.constants import PAD_ID
    from transformer.model.losses import MaskedSparseCrossEntropy

    class PerReplicaMean(keras.losses.Loss):
        """The bug the project's loss avoids: each replica divides by its own token count."""

        def __init__(self):
            super().__init__(reduction="sum")

        def call(self, y_true, y_pred):
            mask = tf.cast(tf.not_equal(y_true, PAD_ID), tf.float32)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(y_true, tf.int32), y_pred)
            return tf.reduce_sum(losses * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    results = {"replicas": mirrored.num_replicas_in_sync}
    # Both mirrored steps are compared with the one-device step of the project's loss: on one
    # device a per-replica mean is that same global mean, so it needs no step of its own.
    a = _one_step(one, MaskedSparseCrossEntropy())
    for name, make_loss in (("masked", MaskedSparseCrossEntropy), ("per_replica_mean", PerReplicaMean)):
        b = _one_step(mirrored, make_loss())
        diff = max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in zip(a["deltas"], b["deltas"]))
        results[name] = {"one_device": {k: a[k] for k in ("loss", "accuracy", "delta_norm")},
                         "mirrored": {k: b[k] for k in ("loss", "accuracy", "delta_norm")},
                         "max_delta_diff": diff}
    out.write_text(json.dumps(results))


# ---------------------------------------------------------------------------- train


def progress_callback(progress: Path | None, sleep_s: float = 0.0):
    """A Keras callback appending "<iterations>" to `progress` after every step, then sleeping `sleep_s` s."""
    import keras

    class Progress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if progress is not None:
                with open(progress, "a") as f:
                    f.write(f"{int(self.model.optimizer.iterations.numpy())}\n")
                    f.flush()
                    os.fsync(f.fileno())
            if sleep_s:
                time.sleep(sleep_s)

    return Progress()


def run_train(config_path: Path, progress: Path | None, sleep_s: float, weights: Path | None,
              logical_cpus: int) -> None:
    if logical_cpus > 1:
        _logical_cpus(logical_cpus)
    import numpy as np

    from transformer.base.config import RunConfig
    from transformer.training.trainer import train

    result = train(RunConfig.from_dict(json.loads(config_path.read_text())),
                   extra_callbacks=(progress_callback(progress, sleep_s),))
    if weights is not None:
        np.savez(weights, *[v.numpy() for v in result.model.trainable_variables])
    print("DONE", json.dumps({k: v for k, v in result.summary.items() if k != "step_time"}), flush=True)


# ---------------------------------------------------------------------------- save loop


def _saved_state(directory: Path):
    """(model, checkpoints, backup, epoch, step): a fresh ~4 MB model (~12 MB with its Adam state)
    restored from DIR's latest epoch checkpoint and latest backup, each checked self-consistent
    (weights = optimizer step = epoch); epoch/step 0 where there is none yet."""
    import keras
    import numpy as np

    from transformer.inference.rundir import RunCheckpoints
    from transformer.training.backup import StepBackupAndRestore

    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024), keras.layers.Dense(512)])  # ~4 MB
    model.compile(keras.optimizers.Adam(), "mse")
    model.optimizer.build(model.trainable_variables)
    checkpoints = RunCheckpoints(directory / "checkpoints", model, model.optimizer)
    backup = StepBackupAndRestore(directory / "backup", save_freq=1)
    backup.set_model(model)

    def consistent(value: int) -> bool:
        return all(np.all(v.numpy() == value) for v in model.trainable_variables)

    epoch = step = 0
    if checkpoints.restore_latest() is not None:  # raises if the latest checkpoint is unreadable
        epoch = int(checkpoints.epoch.numpy())
        assert consistent(epoch) and int(model.optimizer.iterations.numpy()) == epoch, "inconsistent checkpoint"
    model.optimizer.iterations.assign(0)
    metadata = backup._restore()  # raises if no snapshot is readable
    if metadata is not None:
        step = metadata["step"]
        assert consistent(step) and metadata["epoch"] == step, f"inconsistent backup {metadata}"
    return model, checkpoints, backup, epoch, step


def verify_saved(directory: Path) -> tuple[int, int]:
    """(epoch, step) of DIR's latest checkpoint and backup; raises if either is unreadable or inconsistent."""
    return _saved_state(directory)[3:]


def save_loop(directory: Path, verify_only: bool) -> None:
    import numpy as np

    model, checkpoints, backup, epoch, step = _saved_state(directory)
    print("VERIFIED", epoch, step, flush=True)
    if verify_only:
        return
    i = max(epoch, step)
    while True:
        i += 1
        for v in model.trainable_variables:
            v.assign(np.full(v.shape, i, dtype="float32"))
        model.optimizer.iterations.assign(i)
        print("CHECKPOINT", i, flush=True)  # the parent may SIGKILL on reading this: mid-save
        checkpoints.save(i)
        print("BACKUP", i, flush=True)
        backup._save_snapshot(epoch=i, batches_done=0)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["equivalence", "train", "save-loop"])
    parser.add_argument("path", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--weights", type=Path)
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--logical-cpus", type=int, default=1)
    args = parser.parse_args()
    if args.mode == "equivalence":
        equivalence(args.path)
    elif args.mode == "train":
        run_train(args.path, args.progress, args.sleep, args.weights, args.logical_cpus)
    else:
        save_loop(args.path, args.verify_only)


if __name__ == "__main__":
    main()
