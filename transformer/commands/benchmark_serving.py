"""Load-test the translation service against offline decoding of the same sentences.

    python scripts/benchmark_serving.py exports/bible                   # concurrency 1 4 16 64
    python scripts/benchmark_serving.py exports/bible --concurrency 16 --rounds 3 --output serve.json

Starts `transformer-serve`'s server on 127.0.0.1 in this process and sends the same --requests
requests (1 to --max-texts-per-request sentences each, drawn with a fixed seed from
--sentences) at each --concurrency level: C clients, one keep-alive connection each, sending
their share one after another. In the same run it translates those sentences offline as
`transformer-translate --file` does (the model sorts them by length and decodes chunks of its
chunk_size, which is the server's default --max-batch). Per level: sentences/s and its ratio to
offline, p50/p95/p99 latency, failed requests, responses that differ from the offline
translation of their own input. The JSON report names the machine, load and date.
"""

import argparse
import os
import sys
import time
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.constants import SHARED_CORPUS_DIR
from transformer.base.errors import ConfigError, MissingFileError, command
from transformer.runtime.onednn import configure_onednn


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL", help="run directory, SavedModel export or CTranslate2 export")
    cli.add_checkpoint_arg(parser)
    parser.add_argument("--output", default="serving_benchmark.json", help="JSON report (default serving_benchmark.json)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="concurrent clients, one level after another (default 1 4 16 64)")
    parser.add_argument("--requests", type=int, default=192, help="requests sent at each level (default 192)")
    parser.add_argument("--max-texts-per-request", type=int, default=4, help="sentences per request: 1 to N (default 4)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of offline + every level, back to back; medians reported (default 1)")
    parser.add_argument("--sentences", default=str(SHARED_CORPUS_DIR / "validation.pt"),
                        help="the sentences requests draw from, one per line (default the shared corpus' validation.pt)")
    cli.add_batching_args(parser)
    cli.add_decode_args(parser)
    cli.add_thread_args(parser)
    cli.add_compute_type_arg(parser)
    args = parser.parse_args(argv)
    cli.check_thread_args(args)
    for flag in ("requests", "max_texts_per_request", "rounds"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if min(args.concurrency) <= 0:
        raise ConfigError(f"--concurrency must be > 0, got {min(args.concurrency)}")
    cli.check_batching_args(args)
    cli.start()
    configure_onednn(args.onednn, cli.model_dtype(args.model))  # before TensorFlow loads
    sentences = _sentences(args.sentences)

    from transformer.measure.environment import capture_environment
    from transformer.serving.app import ServeLimits
    from transformer.serving.loadtest import benchmark
    from transformer.serving.server import BatchingConfig, load_for_serving

    batching = BatchingConfig(args.max_batch, args.max_wait_ms, mode=args.batching, streams=args.decoder_streams)
    model, batching, threads = load_for_serving(args.model, cli.decode_config_from_args(args), args.checkpoint,
                                                batching, intra_op=args.intra_op_threads,
                                                inter_op=args.inter_op_threads,
                                                compute_type=args.compute_type)
    limits = ServeLimits(max_texts=max(args.max_texts_per_request, ServeLimits.max_texts))
    report = benchmark(model, sentences, args.concurrency, args.requests, args.max_texts_per_request,
                       batching=batching, limits=limits, rounds=args.rounds)
    report.update({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": list(os.getloadavg()),
                   "threads": threads.to_dict(),
                   "environment": capture_environment(),
                   "command": ["transformer-benchmark-serving", *(sys.argv[1:] if argv is None else argv)]})
    atomic.write_json(args.output, report)
    offline = report["offline"]
    print(f"offline: {offline['sentences_per_s']:.1f} sentences/s ({report['sentences']} sentences, "
          f"chunks of {offline['chunk_size']}); server --max-batch {batching.max_batch}, {report['batching']['used']} batching, "
          f"{batching.streams} decoder stream(s), TensorFlow {threads.describe()}:")
    for level in report["levels"]:
        latency = level["latency_ms"]
        print(f"  {level['clients']:3d} clients: {level['sentences_per_s']:6.1f} sentences/s = "
              f"{level['vs_offline']:.2f}x offline; p50/p95/p99 {latency['p50']:.0f}/{latency['p95']:.0f}/"
              f"{latency['p99']:.0f} ms; {level['failed_requests']} failed, {level['wrong_translations']} differing "
              f"from offline; decoder busy {level['decoder_busy']:.0%}; "
              + (f"{level['rows_per_step']:.1f} rows per step" if level["rows_per_step"]
                 else f"mean batch {level['mean_batch']:.1f}, {level['split_runs']} runs shared with an idle thread"))
    print(f"report: {args.output}")
    return 0


def _sentences(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise MissingFileError(f"--sentences {path}: file not found", hint="give a text file, one sentence per line")
    sentences = [line for line in file.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not sentences:
        raise ConfigError(f"--sentences {path}: no sentences in the file")
    return sentences


if __name__ == "__main__":
    sys.exit(main())
