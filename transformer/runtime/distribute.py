"""Distribution strategies: which one, how many replicas, who is chief, how input is split.

`--strategy` chooses a `tf.distribute.Strategy`:
    auto          multi-worker when TF_CONFIG describes a cluster of more than one task,
                  mirrored when more than one GPU is visible, else TensorFlow's default
                  strategy (no distribution: exactly the single-device code path)
    one-device    `OneDeviceStrategy` on GPU:0 (or CPU:0)
    mirrored      `MirroredStrategy` over every local GPU (every logical CPU device when
                  there is no GPU; one CPU replica unless logical devices were configured)
    multi-worker  `MultiWorkerMirroredStrategy`, cluster and role read from TF_CONFIG
    tpu           `TPUStrategy` (`tpu_strategy`; untested here: no TPU on this machine)

Batches. `--max-tokens` / `--batch-size` are *per replica*; the input pipeline builds
*global* batches of `replicas` times that many sentences (`make_batches(..., replicas=n)`)
and Keras (`TFEpochIterator` → `strategy.experimental_distribute_dataset`) splits every
global batch into `replicas` equal parts. The input's auto-shard policy is set explicitly
(`shard_input`): DATA, i.e. every worker runs the whole pipeline with the same seed and
keeps its own replicas' parts of each global batch (our corpora are one or two files, so
FILE sharding does not apply). The loss is normalised by the *global* count of non-pad
target tokens (`transformer.model.losses.MaskedSparseCrossEntropy` all-reduces the count), so a
step's gradient is the same as one device computing the whole global batch.

Roles. In multi-worker training every worker runs the same script; the chief (task
"chief", or "worker" 0 when the cluster has no chief) writes the run directory. Other
workers must still take part in every save (checkpoints may involve collectives), so
they write into a private temporary directory that is deleted afterwards (`TaskRole`).
Everything here that only parses TF_CONFIG runs before TensorFlow initialises;
`make_strategy` must be called before the first TensorFlow op (MultiWorkerMirroredStrategy
configures the collective runtime at start-up).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import tensorflow as tf

from transformer.base.constants import STRATEGIES
from transformer.base.errors import InputError
from transformer.runtime.tfdata import with_pipeline_options

log = logging.getLogger(__name__)

DEFAULT = "default"  # what "auto" resolves to on one device: TensorFlow's default strategy


class DistributeError(InputError, RuntimeError):
    """A strategy cannot be set up here; the message says what is missing and how to fix it."""

    hint = "fix TF_CONFIG (docs/devices.md) or unset it to train on one machine"


# ---------------------------------------------------------------------------- TF_CONFIG


def read_tf_config(environ: Optional[dict] = None) -> dict:
    """The parsed TF_CONFIG environment variable ({} when unset or empty)."""
    text = (environ if environ is not None else os.environ).get("TF_CONFIG", "")
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise DistributeError(f"TF_CONFIG is not valid JSON ({err}): {text[:200]!r}") from None
    if not isinstance(value, dict) or not isinstance(value.get("cluster", {}), dict):
        raise DistributeError(f"TF_CONFIG must be an object with a 'cluster' mapping, got {text[:200]!r}")
    return value


def cluster_workers(tf_config: dict) -> int:
    """Number of training tasks (chief + workers) in TF_CONFIG's cluster."""
    cluster = tf_config.get("cluster", {})
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


@dataclasses.dataclass(frozen=True)
class TaskRole:
    """This process's place in the cluster.

    Attributes:
        task_type: str. "chief", "worker", ... ("chief" outside multi-worker training).
        task_id: int. Index within `task_type`.
        is_chief: bool. Writes the run directory (checkpoints, reports, summaries).
    """

    task_type: str = "chief"
    task_id: int = 0
    is_chief: bool = True

    def write_dir(self, run_dir: Path) -> Path:
        """Where this task writes: `run_dir` for the chief, a fresh temp directory otherwise."""
        if self.is_chief:
            return run_dir
        return Path(tempfile.mkdtemp(prefix=f"{run_dir.name}-{self.task_type}{self.task_id}-"))

    def cleanup(self, write_dir: Path, run_dir: Path) -> None:
        """Deletes a non-chief's temporary `write_dir` (never the run directory)."""
        if not self.is_chief and Path(write_dir) != Path(run_dir):
            shutil.rmtree(write_dir, ignore_errors=True)


def task_role(strategy_name: str, tf_config: Optional[dict] = None) -> TaskRole:
    """The role TF_CONFIG gives this process under `strategy_name` (a resolved name)."""
    if strategy_name != "multi-worker":
        return TaskRole()
    tf_config = read_tf_config() if tf_config is None else tf_config
    task = tf_config.get("task", {})
    task_type, task_id = task.get("type", "chief"), int(task.get("index", 0))
    has_chief = bool(tf_config.get("cluster", {}).get("chief"))
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
    return TaskRole(task_type, task_id, is_chief)


# ---------------------------------------------------------------------------- strategies


def resolve_strategy_name(requested: str, tf_config: Optional[dict] = None) -> str:
    """Maps `--strategy` to a concrete name without initialising TensorFlow's runtime."""
    if requested not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {requested!r}")
    if requested != "auto":
        return requested
    tf_config = read_tf_config() if tf_config is None else tf_config
    if cluster_workers(tf_config) > 1:
        return "multi-worker"
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return "mirrored"
    return DEFAULT


