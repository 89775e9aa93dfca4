"""The moving average of the weights (`FusedAdam(ema_decay=…)`, transformer/model/ema.py).

The shadows follow the EMA formula with its warm-up (every step and every K steps), leave the
raw weights exactly as training without them, survive a checkpoint round trip (the resumed
average continues, not restarted), stay float32 under mixed precision, and `ema_copy` is a
model holding them.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import TINY_MODEL, build, moves_in_training, random_ids

from transformer.base.config import RunConfig, TrainConfig
from transformer.model.ema import ema_copy, moving_averages
from transformer.model.optimizer import FusedAdam, compile_model

DECAY = 0.9  # low, so the warm-up min(D, (1+n)/(10+n)) reaches D within the steps below (n >= 80)


def _variables():
    dense = keras.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), name="dense")
    table = keras.Variable(np.linspace(0, 2, 20, dtype=np.float32).reshape(5, 4), name="table")
    return dense, table


def _train(optimizer, variables, steps, first_step=0):
    """`steps` updates of a dense matrix and an embedding (IndexedSlices gradient) in a tf.function,
    as `fit` runs them; returns the weights after each update."""
    dense, table = variables
    ids = tf.constant([0, 3, 3, 1])

    @tf.function
    def step(scale):
        with tf.GradientTape() as tape:
            rows = tf.gather(table, ids)
            loss = tf.reduce_sum(tf.sin(tf.matmul(rows[:3, :3], dense) * scale)) + tf.reduce_sum(rows ** 2)
        grads = tape.gradient(loss, [dense, table])
        optimizer.apply_gradients(zip(grads, [dense, table]))

    after = []
    for index in range(first_step, first_step + steps):
        step(tf.constant(index + 1.0))
        after.append([v.numpy().copy() for v in variables])
    return after


def _expected(after, decay, every, first_step=0, start=None):
    """The shadows by the formula: a copy at update 0, then every `every` updates
    s ← d·s + (1−d)·θ with d = min(D, (1+n)/(10+n))^every, n = updates so far."""
    shadows = start
    for offset, weights in enumerate(after):
        t = first_step + offset
        if t % every:
            continue
        if t == 0:
            shadows = [w.copy() for w in weights]
            continue
        n = t + 1
        d = min(decay, (1 + n) / (10 + n)) ** every
        shadows = [d * s + (1 - d) * w for s, w in zip(shadows, weights)]
    return shadows


@pytest.mark.parametrize("every", [1, 3])
def test_shadows_follow_the_ema_formula(every):
    variables = _variables()
    optimizer = FusedAdam(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9, ema_decay=DECAY, ema_every=every)
    optimizer.build(list(variables))
    after = _train(optimizer, variables, 100)
    expected = _expected(after, DECAY, every)
    pairs = optimizer.moving_averages()
    assert [v is w for (v, _), w in zip(pairs, variables)] == [True, True]
    for (_, shadow), want, last in zip(pairs, expected, after[-1]):
        np.testing.assert_allclose(shadow.numpy(), want, rtol=0, atol=1e-5)
        assert np.abs(shadow.numpy() - last).max() > 1e-3  # an average, not the weights


def test_raw_weights_are_those_of_training_without_ema():
    plain, averaged = _variables(), _variables()
    adam = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    without = FusedAdam(1e-2, **adam)
    with_ema = FusedAdam(1e-2, **adam, ema_decay=DECAY, ema_every=2)
    without.build(list(plain))
    with_ema.build(list(averaged))
    _train(without, plain, 20)
    _train(with_ema, averaged, 20)
    for a, b in zip(plain, averaged):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Adam's state keeps its checkpoint positions: the shadows come after the moments
    assert [v.path.split("/")[-1] for v in with_ema.variables[:len(without.variables)]] == \
        [v.path.split("/")[-1] for v in without.variables]


def test_a_checkpoint_round_trip_continues_the_average(tmp_path):
    every, first, rest = 2, 7, 6
    variables = _variables()
    optimizer = FusedAdam(1e-2, ema_decay=DECAY, ema_every=every)
    optimizer.build(list(variables))
    before = _train(optimizer, variables, first)
    path = tf.train.Checkpoint(optimizer=optimizer, v0=variables[0], v1=variables[1]).write(str(tmp_path / "ckpt"))
    saved = [s.numpy().copy() for _, s in optimizer.moving_averages()]

    resumed_vars = _variables()
    resumed = FusedAdam(1e-2, ema_decay=DECAY, ema_every=every)
    resumed.build(list(resumed_vars))
    tf.train.Checkpoint(optimizer=resumed, v0=resumed_vars[0], v1=resumed_vars[1]).read(path).assert_consumed()
    for (_, shadow), value in zip(resumed.moving_averages(), saved):
        np.testing.assert_array_equal(shadow.numpy(), value)
    after = _train(resumed, resumed_vars, rest, first_step=first)
    expected = _expected(after, DECAY, every, first_step=first, start=saved)
    for (_, shadow), want in zip(resumed.moving_averages(), expected):
        np.testing.assert_allclose(shadow.numpy(), want, rtol=0, atol=1e-5)
    full = _expected(before + after, DECAY, every)  # the same as one uninterrupted run's
    for (_, shadow), want in zip(resumed.moving_averages(), full):
        np.testing.assert_allclose(shadow.numpy(), want, rtol=0, atol=1e-5)


def test_bad_decay_is_refused():
    with pytest.raises(ValueError, match="ema_decay must be in"):
        FusedAdam(1e-2, ema_decay=1.0)
    with pytest.raises(ValueError, match="ema_every must be"):
        FusedAdam(1e-2, ema_decay=0.9, ema_every=0)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_ema_copy_holds_the_float32_shadows(policy):
    """Under mixed precision the shadows are float32 like the variables, and the copy's logits stay float32;
    under mixed_float16 the average is kept inside Keras' LossScaleOptimizer."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build(TINY_MODEL)
        config = RunConfig(train=TrainConfig(ema_decay=DECAY, ema_every=1, lr_schedule="inverse-sqrt",
                                             warmup_steps=10, xla=False))
        optimizer = compile_model(model, config)
        src, tgt = random_ids(TINY_MODEL)
        model.fit((src, tgt[:, :-1]), tgt[:, 1:], epochs=1, steps_per_epoch=3, verbose=0)
        pairs = moving_averages(optimizer)
        assert len(pairs) == len(model.trainable_weights)
        assert {s.dtype for _, s in pairs} == {"float32"}
        copy = ema_copy(model)
        shadows = {id(v): s.numpy() for v, s in pairs}
        moved = 0
        for weight, raw in zip(copy.weights, model.weights):
            np.testing.assert_array_equal(weight.numpy(), shadows.get(id(raw), raw.numpy()))
            np.testing.assert_allclose(weight.numpy(), raw.numpy(), rtol=0, atol=0.1)  # updated: near the weights
            moved += not np.array_equal(weight.numpy(), raw.numpy())
        assert moved == sum(moves_in_training(v) for v, _ in pairs)  # fit ended without writing the average into the model
        assert copy((src, tgt[:, :-1]), training=False).dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy(previous)
