"""oneDNN's TensorFlow ops (`_Mkl*` kernels) on or off for a process, chosen before TensorFlow loads.

    configure_onednn("off")      # a command, after parsing its flags, before importing TensorFlow
    onednn_state()               # {"enabled": False, "env": "0", "asked": "off"} for reports

TensorFlow's x86 wheel rewrites MatMul, BatchMatMul, layer norm and a few other ops into
oneDNN kernels (`TF_ENABLE_ONEDNN_OPTS`): by default on CPUs with AVX-512 VNNI/BF16 or AMX,
off on others (an AVX2-only AMD EPYC Zen 3 reports it off). The switch is read once, when
TensorFlow starts, so it can only be set before `import tensorflow`. Either way the matrix
products run on oneDNN's GEMM (TensorFlow's Eigen contraction calls it); what the switch
changes is the per-op layer around it, which a decoder step of a few hundred small kernels
pays at every op.

Measured on a 2-core AMD EPYC Zen 3 (avx2, no BF16), 2026-11-26, README's default model,
float32 export, 783 validation sentences in batches of 64: oneDNN forced on decoded 124.0
sentences/s against 136.3 with it off (TensorFlow's default on that CPU); 60-step float32
training, two processes each, 1,895 / 1,753 target tokens/s on against 1,789 / 1,598 off,
inside that machine's spread between processes.
Not measured on BF16 CPUs, where TensorFlow turns it on by default: `--onednn off` on a
float32 export there is the open question (docs/speed.md, "oneDNN's ops"). Hence `default`
(TensorFlow's own choice) stays the default, and `on` / `off` are for measuring.

TensorFlow-free at import (the commands call `configure_onednn` before TensorFlow loads).
"""

from __future__ import annotations

import logging
import os
import sys

from transformer.base.constants import ONEDNN_CHOICES

log = logging.getLogger(__name__)

ENV_VAR = "TF_ENABLE_ONEDNN_OPTS"
_asked: dict = {}


def configure_onednn(choice: str = "default") -> str | None:
    """Sets `TF_ENABLE_ONEDNN_OPTS` for this process from a `--onednn` choice.

    Args:
        choice: "default" (leave TensorFlow's own choice, or the variable the user set), "on"
            or "off".

    Returns:
        The variable's value in effect ("1", "0") or None where TensorFlow decides.

    Raises:
        ValueError: an unknown choice.
    An explicit choice when TensorFlow is already imported cannot be applied: a warning
    says so and the process keeps what it runs with. A user's own variable is overridden by
    an explicit choice (the flag is the later, narrower instruction) and kept by "default".
    """
    if choice not in ONEDNN_CHOICES:
        raise ValueError(f"oneDNN choice must be one of {', '.join(ONEDNN_CHOICES)}, got {choice!r}")
    _asked["choice"] = choice
    if choice == "default":
        return os.environ.get(ENV_VAR)
    value = "1" if choice == "on" else "0"
    if "tensorflow" in sys.modules:
        if onednn_enabled() != (choice == "on"):  # what runs, not the variable (TensorFlow may have decided alone)
            log.warning("--onednn %s not applied: TensorFlow is already loaded in this process "
                        "(set %s=%s before it starts)", choice, ENV_VAR, value)
        return os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = value
    return value


def onednn_enabled() -> bool | None:
    """Whether this process's TensorFlow runs oneDNN's ops (imports TensorFlow); None if unknown."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TensorFlow without the private helper
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def onednn_state() -> dict:
    """For reports: {"enabled": what TensorFlow runs with, "env": the variable or None, "asked": the flag}."""
    return {"enabled": onednn_enabled(), "env": os.environ.get(ENV_VAR), "asked": _asked.get("choice", "default")}
