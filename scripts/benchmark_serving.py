"""Load-test the translation service against offline decoding of the same sentences.

Usage and code: transformer/commands/benchmark_serving.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-benchmark-serving` command does.
"""

import sys

from transformer.commands.benchmark_serving import main

if __name__ == "__main__":
    sys.exit(main())
