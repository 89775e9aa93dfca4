"""Device selection and the precision policy, with clear errors for what is missing.

TensorFlow lets a process configure its devices (which GPUs are visible, GPU memory
growth) only until its runtime initialises at the first op; after that a change raises
`RuntimeError`. `select_device` reads TensorFlow's current settings and changes only what
differs, so it can run again in the same process (a second `train()`, a notebook that trains
twice), for the same device or another:

* gpu / auto: memory growth on for every visible GPU. Too late for that (an op already ran):
  the run goes on without it (TensorFlow may reserve most GPU memory), warned once.
* cpu: the GPUs are hidden. Too late for that: the training is placed on the CPU instead
  (`distribute.make_strategy` builds `OneDeviceStrategy("/cpu:0")` while a GPU is visible),
  with a warning saying what TensorFlow allows.
* gpu after cpu hid the GPUs: they are shown again if TensorFlow has not initialised yet,
  else `DeviceError` (restart the process). auto then uses the CPU.

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


_warned: set[str] = set()  # warnings given once per process


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _memory_growth(gpus: list) -> None:
    """Turns on memory growth for `gpus` where it is not on yet and TensorFlow still allows it."""
    for gpu in gpus:
        if tf.config.experimental.get_memory_growth(gpu):
            continue
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # the runtime is initialised: physical devices are fixed
            _warn_once("memory-growth",
                       "GPU memory growth not enabled: TensorFlow initialised the GPU before --device was applied "
                       "(a TensorFlow op ran first), so it may reserve most GPU memory; set "
                       "TF_FORCE_GPU_ALLOW_GROWTH=true before starting Python to enable it anyway")
            return


def _show_gpus(gpus: list) -> None:
    """Makes `gpus` visible again after an earlier --device cpu hid them; DeviceError when too late."""
    try:
        tf.config.set_visible_devices(gpus, "GPU")
    except RuntimeError:
        raise DeviceError(
            "--device gpu: the GPUs were hidden earlier in this process (by --device cpu or "
            "tf.config.set_visible_devices), and TensorFlow cannot show them again once it has initialised. "
            "Fix: restart the process (Colab: Runtime → Restart session) and train on the GPU there, "
            "or run each device in its own process (scripts/benchmark.py does)."
        ) from None


def _hide_gpus() -> None:
    """Hides the GPUs for --device cpu; when too late, warns that the run is placed on the CPU instead."""
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        log.warning(
            "--device cpu: TensorFlow already initialised the GPU in this process (an earlier GPU run or "
            "TensorFlow op) and cannot hide it any more. Training is placed on the CPU instead "
            "(tf.distribute.OneDeviceStrategy('/cpu:0')); work outside the training step, such as validation "
            "BLEU decoding, may still use the GPU. For a CPU-only process, restart it (Colab: Runtime → Restart "
            "session) and train on the CPU first, or start Python with CUDA_VISIBLE_DEVICES=''.")


def select_device(requested: str) -> str:
    """Applies --device {auto,cpu,gpu}; returns "gpu" or "cpu" (what will be used).

    Safe to call again in the same process, for any device (see the module docstring).
    """
    if requested not in DEVICES:
        raise ValueError(f"--device must be {one_of(DEVICES)}, got {requested!r}")
    visible = tf.config.get_visible_devices("GPU")
    if requested == "cpu":
        if visible:
            _hide_gpus()
        return "cpu"
    if requested == "gpu":
        gpus = require_gpu()
        if not visible:
            _show_gpus(gpus)
            visible = gpus
        _memory_growth(visible)
        return "gpu"
    if not visible:  # auto: the GPUs TensorFlow sees now (hidden ones stay hidden)
        if tf.config.list_physical_devices("GPU"):
            log.info("--device auto: the GPUs are hidden in this process (an earlier --device cpu): using the CPU")
        return "cpu"
    _memory_growth(visible)
    return "gpu"


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
