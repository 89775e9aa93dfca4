"""Training orchestration: config → data → tokenizers → pipeline → model → fit → reports.

`train(config)` is the one entry point (scripts/train.py and the notebooks call it). It fills
a run directory laid out as transformer/inference/rundir.py describes (config.json, tokenizers/,
checkpoints/, best/, backup/, tensorboard/, report.json, summary.json).

Distribution (`--strategy`, see transformer/runtime/distribute.py): the model, optimizer, metrics and
checkpoint are created under `strategy.scope()`; batch flags are per replica and the
pipeline builds global batches of `replicas` times that size. In multi-worker training only
the chief writes the run directory; other workers write the same files to a temporary
directory that is deleted when `train` returns, and read checkpoints/backups from the
chief's run directory (which must be on a filesystem they share).

Fault tolerance. A checkpoint is saved at every epoch end; with `--backup-every-steps N` a
`StepBackupAndRestore` snapshot (model + optimizer + position in the epoch) is also taken
every N steps. Re-running the same command after a crash continues from the newer of the
two (a backup present in the run directory implies `--resume`).

Out of memory: with `--auto-batch` a run retries at half the batch (transformer/training/auto_batch.py).
Datasets (incl. the TPU path): transformer/training/training_data.py; step timing under a strategy:
transformer/training/replica_timing.py.

Size: over ~350 lines on purpose: `_train` reads top to bottom as the whole run; its parts
live in rundir, optimizer, training_data, auto_batch, replica_timing and the callback modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import keras
import tensorflow as tf

from transformer.base import atomic
from transformer.base.config import AUTO, RUN_TRAIN_FIELDS, ModelConfig, RunConfig, check_sampling, parse_profile_steps
from transformer.base.errors import ConfigError, OutputExistsError
from transformer.data.corpora import load_corpus
from transformer.data.pipeline import length_grid, make_batches, resolve_length_buckets
from transformer.data.tokenizer import build_or_load_tokenizers, load_tokenizers
from transformer.inference.rundir import (
    BACKUP_DIR,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    EMA_DIR,
    EMA_FILE,
    REPORT_FILE,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    TOKENIZER_DIR,
    RunCheckpoints,
    build_model,
    save_weights,
)
from transformer.inference.translator import DecodeConfig, Translator
from transformer.measure.reports import StepTimeReport
from transformer.model.ema import ema_copy
from transformer.model.optimizer import compile_model, make_schedule
from transformer.model.transformer import Transformer
from transformer.runtime import distribute
from transformer.runtime.devices import select_device, set_precision
from transformer.runtime.faults import DivergenceGuard, InterruptHandler
from transformer.runtime.flops import TransformerDims
from transformer.runtime.fused_kernels import disable_fused_kernels, enable_fused_kernels
from transformer.runtime.precision import PrecisionDecision, decide_precision
from transformer.runtime.runlock import RunLock, make_run_dir
from transformer.runtime.threads import configure_training_threads
from transformer.runtime.xla_cache import enable_xla_cache, xla_cache_entries
from transformer.runtime.xla_flags import XLA_FLAGS_ENV, enable_fast_gpu_compile
from transformer.training.auto_batch import FitJob, fit_with_auto_batch, state_values
from transformer.training.backup import StepBackupAndRestore, snapshots
from transformer.training.batch_probe import budget_tokens, resolve_batch
from transformer.training.budget import TrainingClock
from transformer.training.depth import DEEP_LAYERS, resolve_depth
from transformer.training.gc_freeze import FreezeLongLived
from transformer.training.init_from import InitSource, open_init_source
from transformer.training.late_dropout import LateDropout, late_dropout_switch
from transformer.training.profiling import StepProfiler
from transformer.training.progress import BudgetProgress, dynamic_display
from transformer.training.replica_timing import ReplicaBatchTimer
from transformer.training.summaries import StepTensorBoard
from transformer.training.timing import BatchTimer
from transformer.training.training_data import (
    count_batches,
    epoch_steps,
    no_batches_error,
    tokenized_training_pairs,
    xla_workload,
)
from transformer.training.validation_bleu import ValidationBleu, fixed_sample
from transformer.training.xla_warmup import run_warmup, warmup_threads

log = logging.getLogger(__name__)



# On a GPU an epoch of the Bible corpus takes seconds (24 batches of 65,536 tokens: 3.4 s on an
# H100) and a save ~0.5 s: one per epoch cost 29 s of a 3-minute run's 299 s. There, epoch
# checkpoints are at least this far apart (the last epoch's is always written).
GPU_CHECKPOINT_MIN_INTERVAL_S = 30.0


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves a RunCheckpoints checkpoint at the end of every epoch (and every `every_steps` steps).

    With `min_interval_s`, an epoch's checkpoint is skipped when the last save is more recent
    than that (seconds of wall time); the last epoch's is then written when training ends. The
    first epoch's is always written, so a run that crashes or diverges early still leaves one.
    A mid-epoch checkpoint records the epoch as not finished: resuming from it restarts that
    epoch's data (with the optimizer's step count kept). Use --backup-every-steps for exact
    mid-epoch resumption; these checkpoints are for checkpoint averaging and evaluation.
    """

    def __init__(self, checkpoints: RunCheckpoints, every_steps: Optional[int] = None,
                 clock: Optional[TrainingClock] = None, min_interval_s: float = 0.0):
        super().__init__()
        self.checkpoints = checkpoints
        self.every_steps = every_steps
        self.clock = clock  # told how long a save takes (the wall clock's reserve)
        self.min_interval_s = min_interval_s
        self.seconds_spent = 0.0
        self._epoch = 0
        self._saved_at: Optional[float] = None  # perf_counter() of the last save; None: none yet
        self._unsaved_epoch: Optional[int] = None  # an epoch whose checkpoint was skipped

    def _save(self, epoch: int) -> str:
        start = time.perf_counter()
        path = self.checkpoints.save(epoch)
        seconds = time.perf_counter() - start
        self.seconds_spent += seconds
        self._saved_at = time.perf_counter()
        self._unsaved_epoch = None
        if self.clock is not None:
            self.clock.expect_at_end("checkpoint", seconds)
        return path

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def save_now(self) -> str:
        """A checkpoint of the current (unfinished) epoch, e.g. before stopping on a signal."""
        return self._save(self._epoch)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if self.every_steps and step % self.every_steps == 0:
            path = self._save(self._epoch)
            log.info("step %d: checkpoint %s", step, path)

    def on_epoch_end(self, epoch, logs=None):
        if self._saved_at is not None and time.perf_counter() - self._saved_at < self.min_interval_s:
            self._unsaved_epoch = epoch + 1
            return
        path = self._save(epoch + 1)
        log.info("epoch %d: checkpoint %s", epoch + 1, path)

    def on_train_end(self, logs=None):
        if self._unsaved_epoch is not None:
            epoch = self._unsaved_epoch
            log.info("epoch %d: checkpoint %s", epoch, self._save(epoch))


