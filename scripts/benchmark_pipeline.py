"""How fast the training input pipeline makes batches.

Usage and code: transformer/commands/benchmark_pipeline.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark-pipeline` command does.
"""

import sys

from transformer.commands.benchmark_pipeline import main

if __name__ == "__main__":
    sys.exit(main())
