"""Mid-epoch backups that survive a killed process: `StepBackupAndRestore`.

Keras 3.15's `keras.callbacks.BackupAndRestore` (keras/src/callbacks/backup_and_restore.py)
saves `model.save_weights("latest.weights.h5")` — which includes the optimizer's variables
(`iterations` and Adam's moments: `saving_lib._save_state` walks `model.optimizer`) — and a
`training_metadata.json` with the epoch, every `save_freq` batches; `on_train_begin` loads
both and sets `model._initial_epoch`, which `fit` reads after `on_train_begin`. Three gaps
matter for killed jobs, and this subclass closes them:

1. Both files are overwritten in place, so a kill during a save can leave a truncated
   weights file or metadata that does not match the weights. Here every save writes a
   fresh snapshot directory `snapshot-<step>-<epoch>/` under a temporary name, fsyncs it
   and renames it into place (atomic on POSIX); the previous snapshot is kept until the
   new one is complete, and loading falls back to it if the newest is unreadable.
2. Keras restores the epoch but not the position inside it: the interrupted epoch runs
   all its batches again (up to a whole epoch repeated). Here the metadata records the
   batches done in the epoch, and with a known `steps_per_epoch` the resumed epoch stops
   after its remaining batches (it sets `model.stop_training` at the last one and clears
   it in `on_epoch_end`, before `fit` checks it). The optimizer step counter continues
   from the snapshot, so at most `save_freq` steps are repeated. Without
   `steps_per_epoch` (epochs are full passes of unknown length) the resumed epoch is a
   full pass, as in Keras. The data order after a restart is not the uninterrupted
   run's (tf.data's shuffle state is not saved).
3. Keras 3 has no multi-worker handling. Here snapshots are read from `backup_dir` (the
   chief's, on a filesystem all workers share) and written to `write_dir` (the chief's
   `backup_dir`, a temporary directory on other workers).

A snapshot older (by optimizer step) than the state already restored, e.g. from a newer
epoch checkpoint, is ignored. Snapshots are deleted when `fit` completes.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Optional

import keras

from transformer.base import atomic
from transformer.runtime.faults import check_finite_weights, saving

log = logging.getLogger(__name__)

WEIGHTS_FILE = "latest.weights.h5"  # Keras' names, inside each snapshot directory
METADATA_FILE = "training_metadata.json"
_SNAPSHOT = re.compile(r"^snapshot-(\d+)-(\d+)$")
KEEP = 2  # the newest snapshot and the one before it


def snapshots(directory: str | Path) -> list[Path]:
    """Complete snapshot directories in `directory`, newest (step, epoch) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _SNAPSHOT.match(path.name)
        if match and path.is_dir():
            found.append(((int(match.group(1)), int(match.group(2))), path))
    return [path for _, path in sorted(found, reverse=True)]


def read_metadata(snapshot: Path) -> dict:
    """{"epoch", "batches_done", "step"} of a snapshot; raises OSError/ValueError/KeyError when unreadable."""
    metadata = json.loads((snapshot / METADATA_FILE).read_text())
    return {key: int(metadata[key]) for key in ("epoch", "batches_done", "step")}


class StepBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` with atomic snapshots, mid-epoch resume and worker-aware writes.

    Args:
        backup_dir: str or Path. Where snapshots are read from on `on_train_begin`.
        save_freq: int or "epoch". Save every `save_freq` optimizer steps (and at every
            epoch end), or only at epoch ends. Defaults to `"epoch"`.
        steps_per_epoch: int or None. The `fit` argument; needed to resume mid-epoch.
        write_dir: str, Path or None. Where this task writes snapshots (a non-chief
            worker's temporary directory). Defaults to `backup_dir`.
        delete_checkpoint: bool. Delete `write_dir` when `fit` completes. Defaults to `True`.

    Attributes:
        restored: dict or None. Metadata of the snapshot restored by the last `on_train_begin`.

    Example:

    >>> backup = StepBackupAndRestore("runs/a/backup", save_freq=200, steps_per_epoch=1000)
    >>> model.fit(batches.repeat(), epochs=5, steps_per_epoch=1000, callbacks=[backup])
    """

    def __init__(self, backup_dir, save_freq="epoch", steps_per_epoch: Optional[int] = None,
                 write_dir=None, delete_checkpoint: bool = True):
        super().__init__(str(backup_dir), save_freq=save_freq, delete_checkpoint=delete_checkpoint)
        self.backup_path = Path(backup_dir)
        self.write_path = Path(write_dir) if write_dir is not None else self.backup_path
        self.steps_per_epoch = steps_per_epoch
        self.restored: Optional[dict] = None
        self._resume_batches = 0  # batches of the restored epoch already done
        self._epoch_offset = 0  # the same, for the epoch in progress
        self._epoch_batches = 0
        self._last_saved_step = 0
        self._ended_epoch_early = False

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None):
        self.restored = self._restore()
        self.model._initial_epoch = self.restored["epoch"] if self.restored else None
        self._resume_batches = self.restored["batches_done"] if self.restored else 0
        self._last_saved_step = self._step()
        if self._resume_batches and not self.steps_per_epoch:
            log.warning("backup taken %d batches into epoch %d, but epochs have no fixed length "
                        "(no steps_per_epoch): the epoch restarts from its first batch",
                        self._resume_batches, self.restored["epoch"] + 1)
            self._resume_batches = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        self._epoch_offset, self._resume_batches = self._resume_batches, 0
        self._epoch_batches = self._epoch_offset

    def on_train_batch_end(self, batch, logs=None):
        self._epoch_batches = self._epoch_offset + batch + 1
        epoch_done = self.steps_per_epoch is not None and self._epoch_batches >= self.steps_per_epoch
        if epoch_done and self._epoch_offset:  # a resumed epoch: stop after its remaining batches
            self.model.stop_training = True
            self._ended_epoch_early = True
        elif (not epoch_done and self.save_freq != "epoch"
              and self._step() - self._last_saved_step >= self.save_freq):
            self._save_snapshot(self._current_epoch, self._epoch_batches)

    def on_epoch_end(self, epoch, logs=None):
        if self._ended_epoch_early:
            self.model.stop_training = False
            self._ended_epoch_early = False
        self._save_snapshot(epoch + 1, 0)

    def on_train_end(self, logs=None):
        if self.delete_checkpoint:
            shutil.rmtree(self.write_path, ignore_errors=True)

    # ------------------------------------------------------------------ snapshots

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def save_now(self) -> Path:
        """A snapshot of the current position (e.g. before stopping on a signal)."""
        if self.steps_per_epoch is not None and self._epoch_batches >= self.steps_per_epoch:
            return self._save_snapshot(self._current_epoch + 1, 0)
        return self._save_snapshot(self._current_epoch, self._epoch_batches)

    def _save_snapshot(self, epoch: int, batches_done: int) -> Path:
        """Writes weights + metadata to a temp directory, then renames it into place.

        Non-finite weights are never saved (TrainingDiverged); a full disk leaves the
        previous snapshot in place (DiskFullError)."""
        check_finite_weights(self.model, "backup snapshot")
        step = self._step()
        final = self.write_path / f"snapshot-{step:012d}-{epoch:06d}"  # replaced if the same state is saved again
        with saving(f"backup snapshot at step {step}", lambda: next(iter(map(str, snapshots(self.write_path))), None)):
            with atomic.staged_directory(final, prefix=".tmp-snapshot-", durable=True) as staging:
                self.model.save_weights(str(staging / WEIGHTS_FILE))
                atomic.write_json(staging / METADATA_FILE, {"epoch": epoch, "batches_done": batches_done, "step": step})
        self._last_saved_step = step
        self._prune(keep=final)
        return final

    def _prune(self, keep: Path) -> None:
        """Keeps the KEEP newest snapshots (always `keep`); deletes older ones and stale temp dirs."""
        for old in [s for s in snapshots(self.write_path) if s != keep][KEEP - 1:]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.write_path.glob(".tmp-snapshot-*"):
            shutil.rmtree(stale, ignore_errors=True)

    def _restore(self) -> Optional[dict]:
        """Loads the newest readable snapshot not older than the current state; its metadata or None."""
        current = self._step()
        failures = []
        for snapshot in snapshots(self.backup_path):
            try:
                metadata = read_metadata(snapshot)
                if metadata["step"] < current:
                    log.info("backup %s (step %d) is older than the restored state (step %d); ignored",
                             snapshot, metadata["step"], current)
                    return None
                if self.model.optimizer is not None and not self.model.optimizer.built:
                    self.model.optimizer.build(self.model.trainable_variables)
                self.model.load_weights(str(snapshot / WEIGHTS_FILE))
            except (OSError, ValueError, KeyError) as err:  # unreadable: try the previous one
                log.warning("backup %s is unreadable (%s); trying an older one", snapshot, err)
                failures.append(f"{snapshot.name}: {err}")
                continue
            if self._step() != metadata["step"]:
                raise ValueError(f"backup {snapshot}: weights hold step {self._step()}, "
                                 f"metadata says {metadata['step']}")
            log.info("restored backup %s: epoch %d, %d batches into it, step %d",
                     snapshot, metadata["epoch"] + 1, metadata["batches_done"], metadata["step"])
            return metadata
        if failures:
            raise RuntimeError(f"no readable backup in {self.backup_path} ({'; '.join(failures)}); "
                               "delete that directory to restart from the last epoch checkpoint")
        return None