@dataclass
class TrainResult:
    output_dir: Path
    tokenizer_dir: Path
    history: dict
    summary: dict
    model: Transformer


def resolve_model_config(config: RunConfig, tokenizers, output_dir: Path, resuming: Optional[bool] = None) -> ModelConfig:
    """The architecture: from the run's saved config when resuming, else from `config` + vocab sizes."""
    resuming = config.train.resume if resuming is None else resuming
    saved = output_dir / CONFIG_FILE
    if resuming and saved.exists():
        model_config = RunConfig.load(saved).model
        asked = {"num_layers": model_config.num_layers} if config.model.num_layers == AUTO else {}
        if model_config != dataclasses.replace(
            config.model, src_vocab_size=model_config.src_vocab_size, tgt_vocab_size=model_config.tgt_vocab_size,
            **asked,
        ):
            log.warning("--resume: using the architecture saved in %s, not the command line's", saved)
        return model_config
    return dataclasses.replace(
        config.model,
        src_vocab_size=int(tokenizers.src.get_vocab_size()),
        tgt_vocab_size=int(tokenizers.tgt.get_vocab_size()),
    )


def _deep_model_tokens(config: RunConfig, tokenizers, run_dir: Path, strategy: tf.distribute.Strategy):
    """`predict_tokens` for `resolve_depth`: times the `DEEP_LAYERS` model, then reseeds (the probe drew numbers)."""
    def predict() -> float:
        deep = resolve_model_config(config.replace(model={"num_layers": DEEP_LAYERS}), tokenizers, run_dir, False)
        tokens = budget_tokens(deep, config, strategy, config.train.time_budget_minutes * 60)
        keras.utils.set_random_seed(config.train.seed)
        return tokens
    return predict


