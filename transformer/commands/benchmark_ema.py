"""What the moving average of the weights (`--ema-decay`) costs a training step.

    python scripts/benchmark_ema.py --run runs/bible --every 1 4 --steps 20 --rounds 4 \
        --output runs/benchmark-ema.json

Builds the model of RUN's config.json (default: the default recipe's at --vocab-size pieces per
language), one copy per variant: no EMA, and an EMA updated every K steps for each --every K.
Each is compiled as training compiles it (`compile_model`; --mixed-precision, no XLA: the CPU
default) and trained on one fixed random batch of --rows × --length tokens per side (64 × 32
= the default recipe's 2,048). Variants alternate within each round (a drift of the machine's
load falls on all alike); the first round is warm-up (tracing) and dropped. The shadow update
alone (every variable once) is timed too, as training runs it (one XLA-fused function) and op by
op (three element-wise ops per variable), alternating. Reports the median step per
variant and its overhead against no EMA, to JSON and stdout.
"""

import argparse
import sys
import time
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.allocator import use_caching_allocator
from transformer.base.constants import PRECISIONS
from transformer.base.errors import command


def _median(values: list) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="training run directory whose model to build (default: the recipe's)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="pieces per language without --run")
    parser.add_argument("--mixed-precision", choices=[p for p in PRECISIONS if p != "auto"], default="bfloat16")
    parser.add_argument("--decay", type=float, default=0.999)
    parser.add_argument("--every", type=int, nargs="+", default=[1, 4], metavar="K", help="update intervals to time")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the first one warm-up (default %(default)s)")
    parser.add_argument("--output", type=Path, help="JSON report")
    args = parser.parse_args(argv)
    if min(args.every) < 1 or args.steps < 1 or args.rounds < 2 or not 0 < args.decay < 1:
        parser.error("--every values and --steps must be >= 1, --rounds >= 2 (the first is warm-up), --decay in (0, 1)")
    cli.start()
    use_caching_allocator()  # as scripts/train.py: the training steps it times run on it

    import keras
    import numpy as np
    import tensorflow as tf

    from transformer.base.config import ModelConfig, RunConfig, TrainConfig
    from transformer.measure.environment import capture_environment
    from transformer.model.ema import moving_averages, update_shadows
    from transformer.model.optimizer import compile_model
    from transformer.model.transformer import Transformer
    from transformer.runtime import artifacts
    from transformer.runtime.devices import set_precision
    from transformer.training.train_step import train_step

    model_config = (artifacts.load_run_config(args.run).model if args.run
                    else ModelConfig(src_vocab_size=args.vocab_size, tgt_vocab_size=args.vocab_size))
    policy = set_precision(args.mixed_precision, "cpu")
    rng = np.random.default_rng(0)
    src = rng.integers(4, model_config.src_vocab_size, (args.rows, args.length)).astype("int32")
    tgt = rng.integers(4, model_config.tgt_vocab_size, (args.rows, args.length + 1)).astype("int32")
    variants = {"no EMA": None, **{f"EMA every {k}": k for k in args.every}}
    models, steps_of = {}, {}
    for name, every in variants.items():
        keras.utils.set_random_seed(0)
        model = Transformer.from_model_config(model_config)
        model.build()
        train = TrainConfig(mixed_precision=args.mixed_precision, xla=False, lr_schedule="inverse-sqrt",
                            ema_decay=None if every is None else args.decay, ema_every=every or 1)
        compile_model(model, RunConfig(model=model_config, train=train))
        models[name], steps_of[name] = model, train_step(model)  # as training runs it: one trace for unknown dims
    steps = {name: [] for name in variants}
    for round_index in range(args.rounds):
        for name, step in steps_of.items():
            for _ in range(args.steps):
                start = time.perf_counter()
                step((src, tgt[:, :-1]), tgt[:, 1:])  # returns the loss: the step has finished
                if round_index:
                    steps[name].append(time.perf_counter() - start)
        print(f"round {round_index + 1}/{args.rounds}" + ("" if round_index else " (warm-up)") + ": " + ", ".join(
            f"{name} {_median(s[-args.steps:]) * 1e3:.1f} ms" for name, s in steps.items() if s), flush=True)

    pairs = moving_averages(models[f"EMA every {args.every[0]}"].optimizer)
    weight = tf.constant(1.0 - args.decay)

    def op_by_op():  # the baseline: three element-wise ops per variable (sub, mul, assign_sub)
        for variable, shadow in pairs:
            shadow.assign_sub(weight * (shadow - variable))

    updates = {"fused (the training update)": tf.function(lambda: update_shadows(
                   tf.distribute.get_strategy(), pairs, tf.constant(1, tf.int64), args.decay, 1)),
               "op by op": tf.function(op_by_op)}
    alone = {name: [] for name in updates}
    for name, update in updates.items():
        update()  # trace / compile
    for _ in range(args.steps):  # alternating, as the steps above
        for name, update in updates.items():
            start = time.perf_counter()
            update()
            _ = pairs[0][1].numpy()  # wait for the update
            alone[name].append(time.perf_counter() - start)
    base = _median(steps["no EMA"])
    results = {name: {"median_step_s": _median(s), "overhead_pct": 100 * (_median(s) / base - 1), "steps": len(s)}
               for name, s in steps.items()}
    parameters = sum(int(np.prod(v.shape)) for v, _ in pairs)
    report = dict(command=" ".join(sys.argv), model=model_config.__dict__, policy=policy, decay=args.decay,
                  batch=[args.rows, args.length], trainable_parameters=parameters,
                  shadow_variables=len(pairs), update_alone_median_s={k: _median(v) for k, v in alone.items()},
                  variants=results, environment=capture_environment())
    print(f"\n{parameters:,} parameters in {len(pairs)} variables, policy {policy}, "
          f"batch {args.rows} x {args.length}\n\n| variant | median step | vs no EMA |\n|---|---|---|")
    for name, result in results.items():
        print(f"| {name} | {result['median_step_s'] * 1e3:.1f} ms | {result['overhead_pct']:+.1f}% |")
    for name, times in alone.items():
        print(f"| the shadow update alone, {name} | {_median(times) * 1e3:.1f} ms | |")
    if args.output:
        atomic.write_json(args.output, report, default=str)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
