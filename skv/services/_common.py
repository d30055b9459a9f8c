"""Shared pieces of the services: env parsing, request checks, a flushed JSONL appender,
upstream relaying.

Request checks (every service; a bad request is a 4xx, never a 500)
-------------------------------------------------------------------

- Body size: :class:`BodyLimit` answers 413 to a body over ``max_body_bytes`` (default
  :data:`DEFAULT_MAX_BODY_BYTES` = 4 MiB; ``SKV_MAX_BODY_BYTES``, ``--max-body-bytes``) before
  reading it in full: at once when ``Content-Length`` says so, else as soon as the bytes
  received pass the limit. 4 MiB of text is about a million tokens.
- JSON: :func:`parse_json_object` (run off the event loop) accepts one JSON object; it refuses
  ``NaN`` / ``Infinity`` literals and numbers out of float range (they cannot be forwarded as
  JSON), nesting deeper than :data:`MAX_JSON_DEPTH`, and strings holding lone UTF-16
  surrogates (``"\\ud800"``: no UTF-8 encoding exists). All give 400.
- Headers: :func:`forward_headers` refuses a non-ASCII header value (400): it could not be
  forwarded unchanged.

Relaying
--------

``open_upstream`` + ``relay_response`` forward one OpenAI-style request to an upstream and
return the client's response (streamed through for ``"stream": true``) plus, through a
callback run exactly once however the relay ends, an :class:`Outcome` with proxy-level timing,
usage and any error. Error mapping (the client always gets a clear status):

=============================  ==========  ===============================================
upstream failure               status      ``Outcome.error_kind``
=============================  ==========  ===============================================
connection refused / DNS       502         ``connect``
timeout (``Timeouts``)        504         ``timeout``
5xx answer                     502         ``upstream_5xx`` (upstream status kept)
other transport error          502         ``upstream_error``
stream dropped mid-way         (200 sent)  ``dropped_stream``: the client gets an SSE
                                           ``data: {"error": ...}`` event and no ``[DONE]``
error event in the stream      (200 sent)  ``stream_error`` (passed through as sent)
client went away mid-way       499         ``client_gone`` (nobody to answer)
=============================  ==========  ===============================================

4xx answers are passed through unchanged (the client's request was wrong, not the upstream).
An upstream's error body is kept apart (``Outcome.error_body``, ``UpstreamError.body``) from
the error message: it may echo the client's input, so redacted traces must not store it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"

#: request body limit unless configured (``SKV_MAX_BODY_BYTES``; 4 MiB ~ a million tokens)
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: deepest nesting of arrays/objects accepted in a request body (chat bodies nest ~5 levels,
#: tool JSON schemas a few more)
MAX_JSON_DEPTH = 64
#: characters of an upstream error body kept (client message; unredacted traces)
ERROR_BODY_CHARS = 500

#: request headers never forwarded upstream (hop-by-hop, recomputed by httpx, or describing
#: the client's body encoding, which is re-encoded)
_DROP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "content-encoding",
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


def env_int(name: str, default: int) -> int:
    raw = env_raw(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def max_body_bytes_from_env() -> int:
    """``SKV_MAX_BODY_BYTES`` or :data:`DEFAULT_MAX_BODY_BYTES`."""
    return env_int("SKV_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)


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


# --------------------------------------------------------------------------- request checks


class _TooLarge(Exception):
    """Raised from ``receive`` once a body passes the limit; :class:`BodyLimit` answers 413."""


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 without being read
    in full (a ``Content-Length`` over the limit: unread; otherwise once the bytes received
    pass it). Bodies within the limit reach the app unchanged."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    def _error(self, status: int, message: str) -> JSONResponse:
        return openai_error(status, message, "invalid_request_error")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
        too_large = self._error(
            413, f"request body over {self.max_bytes} bytes (SKV_MAX_BODY_BYTES)"
        )
        if declared:
            try:
                length = int(declared[0])
            except ValueError:
                await self._error(400, "invalid Content-Length")(scope, receive, send)
                return
            if length > self.max_bytes:
                await too_large(scope, receive, send)
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:  # bodies are read before any answer starts: nothing was sent yet
            await too_large(scope, receive, send)


def install_body_limit(app: FastAPI, max_bytes: int) -> None:
    """Every route of ``app`` answers 413 to a request body over ``max_bytes``."""
    app.add_middleware(BodyLimit, max_bytes=max_bytes)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def _check_str(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate (no UTF-8 form)") from None


def check_json_tree(obj: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """ValueError unless ``obj`` nests at most ``max_depth`` containers deep and every string
    (keys included) encodes as UTF-8. Iterative: no recursion limit to hit."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > max_depth:
                raise ValueError(f"JSON nested deeper than {max_depth} levels")
            if isinstance(node, dict):
                for key, value in node.items():
                    _check_str(key)
                    stack.append((value, depth + 1))
            else:
                stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str):
            _check_str(node)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or ValueError saying what is wrong (see the module
    docstring: no NaN/Infinity, finite numbers, bounded depth, UTF-8-encodable strings)."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError(f"body must be JSON nested at most {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the refusals above
        raise ValueError(f"body must be JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    check_json_tree(body)
    return body


async def json_object_body(request: Request) -> dict[str, Any] | JSONResponse:
    """The request's JSON object body (parsed and checked off the event loop), or the 400 error
    to return instead."""
    raw = await request.body()
    try:
        return await run_in_threadpool(parse_json_object, raw)
    except ValueError as exc:
        return openai_error(400, str(exc), "invalid_request_error")


def encode_json(body: Mapping[str, Any]) -> bytes:
    """A checked body as compact UTF-8 JSON, as forwarded upstream (ValueError: not JSON)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers to forward upstream; ValueError on a non-ASCII value (its bytes
    could not be forwarded unchanged)."""
    out = {}
    for key, value in headers.items():
        if key.lower() in _DROP_HEADERS:
            continue
        if not value.isascii():
            raise ValueError(f"header {key!r} must be ASCII")
        out[key] = value
    return out


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


# --------------------------------------------------------------------------- upstream relaying

#: upstream timeout defaults, seconds (see :class:`Timeouts`)
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_FIRST_BYTE_TIMEOUT_S = 60.0
DEFAULT_TOTAL_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Timeouts:
    """Upstream time limits, in seconds; every one gives 504 ``timeout`` (a router fails over).

    - ``connect_s``: opening the connection.
    - ``first_byte_s``: request sent -> response headers (a non-streaming answer's headers come
      with the whole answer, so it bounds that too); also the longest silence allowed between
      two reads of a streamed answer, so a hung engine is let go after this long.
    - ``total_s``: the request's arrival -> its last byte, whatever happens in between.
    """

    connect_s: float = DEFAULT_CONNECT_TIMEOUT_S
    first_byte_s: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    total_s: float = DEFAULT_TOTAL_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_byte_s", "total_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"timeout {name} must be a positive number of seconds: {value!r}")

    def client(self) -> httpx.Timeout:
        """httpx's per-operation limits (the first-byte and total deadlines are enforced by
        :func:`open_upstream` and :func:`relay_response`)."""
        wait = min(self.first_byte_s, self.total_s)
        return httpx.Timeout(connect=min(self.connect_s, wait), read=wait, write=wait, pool=wait)


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
    error: str | None = None  # the relay's own words: never the client's or upstream's text
    error_body: str | None = None  # the upstream's error body (may echo the client's input)
    upstream: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None and 200 <= self.status < 300

    @property
    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details") or {}
        val = details.get("cached_tokens") if isinstance(details, Mapping) else None
        if isinstance(val, bool) or not isinstance(val, int | float) or not math.isfinite(val):
            return None
        return int(val)


def classify(exc: BaseException) -> tuple[int, str]:
    """(client status, error kind) for an exception raised while talking to the upstream: an
    httpx error, a deadline (TimeoutError), or what an in-process (ASGI) upstream raised."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
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
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return ""
    ch = choices[0]
    msg = ch.get("message")
    text = msg.get("content") if isinstance(msg, Mapping) else ch.get("text")
    return text if isinstance(text, str) else ""


def _is_error_event(event: Mapping[str, Any]) -> bool:
    """An in-band SSE error (``{"error": {...}}``, or vLLM's older ``{"object": "error"}``):
    the stream failed although its status was 200 (e.g. a router's replica broke mid-way)."""
    return isinstance(event.get("error"), Mapping) or event.get("object") == "error"


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
    except (ValueError, RecursionError):
        return None, False
    return (obj if isinstance(obj, dict) else None), False


class UpstreamError(Exception):
    """The upstream failed before any byte reached the client (safe to fail over).

    ``message`` is the relay's own description; ``body`` the upstream's error body, if any."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        upstream_status: int | None = None,
        body: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.upstream_status = upstream_status
        self.body = body

    @property
    def client_message(self) -> str:
        """What the client is told: the message, and the upstream's body when there is one."""
        return f"{self.message}: {self.body}" if self.body else self.message


def _why(exc: BaseException, wait: float | None = None) -> str:
    """An upstream failure in the relay's own words: httpx's errors name only the transport;
    anything else (an in-process upstream's exception) only by its type, since its text may
    echo the request."""
    if isinstance(exc, TimeoutError):
        return f"no response within {wait:.3g} s" if wait is not None else "deadline passed"
    return repr(exc) if isinstance(exc, httpx.HTTPError) else type(exc).__name__


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.perf_counter())


async def _excerpt(resp: httpx.Response, limit: int = ERROR_BODY_CHARS) -> str:
    """The first ``limit`` bytes of an error body, decoded; the response is closed."""
    data = b""
    try:
        async for chunk in resp.aiter_bytes():
            data += chunk
            if len(data) >= limit:
                break
    except Exception:  # an excerpt is best effort: keep what arrived
        pass
    finally:
        await resp.aclose()
    return data[:limit].decode("utf-8", "replace")


async def open_upstream(
    client: httpx.AsyncClient,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    outcome: Outcome,
    timeouts: Timeouts,
    deadline: float,
) -> httpx.Response:
    """POST the JSON ``content`` (streamed response); raise :class:`UpstreamError` on connect
    errors, timeouts (no headers within ``timeouts.first_byte_s`` or by ``deadline``, a
    ``time.perf_counter()`` value) and 5xx. The returned response is open: read or close it."""
    req = client.build_request(
        "POST", url, content=content, headers={**headers, "content-type": "application/json"}
    )
    wait = min(timeouts.first_byte_s, _remaining(deadline))
    try:
        async with asyncio.timeout(wait):
            resp = await client.send(req, stream=True)
    except Exception as exc:  # httpx's, a deadline, or an in-process upstream's
        status, kind = classify(exc)
        raise UpstreamError(status, kind, f"upstream {url}: {kind}: {_why(exc, wait)}") from exc
    outcome.upstream_status = resp.status_code
    if resp.status_code >= 500:
        try:
            async with asyncio.timeout(_remaining(deadline)):
                body = await _excerpt(resp)
        except TimeoutError:
            body = ""
        raise UpstreamError(
            502,
            "upstream_5xx",
            f"upstream {url} answered {resp.status_code}",
            upstream_status=resp.status_code,
            body=body,
        )
    return resp


class _Relay:
    """One upstream response on its way to the client. ``finish`` closes it and runs
    ``on_done(outcome)`` exactly once, however the relay ends: served, upstream error, deadline,
    client gone (``client_gone``, 499) or cancelled."""

    def __init__(
        self,
        resp: httpx.Response,
        outcome: Outcome,
        start: float,
        on_done: Callable[[Outcome], Awaitable[None] | None],
    ) -> None:
        self.resp, self.outcome, self.start, self.on_done = resp, outcome, start, on_done
        self.completed = False  # the relay ran to its own end (served or error answered)
        self._finished = False

    def fail(self, exc: BaseException) -> tuple[int, str]:
        status, kind = classify(exc)
        self.outcome.status, self.outcome.error_kind = status, kind
        self.outcome.error = f"upstream failed while answering: {_why(exc)}"
        return status, kind

    async def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        out = self.outcome
        if not self.completed and out.error_kind is None:
            out.status, out.error_kind = 499, "client_gone"
            out.error = "the client went away before the answer was relayed"
        out.total_ms = (time.perf_counter() - self.start) * 1e3
        try:
            res = self.on_done(out)
            if res is not None:
                await res
        finally:
            with anyio.CancelScope(shield=True):
                await self.resp.aclose()

    async def whole(self, deadline: float, ctype: str) -> Response:
        """A non-streamed answer, read in full then passed on."""
        out = self.outcome
        try:
            async with asyncio.timeout(_remaining(deadline)):
                body = await self.resp.aread()
        except Exception as exc:  # see open_upstream
            status, kind = self.fail(exc)
            self.completed = True
            await self.finish()
            return openai_error(status, out.error or "", kind)
        except BaseException:  # cancelled: still finished (and recorded) once
            await self.finish()
            raise
        out.ttft_ms = (time.perf_counter() - self.start) * 1e3  # first byte = all of it
        try:
            parsed = json.loads(body) if body else None
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            if isinstance(parsed.get("usage"), dict):
                out.usage = parsed["usage"]
            out.content = _message_text(parsed)
        if self.resp.status_code >= 400:
            out.error_kind = f"upstream_{self.resp.status_code}"
            out.error = f"upstream answered {self.resp.status_code}"
            out.error_body = body[:ERROR_BODY_CHARS].decode("utf-8", "replace")
        self.completed = True
        await self.finish()
        return Response(body, status_code=self.resp.status_code, media_type=ctype or None)

    async def chunks(self, deadline: float, strip_usage_chunk: bool) -> AsyncGenerator[bytes, None]:
        """The SSE events as they come; a broken stream ends with an error event."""
        out = self.outcome
        buf = b""
        parts: list[str] = []
        upstream = self.resp.aiter_raw()
        try:
            while True:
                try:  # silence between reads: httpx's read timeout; the total: here
                    async with asyncio.timeout(_remaining(deadline)):
                        chunk = await anext(upstream)
                except StopAsyncIteration:
                    break
                buf += chunk.replace(b"\r\n", b"\n")
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    event, _done = _parse_event(raw)
                    drop = False
                    if event is not None:
                        text = _delta_text(event)
                        if text:
                            parts.append(text)
                            if out.ttft_ms is None:
                                out.ttft_ms = (time.perf_counter() - self.start) * 1e3
                        if isinstance(event.get("usage"), dict):
                            out.usage = event["usage"]
                            drop = strip_usage_chunk and not event.get("choices")
                        if _is_error_event(event) and out.error_kind is None:
                            out.error_kind = "stream_error"
                            out.error = "the upstream's stream carried an error event"
                            out.error_body = raw[:ERROR_BODY_CHARS].decode("utf-8", "replace")
                    if not drop:
                        yield raw + b"\n\n"
                    if _done:
                        # the client has the whole answer once ``[DONE]`` went out: a client
                        # that closes right after it (most do) is served, not gone
                        self.completed = True
            if buf.strip():
                yield buf
            self.completed = True
        except Exception as exc:  # reading the upstream: see open_upstream
            status, kind = self.fail(exc)
            if kind != "timeout":
                kind = out.error_kind = "dropped_stream"
            out.error = f"stream broken mid-way: {_why(exc)}"
            self.completed = True
            err = {"error": {"message": out.error, "type": kind, "code": status}}
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        finally:
            out.content = "".join(parts)
            await self.finish()


class _RelayedStream(StreamingResponse):
    """A relayed SSE stream whose relay is finished even when its body is never iterated (the
    client went away before the first chunk) or is left suspended."""

    def __init__(self, relay: _Relay, content: AsyncGenerator[bytes, None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.relay = relay
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._content.aclose()
                await self.relay.finish()


async def relay_response(
    resp: httpx.Response,
    outcome: Outcome,
    start: float,
    on_done: Callable[[Outcome], Awaitable[None] | None],
    *,
    deadline: float,
    strip_usage_chunk: bool = False,
) -> Response:
    """Turn an open upstream response into the client's response; ``on_done(outcome)`` runs
    exactly once, when the body has been relayed or the relay failed. ``start`` is
    ``time.perf_counter()`` at arrival, ``deadline`` the same clock's limit for the last byte.
    ``strip_usage_chunk``: drop the usage-only SSE chunk (one the relay asked for)."""
    ctype = resp.headers.get("content-type", "")
    outcome.status = resp.status_code
    relay = _Relay(resp, outcome, start, on_done)
    if "text/event-stream" not in ctype:
        return await relay.whole(deadline, ctype)
    outcome.stream = True
    content = relay.chunks(deadline, strip_usage_chunk)
    return _RelayedStream(relay, content, status_code=resp.status_code, media_type=ctype)
