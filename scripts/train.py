"""Train the pt→en Transformer.

Usage and code: transformer/commands/train.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-train` command does.
"""

import sys

from transformer.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
