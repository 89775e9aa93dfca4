"""Epoch checkpoints on a GPU: the first epoch's, then at most one per `min_interval_s`, the last epoch's
always written."""

from transformer.training import trainer
from transformer.training.trainer import GPU_CHECKPOINT_MIN_INTERVAL_S, EpochCheckpoint


class Saves:
    def __init__(self):
        self.epochs = []

    def save(self, epoch):
        self.epochs.append(epoch)
        return f"ckpt-{len(self.epochs)}"


def run_epochs(monkeypatch, ends_at, min_interval_s, train_ends=True):
    """Epochs ending at the given wall-clock seconds, then the end of training (unless the run crashed:
    `train_ends=False`); returns the epochs saved."""
    now = [0.0]
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: now[0])
    saves = Saves()
    saver = EpochCheckpoint(saves, min_interval_s=min_interval_s)
    for epoch, end in enumerate(ends_at):
        saver.on_epoch_begin(epoch)
        now[0] = end
        saver.on_epoch_end(epoch)
    if train_ends:
        saver.on_train_end()
    return saves.epochs


def test_cpu_default_saves_every_epoch(monkeypatch):
    assert run_epochs(monkeypatch, [3.4 * i for i in range(1, 6)], 0.0) == [1, 2, 3, 4, 5]


def test_short_gpu_epochs_are_checkpointed_every_interval_and_at_the_end(monkeypatch):
    ends = [3.4 * i for i in range(1, 21)]  # 20 epochs of 3.4 s: 68 s
    saved = run_epochs(monkeypatch, ends, GPU_CHECKPOINT_MIN_INTERVAL_S)
    assert saved == [1, 10, 19, 20]  # 3.4 s, 34 s, 64.6 s, then the last epoch when training ends


def test_a_run_that_crashes_after_its_first_short_epoch_has_a_checkpoint(monkeypatch):
    """A NaN or a kill in epoch 3 of 3.4-s epochs: epoch 1's checkpoint is there to resume from."""
    assert run_epochs(monkeypatch, [3.4, 6.8], GPU_CHECKPOINT_MIN_INTERVAL_S, train_ends=False) == [1]


def test_the_last_epoch_is_not_saved_twice(monkeypatch):
    assert run_epochs(monkeypatch, [40.0, 80.0], GPU_CHECKPOINT_MIN_INTERVAL_S) == [1, 2]
