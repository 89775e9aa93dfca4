"""How many layers a new run gets: `--num-layers auto` (the default recipe's), decided for the machine.

One rule, from measurements in docs/recipes.md: a time-budgeted run that trains in float32 on a
CPU without BF16 instructions gets `SHALLOW_LAYERS` layers per side, every other run
`DEEP_LAYERS`. On such a CPU (2-core AMD EPYC Zen 3, AVX2 only) README's 30-minute command
trains ~1,800 target tokens/s, under two passes over the corpus, and 2 layers per side learned
much faster than 3; on CPUs with BF16 instructions and on GPUs the default recipe's 3 layers
were measured. A number typed with `--num-layers` is kept; on such a run, above
`SHALLOW_LAYERS`, it gets a `hint:` log line instead.
"""

from __future__ import annotations

from typing import Optional

from transformer.base.config import AUTO, ModelConfig, RunConfig
from transformer.runtime.precision import PrecisionDecision

SHALLOW_LAYERS = 2  # layers per side measured best for 30 minutes of float32 CPU training
DEEP_LAYERS = ModelConfig.num_layers  # the default recipe's, measured where training runs in bfloat16
MEASURED = "30 minutes of README's command on a 2-core AMD EPYC Zen 3, mean of 2 seeds: BLEU 24.19 with 2 layers, 16.22 with 3"


def shallow_pays(config: RunConfig, decision: PrecisionDecision) -> bool:
    """A `--time-budget` run training in float32 on a CPU without BF16 instructions."""
    facts = decision.facts
    return (facts.device == "cpu" and not facts.bf16_flags and decision.mixed_precision == "off"
            and config.train.time_budget_minutes is not None)


def resolve_depth(config: RunConfig, decision: PrecisionDecision) -> tuple[RunConfig, Optional[str]]:
    """(`config` with `model.num_layers` a number, the line to log or None), for a new run.

    `num_layers` "auto" becomes `SHALLOW_LAYERS` where `shallow_pays`, else `DEEP_LAYERS`, and
    the line says why; a typed number is kept, with a `hint:` line if it is above
    `SHALLOW_LAYERS` where `shallow_pays`.
    """
    layers, cpu = config.model.num_layers, decision.facts.cpu_model or "this CPU"
    if layers == AUTO:
        if shallow_pays(config, decision):
            return (config.replace(model={"num_layers": SHALLOW_LAYERS}),
                    f"--num-layers auto: {SHALLOW_LAYERS} ({cpu} has no BF16 instructions, so this run trains in "
                    f"float32 and sees few tokens in its budget; {MEASURED}; docs/recipes.md)")
        return (config.replace(model={"num_layers": DEEP_LAYERS}),
                f"--num-layers auto: {DEEP_LAYERS} (the default recipe's; {SHALLOW_LAYERS} only for a --time-budget "
                f"run in float32 on a CPU without BF16 instructions)")
    if layers > SHALLOW_LAYERS and shallow_pays(config, decision):
        return config, (f"hint: {cpu} has no BF16 instructions, so this run trains in float32 and sees few tokens "
                        f"in its budget; there --num-layers {SHALLOW_LAYERS} learns faster than {layers} "
                        f"({MEASURED}; docs/recipes.md)")
    return config, None
