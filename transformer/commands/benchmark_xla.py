"""What XLA costs and buys for one train step: compile seconds per batch shape, then the steady step.

    python scripts/benchmark_xla.py --tokens 16384 --lengths 64 32 --output runs/xla-gpu.json

Builds the default recipe's model (or RUN's, `--run`), compiled as training compiles it
(`compile_model`: policy, FusedAdam, `jit_compile`), once without XLA and once with it, and
trains each on fixed random batches of `--tokens` tokens per side at each `--length` (`[tokens
// length, length]`, every position a token), through training's step (one trace for unknown
dims, `trace_s`). Per cell: the first step (with XLA the compilation of that shape), the
second, and the median and minimum of `--steps` more; target tokens/s = rows × length ÷ median
step. With XLA, `$XLA_FLAGS` gets training's GPU flags (`transformer/runtime/xla_flags.py`)
unless `--xla-flags xla` keeps XLA's own; XLA reads the variable once per process, so compare
flag settings in separate processes. Precision: bfloat16 on a GPU, float32 on a CPU, unless
`--mixed-precision` says otherwise. Writes JSON and a table.
"""

import argparse
import sys
import time
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.allocator import use_caching_allocator
from transformer.base.constants import PRECISIONS
from transformer.base.errors import command


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="training run directory whose model to build (default: the recipe's)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="pieces per language without --run")
    parser.add_argument("--num-layers", type=int, default=3, help="layers per side without --run")
    parser.add_argument("--mixed-precision", choices=[p for p in PRECISIONS if p != "auto"],
                        help="default: bfloat16 on a GPU, off on a CPU")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384], help="tokens per batch per side")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 32], help="padded lengths (one XLA program each)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell")
    parser.add_argument("--xla", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--xla-flags", choices=["training", "xla"], default="training",
                        help="with XLA: training's GPU flags (default) or XLA's own")
    parser.add_argument("--output", type=Path, help="JSON report")
    args = parser.parse_args(argv)
    if args.steps < 1 or min(args.tokens) < 1 or min(args.lengths) < 1 or args.num_layers < 1:
        parser.error("--steps, --tokens, --lengths and --num-layers must be >= 1")
    cli.start()
    use_caching_allocator()  # as scripts/train.py
    if "on" in args.xla and args.xla_flags == "training":
        from transformer.runtime.xla_flags import enable_fast_gpu_compile

        enable_fast_gpu_compile()  # before TensorFlow's first XLA program

    import os

    import keras
    import tensorflow as tf

    from transformer.base.config import ModelConfig, RunConfig
    from transformer.measure.environment import capture_environment
    from transformer.model.optimizer import compile_model
    from transformer.model.transformer import Transformer
    from transformer.runtime import artifacts
    from transformer.runtime.devices import set_precision
    from transformer.runtime.xla_flags import XLA_FLAGS_ENV
    from transformer.training.train_step import train_step

    device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"  # memory growth: cli.start()
    model_config = (artifacts.load_run_config(args.run).model if args.run else
                    ModelConfig(num_layers=args.num_layers, src_vocab_size=args.vocab_size,
                                tgt_vocab_size=args.vocab_size))
    mode = args.mixed_precision or ("bfloat16" if device == "gpu" else "off")
    policy = set_precision(mode, device)
    cells = []
    for xla in args.xla:
        keras.utils.set_random_seed(0)
        model = Transformer.from_model_config(model_config)
        model.build()
        compile_model(model, RunConfig(model=model_config).replace(train={"xla": xla == "on", "mixed_precision": mode}),
                      schedule=1e-4)
        start = time.perf_counter()
        step = train_step(model)  # as training runs it: one trace for unknown dims, one XLA program per shape
        trace_s = time.perf_counter() - start
        for tokens in args.tokens:
            for length in args.lengths:
                rows = max(1, tokens // length)
                src = tf.random.uniform([rows, length], 4, model_config.src_vocab_size, tf.int32)
                tgt = tf.random.uniform([rows, length + 1], 4, model_config.tgt_vocab_size, tf.int32)
                inputs, labels = (src, tgt[:, :-1]), tgt[:, 1:]
                times = []
                for _ in range(args.steps + 2):
                    start = time.perf_counter()
                    step(inputs, labels)  # returns the loss: the step has finished
                    times.append(time.perf_counter() - start)
                steady = sorted(times[2:])
                median = steady[len(steady) // 2]
                cell = {"xla": xla, "tokens": tokens, "rows": rows, "length": length, "trace_s": trace_s,
                        "first_step_s": times[0], "second_step_s": times[1], "median_step_s": median,
                        "min_step_s": steady[0], "tgt_tokens_per_s": rows * length / median}
                cells.append(cell)
                print(f"XLA {xla}, [{rows}, {length}]: first step {times[0]:.2f} s, median {median * 1e3:.2f} ms, "
                      f"{cell['tgt_tokens_per_s']:,.0f} target tokens/s", flush=True)
        del model
        keras.backend.clear_session()
    report = dict(command=" ".join(sys.argv), device=device, policy=policy, xla_flags=os.environ.get(XLA_FLAGS_ENV),
                  model=model_config.__dict__, cells=cells, environment=capture_environment())
    print(f"\npolicy {policy}, $XLA_FLAGS {report['xla_flags'] or '(none)'}\n\n"
          "| XLA | batch | first step | median step | target tokens/s |\n|---|---|---|---|---|")
    for c in cells:
        print(f"| {c['xla']} | [{c['rows']}, {c['length']}] | {c['first_step_s']:.2f} s | "
              f"{c['median_step_s'] * 1e3:.2f} ms | {c['tgt_tokens_per_s']:,.0f} |")
    if args.output:
        atomic.write_json(args.output, report, default=str)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
