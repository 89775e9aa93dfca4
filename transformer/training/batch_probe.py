"""The batch a run trains with: `--max-tokens` resolved for the device, the schedule scaled to it.

`resolve_batch(...)` runs once at the start of training, after the precision is decided and
the vocabulary sizes are known, before anything builds batches. It returns the config with
`pipeline.max_tokens` an int (or None) and the learning-rate schedule scaled for the batch
(transformer/model/schedule.py `scale_for_batch`), and the `BatchDecision` that training logs
and writes to report.json (`run.batch_decision`). On a GPU, "auto" times real train steps
(`step_timer`) through transformer/runtime/batch_size.py's probe and cache.

`--resume` with `--max-tokens auto` continues the run's batch and schedule as its
config.json recorded them (the last batch an `--auto-batch` retry chose, the factor the
schedule was scaled by), without probing again.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from pathlib import Path
from typing import Optional

import keras
import tensorflow as tf

from transformer.base.config import AUTO, ModelConfig, RunConfig, TrainConfig
from transformer.inference.rundir import CONFIG_FILE, build_model
from transformer.model.optimizer import compile_model
from transformer.model.schedule import batch_factor, resolve_lr_scaling, scale_for_batch
from transformer.runtime.batch_size import RECIPE_MAX_TOKENS, BatchDecision, StepTimer, decide_max_tokens
from transformer.training.train_step import train_step

log = logging.getLogger(__name__)

WARMUP_STEPS = 2  # untimed steps per budget (tracing / XLA compilation, autotuning)
TIMED_STEPS = 3  # timed steps per budget; the fastest counts
# `budget_tokens`: the length of its timed batches, and real target tokens per padded token of a
# batch. Calibrated on README's runs (docs/recipes.md "Depth for the tokens a budget buys").
PROBE_LENGTH = 32
REAL_TOKEN_SHARE = 0.88


def step_timer(model_config: ModelConfig, config: RunConfig, strategy: tf.distribute.Strategy,
               warmup: int = WARMUP_STEPS, timed: int = TIMED_STEPS,
               length: Optional[int] = None) -> tuple[StepTimer, callable]:
    """(time_step, release): `time_step(max_tokens)` → seconds per train step of the real model.

    The model (built once, compiled like training: precision policy, XLA, FusedAdam) runs
    training's step (`train_step`: one trace for unknown dims, so one XLA program per shape)
    on random ids `[max_tokens // length × replicas, length]` on both sides; `length` defaults to
    `max_length`, the longest padded length (the most memory per token). Out of memory raises
    `tf.errors.ResourceExhaustedError`. `release()` drops the probe's model.
    """
    state = {}
    seq_len = length or model_config.max_length

    def step():
        if "step" not in state:
            with strategy.scope():
                model = build_model(model_config)
                compile_model(model, config, schedule=1e-4)
                state["step"] = train_step(model)
        return state["step"]

    def time_step(max_tokens: int) -> float:
        batch = max(1, max_tokens // seq_len) * strategy.num_replicas_in_sync  # per replica → global, as training
        src = tf.random.uniform([batch, seq_len], 4, model_config.src_vocab_size, dtype=tf.int32)
        tgt = tf.random.uniform([batch, seq_len + 1], 4, model_config.tgt_vocab_size, dtype=tf.int32)
        inputs, labels = (src, tgt[:, :-1]), tgt[:, 1:]
        run_step = step()
        best = float("inf")
        for index in range(warmup + timed):
            started = time.perf_counter()
            run_step(inputs, labels)  # returns the loss: the step has finished
            if index >= warmup:
                best = min(best, time.perf_counter() - started)
        return best

    def release() -> None:
        state.clear()
        gc.collect()

    return time_step, release


def budget_tokens(model_config: ModelConfig, config: RunConfig, strategy: tf.distribute.Strategy,
                  budget_s: float) -> float:
    """Real target tokens a run of `model_config` would see in `budget_s` seconds of steps (logged with s/step).

    Times steps of `[max_tokens // PROBE_LENGTH, PROBE_LENGTH]` random ids (`step_timer`: 2
    untimed, the fastest of 3; a few seconds plus building and tracing the model) and scales by
    `REAL_TOKEN_SHARE`. `max_tokens` "auto" is the CPU recipe's. Draws random numbers: reseed after.
    """
    max_tokens = config.pipeline.max_tokens if isinstance(config.pipeline.max_tokens, int) else RECIPE_MAX_TOKENS
    time_step, release = step_timer(model_config, config, strategy, length=PROBE_LENGTH)
    try:
        seconds = time_step(max_tokens)
    finally:
        release()
    tokens = budget_s / seconds * max_tokens * REAL_TOKEN_SHARE
    log.info("step probe: %d layers, %d × %d tokens per side, %.3f s per step → ~%.1f M real target tokens in %.0f s",
             model_config.num_layers, max_tokens // PROBE_LENGTH, PROBE_LENGTH, seconds, tokens / 1e6, budget_s)
    return tokens


def _saved_config(run_dir: Path) -> Optional[RunConfig]:
    path = run_dir / CONFIG_FILE
    return RunConfig.load(path) if path.is_file() else None


def resolve_batch(config: RunConfig, device: str, model_config: ModelConfig, strategy: tf.distribute.Strategy,
                  run_dir: Path, resuming: bool, time_step: Optional[StepTimer] = None) -> tuple[RunConfig, BatchDecision]:
    """(config with the batch and schedule resolved, the decision); see the module docstring.

    `time_step` replaces the real step timer (tests); it is used only to probe a GPU.
    """
    requested = config.pipeline.max_tokens
    saved = _saved_config(run_dir) if resuming and requested == AUTO else None
    if saved is not None and saved.pipeline.max_tokens != AUTO:
        decision = BatchDecision(requested, saved.pipeline.max_tokens,
                                 f"--resume: the run's batch from {run_dir / CONFIG_FILE}", device)
        recorded = saved.train.lr_batch_factor is not None  # configs written before the scaling: none
        rule = saved.train.lr_scaling if recorded else "off"
        factor = saved.train.lr_batch_factor if recorded else 1.0
    else:
        release = None
        if requested == AUTO and device == "gpu" and config.pipeline.kind == "optimized" and time_step is None:
            time_step, release = step_timer(model_config, config, strategy)
        key = {"model": dataclasses.asdict(model_config),
               "policy": keras.mixed_precision.global_policy().name, "xla": bool(config.train.xla)}
        try:
            decision = decide_max_tokens(requested, device, config.pipeline.kind, time_step=time_step,
                                         length=model_config.max_length, key_fields=key)
        finally:
            if release is not None:
                release()
        rule = resolve_lr_scaling(config.train.lr_scaling, requested == AUTO)
        factor = 1.0
        if rule != "off" and config.pipeline.kind == "optimized":
            # the batch of one update: --accumulate-steps micro-batches of max_tokens
            factor = batch_factor(decision.max_tokens * config.train.accumulate_steps, config.train.lr_reference_tokens)
    train = scale_for_batch(config.train, factor, rule, model_config.d_model)
    schedule = _schedule_record(config.train, train)
    config = config.replace(pipeline={"max_tokens": decision.max_tokens}, train=train)
    return config, dataclasses.replace(decision, schedule=schedule)


def _schedule_record(given: TrainConfig, used: TrainConfig) -> dict:
    """What `scale_for_batch` did: rule, factor k, peak lr and warmup as given → as used, and why."""
    k, rule = used.lr_batch_factor, used.lr_scaling
    if given.lr_batch_factor is not None:
        reason = f"schedule as config.json recorded it (scaled ×{k:g}, --lr-scaling {rule})"
    elif rule == "off":
        reason = "learning-rate schedule as given (--lr-scaling off)"
    elif k == 1.0:
        reason = f"learning-rate schedule as given (the batch is the {used.lr_reference_tokens}-token reference)"
    else:
        reason = (f"schedule scaled for {k:g}× the {used.lr_reference_tokens}-token reference batch (--lr-scaling "
                  f"{rule}): warmup {given.warmup_steps} → {used.warmup_steps} steps, peak lr "
                  f"{given.peak_learning_rate if given.peak_learning_rate is not None else 'implied'} → "
                  f"{used.peak_learning_rate:.3g}")
    return {"rule": rule, "factor": k, "reference_tokens": used.lr_reference_tokens, "reason": reason,
            "peak_learning_rate": {"given": given.peak_learning_rate, "used": used.peak_learning_rate},
            "warmup_steps": {"given": given.warmup_steps, "used": used.warmup_steps}}