def local_devices(device: str) -> list[str]:
    """Names of the local devices a MirroredStrategy should use: GPUs, else logical CPUs."""
    gpus = tf.config.list_logical_devices("GPU") if device != "cpu" else []
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]


def make_strategy(name: str, device: str) -> tf.distribute.Strategy:
    """Builds the strategy `name` (resolved, see `resolve_strategy_name`) for `device` ("gpu"/"cpu").

    The default strategy for "cpu" while a GPU is still visible (TensorFlow had initialised it
    before --device cpu could hide it, see `devices.select_device`) is `OneDeviceStrategy`
    on the CPU: the model, optimizer and every train/evaluation step are placed there.
    """
    if name == DEFAULT:
        if device == "cpu" and tf.config.get_visible_devices("GPU"):
            return tf.distribute.OneDeviceStrategy("/cpu:0")
        return tf.distribute.get_strategy()
    if name == "one-device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if device == "gpu" else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(local_devices(device))
    if name == "multi-worker":
        if cluster_workers(read_tf_config()) <= 1:
            log.warning("--strategy multi-worker without a multi-task TF_CONFIG: training on this worker only")
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        return tpu_strategy()
    raise ValueError(f"unknown strategy {name!r}; expected one of {STRATEGIES}")


def tpu_strategy(tpu: Optional[str] = None) -> tf.distribute.Strategy:
    """Connects to a TPU (address from `tpu`, else $TPU_NAME, else "local") → TPUStrategy.

    Untested here (no TPU on this machine). Raises DistributeError when none is reachable.
    """
    address = tpu if tpu is not None else os.environ.get("TPU_NAME", "local")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise DistributeError(
            f"--strategy tpu: no TPU reachable at {address!r} ({err}). On a Cloud TPU VM use "
            "TPU_NAME=local; on Colab pick a TPU runtime; otherwise use --strategy mirrored or auto."
        ) from err
    return tf.distribute.TPUStrategy(resolver)


def describe(strategy: tf.distribute.Strategy, name: str, role: TaskRole) -> dict:
    """The report's `distribution` section: strategy, replicas, workers, this task's role."""
    workers = cluster_workers(read_tf_config()) if name == "multi-worker" else 1
    return {
        "strategy": name,
        "class": type(strategy).__name__,
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": max(workers, 1),
        "task": f"{role.task_type}:{role.task_id}",
        "is_chief": role.is_chief,
    }


# ---------------------------------------------------------------------------- input


def shard_input(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Sets the auto-shard policy explicitly to DATA (see the module docstring)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def tpu_batches(tokenized: tf.data.Dataset, batch_size: int, max_length: int, training: bool,
                shuffle_buffer: int = 20000, seed: Optional[int] = None) -> tf.data.Dataset:
    """Static-shape batches for TPUs: every batch `[batch_size, max_length]`, remainder dropped.

    `tokenized` is `pipeline.tokenize_pairs(...)` (tokenization runs on the host, inside
    tf.data). XLA on TPU compiles one program per shape, so padding is fixed at
    `max_length` (targets at `max_length + 1` before the in/out split) and partial batches
    are dropped, also for validation. `batch_size` is the global batch (sentences).
    """
    if training:
        tokenized = tokenized.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    batched = tokenized.padded_batch(batch_size, padded_shapes=([max_length], [max_length + 1]),
                                     drop_remainder=True)

    def split(src, tgt):  # [B, L], [B, L + 1] → ((src, tgt_in), tgt_out), all [B, L]
        return (src, tgt[:, :-1]), tgt[:, 1:]

    return with_pipeline_options(batched.map(split, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))


# ---------------------------------------------------------------------------- Keras workarounds


def patch_keras_for_multi_worker(model, strategy: tf.distribute.Strategy) -> None:
    """Lets `model.fit`/`evaluate` run under MultiWorkerMirroredStrategy (Keras 3.15).

    Keras 3.15's TF trainer (keras/src/backend/tensorflow/trainer.py) fails twice under
    MultiWorkerMirroredStrategy (keras-team/keras#20585), and this patches *this model
    instance* around both; other strategies keep Keras' own code:

    1. `TensorFlowTrainer._maybe_symbolic_build` takes the first distributed batch and calls
       `strategy.reduce("MEAN", batch, axis=None)` on the whole nested
       `((src, tgt_in), tgt_out)` structure only to get shapes; the collective cross-device
       ops reject a nested structure ("Attempt to convert a value (PerReplica...) to a
       Tensor"). Replaced by the same steps on this worker's first replica's part.
    2. `reduce_per_replica(..., reduction="auto")` reduces every step output with
       `strategy.reduce("MEAN", v, axis=0)` in multi-worker mode, which fails on scalar
       logs ("Invalid reduction dimension 0 for input with 0 dimensions"). `train_step` /
       `test_step` are wrapped to return scalar logs as shape [1], so that reduction is a
       mean over replicas; the logs `fit` sees are scalars again. (Epoch logs are read from
       the metrics' aggregated variables, as under every strategy.)
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = strategy.experimental_local_results(next(batches))[0]
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    def vector_logs(step):
        def step_with_vector_logs(data):
            logs = step(data)
            return {name: tf.reshape(value, [1]) if tf.is_tensor(value) and value.shape.rank == 0 else value
                    for name, value in logs.items()}

        return step_with_vector_logs

    model._maybe_symbolic_build = maybe_symbolic_build
    model.train_step = vector_logs(model.train_step)
    model.test_step = vector_logs(model.test_step)
