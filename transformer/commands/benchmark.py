"""Benchmark matrix: short trainings per lever, one step-time report per cell, one table.

    python scripts/benchmark.py --data ../shared/data/bible-pt-en --steps 30 \
        --pipelines naive optimized --precisions off bfloat16 --xla off on \
        --naive-batches 64 --token-batches 8192 --output runs/benchmark

Every cell trains the same model on the same data for --steps steps in its own process
(`scripts/train.py`), so the table compares like with like. The first cell is the baseline
for speed-ups: put `naive` first to compare against the TF tutorial's pipeline. Writes
<output>/<cell>/report.json, <output>/comparison.md, <output>/sweep.md (tokens/s and utilisation
against batch and width) and <output>/comparison.png (tokens/s and step time per step). One
cell is enough. Extra flags after `--` go to scripts/train.py unchanged (e.g. `-- --num-layers
2`); the cells' batch and width flags override them. `-- --preset tutorial` benchmarks the TF
tutorial's model. How cost grows with model width and batch (dff = 4·width):

    python scripts/benchmark.py --data ../shared/data/bible-pt-en --steps 20 --pipelines optimized \
        --precisions auto --d-models 128 256 512 --token-batches 2048 8192 --output runs/sweep
"""

import argparse
import sys
from pathlib import Path

from transformer.base import cli
from transformer.base.cli import XLA_CHOICES
from transformer.base.constants import DEVICES, PIPELINE_KINDS, PRECISIONS, XLA_MODES
from transformer.base.errors import command
from transformer.measure.benchmark import make_cells, run_matrix


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="local corpus directory (default: the TFDS dataset of scripts/train.py)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per cell (default %(default)s)")
    parser.add_argument("--pipelines", nargs="+", default=["naive", "optimized"], choices=PIPELINE_KINDS)
    parser.add_argument("--precisions", nargs="+", default=["off"], choices=PRECISIONS,
                        help="--mixed-precision per cell (auto: what scripts/train.py decides by default)")
    parser.add_argument("--xla", nargs="+", default=["off"], choices=XLA_MODES)
    parser.add_argument("--naive-batches", nargs="+", type=int, default=[64], help="sentences per batch (naive)")
    parser.add_argument("--token-batches", nargs="+", type=int, default=[8192],
                        help="padded tokens per batch per side (optimized)")
    parser.add_argument("--d-models", nargs="+", type=int, default=[None], metavar="D",
                        help="model widths to sweep: --d-model D --dff 4·D (default: the model flags)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--timeout", type=float, help="seconds allowed per cell")
    parser.add_argument("--output", type=Path, default=Path("runs/benchmark"))
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then extra scripts/train.py flags")
    args = parser.parse_args(argv)
    cli.start()

    extra = [a for a in args.train_args if a != "--"]
    common = ["--steps-per-epoch", str(args.steps), "--validation-steps", "1", "--device", args.device, *extra]
    if args.data:
        common = ["--data", args.data, *common]
    cells = make_cells(args.pipelines, args.precisions, [XLA_CHOICES[x] for x in args.xla],
                       args.naive_batches, args.token_batches, args.d_models)
    print(f"{len(cells)} cells × {args.steps} steps → {args.output}", flush=True)
    table = run_matrix(cells, args.output, common, args.timeout)
    print(table)
    print(f"\nwrote {args.output / 'comparison.md'}, {args.output / 'sweep.md'} and {args.output / 'comparison.png'}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
