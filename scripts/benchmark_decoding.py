"""Decoding speed.

Usage and code: transformer/commands/benchmark_decoding.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark-decoding` command does.
"""

import sys

from transformer.commands.benchmark_decoding import main

if __name__ == "__main__":
    sys.exit(main())
