"""Compare step-time reports: prints a Markdown table, optionally saves it and a PNG plot.

Usage:
    python scripts/compare_reports.py runs/a/report.json runs/b/report.json \
        [--plot compare.png] [--markdown compare.md] [--threshold 10]

Speed-ups are relative to the first report. See transformer/measure/compare.py.
"""

import argparse
import sys
from pathlib import Path

from transformer.base import cli
from transformer.base.errors import command
from transformer.measure import compare


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", type=Path, help="report JSON files; the first is the baseline")
    parser.add_argument("--plot", type=Path, help="save a PNG of tokens/s and step time vs step here")
    parser.add_argument("--markdown", type=Path, help="save the Markdown table here")
    parser.add_argument(
        "--threshold",
        type=float,
        default=compare.DEFAULT_THRESHOLD_PCT,
        help="data-wait share (%% of step time) above which a run is input-bound (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    cli.start()
    if len(args.reports) < 2:
        parser.error("give at least 2 reports")
    table = compare.compare(args.reports, plot=args.plot, markdown=args.markdown, threshold_pct=args.threshold)
    print(table)
    return 0



if __name__ == "__main__":
    sys.exit(main())
