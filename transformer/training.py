"""Training orchestration: config → data → tokenizers → pipeline → model → fit → reports.

`train(config)` is the one entry point (scripts/train.py and the notebooks call it). A run
directory holds:
    config.json          the effective RunConfig (model vocab sizes filled in)
    tokenizers/          a copy of the tokenizer SavedModel used (the run is self-contained)
    checkpoints/         tf.train.CheckpointManager checkpoints (model + optimizer + epoch)
    tensorboard/         Keras TensorBoard logs
    report.json, report_steps.csv   the step-time report (written even when training dies)
    summary.json         final losses, validation masked accuracy, wall time
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import keras
import tensorflow as tf

from transformer.config import ModelConfig, RunConfig
from transformer.data import load_corpus
from transformer.devices import select_device, set_precision
from transformer.flops import TransformerDims
from transformer.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from transformer.model import Transformer
from transformer.pipeline import make_batches
from transformer.reports import StepTimeReport
from transformer.schedule import WarmupInverseSqrt
from transformer.timing import BatchTimer
from transformer.tokenizer import build_or_load_tokenizers, load_tokenizers

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"


def build_model(model_config: ModelConfig) -> Transformer:
    """A built (weights created) Transformer for `model_config` under the global dtype policy."""
    model = Transformer.from_model_config(model_config)
    model.build()
    return model


def compile_model(model: Transformer, config: RunConfig) -> keras.optimizers.Optimizer:
    """Adam(0.9, 0.98, 1e-9) on the warmup schedule, masked loss/accuracy, optional XLA.

    Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer. The optimizer's
    variables are created here so a checkpoint can restore them before the first step.
    """
    schedule = WarmupInverseSqrt(model.config.d_model, config.train.warmup_steps)
    optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    model.compile(
        optimizer=optimizer,
        loss=MaskedSparseCrossEntropy(config.train.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=config.train.xla,
    )
    model.optimizer.build(model.trainable_variables)
    return model.optimizer


class RunCheckpoints:
    """Model + optimizer + finished-epoch counter, saved atomically by tf.train.CheckpointManager.

    A save writes new files and then updates the `checkpoint` index, so a crash mid-save
    leaves the previous checkpoint as the latest readable one.
    """

    def __init__(self, directory: Path, model: keras.Model, optimizer, max_to_keep: int = 3):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=max_to_keep)

    def restore_latest(self) -> Optional[str]:
        path = self.manager.latest_checkpoint
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        return path

    def save(self, epoch: int) -> str:
        self.epoch.assign(epoch)
        return self.manager.save()


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves a RunCheckpoints checkpoint at the end of every epoch."""

    def __init__(self, checkpoints: RunCheckpoints):
        super().__init__()
        self.checkpoints = checkpoints

    def on_epoch_end(self, epoch, logs=None):
        path = self.checkpoints.save(epoch + 1)
        log.info("epoch %d: checkpoint %s", epoch + 1, path)


@dataclass
class TrainResult:
    output_dir: Path
    tokenizer_dir: Path
    history: dict
    summary: dict
    model: Transformer


def resolve_model_config(config: RunConfig, tokenizers, output_dir: Path) -> ModelConfig:
    """The architecture: from the run's saved config on resume, else from `config` + vocab sizes."""
    saved = output_dir / CONFIG_FILE
    if config.train.resume and saved.exists():
        model_config = RunConfig.load(saved).model
        if model_config != dataclasses.replace(
            config.model, src_vocab_size=model_config.src_vocab_size, tgt_vocab_size=model_config.tgt_vocab_size
        ):
            log.warning("--resume: using the architecture saved in %s, not the command line's", saved)
        return model_config
    return dataclasses.replace(
        config.model,
        src_vocab_size=int(tokenizers.src.get_vocab_size()),
        tgt_vocab_size=int(tokenizers.tgt.get_vocab_size()),
    )


def run_description(config: RunConfig, device: str = "") -> dict:
    """The `run` section of the step-time report: what this run is, for comparisons."""
    pipeline = config.pipeline
    batching = (f"{pipeline.batch_size} sentences" if pipeline.kind == "naive" or pipeline.max_tokens is None
                else f"{pipeline.max_tokens} tokens/bucket")
    return {
        "label": config.train.label or Path(config.train.output_dir).name,
        "device": device or config.train.device,
        "precision": config.train.mixed_precision,
        "xla": config.train.xla,
        "pipeline": pipeline.kind,
        "batching": batching,
        "dataset": config.data.data_dir or config.data.train_src or config.data.dataset,
        "config": config.to_dict(),
    }


