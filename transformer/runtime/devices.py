"""Device selection, precision policy and XLA, with clear errors for what is missing.

Everything here must run before TensorFlow initialises its devices (before the first op).
What cannot run on a CPU-only machine (CUDA) is isolated in `require_gpu`.
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from transformer.base.constants import DEVICES, PRECISION_MODES, one_of
from transformer.base.errors import InputError
from transformer.runtime.precision import POLICIES

log = logging.getLogger(__name__)


class DeviceError(InputError, RuntimeError):
    """The requested device is not available; the message says how to fix the runtime."""

    hint = "--device auto uses a GPU when TensorFlow sees one, else the CPU"


def visible_devices_report() -> str:
    """One line per physical device TensorFlow sees, plus its build flags."""
    devices = tf.config.list_physical_devices()
    lines = [f"  {d.device_type}: {d.name}" for d in devices] or ["  (none)"]
    build = tf.sysconfig.get_build_info()
    lines.append(
        f"  TensorFlow {tf.__version__}, built with CUDA: {tf.test.is_built_with_cuda()} "
        f"(cuda {build.get('cuda_version', '-')}, cudnn {build.get('cudnn_version', '-')})"
    )
    return "\n".join(lines)


def require_gpu() -> list:
    """Returns the visible GPUs or raises DeviceError explaining how to get one."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return gpus
    raise DeviceError(
        "--device gpu was requested but TensorFlow sees no GPU. TensorFlow sees:\n"
        f"{visible_devices_report()}\n"
        "Fix: on Colab, Runtime → Change runtime type → T4 GPU, then restart the session; "
        "on Linux, install the CUDA build: pip install 'tensorflow[and-cuda]==2.21.0' and check "
        "that `nvidia-smi` lists the card; or run with --device cpu."
    )


def select_device(requested: str) -> str:
    """Applies --device {auto,cpu,gpu}; returns "gpu" or "cpu" (what will be used)."""
    if requested == "gpu":
        gpus = require_gpu()
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        return "gpu"
    if requested == "cpu":
        tf.config.set_visible_devices([], "GPU")
        return "cpu"
    if requested != "auto":
        raise ValueError(f"--device must be {one_of(DEVICES)}, got {requested!r}")
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    return "gpu" if gpus else "cpu"


def set_precision(mode: str, device: str) -> str:
    """Sets the Keras global dtype policy from --mixed-precision {off,float16,bfloat16}.

    Returns the policy name. Logits and loss stay float32 in the model whatever the policy.
    """
    policy = POLICIES.get(mode)
    if policy is None:
        raise ValueError(f"--mixed-precision must be {one_of(PRECISION_MODES)}, got {mode!r}")
    if mode == "float16" and device == "cpu":
        log.warning("mixed float16 on CPU runs but is usually slower than float32; bfloat16 suits CPUs")
    if mode == "bfloat16" and device == "gpu":
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        capability = details.get("compute_capability", (0, 0))
        if capability < (8, 0):
            log.warning("GPU compute capability %s has no fast bfloat16 (needs >= 8.0, e.g. A100); "
                        "use --mixed-precision float16 on a T4/V100", capability)
    keras.mixed_precision.set_global_policy(policy)
    return policy
