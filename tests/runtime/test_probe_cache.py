"""The bf16 probe's verdict is cached only when it was taken idle: busy rules (CPU share, other
processes' share of the CPUs, else the load at start and end), a busy probe taken again (the
first idle one, else the least starved, decides), re-probing busy or incomplete cache entries,
and the reason line that says which verdict was used. Probe results are injected, as in
tests/runtime/test_precision.py."""

import calendar
import dataclasses
import json
import os
import time

import pytest

from transformer.runtime import precision
from transformer.runtime.precision import DeviceFacts, ProbeResult, decide_precision

XEON = DeviceFacts("cpu", "Intel Xeon (avx512_bf16, no AMX)", ("avx512_bf16", "avx512f"))


def result(float32: float, bfloat16: float, cpu_share=0.95, load=0.2, load_end=0.3, cpus=2,
           taken_at="2026-01-02T03:04:05Z", others_share=None) -> ProbeResult:
    return ProbeResult(float32, bfloat16, 1024, 0.5, load, cpus, load_end, cpu_share, taken_at, others_share)


IDLE_XEON = result(252.0, 158.0)  # 0.63×: float32
STARVED_XEON = result(118.0, 158.0, cpu_share=0.50)  # 1.34×, the load average did not show it
FLATTERED = result(100.0, 170.0, cpu_share=0.45)  # a busy probe that would pick bfloat16


@pytest.fixture(autouse=True)
def unpinned(monkeypatch, tmp_path):
    """No pin (conftest pins auto to float32 for other tests) and a private probe cache."""
    monkeypatch.delenv(precision.PIN_ENV, raising=False)
    monkeypatch.setenv(precision.CACHE_ENV, str(tmp_path / "precision.json"))


def probes(*results):
    """A probe returning `results` in turn; `.calls` counts them."""
    queue = list(results)

    def probe():
        probe.calls += 1
        return queue.pop(0)

    probe.calls = 0
    return probe


def no_probe():
    raise AssertionError("the probe must not run here")


@pytest.mark.parametrize("share, load, load_end, busy", [
    (0.95, 0.2, 0.3, False),  # idle
    (0.50, 0.3, 0.3, True),  # starved while the lagging load average still looked idle
    (0.95, 1.6, 0.3, True),  # load above cpus - 0.5 at the start
    (0.95, 0.3, 1.6, True),  # ... or at the end
    (0.95, 1.4, 1.4, False),  # below cpus - 0.5 at both ends
    (0.79, None, None, True),  # no load average (an OS without one): the share alone
])
def test_busy_from_cpu_share_and_load_at_both_ends(share, load, load_end, busy):
    """Where the other processes' share was not measured (no /proc/stat)."""
    probe = result(250.0, 700.0, cpu_share=share, load=load, load_end=load_end)
    assert probe.busy is busy and probe.cacheable is not busy
    assert f"CPU share {share:.0%}" in probe.conditions()
    assert not result(250.0, 700.0, cpu_share=None).cacheable  # what shows it was idle is missing


@pytest.mark.parametrize("share, others, load, busy", [
    (0.93, 0.01, 1.8, False),  # a job on both CPUs just ended: the load average lags, nothing else ran
    (0.93, 0.01, 0.2, False),  # idle
    (0.93, 0.45, 0.5, True),  # one busy thread beside the probe, before the load average shows it
    (0.93, 0.21, 0.2, True),  # just above MAX_OTHERS_SHARE
    (0.60, 0.01, 0.2, True),  # starved with nothing else on the CPUs (a noisy VM's hypervisor)
])
def test_other_processes_share_replaces_the_lagging_load_average(share, others, load, busy):
    probe = result(250.0, 700.0, cpu_share=share, load=load, load_end=load, others_share=others)
    assert probe.busy is busy and probe.cacheable is not busy
    assert f"others {others:.0%}" in probe.conditions()


def test_after_a_job_the_first_probe_is_cached():
    """A benchmark's second cell: the 1-minute load still carries the first. One probe, cached."""
    just_after = result(130.0, 290.0, cpu_share=0.93, load=1.9, load_end=1.8, others_share=0.02)
    probe = probes(just_after)
    decision = decide_precision(facts=XEON, probe=probe)
    assert probe.calls == 1 and decision.probe_cached is False and decision.mixed_precision == "bfloat16"
    assert decide_precision(facts=XEON, probe=no_probe).probe == just_after


def test_busy_probe_decides_this_run_only(tmp_path):
    flattered = decide_precision(facts=XEON, probe=probes(*[FLATTERED] * precision.BUSY_PROBES))
    assert flattered.mixed_precision == "bfloat16" and flattered.probe_cached is False
    assert "fresh probe on a busy machine, not cached: CPU share 45%, load 0.2→0.3 on 2 CPUs" in flattered.reason
    assert not (tmp_path / "precision.json").exists()
    probe = probes(IDLE_XEON)
    fresh = decide_precision(facts=XEON, probe=probe)  # the next run probes again, idle this time
    assert fresh.mixed_precision == "off" and probe.calls == 1
    assert "0.6× fp32 (158 vs 252 GFLOP/s; fresh probe: CPU share 95%, load 0.2→0.3 on 2 CPUs)" in fresh.reason
    cached = decide_precision(facts=XEON, probe=no_probe)
    assert cached.mixed_precision == "off" and cached.probe == IDLE_XEON and cached.probe_cached is True
    assert "cached probe of 2026-01-02T03:04:05Z: CPU share 95%" in cached.summary()
    saved = cached.to_dict()["probe"]
    assert saved["busy"] is False and saved["cpu_share"] == 0.95 and saved["load_end"] == 0.3
    json.dumps(cached.to_dict())


