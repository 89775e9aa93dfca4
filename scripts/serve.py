"""Serve a model over HTTP: a JSON API with dynamic batching, and a web page.

Usage and code: transformer/commands/serve.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-serve` command does.
"""

import sys

from transformer.commands.serve import main

if __name__ == "__main__":
    sys.exit(main())
