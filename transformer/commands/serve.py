"""Serve a model over HTTP: a JSON API with dynamic batching, and a web page.

    python scripts/serve.py exports/bible                       # http://127.0.0.1:8000/
    python scripts/serve.py runs/bible --checkpoint best --port 8080 --max-batch 64
    curl -s localhost:8000/v1/translate -d '{"texts": ["Deus é amor."]}'

MODEL is a run directory or an export (SavedModel, or CTranslate2 with --compute-type),
loaded as transformer-translate --model loads it.
Routes: POST /v1/translate {"texts": [...]} → {"translations", "model", "elapsed_ms"};
GET /health (200 once loaded and warmed); GET /v1/model; GET / (the page). Concurrent
requests are decoded together, up to --max-batch sentences or --max-wait-ms. SIGTERM or
Ctrl-C: stop accepting, answer every accepted request, exit 0. Load test:
scripts/benchmark_serving.py. docs/serving.md has the rest.
"""

import argparse
import sys

from transformer.base import cli
from transformer.base.errors import ConfigError, command
from transformer.runtime.onednn import configure_onednn

POSITIVE = {"max_queue": "--max-queue", "max_texts": "--max-texts", "max_chars": "--max-chars",
            "max_body_bytes": "--max-body-bytes", "timeout": "--timeout"}


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL", help="run directory, SavedModel export or CTranslate2 export")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    cli.add_checkpoint_arg(parser)
    group = parser.add_argument_group("batching and limits")
    cli.add_batching_args(group)
    group.add_argument("--max-queue", type=int, default=1024,
                       help="most sentences waiting; beyond it 503 with Retry-After (default 1024)")
    group.add_argument("--max-texts", type=int, default=64, help="most texts per request (default 64; more: 413)")
    group.add_argument("--max-chars", type=int, default=2000, help="most characters per text (default 2000; more: 413)")
    group.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB; more: 413)")
    group.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take (default 30; then 504)")
    cli.add_decode_args(parser)
    cli.add_thread_args(parser)
    cli.add_compute_type_arg(parser)
    args = parser.parse_args(argv)
    cli.check_thread_args(args)
    for name, flag in POSITIVE.items():
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise ConfigError(f"{flag} must be > 0, got {getattr(args, name)}")
    cli.check_batching_args(args)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    if args.max_texts > args.max_queue:
        raise ConfigError(f"--max-texts ({args.max_texts}) must be <= --max-queue ({args.max_queue}): "
                          "a request that large could never be queued")
    cli.start()
    configure_onednn(args.onednn, cli.model_dtype(args.model))  # before TensorFlow loads

    from transformer.serving.app import ServeLimits
    from transformer.serving.server import BatchingConfig, bind, load_for_serving, serve

    batching = BatchingConfig(args.max_batch, args.max_wait_ms, args.max_queue, args.batching, args.decoder_streams)
    limits = ServeLimits(args.max_texts, args.max_chars, args.max_body_bytes, args.timeout)
    sock = bind(args.host, args.port)  # a port in use fails before the model loads
    model, batching, _ = load_for_serving(args.model, cli.decode_config_from_args(args), args.checkpoint, batching,
                                          intra_op=args.intra_op_threads, inter_op=args.inter_op_threads,
                                          compute_type=args.compute_type)
    return serve(model, sock, batching, limits)


if __name__ == "__main__":
    sys.exit(main())
