"""`--max-tokens auto`: the probe's choice from injected step timings, the decision per device, its cache.

The step timer is injected (max_tokens → seconds per step, or an out-of-memory error), so the
GPU branch runs on any CPU; the real timer is tested in tests/training/test_batch_probe.py.
"""

import json

import pytest
import tensorflow as tf

from transformer.base.config import RECIPE_MAX_TOKENS
from transformer.runtime import batch_size
from transformer.runtime.batch_size import decide_max_tokens, probe_max_tokens

LENGTH = 128
GPU = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
KEY = {"model": {"d_model": 256, "num_layers": 3}, "policy": "mixed_bfloat16", "xla": False}


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(batch_size.CACHE_ENV, str(tmp_path / "batch.json"))
    return tmp_path / "batch.json"


def timer(rates: dict, oom_from: int | None = None, error: Exception | None = None):
    """A step timer: `rates[max_tokens]` padded tokens/s; OOM at budgets ≥ `oom_from`; records calls."""

    def time_step(max_tokens: int) -> float:
        time_step.calls.append(max_tokens)
        if error is not None:
            raise error
        if oom_from is not None and max_tokens >= oom_from:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor of {max_tokens} tokens")
        return (max_tokens // LENGTH * LENGTH) / rates[max_tokens]

    time_step.calls = []
    return time_step


# H100-like: tokens/s keeps growing to 16k, then flattens.
H100_RATES = {2048: 45_000.0, 4096: 90_000.0, 8192: 170_000.0, 16384: 270_000.0, 32768: 285_000.0,
              65536: 290_000.0}


def test_probe_stops_when_a_doubled_batch_gains_less_than_ten_percent():
    time_step = timer(H100_RATES)
    probe = probe_max_tokens(time_step, LENGTH, cap=65536)
    assert probe.chosen == 16384  # 32768 gains +5.6%: not worth 2x the memory and half the updates
    assert time_step.calls == [2048, 4096, 8192, 16384, 32768]
    assert "+6%" in probe.stop and "16384" in probe.stop
    assert [round(t.tokens_per_s) for t in probe.trials] == [45_000, 90_000, 170_000, 270_000, 285_000]


def test_probe_stops_at_the_first_out_of_memory_and_keeps_the_last_that_fitted():
    time_step = timer(H100_RATES, oom_from=8192)
    probe = probe_max_tokens(time_step, LENGTH)
    assert probe.chosen == 4096 and time_step.calls == [2048, 4096, 8192]
    assert probe.stop == "out of memory at 8192 tokens"
    assert probe.trials[-1].step_s is None and probe.trials[-1].error.startswith("out of memory: OOM when")


def test_probe_respects_the_cap():
    linear = {2**i: 10.0 * 2**i for i in range(11, 18)}  # tokens/s doubles with the batch
    time_step = timer(linear)
    assert probe_max_tokens(time_step, LENGTH).chosen == batch_size.PROBE_CAP == 16384  # 8x the recipe's batch
    assert max(time_step.calls) == 16384
    time_step = timer(linear)
    probe = probe_max_tokens(time_step, LENGTH, cap=8192)
    assert probe.chosen == 8192 and time_step.calls == [2048, 4096, 8192] and "cap" in probe.stop


def test_probe_counts_the_padded_tokens_of_the_batch_it_times():
    probe = probe_max_tokens(lambda max_tokens: 1.0, 100, cap=2048)  # 2048 // 100 = 20 sentences of 100
    assert probe.trials[0].tokens == 2000 and probe.trials[0].tokens_per_s == 2000.0


@pytest.mark.parametrize("time_step", [timer(H100_RATES, oom_from=2048), timer({}, error=RuntimeError("no cuBLAS"))])
def test_probe_fails_when_the_first_budget_does_not_run(time_step):
    probe = probe_max_tokens(time_step, LENGTH)
    assert probe.chosen is None and probe.stop.startswith("no budget fitted") and probe.failed
    assert len(probe.trials) == 1


def no_probe(max_tokens):
    raise AssertionError("the probe must not run here")


def test_cpu_auto_keeps_the_recipe_value_without_probing():
    decision = decide_max_tokens("auto", "cpu", time_step=no_probe)
    assert decision.max_tokens == RECIPE_MAX_TOKENS == 2048
    assert decision.reason.startswith("CPU: the recipe's 2048 tokens") and decision.probe is None


def test_explicit_values_and_the_naive_pipeline_are_not_probed():
    assert decide_max_tokens(8192, "gpu", time_step=no_probe).max_tokens == 8192
    assert decide_max_tokens(8192, "gpu", time_step=no_probe).reason == "requested --max-tokens 8192"
    assert decide_max_tokens(None, "gpu", time_step=no_probe).max_tokens is None
    naive = decide_max_tokens("auto", "gpu", "naive", time_step=no_probe)
    assert naive.max_tokens == 2048 and "naive pipeline" in naive.reason
    assert decide_max_tokens("auto", "tpu").max_tokens == 2048


def test_gpu_probe_is_cached_per_gpu_model_and_precision(private_cache):
    first = timer(H100_RATES)
    decision = decide_max_tokens("auto", "gpu", time_step=first, length=LENGTH, key_fields=KEY, gpu=GPU)
    assert decision.max_tokens == 16384 and decision.probe_cached is False and len(first.calls) == 4  # the cap
    assert "NVIDIA H100" in decision.reason and "→ 16384" in decision.reason
    entries = json.loads(private_cache.read_text())
    assert len(entries) == 1 and next(iter(entries.values()))["key"]["gpu"] == GPU

    again = decide_max_tokens("auto", "gpu", time_step=no_probe, length=LENGTH, key_fields=KEY, gpu=GPU)
    assert again.max_tokens == 16384 and again.probe_cached is True
    assert again.probe.trials == decision.probe.trials
    json.dumps(again.to_dict())  # report.json-ready

    for other in ({**KEY, "xla": True}, {**KEY, "policy": "float32"}):  # another key: probed again
        probed = timer(H100_RATES, oom_from=8192)
        changed = decide_max_tokens("auto", "gpu", time_step=probed, length=LENGTH, key_fields=other, gpu=GPU)
        assert changed.max_tokens == 4096 and changed.probe_cached is False and probed.calls
    smaller_gpu = decide_max_tokens("auto", "gpu", time_step=timer(H100_RATES, oom_from=4096), length=LENGTH,
                                    key_fields=KEY, gpu={"name": "Tesla T4", "memory_mib": 15360})
    assert smaller_gpu.max_tokens == 2048 and smaller_gpu.probe_cached is False
    assert len(json.loads(private_cache.read_text())) == 4


def test_a_failed_probe_falls_back_to_the_recipe_and_is_not_cached(private_cache):
    failed = decide_max_tokens("auto", "gpu", time_step=timer(H100_RATES, oom_from=2048), length=LENGTH,
                               key_fields=KEY, gpu=GPU)
    assert failed.max_tokens == 2048 and failed.reason.startswith("GPU probe failed (no budget fitted")
    assert not private_cache.exists()
    retried = timer(H100_RATES)  # the next run probes again, and caches what works
    assert decide_max_tokens("auto", "gpu", time_step=retried, length=LENGTH, key_fields=KEY,
                             gpu=GPU).max_tokens == 16384
    assert retried.calls and private_cache.exists()


def test_an_error_other_than_out_of_memory_keeps_the_last_budget_but_is_not_cached(private_cache):
    def time_step(max_tokens):
        if max_tokens == 8192:
            raise tf.errors.InternalError(None, None, "cuBLAS failed to allocate its workspace")
        return max_tokens / H100_RATES[max_tokens]

    decision = decide_max_tokens("auto", "gpu", time_step=time_step, length=LENGTH, key_fields=KEY, gpu=GPU)
    assert decision.max_tokens == 4096 and decision.probe.failed
    assert "probe failed at 8192 tokens (InternalError)" in decision.reason
    assert not private_cache.exists()


def test_an_unreadable_cache_is_ignored_and_replaced(private_cache):
    private_cache.write_text("{not json")
    decision = decide_max_tokens("auto", "gpu", time_step=timer(H100_RATES), length=LENGTH, key_fields=KEY, gpu=GPU)
    assert decision.max_tokens == 16384 and len(json.loads(private_cache.read_text())) == 1


def test_the_cache_lives_beside_the_precision_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(batch_size.CACHE_ENV)
    monkeypatch.setenv("TRANSFORMER_PRECISION_CACHE", str(tmp_path / "cache" / "precision.json"))
    assert batch_size.cache_path() == tmp_path / "cache" / "batch.json"
