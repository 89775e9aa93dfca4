"""What XLA costs and buys for one train step.

Usage and code: transformer/commands/benchmark_xla.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark-xla` command does.
"""

import sys

from transformer.commands.benchmark_xla import main

if __name__ == "__main__":
    sys.exit(main())
