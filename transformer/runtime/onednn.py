"""oneDNN's TensorFlow ops (`_Mkl*` kernels) on or off for a process, chosen before TensorFlow loads.

    configure_onednn("auto", "float32")   # a command, after parsing its flags, before importing TensorFlow
    onednn_state()      # {"enabled": False, "env": "0", "asked": "auto", "resolved": "off"} for reports

TensorFlow's x86 wheel rewrites MatMul, BatchMatMul, layer norm and a few other ops into
oneDNN kernels (`TF_ENABLE_ONEDNN_OPTS`): by default on CPUs with AVX-512 VNNI/BF16 or AMX,
off on others (an AVX2-only AMD EPYC Zen 3 reports it off). The switch is read once, when
TensorFlow starts, so it can only be set before `import tensorflow`. Either way the matrix
products run on oneDNN's GEMM (TensorFlow's Eigen contraction calls it); what the switch
changes is the per-op layer around it, which a decoder step of a few hundred small kernels
pays at every op.

`auto` (the default) turns them off for a float32 model and leaves TensorFlow's choice for a
bfloat16 one (whose BF16 instructions are reached through oneDNN's kernels). Measured with
float32 exports of README's default model, 783 validation sentences in batches of 64, one process
per setting: a 2-core AMD EPYC Zen 5 (avx512_bf16, where TensorFlow turns them on), 2026-11-27,
319.0 / 343.6 sentences/s on against 465.2 / 442.8 off (two runs; CTranslate2 float32 in the same
processes 416-441); a 2-core AMD EPYC Zen 3 (avx2, where TensorFlow leaves them off),
2026-11-26, 124.0 forced on against 136.3 off. `default`, `on` and `off` are for measuring.

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


def resolve_onednn(choice: str, dtype: str = "float32") -> str:
    """The concrete choice ("default", "on" or "off") for a `--onednn` choice and the model's compute dtype.

    "auto" is "off" for a float32 model and "default" for any other (bfloat16 needs oneDNN's
    kernels for its BF16 instructions); the others are returned as given.

    Raises:
        ValueError: an unknown choice.
    """
    if choice not in ONEDNN_CHOICES:
        raise ValueError(f"oneDNN choice must be one of {', '.join(ONEDNN_CHOICES)}, got {choice!r}")
    if choice != "auto":
        return choice
    return "off" if dtype == "float32" else "default"


def configure_onednn(choice: str = "auto", dtype: str = "float32") -> str | None:
    """Sets `TF_ENABLE_ONEDNN_OPTS` for this process from a `--onednn` choice.

    Args:
        choice: "auto" (off for a float32 model, else "default"), "default" (leave TensorFlow's
            own choice, or the variable the user set), "on" or "off".
        dtype: the compute dtype of the model the process decodes ("float32", "bfloat16").

    Returns:
        The variable's value in effect ("1", "0") or None where TensorFlow decides.

    Raises:
        ValueError: an unknown choice.
    A user's own variable is kept by "auto" and "default", and overridden by "on" / "off" (the
    flag is the later, narrower instruction). An explicit choice when TensorFlow is already
    imported cannot be applied: a warning says so and the process keeps what it runs with
    ("auto" then keeps it silently).
    """
    resolved = resolve_onednn(choice, dtype)
    _asked.update(choice=choice, resolved=resolved)
    if resolved == "default" or (choice == "auto" and ENV_VAR in os.environ):
        return os.environ.get(ENV_VAR)
    value = "1" if resolved == "on" else "0"
    if "tensorflow" in sys.modules:
        if choice != "auto" and onednn_enabled() != (resolved == "on"):  # what runs, not the variable
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
    """For reports: {"enabled": what TensorFlow runs with, "env": the variable or None, "asked": the flag,
    "resolved": what the flag became for the model ("auto" → "off" / "default")}."""
    return {"enabled": onednn_enabled(), "env": os.environ.get(ENV_VAR), "asked": _asked.get("choice", "default"),
            "resolved": _asked.get("resolved", "default")}