def run_description(config: RunConfig, device: str = "", replicas: int = 1) -> dict:
    """The `run` section of the step-time report: what this run is, for comparisons."""
    pipeline = config.pipeline
    batching = (f"{pipeline.batch_size} sentences" if pipeline.kind == "naive" or pipeline.max_tokens is None
                else f"{pipeline.max_tokens} tokens/bucket")
    if replicas > 1:
        batching += f" per replica × {replicas} replicas"
    if config.train.accumulate_steps > 1:  # a report's step is an optimizer update
        batching += f" × {config.train.accumulate_steps} micro-batches per update (accumulated)"
    return {
        "label": config.train.label or Path(config.train.output_dir).name,
        "device": device or config.train.device,
        "precision": config.train.mixed_precision,
        "xla": config.train.xla,
        "pipeline": pipeline.kind,
        "batching": batching,
        "dataset": (" ".join(map(str, config.data.local_corpora)) or config.data.train_src
                    or config.data.dataset),
        "config": config.to_dict(),
    }


def _has_backup(run_dir: Path) -> bool:
    return bool(snapshots(run_dir / BACKUP_DIR))


def train(config: RunConfig, extra_callbacks: tuple = ()) -> TrainResult:
    """Runs one training job end to end; see the module docstring for what it writes.

    The step-time report is written when training ends, and also when it dies (exception,
    out of memory, Ctrl-C): `StepTimeReport.guard` records the state and re-raises. The
    Keras global dtype policy that training sets is restored on return (the returned model
    keeps its own layers' policies), so a caller's later models are not built in bfloat16;
    the fused CPU kernels are turned off again (`runtime/fused_kernels.py`).
    """
    config.validate()
    init = open_init_source(config)  # --init-from: a missing or damaged run stops here, before the run directory
    # before TensorFlow lists its devices (it reads $TF_XLA_FLAGS once); inert when nothing compiles
    xla_cache = enable_xla_cache(config.train.xla_cache) if config.train.xla is not False else None
    if config.train.xla is not False and config.train.device != "cpu":
        enable_fast_gpu_compile()  # before XLA's first compilation (GPU passes only)
    run_dir = Path(config.train.output_dir)
    strategy_name = distribute.resolve_strategy_name(config.train.strategy)
    role = distribute.task_role(strategy_name)
    with contextlib.ExitStack() as stack:
        stack.callback(keras.mixed_precision.set_global_policy, keras.mixed_precision.global_policy())
        stack.callback(disable_fused_kernels)  # a caller's later models (an XLA step, say) trace TensorFlow's ops
        if role.is_chief:  # one writer per run directory (other workers write to temporary directories)
            stack.enter_context(RunLock(make_run_dir(run_dir)))
        interrupts = stack.enter_context(InterruptHandler())
        return _train_locked(config, run_dir, strategy_name, role, interrupts, extra_callbacks, xla_cache, init)


def _train_locked(config: RunConfig, run_dir: Path, strategy_name: str, role: distribute.TaskRole,
                  interrupts: InterruptHandler, extra_callbacks: tuple, xla_cache: Optional[dict],
                  init: Optional[InitSource] = None) -> TrainResult:
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    backup = _has_backup(run_dir)
    if not (config.train.resume or backup) and checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
        raise OutputExistsError(
            f"{run_dir} already holds checkpoints; pass --resume to continue that run or choose another --output",
            hint="one run directory holds one run (README: When something goes wrong)")
    if backup and not config.train.resume:
        log.info("%s holds a backup of an interrupted run: continuing it", run_dir / BACKUP_DIR)
    if config.train.auto_batch and strategy_name == "multi-worker":
        log.warning("--auto-batch retries on one worker only; under multi-worker an out-of-memory "
                    "error on one worker stops the job (restart it with a smaller batch)")
    write_dir = role.write_dir(run_dir)
    try:
        make_run_dir(write_dir)
        report = StepTimeReport(write_dir / REPORT_FILE, run=run_description(config),
                                steps_planned=config.train.planned_steps)
        if config.train.resume or backup:
            report.continue_from_disk()  # a resumed run appends to its earlier measurements
        report.compile["persistent_cache"] = xla_cache
        report.compile["xla_flags"] = os.environ.get(XLA_FLAGS_ENV) or None
        with report.guard():
            return _train(config, run_dir, write_dir, strategy_name, role, config.train.resume or backup,
                          report, extra_callbacks, interrupts, init)
    finally:
        role.cleanup(write_dir, run_dir)


