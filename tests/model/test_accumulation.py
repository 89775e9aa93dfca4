"""Gradient accumulation: N micro-batches give the update of the whole batch in one pass.

The batch's halves hold different numbers of real target tokens, so a mean of micro-batch
means (Keras' own accumulation) would give another update than the batch's token mean: the
test tells the two apart. The learning rate must count updates, not micro-batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import TINY_MODEL, build

from transformer.base import cli
from transformer.base.config import RunConfig, TrainConfig
from transformer.base.constants import PAD_ID
from transformer.model.optimizer import compile_model

ROWS, SRC_LEN, TGT_LEN = 8, 9, 10
MODEL = dataclasses.replace(TINY_MODEL, num_layers=1)  # one block: each training traces a step, keep it short


def batch(config, seed: int = 0):
    """((src, tgt_in), tgt_out) of ROWS rows: the first half long targets, the second half short
    ones (6 times fewer real tokens), repeated tokens (the embeddings' sparse rows repeat)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 12, (ROWS, SRC_LEN)).astype("int32")
    tgt = rng.integers(4, 14, (ROWS, TGT_LEN + 1)).astype("int32")
    src[ROWS // 2:, 4:] = PAD_ID
    tgt[ROWS // 2:, 2:] = PAD_ID
    return (tf.constant(src), tf.constant(tgt[:, :-1])), tf.constant(tgt[:, 1:])


def trained_once(model_config, steps: int, data, policy: str = "float32", peak: float = 1e-3, xla: bool = False):
    """(model, optimizer, loss) after one `train_on_batch` of `data` with `steps` micro-batches per update."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build(model_config, seed=3)
        config = RunConfig(model=model_config, train=TrainConfig(
            accumulate_steps=steps, label_smoothing=0.1, lr_schedule="inverse-sqrt", warmup_steps=4,
            peak_learning_rate=peak, xla=xla))
        optimizer = compile_model(model, config)
        loss = model.train_on_batch(*data, return_dict=True)["loss"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, optimizer, loss


@functools.cache
def whole_batch_update(tie: str):
    """`trained_once(model, 1, batch(model))` of MODEL with `tie_embeddings=tie`: the plain step's
    update that several tests compare with, trained once per test process (read only)."""
    model_config = dataclasses.replace(MODEL, tie_embeddings=tie)
    return trained_once(model_config, 1, batch(model_config))


def moments(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer under float16
    return [m.numpy() for m in inner._momentums], [v.numpy() for v in inner._velocities]


@pytest.mark.parametrize("tie", ["none", "output"])  # sparse embedding gradients; and sparse + dense summed
def test_two_micro_batches_give_the_update_of_the_whole_batch(tie):
    model_config = dataclasses.replace(MODEL, tie_embeddings=tie)
    whole, whole_opt, whole_loss = whole_batch_update(tie)
    parts, parts_opt, parts_loss = trained_once(model_config, 2, batch(model_config))
    assert int(whole_opt.iterations.numpy()) == int(parts_opt.iterations.numpy()) == 1  # one update each
    np.testing.assert_allclose(parts_loss, whole_loss, rtol=1e-6)
    # Adam's first moments are 0.1 × the gradient, its second 0.02 × its square: the gradients agree
    for a, b in zip(*(moments(whole_opt)[0], moments(parts_opt)[0])):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)  # float32 sums in another order (moments ~1e-2)
    for a, b in zip(*(moments(whole_opt)[1], moments(parts_opt)[1])):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-12)
    # and so do the weights, except where the gradient is round-off: the attention key biases' is zero in
    # exact arithmetic (softmax ignores a constant per query), and Adam's first step lr·g/(|g| + ε) enlarges noise
    # (0.2% of the step lr = 1e-3: the tutorial-width heads' merged matrices add a product's rounding)
    for weight_a, weight_b, m in zip(whole.trainable_weights, parts.trainable_weights, moments(whole_opt)[0]):
        if np.abs(m).max() > 1e-7:
            np.testing.assert_allclose(weight_b.numpy(), weight_a.numpy(), atol=2e-6, err_msg=weight_a.path)


def test_under_xla_the_micro_batches_still_give_the_update_of_the_whole_batch():
    """The accumulation loop compiled by XLA (the GPU default) gives the plain step's update."""
    _, whole_opt, whole_loss = whole_batch_update("none")
    parts, parts_opt, parts_loss = trained_once(MODEL, 2, batch(MODEL), xla=True)
    assert parts.jit_compile and int(parts_opt.iterations.numpy()) == 1
    np.testing.assert_allclose(parts_loss, whole_loss, rtol=1e-5)
    for a, b in zip(moments(whole_opt)[0], moments(parts_opt)[0]):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-8)


def test_a_mean_of_micro_batch_means_would_differ():
    """The test above can fail: weighting each half equally (not by its tokens) moves the gradients."""
    model_config = MODEL
    (src, tgt_in), tgt_out = batch(model_config)
    halves = [((src[s], tgt_in[s]), tgt_out[s]) for s in (slice(0, ROWS // 2), slice(ROWS // 2, ROWS))]
    whole = moments(whole_batch_update("none")[1])[0]
    first, second = (moments(trained_once(model_config, 1, half)[1])[0] for half in halves)
    equal_weights = [(a + b) / 2 for a, b in zip(first, second)]
    assert max(np.abs(a - b).max() / (np.abs(a).max() + 1e-12) for a, b in zip(equal_weights, whole)) > 0.05


def test_rows_not_divisible_fill_with_padding():
    """7 rows in 2 micro-batches (4 + 3 and a pad row): still the whole batch's update."""
    (src, tgt_in), tgt_out = batch(MODEL)
    data = ((src[:7], tgt_in[:7]), tgt_out[:7])
    whole = moments(trained_once(MODEL, 1, data)[1])[0]
    parts = moments(trained_once(MODEL, 2, data)[1])[0]
    for a, b in zip(whole, parts):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)  # float32 sums in another order (moments ~1e-2)


FLOAT16_ON_CPU = pytest.mark.skipif(
    not tf.config.list_physical_devices("GPU"),
    reason="float16 (loss scaling) is the GPU's precision; on a CPU a one-step float16 training took ~100 s "
           "(2-core Xeon amx_bf16, 2026-11-24)")


@pytest.mark.parametrize("policy", ["mixed_bfloat16", pytest.param("mixed_float16", marks=FLOAT16_ON_CPU)])
def test_mixed_precision_accumulates_the_same_gradients(policy):
    """bfloat16 compute, float32 loss; float16 with loss scaling (the scaled sum unscaled once)."""
    data = batch(MODEL)
    _, whole_opt, whole_loss = trained_once(MODEL, 1, data, policy)
    _, parts_opt, parts_loss = trained_once(MODEL, 2, data, policy)
    assert int(whole_opt.iterations.numpy()) == int(parts_opt.iterations.numpy()) == 1
    np.testing.assert_allclose(parts_loss, whole_loss, rtol=2e-2)
    whole, parts = moments(whole_opt)[0], moments(parts_opt)[0]
    assert all(np.isfinite(m).all() for m in parts) and any(np.abs(m).max() > 0 for m in parts)
    # low-precision round-off differs between one pass over 8 rows and two over 4: compare directions, of the
    # gradients that are not round-off themselves (the attention key biases' is zero in exact arithmetic)
    largest = max(np.linalg.norm(m) for m in whole)
    cosine = [float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))
              for a, b in zip(whole, parts) if np.linalg.norm(a) > 1e-3 * largest]
    assert len(cosine) > len(whole) // 2 and min(cosine) > 0.98, cosine


def test_the_learning_rate_counts_updates_not_micro_batches():
    _, optimizer, _ = trained_once(MODEL, 4, batch(MODEL))
    assert int(optimizer.iterations.numpy()) == 1
    schedule = optimizer.learning_rate  # the value the next update uses: step 2 of the warmup
    _, reference, _ = whole_batch_update("none")
    assert float(schedule) == pytest.approx(float(reference.learning_rate))


@pytest.mark.parametrize("typed, message", [
    ("0", "must be >= 1"), ("-2", "must be >= 1"), ("1.5", "whole number"), ("two", "whole number")])
def test_bad_accumulate_steps_are_errors_naming_the_flag(typed, message, capsys):
    parser = argparse.ArgumentParser()
    cli.add_train_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--accumulate-steps", typed])
    err = capsys.readouterr().err
    assert "argument --accumulate-steps" in err and message in err, err


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_accumulate_steps_in_a_config_are_refused(value):
    with pytest.raises(ValueError, match="accumulate_steps must be an integer >= 1"):
        TrainConfig(accumulate_steps=value).validate()
