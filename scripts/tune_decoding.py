"""Choose decoding settings by measurement: length-penalty grid, then greedy vs beam speed.

Usage and code: transformer/commands/tune_decoding.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-tune-decoding` command does.
"""

import sys

from transformer.commands.tune_decoding import main

if __name__ == "__main__":
    sys.exit(main())
