"""Benchmark matrix.

Usage and code: transformer/commands/benchmark.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark` command does.
"""

import sys

from transformer.commands.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