def _train(config: RunConfig, run_dir: Path, write_dir: Path, strategy_name: str, role: distribute.TaskRole,
           resuming: bool, report: StepTimeReport, extra_callbacks: tuple,
           interrupts: Optional[InterruptHandler] = None, init: Optional[InitSource] = None) -> TrainResult:
    started = time.perf_counter()
    threads = configure_training_threads()  # before the first TF op: a cgroup CPU quota caps the pools
    report.run["threads"] = threads.to_dict()  # the budget: environment.cpu_budget
    device = select_device(config.train.device)
    strategy = distribute.make_strategy(strategy_name, device)  # before the first TF op
    replicas = int(strategy.num_replicas_in_sync)
    requested = config
    decision = decide_precision(config.train.mixed_precision, config.train.xla,
                                "tpu" if strategy_name == "tpu" else device, config.pipeline.kind)
    config = _with_decision(requested, decision)  # XLA on a GPU may still change (`_decide_xla`)
    policy = set_precision(config.train.mixed_precision, device)
    # before the model is traced; XLA on a GPU may still change below, where these CPU kernels are off anyway
    report.run["fused_kernels"] = enable_fused_kernels(config.train.fused_kernels, device, config.train.xla)
    keras.utils.set_random_seed(config.train.seed)

    corpus = load_corpus(config.data)
    log.info("corpus %s: %s train pairs, %s validation pairs, %d empty pairs dropped",
             corpus.name, corpus.num_train, corpus.num_validation, corpus.dropped_empty)
    config, tokenizers, tokenizer_dir = _run_tokenizers(config, corpus, run_dir, resuming, init)
    run_tokenizers = write_dir / TOKENIZER_DIR
    if not run_tokenizers.exists():
        shutil.copytree(tokenizer_dir, run_tokenizers)

    if init is not None and config.model.num_layers == AUTO:  # the weights' depth
        config = config.replace(model={"num_layers": init.config.model.num_layers})
    elif init is None and not resuming:  # a resumed run keeps its saved depth
        config, depth_line = resolve_depth(config, decision, _deep_model_tokens(config, tokenizers, run_dir, strategy))
        if depth_line:
            log.info("%s", depth_line)
            report.run["depth_decision"] = depth_line
    model_config = resolve_model_config(config, tokenizers, run_dir, resuming)
    config = dataclasses.replace(config, model=model_config)
    if init is not None:
        init.check_model(model_config)
        config = init.record(config)
    # --max-tokens auto. A GPU probe times steps without XLA: compiling each budget's shape would
    # cost ~32 s apiece there; the batch that speeds up plain steps is the one XLA then gets.
    resolved, batch = resolve_batch(config.replace(train={"xla": False}), "tpu" if strategy_name == "tpu" else device,
                                    model_config, strategy, run_dir, resuming)
    config = resolved.replace(train={"xla": config.train.xla})
    log.info("%s", batch.summary())
    report.run["batch_decision"] = batch.to_dict()
    if batch.probe is not None and not batch.probe_cached:  # the probe drew random numbers
        keras.utils.set_random_seed(config.train.seed)

    budget_s = config.train.time_budget_minutes * 60 if config.train.time_budget_minutes is not None else None
    # the training split tokenized once: for counting an epoch's batches and for training
    tokenized = tokenized_training_pairs(corpus, tokenizers, config) if strategy_name != "tpu" else None
    counting = time.perf_counter()
    decision, config, steps_per_epoch = _decide_xla(requested, decision, config, corpus, tokenizers, strategy_name,
                                                    replicas, tokenized)
    if steps_per_epoch is None:
        steps_per_epoch = epoch_steps(corpus, tokenizers, config, strategy_name, replicas, tokenized)
    if steps_per_epoch is not None and not config.train.steps_per_epoch:
        log.info("one epoch = %d batches (counted in %.1f s)", steps_per_epoch, time.perf_counter() - counting)
        if steps_per_epoch == 0:
            raise no_batches_error(corpus, config, replicas)
    log.info("%s", decision.summary())
    report.run["precision_decision"] = decision.to_dict()
    config.save(write_dir / CONFIG_FILE)
    report.run.update(run_description(config, device, replicas))
    report.run["distribution"] = distribute.describe(strategy, strategy_name, role)
    bucketed = config.pipeline.kind == "optimized" and strategy_name != "tpu"  # TPU: one static shape
    report.compile.update(xla=config.train.xla,
                          length_grid=length_grid(config.pipeline, model_config.max_length) if bucketed else None)
    log.info("strategy %s: %d replica(s), global batch = per-replica batch × %d (%s)",
             strategy_name, replicas, replicas, report.run["batching"])
    total_steps = config.train.planned_steps
    if config.train.lr_schedule == "cosine" and budget_s is None and total_steps is None:
        total_steps = config.train.planned_epochs * (
            steps_per_epoch or count_batches(corpus, tokenizers, config, replicas, tokenized))
        log.info("cosine schedule over %d planned steps (%d epochs)", total_steps, config.train.planned_epochs)
    if budget_s is None and report.steps_planned is None and steps_per_epoch is not None:
        report.steps_planned = config.train.planned_epochs * steps_per_epoch
    clock = TrainingClock(budget_s, total_steps, wall=config.train.budget_clock == "wall", started=started)
    with strategy.scope():
        model = build_model(model_config)
        if init is not None:  # a resumed run's own checkpoint, restored below, replaces these weights
            init.load_weights(model)
            log.info("--init-from: weights of %s (step %s of that run); a new optimizer, schedule and step count",
                     init.prefix, init.step)
        optimizer = compile_model(model, config, make_schedule(config, model_config.d_model, clock.progress, total_steps))
        dropout_switch = late_dropout_switch(model, config.train.dropout_from_epoch)
        checkpoints = RunCheckpoints(write_dir / CHECKPOINT_DIR, model, optimizer,
                                     max_to_keep=config.train.keep_checkpoints,
                                     read_directory=run_dir / CHECKPOINT_DIR, train_elapsed_s=clock.elapsed_s)
    distribute.patch_keras_for_multi_worker(model, strategy)
    initial_epoch = _restore_checkpoint(checkpoints, optimizer, resuming)
    initial_state = state_values(model, optimizer, checkpoints) if config.train.auto_batch else None
    log.info("model: %s parameters, policy %s, XLA %s, device %s",
             f"{model.count_params():,}", policy, config.train.xla, device)

    timer_args = dict(dims=TransformerDims.from_config(model_config), probe_peak=config.train.probe_peak,
                      measure_input_wait=strategy_name != "tpu")
    timer = (BatchTimer(report, **timer_args) if strategy_name == distribute.DEFAULT
             else ReplicaBatchTimer(report, strategy=strategy, **timer_args))
    backup = None
    if config.train.backup_every_steps or _has_backup(run_dir):
        backup = StepBackupAndRestore(run_dir / BACKUP_DIR, save_freq=config.train.backup_every_steps or "epoch",
                                      steps_per_epoch=steps_per_epoch, write_dir=write_dir / BACKUP_DIR)
    bleu = make_bleu_callback(config, corpus, tokenizers, write_dir, report, clock, strategy_name)
    saver = EpochCheckpoint(checkpoints, config.train.checkpoint_every_steps, clock,
                            min_interval_s=GPU_CHECKPOINT_MIN_INTERVAL_S if device == "gpu" else 0.0)
    profiler = None
    if config.train.profile_steps:
        profiler = StepProfiler(*parse_profile_steps(config.train.profile_steps), write_dir / "tensorboard", report)
    warmup = None
    if config.train.xla and config.train.xla_warmup and bucketed and strategy_name == distribute.DEFAULT:
        warmup = run_warmup(config, tokenized, corpus.validation is not None and not _evaluates_loss([bleu]),
                            report, clock)
    if interrupts is not None:  # on SIGINT/SIGTERM: save the exact position, then stop
        interrupts.save = (lambda: f"backup {backup.save_now()}") if backup else (
            lambda: f"checkpoint {saver.save_now()} (--resume repeats this epoch's data)")
    callbacks = [
        DivergenceGuard(report),  # first: a NaN step is never backed up or checkpointed
        *([LateDropout(dropout_switch, config.train.dropout_from_epoch)] if dropout_switch else []),
        *([backup] if backup else []),
        timer,
        *([profiler] if profiler else []),  # after the timer, which syncs the step
        clock,  # after the timer, which syncs the step
        *([warmup] if warmup else []),  # after the clock, which it charges
        saver,
        StepTensorBoard(log_dir=str(write_dir / TENSORBOARD_DIR), update_freq=50),
        *([bleu] if bleu else []),
        *extra_callbacks,
        *([interrupts] if interrupts is not None else []),
    ]
    if budget_s is not None and config.train.verbose:  # instead of Keras' bar (`Epoch 2/1000000`, `N/Unknown`)
        in_place = config.train.verbose == 1 and dynamic_display()
        callbacks.append(BudgetProgress(clock, report, bleu, in_place=in_place))
    callbacks.append(FreezeLongLived(report))  # last: after the evaluation and the step's tracing

    nothing_to_train = clock.budget_spent()  # resumed with its budget used up (fit would take one step)
    if nothing_to_train:
        log.info("time budget of %.1f min already spent: nothing to train", clock.budget_s / 60)
        clock.stopped_by_budget = True
    startup_s = time.perf_counter() - started
    try:
        history = {}
        if not nothing_to_train:
            def on_retry(smaller: RunConfig) -> None:  # the run continues with the smaller batch
                smaller.save(write_dir / CONFIG_FILE)
                report.run.update(batching=run_description(smaller, device, replicas)["batching"],
                                  config=smaller.to_dict())
                report.write()

            job = FitJob(model, checkpoints, callbacks, corpus, tokenizers, strategy_name, replicas, report,
                         initial_state, validate=not _evaluates_loss(callbacks), on_retry=on_retry,
                         tokenized=tokenized, steps_per_epoch=steps_per_epoch)
            steps_before = int(optimizer.iterations.numpy())
            history, config = fit_with_auto_batch(job, config, initial_epoch)
            if int(optimizer.iterations.numpy()) == steps_before and initial_epoch < config.train.planned_epochs:
                raise no_batches_error(corpus, config, replicas)  # --steps-per-epoch: the batches were not counted
    finally:  # also when the resumed run dies: the report says where it started
        if backup is not None and backup.restored is not None:
            report.run["resumed_from_backup"] = backup.restored
            initial_epoch = backup.restored["epoch"]

    ema = _save_ema(model, optimizer, config, write_dir) if config.train.ema_decay is not None else None
    summary = _summary(history, optimizer, config, time.perf_counter() - started, initial_epoch)
    summary["ema"] = ema
    summary["train_time_s"] = round(clock.seconds, 1)  # wall seconds with --budget-clock wall
    summary["budget_clock"] = config.train.budget_clock if budget_s is not None else None
    summary["time_s"] = {"startup": round(startup_s, 1),
                         "training_steps": round(sum(r.time_s for r in report.records), 1),
                         "evaluation": round(bleu.seconds_spent, 1) if bleu is not None else 0.0,
                         "checkpoints": round(saver.seconds_spent, 1)}
    if summary["val_loss"] is None and bleu is not None and bleu.report.evaluations:
        last = bleu.report.evaluations[-1]  # measured on the evaluation sample (budgeted runs)
        summary["val_loss"], summary["val_masked_accuracy"] = last.get("val_loss"), last.get("val_masked_accuracy")
    summary["stopped_by"] = ("time budget" if clock.stopped_by_budget
                             else "early stopping" if bleu is not None and bleu.early_stopped else None)
    summary["tokens_seen"] = report.tokens_seen()
    summary["best_validation_bleu"] = bleu.best if bleu is not None else None
    report.run["stopped_by"] = summary["stopped_by"]
    _log_compilations(report)
    report.run.update(budget_clock=summary["budget_clock"], time_s=summary["time_s"])
    summary["step_time"] = report.summary()
    summary["replicas"] = replicas
    atomic.write_json(write_dir / SUMMARY_FILE, summary)
    # A non-chief's write_dir is deleted when train() returns: point at the chief's files.
    return TrainResult(run_dir, run_tokenizers if role.is_chief else tokenizer_dir, history, summary, model)


