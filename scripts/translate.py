"""Translate Portuguese sentences with a training run or an exported SavedModel.

Usage and code: transformer/commands/translate.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-translate` command does.
"""

import sys

from transformer.commands.translate import main

if __name__ == "__main__":
    sys.exit(main())
