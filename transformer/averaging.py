"""Checkpoint averaging: the mean of the model weights of a run's last N checkpoints.

Averaging the last few checkpoints of a run (Vaswani et al. 2017 averaged the last 5 or 20)
smooths the noise of the final updates; it usually helps most when the learning rate is
still high at the end. The result is written as `<run>/averaged/` (weights only) and is
loaded like any other checkpoint: `--checkpoint averaged` in scripts/evaluate.py,
translate.py and export.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import tensorflow as tf

from transformer.config import RunConfig

log = logging.getLogger(__name__)

AVERAGED_DIR = "averaged"


def run_checkpoints(run_dir: str | Path) -> list[str]:
    """The run's kept checkpoint prefixes (checkpoints/), oldest first."""
    from transformer.training import CHECKPOINT_DIR

    directory = Path(run_dir) / CHECKPOINT_DIR
    state = tf.train.get_checkpoint_state(str(directory))
    if state is None or not state.all_model_checkpoint_paths:
        raise FileNotFoundError(f"no checkpoints in {directory}")
    return list(state.all_model_checkpoint_paths)


def average_checkpoints(run_dir: str | Path, last: int = 5) -> Path:
    """Averages the model weights of the last `last` checkpoints into `<run>/averaged/`.

    Returns the averaged checkpoint's prefix. Only model weights are averaged (not the
    optimizer); the step counters of the averaged checkpoints are written to `averaged.json`.
    """
    from transformer.training import CONFIG_FILE, build_model

    if last < 1:
        raise ValueError(f"--last must be >= 1, got {last}")
    run_dir = Path(run_dir)
    paths = run_checkpoints(run_dir)[-last:]
    if len(paths) < last:
        log.warning("%s keeps only %d checkpoints: averaging those", run_dir, len(paths))
    model = build_model(RunConfig.load(run_dir / CONFIG_FILE).model)
    checkpoint = tf.train.Checkpoint(model=model)
    total = None
    for path in paths:
        checkpoint.restore(path).expect_partial().assert_existing_objects_matched()
        values = [w.numpy().astype(np.float64) for w in model.weights]
        total = values if total is None else [t + v for t, v in zip(total, values)]
    for weight, summed in zip(model.weights, total):
        weight.assign(summed / len(paths))  # cast to the variable's dtype by Keras
    out_dir = run_dir / AVERAGED_DIR
    manager = tf.train.CheckpointManager(checkpoint, str(out_dir), max_to_keep=1)
    prefix = manager.save()
    (out_dir / "averaged.json").write_text(json.dumps({"averaged": paths, "count": len(paths)}, indent=2) + "\n")
    log.info("averaged %d checkpoints → %s", len(paths), prefix)
    return Path(prefix)
