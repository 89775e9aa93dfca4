"""Average the model weights of a run's last N checkpoints into <run>/averaged/.

    python scripts/average_checkpoints.py runs/bible --last 5
    python scripts/evaluate.py --model runs/bible --checkpoint averaged --data ../shared/data/bible-pt-en --split validation

Keep enough checkpoints while training (--keep-checkpoints, --checkpoint-every-steps).
"""

import argparse
import sys

from transformer.base import cli
from transformer.base.errors import command


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="training run directory (config.json, checkpoints/)")
    parser.add_argument("--last", type=int, default=5, help="how many of the latest checkpoints (default 5)")
    args = parser.parse_args(argv)
    cli.start()
    from transformer.inference.rundir import average_checkpoints

    prefix = average_checkpoints(args.run, args.last)
    print(f"averaged checkpoint: {prefix}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