def train(config: RunConfig, extra_callbacks: tuple = ()) -> TrainResult:
    """Runs one training job end to end; see the module docstring for what it writes.

    The step-time report is written when training ends, and also when it dies (exception,
    out of memory, Ctrl-C): `StepTimeReport.guard` records the state and re-raises.
    """
    config.validate()
    output_dir = Path(config.train.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    if not config.train.resume and checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
        raise FileExistsError(
            f"{output_dir} already holds checkpoints; pass --resume to continue that run or choose another --output"
        )
    steps_planned = config.train.epochs * config.train.steps_per_epoch if config.train.steps_per_epoch else None
    report = StepTimeReport(output_dir / "report.json", run=run_description(config), steps_planned=steps_planned)
    with report.guard():
        return _train(config, output_dir, report, extra_callbacks)


def _train(config: RunConfig, output_dir: Path, report: StepTimeReport, extra_callbacks: tuple) -> TrainResult:
    started = time.perf_counter()
    device = select_device(config.train.device)
    policy = set_precision(config.train.mixed_precision, device)
    keras.utils.set_random_seed(config.train.seed)

    corpus = load_corpus(config.data)
    log.info("corpus %s: %s train pairs, %s validation pairs, %d empty pairs dropped",
             corpus.name, corpus.num_train, corpus.num_validation, corpus.dropped_empty)
    tokenizers, tokenizer_dir = build_or_load_tokenizers(corpus, config.tokenizer)
    run_tokenizers = output_dir / "tokenizers"
    if not run_tokenizers.exists():
        shutil.copytree(tokenizer_dir, run_tokenizers)

    model_config = resolve_model_config(config, tokenizers, output_dir)
    config = dataclasses.replace(config, model=model_config)
    config.save(output_dir / CONFIG_FILE)
    report.run.update(run_description(config, device))

    max_length = model_config.max_length
    train_batches = make_batches(corpus.train, tokenizers, config.pipeline, max_length, training=True,
                                 seed=config.train.seed)
    if config.train.steps_per_epoch:
        train_batches = train_batches.repeat()
    val_batches = None
    if corpus.validation is not None:
        val_batches = make_batches(corpus.validation, tokenizers, config.pipeline, max_length, training=False)

    model = build_model(model_config)
    optimizer = compile_model(model, config)
    checkpoints = RunCheckpoints(output_dir / CHECKPOINT_DIR, model, optimizer)
    initial_epoch = 0
    if config.train.resume:
        restored = checkpoints.restore_latest()
        if restored is None:
            log.warning("--resume: no checkpoint in %s; starting from scratch", output_dir / CHECKPOINT_DIR)
        else:
            initial_epoch = int(checkpoints.epoch.numpy())
            log.info("resumed %s at epoch %d, step %d", restored, initial_epoch, int(optimizer.iterations.numpy()))
    log.info("model: %s parameters, policy %s, XLA %s, device %s",
             f"{model.count_params():,}", policy, config.train.xla, device)

    callbacks = [
        BatchTimer(report, dims=TransformerDims.from_config(model_config), probe_peak=config.train.probe_peak),
        EpochCheckpoint(checkpoints),
        keras.callbacks.TensorBoard(log_dir=str(output_dir / "tensorboard"), update_freq=50),
        *extra_callbacks,
    ]
    history = model.fit(
        train_batches,
        epochs=config.train.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=config.train.steps_per_epoch,
        validation_data=val_batches,
        validation_steps=config.train.validation_steps,
        callbacks=callbacks,
        verbose=config.train.verbose,
    ).history

    summary = _summary(history, optimizer, config, time.perf_counter() - started, initial_epoch)
    summary["step_time"] = report.summary()
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return TrainResult(output_dir, run_tokenizers, history, summary, model)


def _summary(history: dict, optimizer, config: RunConfig, wall_s: float, initial_epoch: int) -> dict:
    last = {key: float(values[-1]) for key, values in history.items() if values}
    return {
        "epochs_run": len(history.get("loss", [])),
        "epochs_total": config.train.epochs,
        "initial_epoch": initial_epoch,
        "optimizer_steps": int(optimizer.iterations.numpy()),
        "train_loss": last.get("loss"),
        "train_masked_accuracy": last.get("masked_accuracy"),
        "val_loss": last.get("val_loss"),
        "val_masked_accuracy": last.get("val_masked_accuracy"),
        "wall_time_s": round(wall_s, 1),
    }


def load_trained_model(run_dir: str | Path) -> tuple[Transformer, object, RunConfig]:
    """(model with the latest checkpoint's weights, tokenizers, config) from a run directory."""
    run_dir = Path(run_dir)
    config = RunConfig.load(run_dir / CONFIG_FILE)
    tokenizers = load_tokenizers(run_dir / "tokenizers")
    model = build_model(config.model)
    checkpoint = tf.train.Checkpoint(model=model)
    latest = tf.train.latest_checkpoint(str(run_dir / CHECKPOINT_DIR))
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir / CHECKPOINT_DIR}")
    checkpoint.restore(latest).expect_partial()
    return model, tokenizers, config
