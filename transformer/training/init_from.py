"""Starting a new run from another run's weights (`--init-from RUN`): fine-tuning.

Unlike `--resume`, which continues one run (its optimizer state, step count, schedule and
budget), `--init-from RUN` starts a *new* run in its own `--output`: a fresh optimizer, the
step count from 0, its own learning-rate schedule and time budget. Only the model weights
come from RUN (`--init-checkpoint`: latest by default, or best, averaged, ema, a prefix), and with
them what those weights need: RUN's architecture and tokenizers (copied into the new run, so
it is self-contained). The new run's config.json records where it started:
`train.init_from`, `train.init_checkpoint` and `train.init_from_step` (RUN's optimizer step
at those weights; None when the checkpoint does not hold it, e.g. `averaged`).

The command line's contradicting flags are refused before this module runs
(`transformer/base/cli.py` `apply_init_from`); here a Python caller's config is checked against RUN too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tensorflow as tf

from transformer.base.config import FINE_TUNE_MODEL_FIELDS, ModelConfig, RunConfig
from transformer.base.errors import ArtifactError, ConfigError, InputError
from transformer.inference.rundir import BEST_DIR, BEST_FILE, EMA_DIR, EMA_FILE, TOKENIZER_DIR, build_model, checkpoint_path
from transformer.runtime import artifacts

ITERATIONS_KEY = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"  # RunCheckpoints' optimizer step
# weights-only checkpoints whose step a JSON file records: --init-checkpoint → (their directory, that file), in RUN
STEP_FILES = {"best": (BEST_DIR, BEST_FILE), "ema": (EMA_DIR, f"{EMA_DIR}/{EMA_FILE}")}


@dataclass(frozen=True)
class InitSource:
    """The weights a run starts from.

    run_dir: RUN. prefix: the checkpoint prefix loaded. step: RUN's optimizer step at those
    weights (None if unknown). config: RUN's config.json. tokenizer_dir: RUN/tokenizers.
    """

    run_dir: Path
    prefix: str
    step: Optional[int]
    config: RunConfig
    tokenizer_dir: Path

    def load_weights(self, model) -> None:
        """Assigns the checkpoint's model weights to `model` (built, RUN's architecture); nothing else.

        The checkpoint is read into a throwaway model whose values are then copied: a restore into
        `model` itself would stay pending for its optimizer (RUN's checkpoint reaches the optimizer
        from the model too) and hand RUN's step count and Adam moments to the new run's optimizer.
        """
        source = build_model(self.config.model)
        try:
            artifacts.restore_model_weights(source, self.prefix, self.run_dir)
        except ArtifactError as err:
            raise ArtifactError(f"--init-from {self.run_dir}: {err}", hint=err.hint) from err
        if [w.shape for w in source.weights] != [w.shape for w in model.weights]:
            raise ConfigError(f"--init-from {self.run_dir}: the model has other weights than the run's")
        for weight, value in zip(model.weights, source.weights):  # same construction, same order
            weight.assign(tf.cast(value, weight.dtype))

    def check_model(self, model_config: ModelConfig) -> None:
        """ConfigError when `model_config` is not RUN's architecture (the dropout rates may differ)."""
        ours = dataclasses.replace(model_config, **{k: getattr(self.config.model, k) for k in FINE_TUNE_MODEL_FIELDS})
        if ours != self.config.model:
            differ = [f"model.{f.name} {getattr(ours, f.name)!r} (the run has {getattr(self.config.model, f.name)!r})"
                      for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(self.config.model, f.name)]
            raise ConfigError(f"--init-from {self.run_dir}: the config's architecture is not the run's: "
                              + "; ".join(differ), hint="leave the architecture to the run the weights come from")

    def record(self, config: RunConfig) -> RunConfig:
        """`config` with the start recorded in `train` (saved with the new run's config.json)."""
        return config.replace(train={"init_from": str(self.run_dir), "init_from_step": self.step})


def open_init_source(config: RunConfig) -> Optional[InitSource]:
    """The weights `config.train.init_from` names, checked before training starts; None without it.

    Raises InputError (`error: --init-from RUN: …`) for a missing or damaged run, checkpoint or tokenizers.
    """
    run = config.train.init_from
    if not run:
        return None
    run_dir = Path(run)
    try:
        saved = artifacts.load_run_config(run_dir)
        prefix = checkpoint_path(run_dir, config.train.init_checkpoint)
        artifacts.check_checkpoint(prefix)
    except InputError as err:
        raise type(err)(f"--init-from {run}: {err}", hint=err.hint) from err
    tokenizer_dir = run_dir / TOKENIZER_DIR
    if not tokenizer_dir.is_dir():
        raise ArtifactError(f"--init-from {run}: no tokenizers/ in the run directory",
                            hint="a run directory holds a copy of its tokenizers; restore it from a copy")
    return InitSource(run_dir, prefix, _checkpoint_step(prefix, run_dir, config.train.init_checkpoint), saved,
                      tokenizer_dir)


def _checkpoint_step(prefix: str, run_dir: Path, which: str) -> Optional[int]:
    """RUN's optimizer step at `prefix`: read from the checkpoint, or from best.json for best/ and
    ema/ema.json for ema/ (weights only)."""
    reader = tf.train.load_checkpoint(prefix)
    if reader.has_tensor(ITERATIONS_KEY):
        return int(reader.get_tensor(ITERATIONS_KEY))
    directory, info = STEP_FILES.get(which, (None, None))
    if directory is None or Path(prefix).parent != run_dir / directory or not (run_dir / info).is_file():
        return None
    try:
        return int(json.loads((run_dir / info).read_text())["step"])
    except (ValueError, KeyError, TypeError):
        return None
