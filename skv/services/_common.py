"""Shared pieces of the services: env parsing, a flushed JSONL appender, upstream relaying.

``relay`` forwards one OpenAI-style request to an upstream and returns the client's response
(streamed through for ``"stream": true``) plus, through a callback, an :class:`Outcome` with
proxy-level timing, usage and any error. Error mapping (the client always gets a clear status):

=============================  ==========  ===============================================
upstream failure               status      ``Outcome.error_kind``
=============================  ==========  ===============================================
connection refused / DNS       502         ``connect``
timeout (connect/read/write)   504         ``timeout``
5xx answer                     502         ``upstream_5xx`` (upstream status kept)
other transport error          502         ``upstream_error``
stream dropped mid-way         (200 sent)  ``dropped_stream``: the client gets an SSE
                                           ``data: {"error": ...}`` event and no ``[DONE]``
=============================  ==========  ===============================================

4xx answers are passed through unchanged (the client's request was wrong, not the upstream).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"

#: request headers never forwarded upstream (hop-by-hop or recomputed by httpx)
_DROP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
    }
)


#: the seed project's names (``SEMANTICKV_<X>``) are read as aliases of ``SKV_<X>``
LEGACY_PREFIX = "SEMANTICKV_"
_warned_legacy: set[str] = set()


def env_raw(name: str) -> str | None:
    """``os.environ[name]``, else its legacy ``SEMANTICKV_`` alias (warned about once per name).

    Every service reads its ``SKV_*`` settings through here, so users of the seed project keep
    working; the ``SKV_`` name wins when both are set.
    """
    raw = os.environ.get(name)
    if raw is not None or not name.startswith("SKV_"):
        return raw
    legacy = LEGACY_PREFIX + name.removeprefix("SKV_")
    raw = os.environ.get(legacy)
    if raw is not None and legacy not in _warned_legacy:
        _warned_legacy.add(legacy)
        log.warning("%s is deprecated; use %s (read as its alias)", legacy, name)
    return raw


def env_bool(name: str, default: bool) -> bool:
    raw = env_raw(name)
    if raw is None or raw.strip() == "":
        return default
    val = raw.strip().lower()
    if val in ("1", "true", "yes", "on"):
        return True
    if val in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected true/false")


def env_float(name: str, default: float) -> float:
    raw = env_raw(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None


def env_str(name: str, default: str | None = None) -> str | None:
    raw = env_raw(name)
    return default if raw is None or raw.strip() == "" else raw.strip()


@contextmanager
def serve_in_thread(
    app: Any, host: str = DEFAULT_HOST, *, lifespan: str = "off", timeout_s: float = 10.0
) -> Iterator[str]:
    """Run an ASGI ``app`` under uvicorn on ``host`` (a free port) in a daemon thread; yield its
    base URL. For experiments and tests that need a real HTTP hop in this process.
    ``lifespan="on"`` runs the app's startup and shutdown (closing what it opened) there."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started:
            if time.monotonic() > deadline or not th.is_alive():
                raise RuntimeError(f"uvicorn did not start on {host}:{port}")
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        th.join(timeout=5)
        sock.close()


def openai_error(status: int, message: str, kind: str, **extra: Any) -> JSONResponse:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code", ...}}``."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status, **extra}}, status_code=status
    )


async def json_object_body(request: Request) -> dict[str, Any] | JSONResponse:
    """The request's JSON object body, or the 400 error to return instead."""
    try:
        body = await request.json()
    except ValueError:
        return openai_error(400, "body must be JSON", "invalid_request_error")
    if not isinstance(body, dict):
        return openai_error(400, "body must be a JSON object", "invalid_request_error")
    return body


def add_completion_routes(
    app: FastAPI, handle: Callable[[Request, str, bool], Awaitable[Response]]
) -> None:
    """The two OpenAI endpoints, both served by ``handle(request, endpoint, chat)``."""

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await handle(request, "/v1/chat/completions", True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, "/v1/completions", False)