def _run_tokenizers(config: RunConfig, corpus, run_dir: Path, resuming: bool,
                    init: Optional[InitSource]) -> tuple[RunConfig, object, Path]:
    """(config, tokenizers, their directory) for this run: on `--resume` the run's own (and the
    train fields its optimizer state is laid out by), with `--init-from` those of the initial
    run, else built from the corpus (or loaded from the tokenizer cache). Stops with a
    `ConfigError` when `--subword-alpha` does not suit the tokenizers' kind."""
    saved_tokenizers = run_dir / TOKENIZER_DIR
    if resuming and saved_tokenizers.is_dir() and (run_dir / CONFIG_FILE).exists():
        # the vocabulary the checkpoints were trained with, whatever --vocab-size etc. say now
        tokenizers, tokenizer_dir = load_tokenizers(saved_tokenizers), saved_tokenizers
        saved = RunConfig.load(run_dir / CONFIG_FILE)
        config = dataclasses.replace(config, tokenizer=saved.tokenizer)
        kept = {k: getattr(saved.train, k) for k in RUN_TRAIN_FIELDS}  # the optimizer's state is laid out by them
        if kept != {k: getattr(config.train, k) for k in RUN_TRAIN_FIELDS}:
            log.warning("--resume: the run's %s, not the config's", ", ".join(f"{k}={v}" for k, v in kept.items()))
            config = config.replace(train=kept)
        if init is None and saved.train.init_from:  # resumed without --init-from: the run still records its start
            config = config.replace(train={k: getattr(saved.train, k)
                                           for k in ("init_from", "init_checkpoint", "init_from_step")})
        log.info("--resume: using the run's tokenizers in %s", saved_tokenizers)
    elif init is not None:  # the vocabulary the initial weights were trained with
        tokenizers, tokenizer_dir = load_tokenizers(init.tokenizer_dir), init.tokenizer_dir
        config = config.replace(tokenizer=dataclasses.replace(init.config.tokenizer, root=config.tokenizer.root))
        log.info("--init-from: using the tokenizers of %s", init.run_dir)
    else:
        tokenizers, tokenizer_dir = build_or_load_tokenizers(corpus, config.tokenizer)
    try:  # --resume / --init-from: the tokenizers (and their kind) are the run's, known only now
        check_sampling(config)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return config, tokenizers, tokenizer_dir


