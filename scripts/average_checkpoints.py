"""Average the model weights of a run's last N checkpoints into <run>/averaged/.

Usage and code: transformer/commands/average_checkpoints.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-average-checkpoints` command does.
"""

import sys

from transformer.commands.average_checkpoints import main

if __name__ == "__main__":
    sys.exit(main())
