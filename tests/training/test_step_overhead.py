"""Per-step callback costs cut without changing what is recorded: TensorBoard's batch
scalars, the garbage-collector freeze, the clock's Python mirror of its variables."""

import gc

import keras
import numpy as np
import tensorflow as tf

from transformer.measure.reports import StepTimeReport
from transformer.training.budget import TrainingClock
from transformer.training.gc_freeze import FreezeLongLived
from transformer.training.summaries import StepTensorBoard


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def make_dataset(batches: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(batches * 2, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((features, features.sum(1, keepdims=True))).batch(2)


def scalar_events(log_dir) -> list:
    """(tag, step) of every scalar in the train event files under `log_dir`."""
    events = []
    for path in sorted(tf.io.gfile.glob(str(log_dir / "train" / "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            events += [(value.tag, event.step) for value in event.summary.value]
    return sorted(events)


def test_step_tensorboard_writes_what_keras_tensorboard_writes(tmp_path):
    for name, callback in (("keras", keras.callbacks.TensorBoard), ("ours", StepTensorBoard)):
        keras.utils.set_random_seed(0)
        make_model().fit(make_dataset(7), epochs=2, verbose=0,
                         callbacks=[callback(log_dir=str(tmp_path / name), update_freq=3)])
    ours = scalar_events(tmp_path / "ours")
    assert ours == scalar_events(tmp_path / "keras")
    assert ("batch_loss", 3) in ours and ("batch_loss", 12) in ours and ("batch_loss", 4) not in ours


def test_freeze_after_the_first_step_and_after_evaluations_then_unfreeze():
    report = StepTimeReport(environment={})
    callback = FreezeLongLived(report)
    gc.unfreeze()
    callback.on_train_begin()
    callback.on_train_batch_end(0)
    assert callback.freezes == 1 and gc.get_freeze_count() > 0
    callback.on_train_batch_end(1)  # nothing new: no freeze
    report.evaluations.append({"step": 2})
    callback.on_train_batch_end(2)
    assert callback.freezes == 2
    callback.on_train_end()
    assert gc.get_freeze_count() == 0


def test_clock_counts_in_python_during_fit_and_keeps_its_variables_current():
    clock = TrainingClock(budget_s=3600.0)
    clock.elapsed_s.assign(10.0)  # as restored from a checkpoint
    model = make_model()
    model.fit(make_dataset(4), epochs=1, verbose=0, callbacks=[clock])
    assert clock.seconds == float(clock.elapsed_s.numpy()) > 10.0  # the variable again after fit
    assert abs(clock.fraction_done() - clock.seconds / 3600.0) < 1e-6
    assert abs(float(clock.progress.numpy()) - clock.seconds / 3600.0) < 1e-6