def _save_ema(model: Transformer, optimizer, config: RunConfig, write_dir: Path) -> dict:
    """Saves the moving average of the weights as <run>/ema/ (`--checkpoint ema`); returns what ema.json records."""
    info = {"step": int(optimizer.iterations.numpy()), "decay": config.train.ema_decay, "every": config.train.ema_every}
    prefix = save_weights(ema_copy(model), write_dir / EMA_DIR, EMA_FILE, info)
    log.info("moving average of the weights (decay %g, every %d steps) at step %d → %s",
             info["decay"], info["every"], info["step"], prefix)
    return {**info, "checkpoint": str(prefix)}


def _with_decision(requested: RunConfig, decision: PrecisionDecision, config: Optional[RunConfig] = None) -> RunConfig:
    """`config` (default: `requested`) with the decided precision and XLA, and `requested`'s
    `--length-buckets` resolved for that XLA (what else `config` resolved, e.g. the batch, stays)."""
    base = requested if config is None else config
    buckets = resolve_length_buckets(requested.pipeline, decision.xla).length_buckets
    return base.replace(train={"mixed_precision": decision.mixed_precision, "xla": decision.xla},
                        pipeline={"length_buckets": buckets})


def _decide_xla(requested: RunConfig, decision: PrecisionDecision, config: RunConfig, corpus, tokenizers,
                strategy_name: str, replicas: int, tokenized) -> tuple[PrecisionDecision, RunConfig, Optional[int]]:
    """`--xla auto` on a GPU: weighs the run's compilations against its training time.

    Returns (decision, config, batches per epoch if counted here, else None). Without a time
    budget or `--steps-per-epoch` the training time needs the epoch's batch count: counted
    with the grid XLA would use; when XLA then ends off the grid changes, and so does the count.
    """
    if requested.train.xla is not None or decision.facts.device != "gpu" or requested.pipeline.kind != "optimized":
        return decision, config, None
    validation = corpus.validation is not None
    threads = warmup_threads() if strategy_name == distribute.DEFAULT else 1  # the warm-up: one device
    workload = xla_workload(config, None, validation, threads)
    steps_per_epoch = None
    if workload.train_s() is None:
        steps_per_epoch = epoch_steps(corpus, tokenizers, config, strategy_name, replicas, tokenized)
        workload = xla_workload(config, steps_per_epoch, validation, threads)
    final = decide_precision(requested.train.mixed_precision, None, decision.facts.device, requested.pipeline.kind,
                             facts=decision.facts, workload=workload)
    if final.xla == decision.xla:
        return final, config, steps_per_epoch
    return final, _with_decision(requested, final, config), None


