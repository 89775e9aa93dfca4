"""`--num-layers auto`: 2 layers only for a time-budgeted float32 run on a CPU without BF16 instructions."""

import pytest

from transformer.base import cli
from transformer.base.config import AUTO, ModelConfig, RunConfig
from transformer.runtime.precision import DeviceFacts, PrecisionDecision
from transformer.training.depth import DEEP_LAYERS, SHALLOW_LAYERS, resolve_depth

NO_BF16 = DeviceFacts(device="cpu", cpu_model="AMD EPYC", cpu_flags=())
BF16 = DeviceFacts(device="cpu", cpu_model="AMD EPYC", cpu_flags=("avx512_bf16",))
GPU = DeviceFacts(device="gpu", gpu_capability=(9, 0))


def decision(facts: DeviceFacts, mixed_precision: str = "off") -> PrecisionDecision:
    return PrecisionDecision("auto", None, mixed_precision, False, "test", "test", facts)


def config(budget=30.0, layers=AUTO) -> RunConfig:
    return RunConfig().replace(train={"time_budget_minutes": budget}, model={"num_layers": layers})


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
