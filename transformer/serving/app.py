"""The HTTP API and web page (Starlette), over a `DynamicBatcher`.

    POST /v1/translate  {"texts": [str, ...]} → {"translations": [...], "model": str, "elapsed_ms": float}
    GET  /health        200 {"status": "ready", ...} once the model is loaded and warmed, else 503
    GET  /v1/model      the model: config, vocabulary sizes, precision, export date, decoding, limits
    GET  /              the web page (transformer/serving/page.py)

Every error is JSON `{"error": "..."}` naming the field at fault: 400 malformed JSON or a
wrong/missing field, 404 unknown route, 405 wrong method, 413 too many texts / characters /
bytes, 503 queue full (with Retry-After), 504 past the per-request timeout, 500 a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from transformer.serving.batching import DynamicBatcher, QueueFull, Stopped
from transformer.serving.page import PAGE


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask, and how long it may wait."""

    max_texts: int = 64  # texts per request
    max_chars: int = 2000  # characters per text
    max_body_bytes: int = 1 << 20  # request body
    timeout_s: float = 30.0  # per request, queueing included
    retry_after_s: int = 1  # Retry-After of a 503

    def validate(self) -> "ServeLimits":
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        return self


class RequestError(Exception):
    """A request the API refuses: HTTP `status` with a JSON error."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def read_texts(request: Request, limits: ServeLimits) -> list:
    """The request's `texts`, checked against `limits`, or a RequestError saying what is wrong."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit()):
        raise RequestError(400, f"Content-Length {declared!r} is not a number")
    if declared is not None and int(declared) > limits.max_body_bytes:
        raise RequestError(413, f"body of {declared} bytes; at most {limits.max_body_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise RequestError(413, f"body over {limits.max_body_bytes} bytes")
    try:
        payload = json.loads(bytes(body))
    except UnicodeDecodeError as err:
        raise RequestError(400, f"body is not UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise RequestError(400, f"body is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(payload, dict):
        raise RequestError(400, f'body must be a JSON object with the field "texts", got a JSON {_json_type(payload)}')
    unknown = sorted(set(payload) - {"texts"})
    if unknown:
        raise RequestError(400, f'unknown field "{unknown[0]}"; the body has one field, "texts"')
    if "texts" not in payload:
        raise RequestError(400, 'missing field "texts" (a list of strings)')
    texts = payload["texts"]
    if not isinstance(texts, list):
        raise RequestError(400, f'field "texts" must be a list of strings, got a JSON {_json_type(texts)}')
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise RequestError(400, f'field "texts[{i}]" must be a string, got a JSON {_json_type(text)}')
    if len(texts) > limits.max_texts:
        raise RequestError(413, f'field "texts" holds {len(texts)} texts; at most {limits.max_texts} per request')
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise RequestError(413, f'field "texts[{i}]" has {len(text)} characters; at most {limits.max_chars}')
    # A lone surrogate (valid JSON, not valid UTF-8) becomes invalid bytes, which the model
    # replaces by U+FFFD, as the offline translator does with a file's invalid bytes.
    return [text.encode("utf-8", "surrogatepass") for text in texts]


def _json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def build_app(batcher: DynamicBatcher, info: dict, limits: ServeLimits = ServeLimits(), *,
              warmup: tuple = ("Olá.",)) -> Starlette:
    """The Starlette app. Its lifespan starts `batcher` (warming up on `warmup`) and, at the end,
    waits for every accepted request to be answered before the thread stops.

    Args:
        batcher: the DynamicBatcher (not started).
        info: what `GET /v1/model` returns; its "name" is each response's "model".
        limits: ServeLimits.
    """
    limits.validate()
    name = info.get("name", "model")

    async def translate(request: Request):
        started = time.perf_counter()
        try:
            texts = await read_texts(request, limits)
            translations = await batcher.translate(texts, limits.timeout_s)
        except RequestError as err:
            return error_response(err.status, str(err), err.headers)
        except QueueFull as err:
            return error_response(503, f"busy: {err}; retry later", {"Retry-After": str(limits.retry_after_s)})
        except Stopped as err:
            return error_response(503, str(err), {"Retry-After": str(limits.retry_after_s)})
        except asyncio.TimeoutError:
            return error_response(504, f"no translation within {limits.timeout_s:g} s")
        except Exception as err:  # the model failed: say so, keep serving
            return error_response(500, f"translation failed: {type(err).__name__}: {err}")
        return JSONResponse({"translations": translations, "model": name,
                             "elapsed_ms": round((time.perf_counter() - started) * 1000, 3)})

    async def health(request: Request):
        body = {"status": "ready", "queued": batcher.queued, **batcher.stats}
        if batcher.warmup_error is not None:
            return JSONResponse({**body, "status": "failed", "error": f"warm-up failed: {batcher.warmup_error}"}, 500)
        if not batcher.ready.is_set():
            return JSONResponse({**body, "status": "warming up"}, 503, headers={"Retry-After": "1"})
        return JSONResponse(body)

    async def model(request: Request):
        return JSONResponse({**info, "limits": asdict(limits),
                             "batching": {"mode": batcher.mode,
                                          "max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000,
                                          "max_queue": batcher.max_queue, "streams": batcher.streams}})

    async def page(request: Request):
        return HTMLResponse(PAGE)

    async def http_error(request: Request, exc: HTTPException):
        message = {404: f"no route {request.url.path}; see GET /v1/model, POST /v1/translate, GET /health, GET /",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return error_response(exc.status_code, message, exc.headers)

    async def server_error(request: Request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start(warmup)
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, batcher.stop)

    routes = [Route("/v1/translate", translate, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/v1/model", model, methods=["GET"]), Route("/", page, methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})