def _log_compilations(report: StepTimeReport) -> None:
    """Adds the persistent cache's entries after the run to `report.compile` and logs the compilations."""
    compiled = report.compile
    cache = compiled.get("persistent_cache")
    if cache is not None:
        cache["entries_after"] = xla_cache_entries(Path(cache["directory"]))
    if not compiled.get("xla"):
        return
    steps = {name: compiled[name] for name in ("train", "evaluate") if name in compiled}
    if cache is not None and cache["entries_before"] == cache["entries_after"] == 0 and \
            any(entry["compilations"] for entry in steps.values()):
        log.warning("XLA's persistent cache %s was not written: TensorFlow had read $TF_XLA_FLAGS before train() "
                    "named it (call transformer.runtime.xla_cache.enable_xla_cache before TensorFlow's first op)",
                    cache["directory"])
    log.info("XLA: %s compilations over a grid of %d lengths%s",
             ", ".join(f"{name} {entry['compilations']} ({entry['new_shape_steps_s']:.1f} s in steps meeting a new shape)"
                       for name, entry in steps.items()) or "no",
             len(compiled.get("length_grid") or ()),
             f"; persistent cache {cache['directory']}: {cache['entries_before']} → {cache['entries_after']} programs"
             if cache is not None else "")


def _evaluates_loss(callbacks: list) -> bool:
    """True when a `ValidationBleu` measures the validation loss (then fit's per-epoch pass is skipped)."""
    return any(isinstance(c, ValidationBleu) and c.loss_batches is not None for c in callbacks)


