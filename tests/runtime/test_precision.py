"""`--mixed-precision auto` / `--xla auto`: the decision from device facts, the probe, its cache.

Device facts and the probe are injected, so every branch runs on any CPU; GPU branches are
tested only this way (no GPU here). One training run checks that what is decided is what
training uses and what config.json / report.json say.
"""

import json

import keras
import pytest

from transformer.base import cli
from transformer.base.config import RunConfig
from transformer.runtime import precision
from transformer.runtime.precision import DeviceFacts, ProbeResult, decide_precision

X86_CPUINFO = """processor\t: 0
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
stepping\t: 8
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
processor\t: 1
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
stepping\t: 2
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
ARM_CPUINFO = ("processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"
               "CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\nCPU revision\t: 1\n")

NO_BF16 = DeviceFacts("cpu", "Intel Xeon @ 2.80GHz", ("avx512f",))
AVX512_BF16 = DeviceFacts("cpu", "AMD EPYC", ("avx512_bf16", "avx512f"))
IDLE = dict(load=0.2, load_end=0.3, cpus=2, cpu_share=0.95)  # what an idle 2-CPU machine records
FAST = ProbeResult(float32_gflops=250.0, bfloat16_gflops=700.0, size=1024, seconds=0.4, **IDLE)
SLOW = ProbeResult(float32_gflops=250.0, bfloat16_gflops=300.0, size=1024, seconds=0.4, **IDLE)


@pytest.fixture(autouse=True)
def unpinned(monkeypatch, tmp_path):
    """No pin (conftest pins auto to float32 for other tests) and a private probe cache."""
    monkeypatch.delenv(precision.PIN_ENV, raising=False)
    monkeypatch.setenv(precision.CACHE_ENV, str(tmp_path / "precision.json"))


def probe_returning(result: ProbeResult):
    calls = []

    def probe():
        calls.append(1)
        return result

    probe.calls = calls
    return probe


def no_probe():
    raise AssertionError("the probe must not run here")


def test_cpuinfo_flags_and_model_are_read_on_x86_and_arm():
    model, flags = precision.parse_cpuinfo(X86_CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert flags == ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f")
    assert DeviceFacts("cpu", model, flags).bf16_flags == ("amx_bf16", "avx512_bf16")
    assert precision.parse_cpuinfo(ARM_CPUINFO) == ("", ("bf16",))
    assert precision.parse_cpuinfo("flags : fpu sse2 avx2\n") == ("", ())


def test_cpu_identity_is_the_first_cpus_family_model_and_stepping():
    assert precision.parse_cpu_id(X86_CPUINFO) == "family 6 model 143 stepping 8"  # not the second CPU's
    assert precision.parse_cpu_id(ARM_CPUINFO) == "implementer 0x41 part 0xd40 variant 0x1"
    assert precision.parse_cpu_id("flags : fpu sse2 avx2\n") == ""


def test_cpu_without_bf16_instructions_is_float32_without_probing():
    decision = decide_precision(facts=NO_BF16, probe=no_probe)
    assert (decision.mixed_precision, decision.policy, decision.xla) == ("off", "float32", False)
    assert "no BF16 instructions" in decision.reason and decision.probe is None
    assert decision.probe_cached is None


def test_the_decision_names_the_cpu_with_its_identity():
    zen4 = DeviceFacts("cpu", "AMD EPYC", ("avx512_bf16", "avx512f"), "family 25 model 17 stepping 1")
    decision = decide_precision(facts=zen4, probe=probe_returning(FAST))
    assert decision.reason.startswith("AMD EPYC (family 25 model 17 stepping 1) has avx512_bf16")
    assert decision.to_dict()["device"]["cpu_id"] == "family 25 model 17 stepping 1"
    assert decide_precision(facts=NO_BF16, probe=no_probe).reason.startswith("Intel Xeon @ 2.80GHz has no BF16")


@pytest.mark.parametrize("result, expected", [(FAST, "bfloat16"), (SLOW, "off")])
def test_cpu_with_bf16_follows_the_probe(result, expected):
    probe = probe_returning(result)
    decision = decide_precision(facts=AVX512_BF16, probe=probe)
    assert decision.mixed_precision == expected and len(probe.calls) == 1
    assert "avx512_bf16" in decision.reason and f"{result.speedup:.1f}×" in decision.reason
    assert decision.xla is False and decision.loss_scaling is False
    saved = decision.to_dict()
    assert saved["probe"]["speedup"] == pytest.approx(result.speedup, abs=1e-3)
    assert saved["requested"] == {"mixed_precision": "auto", "xla": "auto"}
    assert saved["policy"] == precision.POLICIES[expected] and saved["probe_cached"] is False
    json.dumps(saved)  # report.json-ready


def test_explicit_flags_win_over_auto():
    decision = decide_precision("off", True, facts=AVX512_BF16, probe=no_probe)
    assert (decision.mixed_precision, decision.xla) == ("off", True)
    assert decision.reason == "requested --mixed-precision off" and decision.xla_reason == "requested --xla"
    decision = decide_precision("bfloat16", False, facts=NO_BF16, probe=no_probe)
    assert (decision.policy, decision.xla) == ("mixed_bfloat16", False)


def test_probe_result_is_cached_per_machine(tmp_path):
    probe = probe_returning(FAST)
    first = decide_precision(facts=AVX512_BF16, probe=probe)
    second = decide_precision(facts=AVX512_BF16, probe=no_probe)  # cache hit: no probe
    assert (first.probe_cached, second.probe_cached) == (False, True)
    assert second.probe == FAST and second.mixed_precision == first.mixed_precision == "bfloat16"
    assert "cached" in second.reason
    # Another CPU (flags differ) is another key: it probes, and both entries are kept.
    amx = DeviceFacts("cpu", "AMD EPYC", ("amx_bf16", "avx512_bf16", "avx512f"))
    assert decide_precision(facts=amx, probe=probe_returning(SLOW)).mixed_precision == "off"
    assert len(json.loads((tmp_path / "precision.json").read_text())) == 2
    assert decide_precision(facts=AVX512_BF16, probe=no_probe).probe == FAST


def test_probe_on_a_busy_machine_is_used_but_not_cached(tmp_path):
    busy = ProbeResult(float32_gflops=50.0, bfloat16_gflops=100.0, size=1024, seconds=1.0, load=6.5, cpus=2)
    decision = decide_precision(facts=AVX512_BF16, probe=probe_returning(busy))
    assert decision.mixed_precision == "bfloat16" and "load 6.5" in decision.reason
    assert not (tmp_path / "precision.json").exists()
    idle = ProbeResult(float32_gflops=250.0, bfloat16_gflops=700.0, size=1024, seconds=0.4, **IDLE)
    probe = probe_returning(idle)
    decide_precision(facts=AVX512_BF16, probe=probe)
    assert decide_precision(facts=AVX512_BF16, probe=no_probe).probe == idle


def test_unreadable_cache_or_failing_probe_fall_back_safely(tmp_path):
    cache = tmp_path / "precision.json"
    cache.write_text("{not json")
    probe = probe_returning(FAST)
    assert decide_precision(facts=AVX512_BF16, probe=probe).mixed_precision == "bfloat16"
    assert len(probe.calls) == 1 and json.loads(cache.read_text())  # rewritten, readable

    def failing():
        raise RuntimeError("no bf16 kernel")

    other = DeviceFacts("cpu", "other CPU", ("avx512_bf16",))
    decision = decide_precision(facts=other, probe=failing)
    assert decision.mixed_precision == "off" and "probe failed" in decision.reason


@pytest.mark.parametrize("capability, mode", [((7, 5), "float16"), ((7, 0), "float16"), ((8, 0), "bfloat16"),
                                              ((9, 0), "bfloat16"), ((6, 1), "off"), (None, "off")])
def test_gpu_precision_from_compute_capability(capability, mode):
    decision = decide_precision(device="gpu", facts=DeviceFacts("gpu", gpu_capability=capability), probe=no_probe)
    assert decision.mixed_precision == mode
    assert decision.loss_scaling is (mode == "float16")
    assert decision.xla is True  # bucketed batches: a bounded set of shapes


def test_xla_auto_by_device_and_pipeline():
    gpu = DeviceFacts("gpu", gpu_capability=(8, 0))
    assert decide_precision(facts=gpu, pipeline_kind="naive", probe=no_probe).xla is False
    assert decide_precision(facts=NO_BF16, pipeline_kind="optimized", probe=no_probe).xla is False
    tpu = decide_precision(facts=DeviceFacts("tpu"), probe=no_probe)
    assert (tpu.mixed_precision, tpu.xla) == ("bfloat16", True)


def test_pin_environment_variable(monkeypatch):
    monkeypatch.setenv(precision.PIN_ENV, "bfloat16")
    decision = decide_precision(facts=NO_BF16, probe=no_probe)
    assert decision.mixed_precision == "bfloat16" and precision.PIN_ENV in decision.reason
    assert decide_precision("off", facts=NO_BF16, probe=no_probe).mixed_precision == "off"  # flags still win
    monkeypatch.setenv(precision.PIN_ENV, "fp8")
    with pytest.raises(ValueError, match=precision.PIN_ENV):
        decide_precision(facts=NO_BF16, probe=no_probe)


def test_real_probe_is_short_and_measures_both_dtypes():
    result = precision.probe_bf16_speedup(size=128, budget_s=0.05)
    assert result.float32_gflops > 0 and result.bfloat16_gflops > 0 and result.size == 128
    assert result.seconds < 5


def test_float16_decision_trains_with_loss_scaling(tiny_model_config):
    from transformer.inference.rundir import build_model
    from transformer.model.optimizer import compile_model
    from transformer.runtime.devices import set_precision

    decision = decide_precision(device="gpu", facts=DeviceFacts("gpu", gpu_capability=(7, 5)), probe=no_probe)
    try:
        assert set_precision(decision.mixed_precision, "cpu") == "mixed_float16"
        model = build_model(tiny_model_config(num_layers=1))
        config = RunConfig().replace(train={"mixed_precision": decision.mixed_precision, "xla": decision.xla,
                                            "lr_schedule": "inverse-sqrt", "peak_learning_rate": None})
        compile_model(model, config)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_cli_and_config_accept_auto_and_old_files():
    parser = cli_parser()
    assert RunConfig().train.mixed_precision == "auto" and RunConfig().train.xla is None
    for flags, xla in [([], None), (["--xla"], True), (["--no-xla"], False), (["--xla", "off"], False),
                       (["--xla", "on"], True), (["--xla", "auto"], None)]:
        assert cli.run_config_from_args(parser.parse_args(flags)).train.xla is xla, flags
    base = RunConfig().replace(train={"xla": False})
    assert cli.run_config_from_args(parser.parse_args(["--xla", "auto"]), base).train.xla is None
    config = cli.run_config_from_args(parser.parse_args(["--mixed-precision", "auto"]))
    assert config.train.mixed_precision == "auto"
    # config.json files written before "auto" existed still load; new ones round-trip null.
    assert RunConfig.from_dict({"train": {"mixed_precision": "off", "xla": False}}).train.xla is False
    assert RunConfig.from_dict(json.loads(json.dumps(RunConfig().to_dict()))) == RunConfig()


def cli_parser():
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_train_args(parser)
    return parser


def test_training_uses_and_reports_the_decision(bible_tokenizers, tmp_path):
    from conftest import run_config, tokenizers_reused

    from transformer.training.trainer import train

    output = tmp_path / "run"
    config = run_config(bible_tokenizers, output, validation=False, epochs=1, steps_per_epoch=1,
                        mixed_precision="auto", xla=None, device="cpu")
    try:
        with tokenizers_reused(bible_tokenizers):
            result = train(config)
        report = json.loads((output / "report.json").read_text())
        decision = report["run"]["precision_decision"]
        saved = RunConfig.load(output / "config.json").train
        assert decision["requested"] == {"mixed_precision": "auto", "xla": "auto"}
        assert report["run"]["precision"] == saved.mixed_precision == decision["mixed_precision"]
        assert report["run"]["xla"] is saved.xla is decision["xla"] is False  # CPU
        assert result.model.dtype_policy.name == decision["policy"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
