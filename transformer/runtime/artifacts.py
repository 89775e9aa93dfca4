"""Checks of saved artifacts before use: run directories, checkpoints, SavedModels.

Every failure is an `ArtifactError` (or the caller's subclass) naming the file that is
missing or damaged, with a hint giving the command that rebuilds it:

    config.json / checkpoints/   re-train: python scripts/train.py ... --output <run>
    tokenizers/                  python scripts/build_tokenizers.py --data <corpus>
    an export                    python scripts/export.py --run <run> --output <dir> --overwrite

TensorFlow reports a damaged SavedModel as e.g. "Cannot parse file ... Wire format was
corrupt" and a damaged checkpoint as a DataLossError; both become one `error:` line here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from transformer.base.errors import ArtifactError

TRAIN_HINT = "re-run scripts/train.py with --output {run} (add --resume if its checkpoints are intact)"
EXPORT_HINT = "re-export it: python scripts/export.py --run <run dir> --output {path} --overwrite"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[-1] if text else type(err).__name__)[:300]


def load_saved_model(directory: str | Path, what: str, hint: str, error: type = ArtifactError):
    """`tf.saved_model.load(directory)`, or `error` naming saved_model.pb / variables/ and `hint`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the ops a tokenizer/export SavedModel uses)

    directory = Path(directory)
    graph = directory / "saved_model.pb"
    if not graph.is_file():
        raise error(f"{what} is incomplete: {graph} is missing", hint=hint)
    if not (directory / "variables").is_dir():
        raise error(f"{what} is incomplete: {directory / 'variables'} is missing", hint=hint)
    try:
        return tf.saved_model.load(str(directory))
    except Exception as err:  # noqa: BLE001 - TF raises parse, data-loss, not-found and op errors
        damaged = graph if "parse" in str(err).lower() or "wire format" in str(err).lower() else directory
        raise error(f"{what} is damaged: {damaged} cannot be loaded ({_first_line(err)})", hint=hint) from err


def load_run_config(run_dir: str | Path):
    """The RunConfig in `run_dir`/config.json, or ArtifactError naming it."""
    from transformer.base.config import RunConfig

    path = Path(run_dir) / "config.json"
    if not Path(run_dir).is_dir():
        raise ArtifactError(f"run directory not found: {run_dir}",
                            hint="--model takes a training run's --output directory or an export")
    try:
        return RunConfig.load(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ArtifactError(f"{path} is missing or damaged: {err}",
                            hint=TRAIN_HINT.format(run=run_dir)) from err


def check_checkpoint(prefix: str) -> None:
    """Reads a checkpoint's index; ArtifactError naming the damaged checkpoint."""
    import tensorflow as tf

    try:
        tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    except Exception as err:  # noqa: BLE001 - DataLossError, NotFoundError, OpError
        raise ArtifactError(
            f"checkpoint {prefix} is damaged ({_first_line(err)})",
            hint="restore it from a copy, choose another with --checkpoint (latest, best, averaged, ema or a "
                 "prefix), or delete it and update the `checkpoint` index file beside it",
        ) from err


def restore_model_weights(model, prefix: str, run_dir: Optional[str | Path] = None) -> None:
    """Restores `model` from checkpoint `prefix`; a mismatch with config.json or damage is an ArtifactError."""
    import tensorflow as tf

    check_checkpoint(prefix)
    try:
        tf.train.Checkpoint(model=model).restore(prefix).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError) as err:  # shapes or variables that are not this config's model
        where = f" ({Path(run_dir) / 'config.json'})" if run_dir is not None else ""
        raise ArtifactError(
            f"checkpoint {prefix} does not match the model of its config{where}: {_first_line(err)}",
            hint="config.json and checkpoints/ must come from the same run; restore the run's own config.json",
        ) from err
    except Exception as err:  # noqa: BLE001 - a truncated/corrupt .data file: OpError, IndexError, ...
        raise ArtifactError(f"checkpoint {prefix} is damaged ({type(err).__name__}: {_first_line(err)})",
                            hint="choose another with --checkpoint, or restore the file from a copy") from err
