"""Learn the WordPiece vocabularies and save the tokenizer SavedModel, without training.

Usage and code: transformer/commands/build_tokenizers.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-build-tokenizers` command does.
"""

import sys

from transformer.commands.build_tokenizers import main

if __name__ == "__main__":
    sys.exit(main())
