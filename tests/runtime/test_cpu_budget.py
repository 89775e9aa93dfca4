"""The CPU budget: a cgroup CPU quota caps the affinity mask, and training's and tf.data's pools follow it."""

import json
import os
import sys
from pathlib import Path

import pytest
from helpers_cgroup import V2_HOST, child_cgroup, clean_env, fake_cgroup_root, run_in_cgroup

from transformer.base.cgroups import cgroup_dirs, cpu_quota
from transformer.runtime.cpu_budget import CpuBudget, cpu_budget
from transformer.runtime.threads import Threads, training_threads

REPO = Path(__file__).resolve().parents[2]


V1_CONTAINER = "31 23 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
def test_docker_v1_quota_seen_from_inside_the_container(tmp_path):
    """Docker on cgroup v1 bind-mounts the container's own cgroup as the mount's root."""
    root = fake_cgroup_root(tmp_path, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n0::/\n", V1_CONTAINER,
                      {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "250000\n",
                       "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root) == (2.5, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us")


def test_v2_the_tightest_ancestor_wins(tmp_path):
    root = fake_cgroup_root(tmp_path, "0::/kubepods/pod1/ctr\n", V2_HOST,
                      {"sys/fs/cgroup/kubepods/cpu.max": "max 100000\n",
                       "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",
                       "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "400000 100000\n"})
    assert cpu_quota(root) == (1.5, "/sys/fs/cgroup/kubepods/pod1/cpu.max")
    assert [(version, mount.name) for version, mount, _ in cgroup_dirs("cpu", root)] == [("v2", "cgroup")]


@pytest.mark.parametrize("files", [
    {},                                                                     # no cgroup files at all
    {"sys/fs/cgroup/cpu.max": "max 100000\n"},                              # v2 without a limit
    {"sys/fs/cgroup/cpu.max": "garbage\n"},                                 # malformed: no limit, no crash
    {"sys/fs/cgroup/cpu.max": "-5 100000\n"},
])
def test_no_quota(tmp_path, files):
    root = fake_cgroup_root(tmp_path, "0::/\n", V2_HOST, files)
    assert cpu_quota(root) == (None, None)
    assert cpu_budget(root) == CpuBudget(affinity=len(os.sched_getaffinity(0)))


def test_without_proc_the_affinity_mask_alone(tmp_path):
    assert cpu_quota(tmp_path) == (None, None)
    assert cgroup_dirs("cpu", tmp_path) == []


def test_v1_unlimited_quota_is_no_limit(tmp_path):
    root = fake_cgroup_root(tmp_path, "1:cpu:/\n", "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
                      {"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root) == (None, None)


@pytest.mark.parametrize("affinity, quota, cpus, limited", [
    (16, 7.6, 7, True),     # rounded down: one thread more than the quota gets the group throttled
    (2, 0.5, 1, True),      # at least one
    (2, 4.0, 2, False),     # a quota above the mask caps nothing
    (2, None, 2, False),
])
def test_budget_rounds_down(affinity, quota, cpus, limited):
    budget = CpuBudget(affinity, quota, "x" if quota else None)
    assert (budget.cpus, budget.limited) == (cpus, limited)


def test_training_threads_follow_a_capped_budget_only():
    assert training_threads(CpuBudget(16, 2.5, "cpu.max")) == Threads(2, 2)
    assert training_threads(CpuBudget(2, None)) == Threads()   # TensorFlow's defaults
    assert training_threads(CpuBudget(2, 8.0, "cpu.max")) == Threads()


def test_pipeline_options_give_tf_data_a_quota_sized_pool(monkeypatch):
    from transformer.runtime import tfdata

    monkeypatch.setattr(tfdata, "cpu_budget", lambda: CpuBudget(16, 3.0, "cpu.max"))
    assert tfdata.pipeline_options().threading.private_threadpool_size == 3
    monkeypatch.setattr(tfdata, "cpu_budget", lambda: CpuBudget(16))
    assert not tfdata.pipeline_options().threading.private_threadpool_size  # tf.data's own default


def test_probe_counts_others_only_beyond_the_cpus_it_leaves_idle():
    from transformer.runtime.precision import _competing_share

    assert _competing_share(1.0, cpus=2, threads=1) == 0.0    # one busy CPU beside a one-thread probe
    assert _competing_share(1.0, cpus=2, threads=2) == 0.5    # the same beside a two-thread probe
    assert _competing_share(0.0, cpus=2, threads=2) == 0.0


# --- a real cgroup: root with a writable cpu controller (cgroup v1, or v2 where it may be delegated)

@pytest.fixture
def one_cpu_cgroup():
    """A new child of this process's cpu cgroup with a 1-CPU quota; its cgroup.procs file. Skips without one."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to cap")
    yield from child_cgroup("cpu", {"v2": {"cpu.max": "100000 100000"},
                                    "v1": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}})


def test_a_training_in_a_one_cpu_cgroup_sizes_its_pools_to_it(one_cpu_cgroup, bible_tokenizers, tmp_path):
    from conftest import tiny_train_argv

    run = tmp_path / "run"
    result = run_in_cgroup(one_cpu_cgroup, sys.executable, "scripts/train.py",
                           *tiny_train_argv(bible_tokenizers, run, steps=2), cwd=REPO, timeout=300,
                           env=clean_env("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["environment"]["cpu_budget"]["quota"] == 1.0
    assert report["environment"]["cpu_budget"]["cpus"] == 1
    assert report["run"]["threads"] == {"intra_op": 1, "inter_op": 1}
    assert "CPU budget 1 of" in result.stderr + result.stdout


def test_outside_a_quota_training_keeps_tensorflows_pools(tiny_run):
    if cpu_budget().limited:
        pytest.skip("this test process runs under a CPU quota")
    report = json.loads((tiny_run / "report.json").read_text())
    assert report["run"]["threads"] == {"intra_op": 0, "inter_op": 0}
    assert report["environment"]["cpu_budget"] == {"cpus": len(os.sched_getaffinity(0)),
                                                   "affinity": len(os.sched_getaffinity(0)),
                                                   "quota": None, "quota_file": None}
