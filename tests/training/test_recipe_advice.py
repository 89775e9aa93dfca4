"""The depth hint: only for a time-budgeted, float32 run on a CPU without BF16 instructions."""

import pytest

from transformer.base.config import RunConfig
from transformer.runtime.precision import DeviceFacts, PrecisionDecision
from transformer.training.recipe_advice import SHALLOW_LAYERS, depth_advice

NO_BF16 = DeviceFacts(device="cpu", cpu_model="AMD EPYC", cpu_flags=())
BF16 = DeviceFacts(device="cpu", cpu_model="AMD EPYC", cpu_flags=("avx512_bf16",))
GPU = DeviceFacts(device="gpu", gpu_capability=(9, 0))


def decision(facts: DeviceFacts, mixed_precision: str = "off") -> PrecisionDecision:
    return PrecisionDecision("auto", None, mixed_precision, False, "test", "test", facts)


def config(budget=30.0, layers=3) -> RunConfig:
    return RunConfig().replace(train={"time_budget_minutes": budget}, model={"num_layers": layers})


def test_a_budgeted_float32_run_on_a_cpu_without_bf16_gets_the_hint():
    hint = depth_advice(config(), decision(NO_BF16))
    assert hint is not None and hint.startswith("hint: AMD EPYC has no BF16")
    assert f"--num-layers {SHALLOW_LAYERS}" in hint and "docs/recipes.md" in hint


@pytest.mark.parametrize("run, made", [
    (config(layers=SHALLOW_LAYERS), decision(NO_BF16)),               # already shallow
    (config(budget=None), decision(NO_BF16)),                         # --epochs, no budget
    (config(), decision(BF16, "bfloat16")),                           # BF16 CPU, auto → bfloat16
    (config(), decision(BF16, "off")),                                # BF16 CPU, float32 asked for
    (config(), decision(GPU, "bfloat16")),                            # a GPU
])
def test_no_hint_elsewhere(run, made):
    assert depth_advice(run, made) is None
