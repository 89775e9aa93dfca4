"""What machine and software a measurement ran on (the step-time report's `environment`)."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from importlib import metadata
from typing import Optional

import numpy as np
import psutil

from transformer.base.allocator import allocator_state
from transformer.runtime.cpu_budget import cpu_budget
from transformer.runtime.onednn import onednn_state
from transformer.runtime.precision import cpu_facts, cpu_id


def _package_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> Optional[str]:
    """`nvidia-smi` output, or None when the binary is absent or fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run([binary], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as err:
        return f"nvidia-smi failed: {err}"
    return done.stdout or done.stderr


def _running_cpu_allocator(tf, predicted: str) -> str:
    """The allocator of this process's CPU device: "bfc" (the caching one keeps statistics), "malloc",
    or "unknown" where TensorFlow cannot say. Before TensorFlow has created its devices (a report
    made before the first op), `predicted`, the one the variable will give it (`allocator_state`):
    asking would create them, and a multi-worker strategy must be configured before that."""
    from tensorflow.python.eager import context  # no public "devices created yet?" check

    if not getattr(context.context(), "_initialized", False):
        return predicted
    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:  # "Allocator stats not available": TensorFlow's default CPU allocator
        return "malloc"
    except Exception:  # noqa: BLE001 - a report must not fail on a TensorFlow that lacks the call
        return "unknown"
    return "bfc"


def capture_environment() -> dict:
    """Versions, device, CPU and host of this process (JSON-ready)."""
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    device = "CPU"
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        device = details.get("device_name", gpus[0].name)
    build = tf.sysconfig.get_build_info()
    allocator = allocator_state()
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "tensorflow_text": _package_version("tensorflow-text"),
        "keras": keras.__version__,
        "numpy": np.__version__,
        "device": device,
        "gpu_count": len(gpus),
        "onednn": onednn_state(),  # TensorFlow's oneDNN ops on/off, and what asked for it
        "cpu_allocator": {**allocator, "running": _running_cpu_allocator(tf, allocator["allocator"])},
        "cuda_build": build.get("cuda_version"),
        "cudnn_build": build.get("cudnn_version"),
        "cpu_model": cpu_facts()[0],
        "cpu_id": cpu_id(),  # x86 family/model/stepping: what tells apart CPUs with one model name
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_count_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_budget": cpu_budget().to_dict(),  # the affinity mask capped by a cgroup CPU quota
        "memory_total_bytes": psutil.virtual_memory().total,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "nvidia_smi": _nvidia_smi(),
    }
