"""Export a trained run as a self-contained SavedModel (tokenizers inside).

Usage and code: transformer/commands/export.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-export` command does.
"""

import sys

from transformer.commands.export import main

if __name__ == "__main__":
    sys.exit(main())
