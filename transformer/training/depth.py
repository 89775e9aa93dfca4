"""How many layers a new run gets: `--num-layers auto` (the default recipe's), decided for the machine.

Two rules, from measurements in docs/recipes.md ("Depth for the tokens a budget buys"), both for
a time-budgeted run on a CPU, where 30 minutes buy few passes over the corpus and a post-norm
model of 3 layers per side learns more slowly per token than one of 2:

* training in float32 on a CPU without BF16 instructions: `SHALLOW_LAYERS` (no probe needed:
  such a CPU trains ~1,800-2,500 target tokens/s, under two passes in 30 minutes);
* any other CPU run on the optimized pipeline: a short timed step of the `DEEP_LAYERS` model
  (`predict_tokens`, transformer/training/batch_probe.py `budget_tokens`) predicts the real
  target tokens it would see in the budget; under `SHALLOW_BELOW_TOKENS`, `SHALLOW_LAYERS`.

Every other run (no budget, a GPU, the naive pipeline) gets `DEEP_LAYERS`. A number typed with
`--num-layers` is kept (no probe); above `SHALLOW_LAYERS` on a float32 run on a CPU without BF16
it gets a `hint:` log line instead.
"""

from __future__ import annotations

from typing import Callable, Optional

from transformer.base.config import AUTO, ModelConfig, RunConfig
from transformer.runtime.precision import PrecisionDecision

SHALLOW_LAYERS = 2  # layers per side measured best for 30 minutes of CPU training
DEEP_LAYERS = ModelConfig.num_layers  # the default recipe's, measured where a budget buys many tokens
MEASURED = "30 minutes of README's command on a 2-core AMD EPYC Zen 3, mean of 2 seeds: BLEU 24.19 with 2 layers, 16.22 with 3"
# Real target tokens a DEEP_LAYERS run would see in its budget, below which SHALLOW_LAYERS pays.
# Measured (docs/recipes.md): 2 layers won at 3.1 M (Zen 3, float32) and 7.5 M (Zen 4, bfloat16) of
# the 3-layer model's tokens, on the same machine; and 2 layers after 19 M tokens (60 minutes, Zen 4)
# scored above 3 layers after 26 M (60 minutes, Zen 5). The line sits just above 26 M; above it (a GPU,
# a CPU over hours) 3 layers stay, not measured against 2.
SHALLOW_BELOW_TOKENS = 30e6
MEASURED_BF16 = ("30 minutes of README's command on a 2-core AMD EPYC Zen 4 (bfloat16), same day: "
                 "BLEU 31.09 with 2 layers (3 seeds), 26.85 with 3 (2 seeds); 60 minutes: 33.10 with 2 layers "
                 "after 19 M tokens (Zen 4), 32.54 with 3 after 26 M (Zen 5)")


def shallow_pays(config: RunConfig, decision: PrecisionDecision) -> bool:
    """A `--time-budget` run training in float32 on a CPU without BF16 instructions."""
    facts = decision.facts
    return (facts.device == "cpu" and not facts.bf16_flags and decision.mixed_precision == "off"
            and config.train.time_budget_minutes is not None)


def probe_decides(config: RunConfig, decision: PrecisionDecision) -> bool:
    """A `--time-budget` run on a CPU, optimized pipeline, not covered by `shallow_pays`: time a step."""
    return (decision.facts.device == "cpu" and config.train.time_budget_minutes is not None
            and config.pipeline.kind == "optimized" and not shallow_pays(config, decision))


def resolve_depth(config: RunConfig, decision: PrecisionDecision,
                  predict_tokens: Optional[Callable[[], float]] = None) -> tuple[RunConfig, Optional[str]]:
    """(`config` with `model.num_layers` a number, the line to log or None), for a new run.

    `num_layers` "auto" becomes `SHALLOW_LAYERS` where `shallow_pays`, or where `probe_decides`
    and `predict_tokens()` (real target tokens a `DEEP_LAYERS` model would see in the budget;
    called only then) is under `SHALLOW_BELOW_TOKENS`; else `DEEP_LAYERS`. The line says why. A
    typed number is kept, with a `hint:` line if it is above `SHALLOW_LAYERS` where `shallow_pays`.
    """
    layers, cpu = config.model.num_layers, decision.facts.cpu_model or "this CPU"
    if layers == AUTO:
        if shallow_pays(config, decision):
            return (config.replace(model={"num_layers": SHALLOW_LAYERS}),
                    f"--num-layers auto: {SHALLOW_LAYERS} ({cpu} has no BF16 instructions, so this run trains in "
                    f"float32 and sees few tokens in its budget; {MEASURED}; docs/recipes.md)")
        if predict_tokens is not None and probe_decides(config, decision):
            tokens = predict_tokens()
            budget = f"{config.train.time_budget_minutes:g}-minute"
            if tokens < SHALLOW_BELOW_TOKENS:
                return (config.replace(model={"num_layers": SHALLOW_LAYERS}),
                        f"--num-layers auto: {SHALLOW_LAYERS} (a timed step says {DEEP_LAYERS} layers would see "
                        f"~{tokens / 1e6:.1f} M target tokens in this {budget} budget on {cpu}, under "
                        f"{SHALLOW_BELOW_TOKENS / 1e6:g} M, where 2 layers learn more; "
                        f"{MEASURED_BF16}; docs/recipes.md)")
            return (config.replace(model={"num_layers": DEEP_LAYERS}),
                    f"--num-layers auto: {DEEP_LAYERS} (a timed step says {DEEP_LAYERS} layers see ~{tokens / 1e6:.1f} M "
                    f"target tokens in this {budget} budget on {cpu}: {SHALLOW_LAYERS} only under "
                    f"{SHALLOW_BELOW_TOKENS / 1e6:g} M)")
        return (config.replace(model={"num_layers": DEEP_LAYERS}),
                f"--num-layers auto: {DEEP_LAYERS} (the default recipe's; {SHALLOW_LAYERS} only for a --time-budget "
                f"run on a CPU that sees under {SHALLOW_BELOW_TOKENS / 1e6:g} M target tokens in it)")
    if layers > SHALLOW_LAYERS and shallow_pays(config, decision):
        return config, (f"hint: {cpu} has no BF16 instructions, so this run trains in float32 and sees few tokens "
                        f"in its budget; there --num-layers {SHALLOW_LAYERS} learns faster than {layers} "
                        f"({MEASURED}; docs/recipes.md)")
    return config, None