def test_a_busy_probe_is_taken_again_and_the_first_idle_one_decides(tmp_path):
    """A starved probe can invert the ratio: on a shared EPYC Zen 4, bf16 1.2× float32 (idle ~2×)."""
    starved = result(130.0, 158.0, cpu_share=0.65)
    idle = result(130.0, 290.0)
    probe = probes(starved, idle, starved)
    decision = decide_precision(facts=XEON, probe=probe)
    assert probe.calls == 2 and decision.probe == idle and decision.mixed_precision == "bfloat16"
    assert decide_precision(facts=XEON, probe=no_probe).probe == idle  # the idle one was cached


def test_when_every_probe_is_busy_the_least_starved_decides_uncached(tmp_path):
    lagging = dict(load=1.8, load_end=1.8)  # without /proc/stat a job that just ended looks busy at any share
    probe = probes(result(130.0, 150.0, cpu_share=0.65, **lagging), result(130.0, 290.0, cpu_share=0.93, **lagging),
                   result(130.0, 140.0, cpu_share=0.70, **lagging), IDLE_XEON)
    decision = decide_precision(facts=XEON, probe=probe)
    assert probe.calls == precision.BUSY_PROBES == 3
    assert decision.probe.cpu_share == 0.93 and decision.mixed_precision == "bfloat16"
    assert "fresh probe on a busy machine, not cached: CPU share 93%" in decision.reason
    assert not (tmp_path / "precision.json").exists()


@pytest.mark.parametrize("entry", [
    dataclasses.asdict(STARVED_XEON),  # taken busy (e.g. by hand or another version of the code)
    {key: value for key, value in dataclasses.asdict(STARVED_XEON).items()
     if key not in ("load_end", "cpu_share", "taken_at")},  # lacks the fields that show it was idle
])
def test_cached_entry_taken_busy_or_incomplete_is_probed_again(tmp_path, entry):
    path = tmp_path / "precision.json"
    key = precision.cache_key(XEON)
    path.write_text(json.dumps({key: {"cpu_model": XEON.cpu_model, "probe": entry}}))
    probe = probes(IDLE_XEON)
    decision = decide_precision(facts=XEON, probe=probe)
    assert probe.calls == 1 and decision.probe == IDLE_XEON and decision.probe_cached is False
    assert ProbeResult(**json.loads(path.read_text())[key]["probe"]) == IDLE_XEON  # replaced


def test_entries_of_the_previous_probe_version_are_not_read(monkeypatch):
    key = precision.cache_key(XEON)
    monkeypatch.setattr(precision, "PROBE_VERSION", precision.PROBE_VERSION - 1)
    assert precision.cache_key(XEON) != key


def test_cpus_of_one_model_name_and_flags_get_their_own_entries():
    """A cloud VM's 'AMD EPYC' with avx512_bf16 is a Zen 4 or a Zen 5: a home directory shared
    by both must not let one's probe decide for the other."""
    zen4 = DeviceFacts("cpu", "AMD EPYC", ("avx512_bf16", "avx512f"), "family 25 model 17 stepping 1")
    zen5 = dataclasses.replace(zen4, cpu_id="family 26 model 2 stepping 1")
    assert precision.cache_key(zen4) != precision.cache_key(zen5)


def test_a_cpu_quota_gets_its_own_cache_entry(monkeypatch, tmp_path):
    """A probe cached on the whole machine does not decide a container limited to fewer CPUs."""
    from transformer.runtime.cpu_budget import CpuBudget

    monkeypatch.setattr(precision, "cpu_budget", lambda: CpuBudget(affinity=2))
    whole = precision.cache_key(XEON)
    monkeypatch.setattr(precision, "cpu_budget", lambda: CpuBudget(affinity=2, quota=1.0, quota_file="cpu.max"))
    assert precision.cache_key(XEON) != whole
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({whole: {"cpu_model": XEON.cpu_model, "probe": dataclasses.asdict(IDLE_XEON)}}))
    probe = probes(IDLE_XEON)
    decision = decide_precision(facts=XEON, probe=probe)
    assert probe.calls == 1 and decision.probe_cached is False
    assert set(json.loads(path.read_text())) == {whole, precision.cache_key(XEON)}


def test_a_one_thread_probe_gets_its_own_cache_entry(monkeypatch):
    """An intra-op pool set to one thread reaches about half the GFLOP/s of two: its probe is not
    the one a process with the default pool (one thread per CPU) reads."""
    import tensorflow as tf

    from transformer.runtime.cpu_budget import CpuBudget

    monkeypatch.setattr(precision, "cpu_budget", lambda: CpuBudget(affinity=2))
    monkeypatch.setattr(tf.config.threading, "get_intra_op_parallelism_threads", lambda: 0)
    assert precision.probe_threads() == 2
    pool = precision.cache_key(XEON)
    monkeypatch.setattr(tf.config.threading, "get_intra_op_parallelism_threads", lambda: 1)
    assert precision.probe_threads() == 1 and precision.cache_key(XEON) != pool
    monkeypatch.setattr(tf.config.threading, "get_intra_op_parallelism_threads", lambda: 8)
    assert precision.probe_threads() == 2 and precision.cache_key(XEON) == pool  # capped by the CPUs


def test_real_probe_records_cpu_share_and_both_loads():
    started = time.time()
    probe = precision.probe_bf16_speedup(size=128, budget_s=0.05)
    assert 0.0 < probe.cpu_share < 2.0 and probe.cpus >= 1
    assert (probe.load is None) == (probe.load_end is None)
    if os.path.exists("/proc/stat"):
        assert 0.0 <= probe.others_share < 2.0
    taken = calendar.timegm(time.strptime(probe.taken_at, "%Y-%m-%dT%H:%M:%SZ"))
    assert abs(taken - started) < 60
