"""Score a model (sacrebleu BLEU + chrF) and measure its decoding speed; writes JSON.

Usage and code: transformer/commands/evaluate.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-evaluate` command does.
"""

import sys

from transformer.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
