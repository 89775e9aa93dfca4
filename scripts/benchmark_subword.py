"""What subword sampling (--subword-alpha) costs the input pipeline per epoch.

Usage and code: transformer/commands/benchmark_subword.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark-subword` command does.
"""

import sys

from transformer.commands.benchmark_subword import main

if __name__ == "__main__":
    sys.exit(main())
