"""`resolve_batch`: --max-tokens and the schedule as training resolves them (GPU probe injected,
--resume from config.json), and the real step timer on a tiny model."""

import json
import math

import pytest
import tensorflow as tf

from transformer.base.config import ModelConfig, RunConfig
from transformer.runtime import batch_size
from transformer.training.batch_probe import resolve_batch, step_timer

MODEL = ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, max_length=16, src_vocab_size=50,
                    tgt_vocab_size=40)


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(batch_size.CACHE_ENV, str(tmp_path / "batch.json"))


def gpu_timer(max_tokens: int) -> float:
    """An H100-like GPU: tokens/s flattens after 16,384 tokens; out of memory from 65,536."""
    if max_tokens >= 65536:
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    rate = {2048: 45e3, 4096: 90e3, 8192: 170e3, 16384: 270e3, 32768: 285e3}[max_tokens]
    return max_tokens / rate


def resolve(config: RunConfig, device="gpu", run_dir=None, resuming=False, time_step=gpu_timer):
    return resolve_batch(config, device, MODEL, tf.distribute.get_strategy(), run_dir, resuming, time_step)


def test_gpu_auto_probes_the_batch_and_keeps_the_recipe_schedule_unless_asked(tmp_path):
    kept, _ = resolve(RunConfig(), run_dir=tmp_path)
    assert kept.pipeline.max_tokens == 16384
    assert (kept.train.lr_scaling, kept.train.warmup_steps, kept.train.peak_learning_rate) == ("off", 200, 1e-3)
    config, decision = resolve(RunConfig().replace(train={"lr_scaling": "sqrt"}), run_dir=tmp_path)
    assert config.pipeline.max_tokens == 16384 and decision.max_tokens == 16384
    train = config.train
    assert (train.lr_scaling, train.lr_batch_factor, train.warmup_steps) == ("sqrt", 8.0, 25)
    assert train.peak_learning_rate == pytest.approx(1e-3 * math.sqrt(2))
    record = json.loads(json.dumps(decision.to_dict()))  # what report.json gets
    assert record["requested"] == "auto" and record["probe"]["chosen"] == 16384
    assert record["schedule"]["warmup_steps"] == {"given": 200, "used": 25}
    assert record["schedule"]["peak_learning_rate"]["given"] == 1e-3
    assert "8× the 2048-token reference batch" in decision.summary()


def test_explicit_batches_keep_the_schedule_unless_asked(tmp_path):
    config, decision = resolve(RunConfig().replace(pipeline={"max_tokens": 8192}), time_step=None)
    assert config.pipeline.max_tokens == 8192 and decision.probe is None
    assert (config.train.lr_scaling, config.train.warmup_steps, config.train.peak_learning_rate) == ("off", 200, 1e-3)
    asked = RunConfig().replace(pipeline={"max_tokens": 8192}, train={"lr_scaling": "sqrt"})
    config, _ = resolve(asked, time_step=None)
    assert (config.train.lr_batch_factor, config.train.warmup_steps) == (4.0, 50)


def test_cpu_auto_is_the_recipe_with_its_schedule(tmp_path):
    config, decision = resolve(RunConfig(), device="cpu", time_step=None)
    assert config.pipeline.max_tokens == 2048 and decision.reason.startswith("CPU")
    assert (config.train.warmup_steps, config.train.peak_learning_rate, config.train.lr_batch_factor) == (200, 1e-3, 1.0)


def test_resume_continues_the_saved_batch_and_schedule_without_probing(tmp_path):
    first, _ = resolve(RunConfig(), run_dir=tmp_path)
    # an --auto-batch retry halved the batch; the schedule stays as it was scaled
    first.replace(pipeline={"max_tokens": 8192}).save(tmp_path / "config.json")

    def no_probe(max_tokens):
        raise AssertionError("--resume must not probe again")

    resumed, decision = resolve(RunConfig(), run_dir=tmp_path, resuming=True, time_step=no_probe)
    assert resumed.pipeline.max_tokens == 8192 and decision.reason.startswith("--resume")
    assert resumed.train == first.train  # factor 8 as recorded, not 4 from the halved batch
    explicit, _ = resolve(RunConfig().replace(pipeline={"max_tokens": 4096}), run_dir=tmp_path, resuming=True,
                          time_step=no_probe)
    assert explicit.pipeline.max_tokens == 4096  # a typed value wins


def test_resume_of_a_run_saved_before_the_scaling_keeps_its_schedule(tmp_path):
    saved = RunConfig().replace(pipeline={"max_tokens": 4096}).to_dict()
    for key in ("lr_scaling", "lr_reference_tokens", "lr_batch_factor"):
        del saved["train"][key]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    resumed, _ = resolve(RunConfig(), run_dir=tmp_path, resuming=True, time_step=None)
    assert resumed.pipeline.max_tokens == 4096
    assert (resumed.train.lr_scaling, resumed.train.warmup_steps, resumed.train.peak_learning_rate) == ("off", 200, 1e-3)


def test_real_step_timer_times_train_steps_of_the_model():
    config = RunConfig(model=MODEL).replace(train={"xla": False, "mixed_precision": "off"})
    time_step, release = step_timer(MODEL, config, tf.distribute.get_strategy(), warmup=1, timed=2)
    try:
        seconds = [time_step(budget) for budget in (64, 256)]  # 4 and 16 sentences of 16 tokens
    finally:
        release()
    assert all(0 < s < 60 for s in seconds)


def test_gpu_branch_with_the_real_timer_probes_caches_and_scales(tmp_path, monkeypatch):
    """The whole GPU path but the device: real train steps (here on the CPU), the cache, the schedule."""
    monkeypatch.setattr(batch_size, "gpu_facts", lambda: {"name": "test GPU", "memory_mib": 1})
    config = RunConfig(model=MODEL).replace(train={"xla": False, "mixed_precision": "off", "lr_scaling": "sqrt"})
    strategy = tf.distribute.get_strategy()
    resolved, decision = resolve_batch(config, "gpu", MODEL, strategy, tmp_path, False)
    chosen = decision.max_tokens
    trials = decision.probe.trials
    assert chosen in (2048, 4096, 8192, 16384, 32768, 65536) and decision.probe_cached is False
    assert [t.max_tokens for t in trials][:2] == [2048, 4096] and all(t.step_s > 0 for t in trials)
    assert resolved.pipeline.max_tokens == chosen and resolved.train.lr_batch_factor == chosen / 2048
    again, cached = resolve_batch(config, "gpu", MODEL, strategy, tmp_path, False)
    assert cached.probe_cached is True and again == resolved