class JsonlAppender:
    """Appends one JSON object per line to a file, flushed per record, thread-safe.

    The file is created (with ``header`` as its first line when given) on the first append.
    """

    def __init__(self, path: str | Path, header: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.header = dict(header) if header is not None else None
        self._lock = threading.Lock()
        self._fh: Any = None
        self.count = 0

    def append_line(self, line: str) -> None:
        with self._lock:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
                if self.header is not None and self._fh.tell() == 0:
                    self._fh.write(json.dumps(self.header, sort_keys=True) + "\n")
            self._fh.write(line.rstrip("\n") + "\n")
            self._fh.flush()
            self.count += 1

    def append(self, obj: Mapping[str, Any]) -> None:
        self.append_line(json.dumps(obj, sort_keys=True, default=str))

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def run_stamp() -> str:
    """``YYYYmmdd-HHMMSS-<pid>``: a per-process file stem, so runs never share a file."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_HEADERS}


@dataclass
class Outcome:
    """What happened to one relayed request (filled as the response is relayed)."""

    status: int = 0  # what the client got
    upstream_status: int | None = None
    stream: bool = False
    ttft_ms: float | None = None
    total_ms: float | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    content: str = ""
    error_kind: str | None = None
    error: str | None = None
    upstream: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None and 200 <= self.status < 300

    @property
    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details") or {}
        val = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return int(val) if isinstance(val, int | float) else None


def classify(exc: BaseException) -> tuple[int, str]:
    """(client status, error kind) for an httpx exception."""
    if isinstance(exc, httpx.TimeoutException):
        return 504, "timeout"
    if isinstance(exc, httpx.ConnectError):
        return 502, "connect"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return 502, "dropped_stream"
    return 502, "upstream_error"


def _delta_text(event: Mapping[str, Any]) -> str:
    out = []
    for ch in event.get("choices") or []:
        if not isinstance(ch, Mapping):
            continue
        delta = ch.get("delta")
        if isinstance(delta, Mapping) and isinstance(delta.get("content"), str):
            out.append(delta["content"])
        elif isinstance(ch.get("text"), str):
            out.append(ch["text"])
    return "".join(out)


def _message_text(body: Mapping[str, Any]) -> str:
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        return ""
    ch = choices[0]
    msg = ch.get("message")
    if isinstance(msg, Mapping):
        return msg.get("content") or ""
    return ch.get("text") or ""


def _parse_event(raw: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(JSON payload of an SSE event or None, is_done)."""
    data = []
    for line in raw.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
    if not data:
        return None, False
    payload = b"\n".join(data)
    if payload == b"[DONE]":
        return None, True
    try:
        obj = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, False
    return (obj if isinstance(obj, dict) else None), False


class UpstreamError(Exception):
    """The upstream failed before any byte reached the client (safe to fail over)."""

    def __init__(self, status: int, kind: str, message: str, upstream_status: int | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.upstream_status = upstream_status


async def open_upstream(
    client: httpx.AsyncClient,
    url: str,
    payload: Mapping[str, Any],
    headers: Mapping[str, str],
    outcome: Outcome,
) -> httpx.Response:
    """Send the request (streamed response); raise :class:`UpstreamError` on connect errors,
    timeouts and 5xx. The returned response is open: read or close it."""
    req = client.build_request("POST", url, json=payload, headers=dict(headers))
    try:
        resp = await client.send(req, stream=True)
    except httpx.HTTPError as exc:
        status, kind = classify(exc)
        raise UpstreamError(status, kind, f"upstream {url}: {kind}: {exc!r}") from exc
    outcome.upstream_status = resp.status_code
    if resp.status_code >= 500:
        try:
            body = (await resp.aread())[:500].decode("utf-8", "replace")
        except httpx.HTTPError:
            body = ""
        finally:
            await resp.aclose()
        raise UpstreamError(
            502,
            "upstream_5xx",
            f"upstream {url} answered {resp.status_code}: {body}",
            upstream_status=resp.status_code,
        )
    return resp


async def relay_response(
    resp: httpx.Response,
    outcome: Outcome,
    start: float,
    on_done: Callable[[Outcome], Awaitable[None] | None],
    *,
    strip_usage_chunk: bool = False,
) -> Response:
    """Turn an open upstream response into the client's response; ``on_done(outcome)`` runs
    once the body has been relayed (or failed). ``start`` is ``time.perf_counter()`` at
    arrival. ``strip_usage_chunk``: drop the usage-only SSE chunk (one the relay asked for)."""
    ctype = resp.headers.get("content-type", "")
    outcome.status = resp.status_code

    async def finish() -> None:
        outcome.total_ms = (time.perf_counter() - start) * 1e3
        res = on_done(outcome)
        if res is not None:
            await res

    if "text/event-stream" not in ctype:
        try:
            body = await resp.aread()
        except httpx.HTTPError as exc:
            status, kind = classify(exc)
            outcome.status, outcome.error_kind, outcome.error = status, kind, repr(exc)
            await finish()
            return openai_error(status, f"upstream failed while answering: {exc!r}", kind)
        finally:
            await resp.aclose()
        outcome.ttft_ms = (time.perf_counter() - start) * 1e3  # non-streaming: first byte = all
        try:
            parsed = json.loads(body) if body else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = None
        if isinstance(parsed, dict):
            if isinstance(parsed.get("usage"), dict):
                outcome.usage = parsed["usage"]
            outcome.content = _message_text(parsed)
        if resp.status_code >= 400:
            outcome.error_kind = f"upstream_{resp.status_code}"
            outcome.error = body[:500].decode("utf-8", "replace")
        await finish()
        return Response(body, status_code=resp.status_code, media_type=ctype or None)

    outcome.stream = True

    async def body_iter() -> AsyncIterator[bytes]:
        buf = b""
        parts: list[str] = []
        try:
            async for chunk in resp.aiter_raw():
                buf += chunk.replace(b"\r\n", b"\n")
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    event, _done = _parse_event(raw)
                    drop = False
                    if event is not None:
                        text = _delta_text(event)
                        if text:
                            parts.append(text)
                            if outcome.ttft_ms is None:
                                outcome.ttft_ms = (time.perf_counter() - start) * 1e3
                        if isinstance(event.get("usage"), dict):
                            outcome.usage = event["usage"]
                            drop = strip_usage_chunk and not event.get("choices")
                    if not drop:
                        yield raw + b"\n\n"
            if buf.strip():
                yield buf
        except httpx.HTTPError as exc:
            status, kind = classify(exc)
            if isinstance(exc, httpx.TimeoutException):
                kind = "timeout"
            elif kind != "dropped_stream":
                kind = "dropped_stream"
            outcome.error_kind, outcome.error = kind, f"stream broken mid-way: {exc!r}"
            outcome.status = status
            err = {"error": {"message": outcome.error, "type": kind, "code": status}}
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        finally:
            outcome.content = "".join(parts)
            await resp.aclose()
            await finish()

    return StreamingResponse(body_iter(), status_code=resp.status_code, media_type=ctype)
