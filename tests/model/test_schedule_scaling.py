"""The learning-rate schedule follows the batch (`--lr-scaling`): warmup in tokens, peak × min(√k, √2)."""

import math

import pytest

from transformer.base.config import RunConfig, TrainConfig
from transformer.model.optimizer import make_schedule
from transformer.model.schedule import (
    MAX_PEAK_LR_FACTOR,
    batch_factor,
    resolve_lr_scaling,
    scale_for_batch,
)

RECIPE = TrainConfig()  # cosine, peak 1e-3, warmup 200, reference 2048 tokens


@pytest.mark.parametrize("max_tokens,warmup,peak", [
    (2048, 200, 1e-3),  # the reference batch: unchanged
    (3072, 133, 1e-3 * math.sqrt(1.5)),  # √k below the cap
    (4096, 100, 1e-3 * math.sqrt(2)),  # √2: where the cap starts
    (16384, 25, 1e-3 * math.sqrt(2)),  # 8x: warmup keeps its 409,600 tokens, the peak is capped
    (1024, 400, 1e-3 * math.sqrt(0.5)),  # a smaller batch: longer warmup, lower peak
])
def test_sqrt_rule_keeps_warmup_tokens_and_caps_the_peak(max_tokens, warmup, peak):
    k = batch_factor(max_tokens, RECIPE.lr_reference_tokens)
    scaled = scale_for_batch(RECIPE, k, "sqrt", d_model=256)
    assert scaled.warmup_steps == warmup and scaled.peak_learning_rate == pytest.approx(peak)
    assert scaled.lr_batch_factor == k and scaled.lr_scaling == "sqrt"
    assert scaled.peak_learning_rate <= RECIPE.peak_learning_rate * MAX_PEAK_LR_FACTOR * (1 + 1e-12)


def test_off_leaves_the_schedule_and_records_the_factor():
    scaled = scale_for_batch(RECIPE, 8.0, "off", d_model=256)
    assert (scaled.peak_learning_rate, scaled.warmup_steps) == (1e-3, 200)
    assert (scaled.lr_scaling, scaled.lr_batch_factor) == ("off", 8.0)


def test_scaling_is_applied_once():
    once = scale_for_batch(RECIPE, 8.0, "sqrt", d_model=256)
    assert scale_for_batch(once, 8.0, "sqrt", d_model=256) == once  # a saved config.json is not rescaled
    assert RECIPE.lr_batch_factor is None and RECIPE.warmup_steps == 200  # the caller's config is not mutated


def test_inverse_sqrt_without_a_peak_gets_its_implied_peak_scaled():
    tutorial = TrainConfig(lr_schedule="inverse-sqrt", peak_learning_rate=None, warmup_steps=4000)
    scaled = scale_for_batch(tutorial, 4.0, "sqrt", d_model=128)
    assert scaled.warmup_steps == 1000
    assert scaled.peak_learning_rate == pytest.approx((128 * 4000) ** -0.5 * math.sqrt(2))


def test_auto_scales_only_batches_that_auto_chose():
    assert resolve_lr_scaling("auto", batch_was_auto=True) == "off"  # measured: the recipe's schedule holds
    assert resolve_lr_scaling("auto", batch_was_auto=False) == "off"
    assert resolve_lr_scaling("sqrt", batch_was_auto=False) == "sqrt"
    assert resolve_lr_scaling("off", batch_was_auto=True) == "off"
    assert batch_factor(None, 2048) == 1.0


def test_the_built_schedule_peaks_at_the_scaled_values():
    train = scale_for_batch(RECIPE, 8.0, "sqrt", d_model=256)
    schedule = make_schedule(RunConfig(train=train), 256, total_steps=200)
    lr = [float(schedule(step)) for step in (0, 23, 24, 25, 199)]
    assert lr[0] == pytest.approx(1e-3 * math.sqrt(2) / 25, rel=1e-5)  # linear warmup over 25 steps
    assert lr[2] == pytest.approx(1e-3 * math.sqrt(2), rel=1e-5) and lr[1] < lr[2]  # peak at step 25
    assert lr[3] < lr[2] and lr[4] < 1e-5  # then cosine decay to 0 over the 200 planned steps
