"""TensorFlow's thread pools for decoding: the rule, and setting them once per process."""

import os
import subprocess
import sys

import pytest

from transformer.runtime.threads import Threads, decoding_threads


@pytest.mark.parametrize("streams, cores, expected", [
    (1, 2, Threads()),               # one loop: TensorFlow's defaults, its big ops split over the cores
    (2, 2, Threads(1, 2)),
    (3, 2, Threads(1, 3)),           # more loops than cores: kernels inline, one thread per loop
    (3, 16, Threads(5, 3)),          # many cores: shared among the loops
])
def test_decoding_threads_rule(streams, cores, expected):
    assert decoding_threads(streams, cores) == expected


def test_flags_replace_the_rule():
    assert decoding_threads(3, 2, intra_op=2) == Threads(2, 3)
    assert decoding_threads(3, 2, intra_op=0, inter_op=0) == Threads(0, 0)  # 0: TensorFlow's own default
    assert decoding_threads(1, 2, inter_op=4) == Threads(0, 4)


PROCESS = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
import tensorflow as tf
from transformer.runtime.threads import Threads, configure_threads, current_threads
print("set", configure_threads(Threads(1, 3)))
tf.constant(1.0) + 1.0  # the runtime starts: the pools are fixed from here
print("again", configure_threads(Threads(2, 2)))
print("now", current_threads())
"""


def _run(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", **env_extra})
    out = subprocess.run([sys.executable, "-c", PROCESS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_configure_threads_sets_once_then_keeps_what_runs():
    out = _run({})
    assert "set Threads(intra_op=1, inter_op=3)" in out
    assert "already started (intra-op 1, inter-op 3); intra-op 2, inter-op 2 not applied" in out
    assert "again Threads(intra_op=1, inter_op=3)" in out and "now Threads(intra_op=1, inter_op=3)" in out


def test_environment_variable_wins():
    out = _run({"TF_NUM_INTRAOP_THREADS": "2"})
    assert "set Threads(intra_op=2, inter_op=3)" in out
