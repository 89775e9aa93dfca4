"""`model.fit` with `--auto-batch`: after an out-of-memory error, retry at half the batch.

A `tf.errors.ResourceExhaustedError` during `fit` is recorded in the report; with
`--auto-batch` the run restores the last backup/checkpoint (or the initial weights) and
retries with half the batch — `max_tokens` for the optimized pipeline, `batch_size`
otherwise — down to `--auto-batch-floor` (default `AUTO_BATCH_FLOOR_TOKENS` /
`AUTO_BATCH_FLOOR_SENTENCES`); every retry is logged and appended to the report's
`run.auto_batch_retries`. An OOM it cannot retry ends the command with `error: out of memory at
step N with --max-tokens M (…)` and a hint (`OutOfMemoryError`), the report marked crashed.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import tensorflow as tf

from transformer.base.allocator import allocator_state
from transformer.base.config import PipelineConfig, RunConfig
from transformer.base.errors import OutOfMemoryError
from transformer.inference.rundir import RunCheckpoints
from transformer.measure.reports import StepTimeReport, error_info
from transformer.training.training_data import epoch_steps, make_datasets

log = logging.getLogger(__name__)

AUTO_BATCH_FLOOR_TOKENS = 256  # --auto-batch never goes below this max_tokens (optimized pipeline)
AUTO_BATCH_FLOOR_SENTENCES = 4  # ... nor below this batch_size (naive, or optimized without max_tokens)


@dataclass
class FitJob:
    """What `fit_with_auto_batch` needs besides the config (which a retry replaces).

    initial_state: `state_values(...)` before training (restored when an OOM strikes before
        the first checkpoint); None without --auto-batch.
    validate: run fit's per-epoch validation pass (False when a callback measures the loss).
    on_retry: called with the smaller config after each retry (saves it, updates the report).
    tokenized: `training_data.tokenized_training_pairs(...)` already built (and its cache
        filled by `count_batches`), or None: the training pipeline tokenizes for itself.
    steps_per_epoch: batches per `fit` epoch (`training_data.epoch_steps`) of the first
        attempt; the training batches then repeat (one iterator for the run). None: TPU.
    """

    model: object
    checkpoints: RunCheckpoints
    callbacks: list
    corpus: object
    tokenizers: object
    strategy_name: str
    replicas: int
    report: StepTimeReport
    initial_state: Optional[list]
    validate: bool
    on_retry: Callable[[RunConfig], None]
    tokenized: Optional[tf.data.Dataset] = None
    steps_per_epoch: Optional[int] = None


def fit_with_auto_batch(job: FitJob, config: RunConfig, initial_epoch: int) -> tuple[dict, RunConfig]:
    """`model.fit`, retried at half the batch after an out-of-memory error with --auto-batch.

    Returns (history, the config of the attempt that completed).
    """
    optimizer = job.model.optimizer
    steps_per_epoch = job.steps_per_epoch
    while True:
        train_batches, val_batches = make_datasets(job.corpus, job.tokenizers, config, job.strategy_name,
                                                   job.replicas, tokenized=job.tokenized,
                                                   repeat=steps_per_epoch is not None, validation=job.validate)
        try:
            history = job.model.fit(
                train_batches,
                epochs=config.train.planned_epochs,
                initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch,
                validation_data=val_batches,
                shuffle=False,  # the pipeline shuffles the training batches itself
                callbacks=job.callbacks,
                verbose=0 if config.train.time_budget_minutes is not None else config.train.verbose,
            ).history
            return history, config
        except tf.errors.ResourceExhaustedError as err:
            smaller = halved_pipeline(config.pipeline, config.train.auto_batch_floor) if config.train.auto_batch else None
            if smaller is None:
                raise out_of_memory(err, config, int(optimizer.iterations.numpy())) from err
            failed_step = int(optimizer.iterations.numpy())
            initial_epoch = _restore_for_retry(job.checkpoints, optimizer, job.model, job.initial_state)
            _record_retry(job.report, err, config.pipeline, smaller, failed_step, int(optimizer.iterations.numpy()))
            config = dataclasses.replace(config, pipeline=smaller)
            if steps_per_epoch is not None:  # smaller batches: more of them per epoch
                steps_per_epoch = epoch_steps(job.corpus, job.tokenizers, config, job.strategy_name, job.replicas,
                                              job.tokenized)
            job.on_retry(config)


def out_of_memory(err: tf.errors.ResourceExhaustedError, config: RunConfig, step: int) -> OutOfMemoryError:
    """The `error:` line for an OOM `fit_with_auto_batch` cannot retry: the step, the batch, TensorFlow's
    allocation and the CPU allocator's cap (`base.allocator`, a container's memory limit included)."""
    pipeline = config.pipeline
    batch = (f"--max-tokens {pipeline.max_tokens}" if pipeline.kind == "optimized" and pipeline.max_tokens is not None
             else f"--batch-size {pipeline.batch_size}")
    allocation = next((line.strip() for line in str(err).splitlines() if "OOM when allocating" in line), "")
    allocation = allocation.split(" on /job:")[0]  # "OOM when allocating tensor with shape[…] and type float"
    cap = allocator_state()
    capped = f"; the CPU allocator's cap is {cap['limit_mb']:,} MiB ({cap['limit_from']})" if cap["limit_mb"] else ""
    message = f"out of memory at step {step} with {batch}" + (f" ({allocation})" if allocation else "") + capped
    if config.train.auto_batch:
        return OutOfMemoryError(message + f": --auto-batch is at its floor ({batch})",
                                "lower --auto-batch-floor, train a smaller model, or give the run more memory")
    return OutOfMemoryError(message)


def halved_pipeline(pipeline: PipelineConfig, floor: Optional[int] = None) -> Optional[PipelineConfig]:
    """`pipeline` with half the batch (max_tokens, else batch_size), not below `floor`; None at the floor."""
    if pipeline.kind == "optimized" and pipeline.max_tokens is not None:
        floor = floor or AUTO_BATCH_FLOOR_TOKENS
        smaller = max(floor, pipeline.max_tokens // 2)
        return dataclasses.replace(pipeline, max_tokens=smaller) if smaller < pipeline.max_tokens else None
    floor = floor or AUTO_BATCH_FLOOR_SENTENCES
    smaller = max(floor, pipeline.batch_size // 2)
    return dataclasses.replace(pipeline, batch_size=smaller) if smaller < pipeline.batch_size else None


def state_values(model, optimizer, checkpoints: RunCheckpoints) -> list:
    """Values of every model/optimizer/epoch variable (the state --auto-batch falls back to)."""
    return [v.numpy() for v in _state_variables(model, optimizer, checkpoints)]


def _state_variables(model, optimizer, checkpoints: RunCheckpoints) -> list:
    return [*model.variables, *optimizer.variables, checkpoints.epoch]


def _restore_for_retry(checkpoints: RunCheckpoints, optimizer, model, initial_state: list) -> int:
    """After an OOM: back to the latest checkpoint, else the initial state; returns its epoch.

    A backup newer than that state is then restored by `StepBackupAndRestore` when `fit`
    starts again (it only loads snapshots at least as new as the current step).
    """
    if checkpoints.restore_latest() is None:
        for variable, value in zip(_state_variables(model, optimizer, checkpoints), initial_state):
            variable.assign(value)
    return int(checkpoints.epoch.numpy())


def _record_retry(report: StepTimeReport, err: BaseException, before: PipelineConfig, after: PipelineConfig,
                  failed_step: int, restart_step: int) -> None:
    field = "max_tokens" if before.kind == "optimized" and before.max_tokens is not None else "batch_size"
    retry = {
        "error": {k: v for k, v in error_info(err).items() if k != "traceback"},
        "failed_at_step": failed_step,
        "restarted_from_step": restart_step,
        "field": field,
        "before": getattr(before, field),
        "after": getattr(after, field),
    }
    report.run.setdefault("auto_batch_retries", []).append(retry)
    log.warning("out of memory at step %d (%s): --auto-batch restarts from step %d with %s %d → %d",
                failed_step, retry["error"]["type"], restart_step, field, retry["before"], retry["after"])
