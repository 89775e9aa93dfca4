"""Loading the model for serving, and running the server (uvicorn) in the foreground or a thread.

    model = load_model("exports/bible")           # run directory or export, as transformer-translate
    serve(model, bind("127.0.0.1", 8000))         # blocks; SIGTERM/SIGINT stop it gracefully
    with ServerThread(model) as server: ...       # tests and the load test: server.url

A graceful stop closes the listening socket (new connections are refused), lets every
request already accepted finish (its batch is decoded), then returns: the process exits 0.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from transformer.base.config import DecodeConfig
from transformer.base.errors import ConfigError, InputError
from transformer.runtime.threads import configure_threads, decoding_threads
from transformer.serving.app import ServeLimits, build_app
from transformer.serving.batching import DynamicBatcher, StepBatcher

WARMUP = ("Olá.", "No princípio, Deus criou os céus e a terra.", "")


@dataclass
class ServedModel:
    """What the server needs of a model: `translate` (list → list of str), its description, and
    `engine` (None, or a callable making a step-level decoder for `StepBatcher`: greedy without XLA)."""

    translate: Callable[[list], list]
    info: dict = field(default_factory=dict)
    engine: Optional[Callable[[], object]] = None


def load_model(path: str | Path, decode: DecodeConfig = DecodeConfig(), checkpoint: str = "latest",
               compute_type: Optional[str] = None) -> ServedModel:
    """A run directory or an export (SavedModel or CTranslate2, in `compute_type`), loaded as
    `transformer-translate --model` loads it."""
    from transformer.inference.ctranslate2_export import CTranslate2Translator
    from transformer.inference.export import ExportedTranslator, open_translator

    translator = open_translator(path, decode, checkpoint, compute_type)
    path = Path(path)
    if isinstance(translator, CTranslate2Translator):
        manifest = translator.manifest
        info = {"kind": "ctranslate2", "model_config": manifest.get("model", {}), "decode": translator.config.to_dict(),
                "created": manifest.get("created"), "precision": translator.compute_type,
                "ctranslate2": manifest.get("ctranslate2"), "threads": translator.threads}
    elif isinstance(translator, ExportedTranslator):
        manifest = translator.manifest
        dtypes = sorted({v.dtype.name for v in translator.serving.variables if v.dtype.is_floating})
        info = {"kind": "export", "model_config": manifest.get("model", {}), "decode": manifest.get("decode", {}),
                "created": manifest.get("created"), "precision": manifest.get("precision", "/".join(dtypes) or "unknown"),
                "tensorflow": manifest.get("tensorflow")}
    else:
        config = translator.model.config
        created = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime((path / "config.json").stat().st_mtime))
        info = {"kind": "run", "checkpoint": checkpoint,
                "model_config": {k: getattr(config, k) for k in config.__dataclass_fields__},
                "decode": translator.config.to_dict(), "created": created,
                "precision": translator.model.dtype_policy.name}
    decoding = info["decode"]  # what the model decodes with: the export's own settings, or the flags'
    steppable = (decoding.get("beam_size", 1) == 1 and not decoding.get("jit_compile", False)
                 and info["kind"] != "ctranslate2")
    engine = _continuous_decoders(translator) if steppable else None
    model_config = info["model_config"]
    info = {"name": path.resolve().name, "path": str(path.resolve()), **info,
            "vocabulary": {"source": model_config.get("src_vocab_size"), "target": model_config.get("tgt_vocab_size")}}
    return ServedModel(translator.translate, info, engine)


def _continuous_decoders(translator) -> Callable[[], object]:
    """A maker of `ContinuousDecoder`s over `translator` (a `Translator`, or an export whose weights
    are rebuilt into one once, shared by every decoder it makes)."""
    from transformer.inference.export import ExportedTranslator
    from transformer.inference.stepping import ContinuousDecoder, translator_from_saved

    @functools.cache
    def steppable():
        if isinstance(translator, ExportedTranslator):
            return translator_from_saved(translator.module, translator.manifest)
        return translator

    return lambda: ContinuousDecoder(steppable())


@dataclass(frozen=True)
class BatchingConfig:
    """How requests are gathered into decoder calls (see transformer/serving/batching.py).

    max_batch None: the model's `chunk_size`, the batch the offline translator decodes.
    mode "step": sentences join and leave a running decode between steps (`StepBatcher`; greedy
    models without XLA, others fall back to "run"); "run": length-sorted runs of the waiting
    sentences, each decoded to its end in one translator call (`DynamicBatcher`).
    streams: translator calls at once with "run" (None: `DEFAULT_DECODER_STREAMS`); with "step",
    running batches, one thread each (None: 1).
    """

    max_batch: Optional[int] = None
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    mode: str = "run"
    streams: Optional[int] = None

    def __post_init__(self):
        if self.mode not in BATCHING_MODES:
            raise ValueError(f"batching mode must be one of {', '.join(BATCHING_MODES)}, got {self.mode!r}")
        if self.streams is not None and self.streams < 1:
            raise ValueError(f"decoder streams must be >= 1, got {self.streams}")

    def planned_streams(self) -> int:
        """Decoder calls at once as `resolve` sets them for a model that can step (known before loading)."""
        return self.streams or (1 if self.mode == "step" else DEFAULT_DECODER_STREAMS)

    def threads(self, path: str | Path, decode: DecodeConfig = DecodeConfig(), *, intra_op: Optional[int] = None,
                inter_op: Optional[int] = None):
        """TensorFlow's pools for serving `path` (`runtime.threads.decoding_threads`; set them before loading).

        Run batching: one loop per decoder call or per stream of the export, whichever is more, so
        kernels run inline (intra-op 1 on 2 cores) and the calls fill the cores. Step batching: one
        loop per running batch (one batch: TensorFlow's defaults, its ops split over the cores).
        """
        from transformer.inference.export import decode_config_of

        loops = self.planned_streams() if self.mode == "step" else max(self.planned_streams(),
                                                                        decode_config_of(path, decode).streams)
        return decoding_threads(loops, intra_op=intra_op, inter_op=inter_op)

    def resolve(self, model: ServedModel) -> "BatchingConfig":
        """This config with `max_batch` (the model's chunk_size where None), `mode` (run where the
        model has no step engine) and `streams` set."""
        mode = self.mode if model.engine is not None else "run"
        return replace(self, mode=mode, streams=replace(self, mode=mode).planned_streams(),
                       max_batch=self.max_batch or int(model.info.get("decode", {}).get("chunk_size")
                                                       or DEFAULT_MAX_BATCH))


DEFAULT_MAX_BATCH = 32  # for an export without a decode config
DEFAULT_DECODER_STREAMS = 2  # with intra-op 1: 16 clients 1.26x one call's sentences/s (docs/serving.md)
BATCHING_MODES = ("step", "run")


def load_for_serving(path: str | Path, decode: DecodeConfig, checkpoint: str, batching: BatchingConfig, *,
                     intra_op: Optional[int] = None, inter_op: Optional[int] = None,
                     compute_type: Optional[str] = None):
    """(model, resolved batching, thread pools in effect): sets TensorFlow's pools for `batching`
    (`BatchingConfig.threads`, flags `intra_op` / `inter_op` win), then loads `path` (`compute_type`:
    a CTranslate2 export's) and resolves `batching` against it; decoder streams the model cannot
    take are a ConfigError naming the flag."""
    threads = configure_threads(batching.threads(path, decode, intra_op=intra_op, inter_op=inter_op))
    model = load_model(path, decode, checkpoint, compute_type)
    try:
        return model, batching.resolve(model), threads
    except ValueError as err:
        raise ConfigError(f"--decoder-streams {batching.streams}: {err}") from err


def make_app(model: ServedModel, batching: BatchingConfig = BatchingConfig(), limits: ServeLimits = ServeLimits()):
    """(Starlette app, its DynamicBatcher) for `model`."""
    batching = batching.resolve(model)
    if batching.mode == "step":
        batcher = StepBatcher([model.engine() for _ in range(batching.streams)], batching.max_batch,
                              batching.max_wait_ms, batching.max_queue)
    else:
        batcher = DynamicBatcher(model.translate, batching.max_batch, batching.max_wait_ms, batching.max_queue,
                                 batching.streams)
    return build_app(batcher, model.info, limits, warmup=WARMUP), batcher


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), or an InputError naming --host/--port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise InputError(f"--host {host}: {err.strerror}", hint="give an address or a host name, e.g. 127.0.0.1") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise InputError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror})",
                         hint="choose another --port (0 picks a free one) or stop the program using it") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, stopping gracefully on SIGTERM/SIGINT without re-raising the signal."""

    stopped_by: Optional[int] = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, signum, frame):
        if self.stopped_by is not None:  # a second signal: stop waiting for connections
            self.force_exit = True
        self.stopped_by = signum
        self.should_exit = True


class JsonErrorH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering a request it cannot parse (a malformed request line or
    header, e.g. `Content-Length: abc`) with a JSON 400 like every other error, not plain text.

    It then closes lingering, as web servers do: the sending side first, the connection
    `LINGER_S` later, discarding what the client still sends meanwhile (its body). Closed at
    once, the body arriving after the close would make the kernel reset the connection, and a
    reset can destroy the 400 before the client has read it.
    """

    LINGER_S = 2.0
    _discarding = False

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": "invalid HTTP request: a malformed request line or header "
                                    "(e.g. a Content-Length that is not a number)"}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(self.LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self._discarding:
            super().data_received(data)


def _config(app, log_level: str) -> uvicorn.Config:
    # log_config=None: uvicorn's loggers go through the program's logging (cli.start), at `log_level`;
    # its own config would bind handlers to the sys.stderr of the moment.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(log_level.upper())
    return uvicorn.Config(app, log_config=None, log_level=log_level, access_log=False, lifespan="on",
                          http=JsonErrorH11Protocol, timeout_graceful_shutdown=None, timeout_keep_alive=5)


def serve(model: ServedModel, sock: socket.socket, batching: BatchingConfig = BatchingConfig(),
          limits: ServeLimits = ServeLimits(), log_level: str = "warning") -> int:
    """Serves `model` on the listening socket `sock` (see `bind`) until SIGTERM or SIGINT; prints
    `ready: http://HOST:PORT` on stderr once warm. Returns 0 after a graceful stop.
    """
    app, batcher = make_app(model, batching, limits)
    url = _url(sock)
    server = _Server(_config(app, log_level))

    def announce():
        batcher.ready.wait()
        print(f"ready: {url} (model {model.info.get('name')}, --max-batch {batcher.max_batch}; POST /v1/translate, "
              "GET /health, GET /v1/model, "
              "page at /)", file=sys.stderr, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    print(f"listening on {url}; warming up", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    if server.stopped_by is not None:
        name = signal.Signals(server.stopped_by).name
        print(f"stopped by {name}: {batcher.stats['requests']} requests accepted, {batcher.stats['answered']} answered",
              file=sys.stderr, flush=True)
    return 0


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


class ServerThread:
    """The server on 127.0.0.1 (a free port) in a background thread; `with` waits until it is ready.

    Attributes: url, batcher, app.
    """

    def __init__(self, model: ServedModel, batching: BatchingConfig = BatchingConfig(),
                 limits: ServeLimits = ServeLimits(), host: str = "127.0.0.1"):
        self.app, self.batcher = make_app(model, batching, limits)
        self._sock = bind(host, 0)
        self.url = _url(self._sock)
        self._server = _Server(_config(self.app, "warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + 120
        while not (self._server.started and self.batcher.ready.is_set()):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(60)
