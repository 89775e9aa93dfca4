"""The run directory: its layout, its checkpoints, and loading a trained model back from it.

A training run directory (`scripts/train.py --output DIR`) holds:
    config.json          the effective RunConfig (model vocab sizes filled in)   CONFIG_FILE
    tokenizers/          a copy of the tokenizer SavedModel used (self-contained)  TOKENIZER_DIR
    checkpoints/         tf.train.CheckpointManager checkpoints (model + optimizer + epoch)
    best/, best.json     the best checkpoint by validation BLEU (weights only)     BEST_DIR, BEST_FILE
    averaged/            the mean of the last N checkpoints (`average_checkpoints`), with averaged.json
    ema/                 the moving average of the weights at the end of training (--ema-decay), with ema.json
    backup/              mid-epoch snapshots (--backup-every-steps), deleted when fit completes
    tensorboard/         Keras TensorBoard logs (+ tensorboard/bleu)
    report.json, report_steps.csv   the step-time report (written even when training dies)
    summary.json         final losses, validation masked accuracy, wall time

Checkpoint averaging: averaging the last few checkpoints of a run (Vaswani et al. 2017
averaged the last 5 or 20) smooths the noise of the final updates; it usually helps most
when the learning rate is still high at the end. `--checkpoint averaged` loads the result.
An exponential moving average kept while training (`--ema-decay`, transformer/model/ema.py)
smooths them over more steps at no extra checkpoints; `--checkpoint ema` loads it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from transformer.base import atomic
from transformer.base.config import ModelConfig, RunConfig
from transformer.base.constants import CHECKPOINT_CHOICES
from transformer.base.errors import ConfigError, MissingFileError
from transformer.data.tokenizer import load_tokenizers
from transformer.inference.translator import DecodeConfig, Translator
from transformer.model.transformer import Transformer
from transformer.runtime import artifacts
from transformer.runtime.faults import check_finite_weights, saving

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizers"
CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
BEST_FILE = "best.json"
AVERAGED_DIR = "averaged"
AVERAGED_FILE = "averaged.json"
EMA_DIR = "ema"
EMA_FILE = "ema.json"  # in EMA_DIR: the optimizer step of the average, its decay and update interval
BACKUP_DIR = "backup"
TENSORBOARD_DIR = "tensorboard"
REPORT_FILE = "report.json"
SUMMARY_FILE = "summary.json"


def build_model(model_config: ModelConfig) -> Transformer:
    """A built (weights created) Transformer for `model_config` under the global dtype policy."""
    model = Transformer.from_model_config(model_config)
    model.build()
    return model


def cast_model(model: Transformer, dtype: str) -> Transformer:
    """A copy of `model` whose weights and compute are `dtype` ("bfloat16", "float32").

    For inference on CPUs with BF16 instructions: every layer holds `dtype` weights and
    computes in it, except what runs in float32 under every policy (layer-norm statistics,
    attention softmax, the output projection: logits stay float32).
    """
    copy = Transformer.from_model_config(model.config, dtype=dtype)
    copy.build()
    pairs = list(zip(copy.weights, model.weights))  # same construction, same order
    if len(copy.weights) != len(model.weights) or any(a.shape != b.shape for a, b in pairs):
        raise ValueError(f"the {dtype} copy of the model has other weights than the model")
    for weight, value in pairs:
        weight.assign(tf.cast(value, weight.dtype))
    return copy


class RunCheckpoints:
    """Model + optimizer + finished-epoch counter, saved atomically by tf.train.CheckpointManager.

    A save writes new files and then updates the `checkpoint` index, so a crash mid-save
    leaves the previous checkpoint as the latest readable one. Checkpoints are written to
    `directory` and restored from `read_directory` (default: the same; a non-chief worker
    writes to its temporary directory and restores from the chief's).
    """

    def __init__(self, directory: Path, model: keras.Model, optimizer, max_to_keep: int = 5,
                 read_directory: Optional[Path] = None, train_elapsed_s: Optional[tf.Variable] = None):
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        extra = {"train_elapsed_s": train_elapsed_s} if train_elapsed_s is not None else {}
        self.model = model
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch, **extra)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=max_to_keep)
        self.read_directory = Path(read_directory if read_directory is not None else directory)

    def restore_latest(self) -> Optional[str]:
        path = tf.train.latest_checkpoint(str(self.read_directory))
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        return path

    def save(self, epoch: int) -> str:
        """Saves (epoch = finished epochs); never non-finite weights; a full disk keeps the previous one."""
        check_finite_weights(self.model, "checkpoint")
        self.epoch.assign(epoch)
        with saving(f"a checkpoint in {self.manager.directory}", lambda: self.manager.latest_checkpoint):
            return self.manager.save()


CHECKPOINT_HINTS = {
    "latest": "train first (scripts/train.py --output <run>); checkpoints are written at every epoch end",
    "best": "best/ is written when training computes validation BLEU (--bleu-sentences > 0)",
    "averaged": "create it with: python scripts/average_checkpoints.py <run>",
    "ema": "ema/ is written at the end of a run trained with --ema-decay D",
}


def checkpoint_path(run_dir: str | Path, which: str = "latest") -> str:
    """Checkpoint prefix of a run: "latest" (checkpoints/), "best" (by validation BLEU, best/),
    "averaged" (scripts/average_checkpoints.py, averaged/), "ema" (the moving average, ema/), or an
    explicit checkpoint prefix."""
    run_dir = Path(run_dir)
    directories = dict(zip(CHECKPOINT_CHOICES, (run_dir / CHECKPOINT_DIR, run_dir / BEST_DIR, run_dir / AVERAGED_DIR,
                                                run_dir / EMA_DIR)))
    if which not in directories:
        if tf.io.gfile.exists(f"{which}.index"):
            return which
        raise ConfigError(f"checkpoint must be one of {CHECKPOINT_CHOICES} or a checkpoint prefix, got {which!r}")
    latest = tf.train.latest_checkpoint(str(directories[which]))
    if latest is None:
        raise MissingFileError(f"no {which} checkpoint in {directories[which]}", hint=CHECKPOINT_HINTS[which])
    return latest


def load_trained_model(run_dir: str | Path, checkpoint: str = "latest") -> tuple[Transformer, object, RunConfig]:
    """(model with the chosen checkpoint's weights, tokenizers, config) from a run directory.

    `checkpoint`: see `checkpoint_path` (latest, best, averaged, ema or a prefix).
    """
    run_dir = Path(run_dir)
    config = artifacts.load_run_config(run_dir)
    path = checkpoint_path(run_dir, checkpoint)
    tokenizers = load_tokenizers(run_dir / TOKENIZER_DIR)
    model = build_model(config.model)
    artifacts.restore_model_weights(model, path, run_dir)
    return model, tokenizers, config


def translator_from_run(run_dir, config: DecodeConfig = DecodeConfig(), checkpoint: str = "latest",
                        dtype: str = "float32") -> Translator:
    """A Translator over a training run directory's checkpoint (latest, best, averaged, ema) and its tokenizers.

    dtype: "bfloat16" decodes with a bfloat16 copy of the weights (`cast_model`).
    """
    model, tokenizers, _ = load_trained_model(run_dir, checkpoint)
    if dtype != "float32":
        model = cast_model(model, dtype)
    return Translator(tokenizers, model, config)


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` looks like a training run directory (it has config.json)."""
    return (Path(path) / CONFIG_FILE).is_file()


# ---------------------------------------------------------------------------- averaging


def run_checkpoints(run_dir: str | Path) -> list[str]:
    """The run's kept checkpoint prefixes (checkpoints/), oldest first."""
    directory = Path(run_dir) / CHECKPOINT_DIR
    state = tf.train.get_checkpoint_state(str(directory))
    if state is None or not state.all_model_checkpoint_paths:
        raise MissingFileError(f"no checkpoints in {directory}",
                               hint="train with --keep-checkpoints N (and --checkpoint-every-steps) to have several")
    return list(state.all_model_checkpoint_paths)


def average_checkpoints(run_dir: str | Path, last: int = 5) -> Path:
    """Averages the model weights of the last `last` checkpoints into `<run>/averaged/`.

    Returns the averaged checkpoint's prefix. Only model weights are averaged (not the
    optimizer); the step counters of the averaged checkpoints are written to `averaged.json`.
    """
    if last < 1:
        raise ConfigError(f"--last must be >= 1, got {last}")
    run_dir = Path(run_dir)
    paths = run_checkpoints(run_dir)[-last:]
    if len(paths) < last:
        log.warning("%s keeps only %d checkpoints: averaging those", run_dir, len(paths))
    model = build_model(artifacts.load_run_config(run_dir).model)
    checkpoint = tf.train.Checkpoint(model=model)
    total = None
    for path in paths:
        checkpoint.restore(path).expect_partial().assert_existing_objects_matched()
        values = [w.numpy().astype(np.float64) for w in model.weights]
        total = values if total is None else [t + v for t, v in zip(total, values)]
    for weight, summed in zip(model.weights, total):
        weight.assign(summed / len(paths))  # cast to the variable's dtype by Keras
    prefix = save_weights(model, run_dir / AVERAGED_DIR, AVERAGED_FILE, {"averaged": paths, "count": len(paths)})
    log.info("averaged %d checkpoints → %s", len(paths), prefix)
    return prefix


def save_weights(model: keras.Model, directory: Path, info_file: str, info: dict) -> Path:
    """Saves `model`'s weights alone as the one checkpoint of `directory` (averaged/, ema/), with `info` as
    `directory/info_file`; returns the prefix. Non-finite weights are refused; a full disk keeps the previous one."""
    check_finite_weights(model, f"{directory.name} checkpoint")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), max_to_keep=1)
    with saving(f"a checkpoint in {directory}", lambda: manager.latest_checkpoint):
        prefix = manager.save()
    atomic.write_json(directory / info_file, info)
    return Path(prefix)
