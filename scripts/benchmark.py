"""Benchmark matrix: short trainings per lever, one step-time report per cell, one table.

    python scripts/benchmark.py --data ../shared/data/bible-pt-en --steps 30 \
        --pipelines naive optimized --precisions off bfloat16 --xla off on \
        --naive-batches 64 --token-batches 8192 --output runs/benchmark

Every cell trains the same model on the same data for --steps steps in its own process
(`scripts/train.py`), so the table compares like with like. The first cell is the baseline
for speed-ups: put `naive` first to compare against the TF tutorial's pipeline. Writes
<output>/<cell>/report.json, <output>/comparison.md and <output>/comparison.png.
Extra flags after `--` go to scripts/train.py unchanged (e.g. `-- --num-layers 2`); the cells'
batch flags override them. `-- --preset tutorial` benchmarks the TF tutorial's model.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformer.benchmark import make_cells, run_matrix  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="local corpus directory (default: the TFDS dataset of scripts/train.py)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per cell (default %(default)s)")
    parser.add_argument("--pipelines", nargs="+", default=["naive", "optimized"], choices=["naive", "optimized"])
    parser.add_argument("--precisions", nargs="+", default=["off"], choices=["off", "bfloat16", "float16"])
    parser.add_argument("--xla", nargs="+", default=["off"], choices=["off", "on"])
    parser.add_argument("--naive-batches", nargs="+", type=int, default=[64], help="sentences per batch (naive)")
    parser.add_argument("--token-batches", nargs="+", type=int, default=[8192],
                        help="padded tokens per batch per side (optimized)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    parser.add_argument("--timeout", type=float, help="seconds allowed per cell")
    parser.add_argument("--output", type=Path, default=Path("runs/benchmark"))
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then extra scripts/train.py flags")
    args = parser.parse_args(argv)

    extra = [a for a in args.train_args if a != "--"]
    common = ["--steps-per-epoch", str(args.steps), "--validation-steps", "1", "--device", args.device, *extra]
    if args.data:
        common = ["--data", args.data, *common]
    cells = make_cells(args.pipelines, args.precisions, [x == "on" for x in args.xla],
                       args.naive_batches, args.token_batches)
    print(f"{len(cells)} cells × {args.steps} steps → {args.output}", flush=True)
    try:
        table = run_matrix(cells, args.output, common, args.timeout)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(table)
    print(f"\nwrote {args.output / 'comparison.md'} and {args.output / 'comparison.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
