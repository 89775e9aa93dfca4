"""What the moving average of the weights (--ema-decay) costs a training step.

Usage and code: transformer/commands/benchmark_ema.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark-ema` command does.
"""

import sys

from transformer.commands.benchmark_ema import main

if __name__ == "__main__":
    sys.exit(main())