def make_bleu_callback(config: RunConfig, corpus, tokenizers, write_dir: Path, report: StepTimeReport,
                       clock: TrainingClock, strategy_name: str) -> Optional[ValidationBleu]:
    """The validation-BLEU callback over a fixed sample, or None (disabled / no validation split).

    Under a time budget it evaluates at `train.eval_at` fractions of the budget and at the end
    (unless `bleu_every_steps`), and also measures the validation loss on the same sample,
    replacing fit's per-epoch pass over the whole validation split.
    """
    size = config.train.bleu_sentences
    if not size or corpus.validation is None:
        return None
    if strategy_name in ("multi-worker", "tpu"):
        log.warning("validation BLEU during training is not run under --strategy %s; "
                    "evaluate checkpoints with scripts/evaluate.py", strategy_name)
        return None
    sources, references = [], []
    for src, tgt in corpus.validation.as_numpy_iterator():
        sources.append(src.decode("utf-8"))
        references.append(tgt.decode("utf-8"))
    sources, references = fixed_sample(sources, references, size)
    budgeted = config.train.time_budget_minutes is not None
    loss_batches = None
    if budgeted:
        loss_batches = make_batches(tf.data.Dataset.from_tensor_slices((sources, references)), tokenizers,
                                    config.pipeline, config.model.max_length, training=False)
    fractions = config.train.eval_at if budgeted and not config.train.bleu_every_steps else None
    return ValidationBleu(lambda model: Translator(tokenizers, model, DecodeConfig()), sources, references,
                          run_dir=write_dir, every_steps=config.train.bleu_every_steps,
                          patience=config.train.early_stop_patience, report=report, clock=clock,
                          fractions=fractions, loss_batches=loss_batches)


def _restore_checkpoint(checkpoints: RunCheckpoints, optimizer, resuming: bool) -> int:
    """Restores the latest epoch checkpoint when resuming; returns the epoch to start at."""
    if not resuming:
        return 0
    restored = checkpoints.restore_latest()
    if restored is None:
        log.info("resume: no epoch checkpoint in %s", checkpoints.read_directory)
        return 0
    epoch = int(checkpoints.epoch.numpy())
    log.info("resumed %s at epoch %d, step %d", restored, epoch, int(optimizer.iterations.numpy()))
    return epoch


def _summary(history: dict, optimizer, config: RunConfig, wall_s: float, initial_epoch: int) -> dict:
    last = {key: float(values[-1]) for key, values in history.items() if values}
    return {
        "epochs_run": len(history.get("loss", [])),
        "epochs_total": config.train.epochs,  # None: 1, or until the time budget
        "initial_epoch": initial_epoch,
        "optimizer_steps": int(optimizer.iterations.numpy()),
        "train_loss": last.get("loss"),
        "train_masked_accuracy": last.get("masked_accuracy"),
        "val_loss": last.get("val_loss"),
        "val_masked_accuracy": last.get("val_masked_accuracy"),
        "wall_time_s": round(wall_s, 1),
    }
