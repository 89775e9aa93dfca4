"""Decoding speed: cached batched greedy vs the TF tutorial's batch-1 uncached loop.

    python scripts/benchmark_decoding.py --run runs/bible
    python scripts/benchmark_decoding.py --run runs/bible --no-xla --baseline-sentences 100

Trains nothing. Translates the validation split (default: the shared Bible corpus) with the
run's model twice: (1) cached, batched, length-sorted greedy decoding (transformer/inference/translator.py),
all sentences; (2) the tutorial Translator's design — one sentence at a time, the whole model
re-run on the full prefix every step — on the first --baseline-sentences sentences. Prints
and saves (JSON) both rates and the speed-up.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from transformer.base import cli
from transformer.base.config import DecodeConfig
from transformer.base.constants import SHARED_CORPUS_DIR
from transformer.base.errors import command

DEFAULT_DATA = SHARED_CORPUS_DIR


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="training run directory")
    cli.add_checkpoint_arg(parser)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help=f"directory with {{split}}.pt/.en (default {DEFAULT_DATA})")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--limit", type=int, help="use only the first N sentences for the cached side")
    parser.add_argument("--baseline-sentences", type=int, default=50,
                        help="sentences translated by the slow batch-1 uncached loop (default 50)")
    parser.add_argument("--chunk-size", type=int, default=128, help="sentences per cached batch (default 128)")
    parser.add_argument("--xla", action=argparse.BooleanOptionalAction, default=True,
                        help="XLA-compile the cached decode loop (default on)")
    parser.add_argument("--repeats", type=int, default=1, help="warm passes of the cached side (default 1)")
    parser.add_argument("--output", help="JSON report (default <run>/decoding_benchmark.json)")
    args = parser.parse_args(argv)
    cli.start()

    import tensorflow as tf

    from transformer.data.corpora import load_split
    from transformer.inference.evaluation import benchmark_decoding, save_report
    from transformer.inference.rundir import translator_from_run

    sources, references = load_split(data_dir=args.data, split=args.split, limit=args.limit)
    translator = translator_from_run(args.run, DecodeConfig(chunk_size=args.chunk_size, jit_compile=args.xla),
                                     args.checkpoint)
    started = time.perf_counter()
    report = benchmark_decoding(translator, sources, references, baseline_sentences=args.baseline_sentences,
                                repeats=args.repeats)
    report.update({
        "run": str(Path(args.run).resolve()),
        "data": f"{args.data} ({args.split})",
        "command": "python scripts/benchmark_decoding.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "tensorflow": tf.__version__,
                    "gpus": len(tf.config.list_physical_devices("GPU"))},
        "wall_time_s": round(time.perf_counter() - started, 1),
    })
    output = Path(args.output) if args.output else Path(args.run) / "decoding_benchmark.json"
    save_report(report, output)
    cached, base = report["cached_batched"]["warm"], report["uncached_batch1"]
    print(json.dumps({k: report[k] for k in ("cached_batched", "uncached_batch1", "cached_batched_on_baseline_subset",
                                             "cached_batched_unbounded_on_baseline_subset",
                                             "cached_batch1_on_baseline_subset",
                                             "identical_to_uncached_when_unbounded",
                                             "identical_to_uncached_with_bound")
                      if k in report}, indent=2))
    print(f"cached batched greedy: {cached['sentences_per_s']:.2f} sentences/s ({report['num_sentences']} sentences)")
    print(f"tutorial batch-1 uncached loop: {base['sentences_per_s']:.3f} sentences/s "
          f"(first {base['sentences']} sentences)")
    print(f"speed-up: {report['speedup']}x (cold, compilation included: {report['speedup_cold']}x; "
          f"same {base['sentences']} sentences: {report['speedup_same_subset']}x, and without the "
          f"output-length bound: {report['speedup_same_subset_unbounded']}x)")
    print(f"report: {output}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
