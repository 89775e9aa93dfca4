"""`train_step`: the step benchmarks and the batch probe time is Keras' own training step,
traced once for unknown dims (as `fit` runs it), where `train_on_batch` retraces per shape."""

import numpy as np
import tensorflow as tf

from transformer.base.config import ModelConfig, RunConfig, TrainConfig
from transformer.inference.rundir import build_model
from transformer.model.optimizer import compile_model
from transformer.training.timing import compiled_step
from transformer.training.train_step import train_step

CONFIG = ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, max_length=32,
                     src_vocab_size=40, tgt_vocab_size=40)


def compiled(seed: int = 0):
    tf.keras.utils.set_random_seed(seed)
    model = build_model(CONFIG)
    compile_model(model, RunConfig(model=CONFIG, train=TrainConfig(xla=False, lr_schedule="inverse-sqrt",
                                                                  warmup_steps=2)))
    return model


def batch(rows: int, length: int, seed: int = 0):
    ids = np.random.default_rng(seed).integers(4, 40, (rows, length + 1)).astype("int32")
    return (ids[:, :-1], ids[:, :-1]), ids[:, 1:]


def test_one_trace_serves_every_shape_where_train_on_batch_retraces():
    model = compiled()
    step = train_step(model)
    for shape in ((4, 12), (3, 9), (2, 16), (4, 12)):
        assert np.isfinite(step(*batch(*shape)))
    assert step.compiled.experimental_get_tracing_count() == 1
    assert int(model.optimizer.iterations.numpy()) == 4

    other = compiled()
    for shape in ((4, 12), (3, 9)):
        other.train_on_batch(*batch(*shape))
    assert compiled_step(other.train_function).experimental_get_tracing_count() == 2  # the check can fail


def test_it_is_the_training_step_itself_same_weights_as_train_on_batch():
    ours, theirs = compiled(seed=3), compiled(seed=3)
    step = train_step(ours)
    losses = []
    for _ in range(8):
        inputs, labels = batch(4, 10)
        losses.append(step(inputs, labels))
        theirs.train_on_batch(inputs, labels)
    assert losses[-1] < losses[0] - 0.05  # it trains
    for mine, reference in zip(ours.trainable_variables, theirs.trainable_variables):
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)
