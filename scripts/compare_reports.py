"""Compare step-time reports.

Usage and code: transformer/commands/compare_reports.py (`--help`). Runs the installed package
(`pip install -e .`, README.md "Set-up"), as the `transformer-compare-reports` command does.
"""

import sys

from transformer.commands.compare_reports import main

if __name__ == "__main__":
    sys.exit(main())
