"""TensorFlow's caching CPU allocator: asked for by the training commands before TensorFlow starts, a user's choice kept."""

import json
import os
import subprocess
import sys

import pytest
from helpers_cgroup import V2_HOST, child_cgroup, clean_env, fake_cgroup_root, run_in_cgroup

from transformer.base import allocator

# A training command's start, then TensorFlow: which allocator did its CPU device get? Only the
# BFC allocator keeps statistics (`get_memory_info` raises for malloc).
PROCESS = """
import json
from transformer.base import cli
from transformer.base.allocator import allocator_state, use_caching_allocator
cli.start()
use_caching_allocator()
import tensorflow as tf
with tf.device("CPU:0"):  # on a GPU machine ops run on the GPU by default
    x = tf.ones([256, 256]) * 2.0
try:
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
except ValueError:
    peak = None
print(json.dumps({"peak": peak, "state": allocator_state()}))
"""


def _in_new_process(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (allocator.USE_BFC_VAR, allocator.LIMIT_VAR)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    # oneDNN's ops off: with them on (TensorFlow's default on CPUs with AVX512, e.g. an EPYC Zen 5) the CPU
    # device's allocator is oneDNN's, which pools large blocks and keeps statistics whatever the variable says
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    if env_value is not None:
        env[allocator.USE_BFC_VAR] = env_value
    out = subprocess.run([sys.executable, "-c", PROCESS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_training_runs_tensorflow_on_the_caching_allocator():
    result = _in_new_process(None)
    assert result["peak"] is not None and result["peak"] >= 256 * 256 * 4  # the BFC allocator counted the tensor
    assert result["state"]["allocator"] == "bfc" and result["state"]["env"] == "true"
    assert result["state"]["limit_mb"] == allocator.memory_budget_mb()[0]


def test_a_users_false_keeps_malloc():
    result = _in_new_process("false")
    assert result["peak"] is None  # malloc keeps no statistics
    assert result["state"] == {"allocator": "malloc", "env": "false", "limit_mb": None, "limit_from": None}


@pytest.mark.parametrize("given, expected", [(None, True), ("true", True), ("1", True), ("TRUE", True),
                                             ("false", False), ("0", False)])
def test_the_variable_is_read_as_tensorflow_reads_it(given, expected):
    environ = {} if given is None else {allocator.USE_BFC_VAR: given}
    assert allocator.use_caching_allocator(environ) is expected
    assert (allocator.LIMIT_VAR in environ) is (expected and allocator.memory_budget_mb()[0] is not None)
    assert allocator.allocator_state(environ)["allocator"] == ("bfc" if expected else "malloc")


def test_a_users_limit_is_kept():
    environ = {allocator.LIMIT_VAR: "512"}
    assert allocator.use_caching_allocator(environ)
    assert environ[allocator.LIMIT_VAR] == "512"
    assert allocator.allocator_state(environ) == {"allocator": "bfc", "env": "true", "limit_mb": 512,
                                                  "limit_from": allocator.LIMIT_VAR}


def test_a_containers_memory_limit_caps_the_allocator_with_headroom(tmp_path, monkeypatch):
    """A 3 GiB container: the cap leaves a quarter (at most 1 GiB) for the rest of the process."""
    monkeypatch.setattr(allocator, "physical_memory_mb", lambda: 24 * 1024)
    root = fake_cgroup_root(tmp_path, "0::/\n", V2_HOST, {"sys/fs/cgroup/memory.max": str(3 << 30)})
    cap, reason = allocator.memory_budget_mb(root)
    assert cap == 3072 - 768 and "3,072 MiB of /sys/fs/cgroup/memory.max" in reason
    root = fake_cgroup_root(tmp_path / "big", "0::/\n", V2_HOST, {"sys/fs/cgroup/memory.max": str(16 << 30)})
    assert allocator.memory_budget_mb(root)[0] == 16 * 1024 - 1024           # headroom at most 1 GiB
    root = fake_cgroup_root(tmp_path / "above", "0::/\n", V2_HOST, {"sys/fs/cgroup/memory.max": str(64 << 30)})
    assert allocator.memory_budget_mb(root) == (24 * 1024, "physical memory")  # a limit above the machine


@pytest.mark.parametrize("text", ["max\n", "9223372036854771712\n", "garbage\n"])
def test_no_memory_limit_leaves_physical_memory(tmp_path, monkeypatch, text):
    monkeypatch.setattr(allocator, "physical_memory_mb", lambda: 2048)
    v1 = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    root = fake_cgroup_root(tmp_path, "4:memory:/\n", v1, {"sys/fs/cgroup/memory/memory.limit_in_bytes": text})
    assert allocator.memory_budget_mb(root) == (2048, "physical memory")


# A real container limit: root with a writable memory controller (cgroup v1, or a delegated v2 subtree).
TOO_BIG = """
import json
from transformer.base.allocator import allocator_state, use_caching_allocator
use_caching_allocator()
import tensorflow as tf
try:
    with tf.device("CPU:0"):
        x = tf.zeros([2 << 30 >> 2])  # 2 GiB of float32, above the 1.5 GiB limit
        tf.reduce_sum(x).numpy()
    outcome = "allocated"
except tf.errors.ResourceExhaustedError:
    outcome = "ResourceExhaustedError"
print(json.dumps({"outcome": outcome, "state": allocator_state()}))
"""


@pytest.fixture
def memory_cgroup_1536m():
    """A new child of this process's memory cgroup limited to 1.5 GiB; its cgroup.procs file. Skips without one."""
    limit = str(1536 << 20)
    yield from child_cgroup("memory", {"v2": {"memory.max": limit}, "v1": {"memory.limit_in_bytes": limit}})


def test_in_a_memory_limited_cgroup_tensorflow_raises_instead_of_being_killed(memory_cgroup_1536m):
    """Without the cap TensorFlow would take the 2 GiB from the machine and the kernel would kill it (exit -9)."""
    env = {**clean_env(allocator.USE_BFC_VAR, allocator.LIMIT_VAR), "TF_ENABLE_ONEDNN_OPTS": "0"}
    out = run_in_cgroup(memory_cgroup_1536m, sys.executable, "-c", TOO_BIG, env=env, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "ResourceExhaustedError"
    assert result["state"]["limit_mb"] == 1536 - 384 and "cgroup memory limit 1,536 MiB" in result["state"]["limit_from"]
