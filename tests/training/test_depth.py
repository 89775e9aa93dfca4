"""`--num-layers auto`: 2 layers for a time-budgeted CPU run that sees few tokens (float32 without BF16, or a timed step)."""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_config, tokenizers_reused

from transformer.base import cli
from transformer.base.config import AUTO, ModelConfig, RunConfig
from transformer.runtime.precision import DeviceFacts, PrecisionDecision
from transformer.training import depth
from transformer.training.depth import DEEP_LAYERS, SHALLOW_BELOW_TOKENS, SHALLOW_LAYERS, resolve_depth
from transformer.training.trainer import train

NO_BF16 = DeviceFacts(device="cpu", cpu_model="AMD EPYC", cpu_flags=())
BF16 = DeviceFacts(device="cpu", cpu_model="AMD EPYC", cpu_flags=("avx512_bf16",))
GPU = DeviceFacts(device="gpu", gpu_capability=(9, 0))


def decision(facts: DeviceFacts, mixed_precision: str = "off") -> PrecisionDecision:
    return PrecisionDecision("auto", None, mixed_precision, False, "test", "test", facts)


def config(budget=30.0, layers=AUTO, pipeline="optimized") -> RunConfig:
    return RunConfig().replace(train={"time_budget_minutes": budget}, model={"num_layers": layers},
                               pipeline={"kind": pipeline})


def never() -> float:
    raise AssertionError("the step was timed where no probe decides")


ELSEWHERE = [
    (config(budget=None), decision(NO_BF16)),                         # --epochs, no budget
    (config(), decision(BF16, "bfloat16")),                           # BF16 CPU, auto → bfloat16
    (config(), decision(BF16, "off")),                                # BF16 CPU, float32 asked for
    (config(), decision(GPU, "bfloat16")),                            # a GPU
]


def test_the_default_recipe_and_the_command_line_leave_the_depth_to_the_machine():
    assert RunConfig().model.num_layers == AUTO and ModelConfig().num_layers == DEEP_LAYERS == 3
    parser = cli.argparse.ArgumentParser()
    cli.add_model_args(parser)
    assert cli.run_config_from_args(parser.parse_args([])).model.num_layers == AUTO
    assert cli.run_config_from_args(parser.parse_args(["--num-layers", "4"])).model.num_layers == 4
    assert cli.run_config_from_args(parser.parse_args(["--num-layers", "Auto"])).model.num_layers == AUTO
    with pytest.raises(SystemExit):
        parser.parse_args(["--num-layers", "deep"])
    with pytest.raises(cli.ConfigError, match="model.num_layers must be > 0"):
        cli.run_config_from_args(parser.parse_args(["--num-layers", "0"]))


def test_auto_is_shallow_for_a_budgeted_float32_run_on_a_cpu_without_bf16():
    resolved, line = resolve_depth(config(), decision(NO_BF16))
    assert resolved.model.num_layers == SHALLOW_LAYERS == 2
    assert line.startswith("--num-layers auto: 2 (AMD EPYC has no BF16") and "docs/recipes.md" in line
    assert resolved.replace(model={"num_layers": AUTO}) == config()  # nothing else changed


@pytest.mark.parametrize("run, made", ELSEWHERE)
def test_auto_is_the_default_recipe_elsewhere(run, made):
    resolved, line = resolve_depth(run, made)
    assert resolved.model.num_layers == DEEP_LAYERS and line.startswith(f"--num-layers auto: {DEEP_LAYERS}")


def test_a_typed_depth_is_kept_with_a_hint_where_shallow_pays():
    resolved, hint = resolve_depth(config(layers=3), decision(NO_BF16))
    assert resolved.model.num_layers == 3
    assert hint.startswith("hint: AMD EPYC has no BF16") and f"--num-layers {SHALLOW_LAYERS}" in hint
    assert resolve_depth(config(layers=SHALLOW_LAYERS), decision(NO_BF16))[1] is None  # already shallow


@pytest.mark.parametrize("run, made", ELSEWHERE)
def test_no_hint_elsewhere(run, made):
    typed = run.replace(model={"num_layers": 4})
    assert resolve_depth(typed, made) == (typed, None)


@pytest.mark.parametrize("tokens, layers", [(0.5 * SHALLOW_BELOW_TOKENS, SHALLOW_LAYERS),
                                            (2.0 * SHALLOW_BELOW_TOKENS, DEEP_LAYERS)])
def test_on_a_bf16_cpu_a_timed_step_decides_by_the_tokens_the_budget_buys(tokens, layers):
    calls = []
    resolved, line = resolve_depth(config(), decision(BF16, "bfloat16"), lambda: calls.append(1) or tokens)
    assert calls == [1] and resolved.model.num_layers == layers
    assert line.startswith(f"--num-layers auto: {layers} (a timed step says {DEEP_LAYERS} layers")
    assert f"~{tokens / 1e6:.1f} M target tokens in this 30-minute budget on AMD EPYC" in line
    assert resolved.replace(model={"num_layers": AUTO}) == config()


@pytest.mark.parametrize("run, made", [
    (config(budget=None), decision(BF16, "bfloat16")),     # no budget
    (config(), decision(GPU, "bfloat16")),                 # a GPU
    (config(pipeline="naive"), decision(BF16, "bfloat16")),  # sentences per batch: no token rate to predict
    (config(layers=3), decision(BF16, "bfloat16")),        # typed
    (config(), decision(NO_BF16)),                         # float32 without BF16: decided without a probe
])
def test_no_step_is_timed_where_the_rules_decide_without_one(run, made):
    resolved, _ = resolve_depth(run, made, never)
    assert resolved.model.num_layers != AUTO


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="the probe decides on a CPU")
def test_a_probed_depth_trains_as_the_same_depth_typed(bible_tokenizers, tmp_path, monkeypatch):
    """The probe builds and trains a model on random ids: the run itself must not notice (reseeded)."""
    monkeypatch.setattr(depth, "shallow_pays", lambda *_: False)  # the probe decides on any CPU
    monkeypatch.setattr(depth, "SHALLOW_BELOW_TOKENS", float("inf"))  # and says 2 layers
    steps = dict(validation=False, epochs=1, steps_per_epoch=3, time_budget_minutes=10.0)
    probed = run_config(bible_tokenizers, tmp_path / "probed", **steps).replace(model={"num_layers": AUTO})
    typed = run_config(bible_tokenizers, tmp_path / "typed", **steps).replace(model={"num_layers": SHALLOW_LAYERS})
    with tokenizers_reused(bible_tokenizers):
        probed_run, typed_run = train(probed), train(typed)
    assert RunConfig.load(tmp_path / "probed" / "config.json").model.num_layers == SHALLOW_LAYERS
    report = json.loads((tmp_path / "probed" / "report.json").read_text())
    assert report["run"]["depth_decision"].startswith(f"--num-layers auto: {SHALLOW_LAYERS} (a timed step says")
    assert probed_run.summary["optimizer_steps"] == typed_run.summary["optimizer_steps"] == 3
    for a, b in zip(probed_run.model.weights, typed_run.model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
