"""Serve a model over HTTP: a JSON API with dynamic batching, and a web page.

    python scripts/serve.py exports/bible                       # http://127.0.0.1:8000/
    python scripts/serve.py runs/bible --checkpoint best --port 8080 --max-batch 64
    curl -s localhost:8000/v1/translate -d '{"texts": ["Deus é amor."]}'
    python scripts/serve.py exports/bible --benchmark serve_benchmark.json   # load test, then exit

MODEL is a run directory or an export, loaded as transformer-translate --model loads it.
Routes: POST /v1/translate {"texts": [...]} → {"translations", "model", "elapsed_ms"};
GET /health (200 once loaded and warmed); GET /v1/model; GET / (the page). Concurrent
requests are decoded together, up to --max-batch sentences or --max-wait-ms. SIGTERM or
Ctrl-C: stop accepting, answer every accepted request, exit 0. docs/serving.md has the rest.
"""

import argparse
import os
import sys
import time
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.constants import SHARED_CORPUS_DIR
from transformer.base.errors import ConfigError, command

POSITIVE = {"max_batch": "--max-batch", "max_queue": "--max-queue", "max_texts": "--max-texts",
            "max_chars": "--max-chars", "max_body_bytes": "--max-body-bytes", "timeout": "--timeout",
            "clients": "--clients", "requests": "--requests", "rounds": "--rounds"}


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL", help="run directory or exported SavedModel")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    cli.add_checkpoint_arg(parser)
    group = parser.add_argument_group("batching and limits")
    group.add_argument("--max-batch", type=int, default=32, help="most sentences per decoder call (default 32)")
    group.add_argument("--max-wait-ms", type=float, default=5.0,
                       help="longest a request waits for others to join its batch (default 5)")
    group.add_argument("--max-queue", type=int, default=1024,
                       help="most sentences waiting; beyond it 503 with Retry-After (default 1024)")
    group.add_argument("--max-texts", type=int, default=64, help="most texts per request (default 64; more: 413)")
    group.add_argument("--max-chars", type=int, default=2000, help="most characters per text (default 2000; more: 413)")
    group.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB; more: 413)")
    group.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take (default 30; then 504)")
    bench = parser.add_argument_group("load test (--benchmark)")
    bench.add_argument("--benchmark", metavar="JSON",
                       help="instead of serving: load-test the server on 127.0.0.1 against offline batched decoding, "
                            "write this JSON report and exit")
    bench.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    bench.add_argument("--requests", type=int, default=10, help="requests per client (default 10)")
    bench.add_argument("--rounds", type=int, default=3,
                       help="rounds of offline, server, offline timings, interleaved; medians reported (default 3)")
    bench.add_argument("--sentences", default=str(SHARED_CORPUS_DIR / "validation.pt"),
                       help="the sentences requests draw from, one per line (default the shared corpus' validation.pt)")
    cli.add_decode_args(parser)
    args = parser.parse_args(argv)
    for name, flag in POSITIVE.items():
        if getattr(args, name) <= 0:
            raise ConfigError(f"{flag} must be > 0, got {getattr(args, name)}")
    if args.max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    if args.max_texts > args.max_queue:
        raise ConfigError(f"--max-texts ({args.max_texts}) must be <= --max-queue ({args.max_queue}): "
                          "a request that large could never be queued")
    cli.start()

    from transformer.serving.app import ServeLimits
    from transformer.serving.server import BatchingConfig, bind, load_model, serve

    batching = BatchingConfig(args.max_batch, args.max_wait_ms, args.max_queue)
    limits = ServeLimits(args.max_texts, args.max_chars, args.max_body_bytes, args.timeout)
    sentences = _benchmark_sentences(args.sentences) if args.benchmark else None
    sock = None if args.benchmark else bind(args.host, args.port)  # a port in use fails before the model loads
    model = load_model(args.model, cli.decode_config_from_args(args), args.checkpoint)
    if sock is not None:
        return serve(model, sock, batching, limits)

    from transformer.measure.environment import capture_environment
    from transformer.serving.loadtest import benchmark

    report = benchmark(model, sentences, args.clients, args.requests, batching=batching, limits=limits,
                       rounds=args.rounds)
    report.update({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": list(os.getloadavg()),
                   "environment": capture_environment(), "command": ["transformer-serve", *(argv or sys.argv[1:])]})
    atomic.write_json(args.benchmark, report)
    server, offline = report["server"], report["offline"]
    print(f"server: {server['sentences_per_s']:.1f} sentences/s with {args.clients} clients "
          f"({server['failed_requests']} failed, {server['wrong_translations']} differing from offline; "
          f"p95 {server['latency_ms']['p95']:.0f} ms; mean batch {server['mean_batch']:.1f})")
    print(f"offline: {offline['batched_sentences_per_s']:.1f} sentences/s in batches of {offline['batch']}, "
          f"{offline['one_call_sentences_per_s']:.1f} in one call → server/offline "
          f"{report['server_vs_offline_batched']:.2f} and {report['server_vs_offline_one_call']:.2f} "
          f"(medians of {args.rounds} rounds); report: {args.benchmark}")
    return 0


def _benchmark_sentences(path: str) -> list[str]:
    from transformer.base.errors import MissingFileError

    file = Path(path)
    if not file.is_file():
        raise MissingFileError(f"--sentences {path}: file not found", hint="give a text file, one sentence per line")
    sentences = [line for line in file.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not sentences:
        raise ConfigError(f"--sentences {path}: no sentences in the file")
    return sentences[:2000]


if __name__ == "__main__":
    sys.exit(main())
