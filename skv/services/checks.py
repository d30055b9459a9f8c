"""Request checks for every service: a bad request is a 4xx, never a 500.

- Body size: :class:`BodyLimit` answers 413 to a body over ``max_body_bytes`` (default
  :data:`DEFAULT_MAX_BODY_BYTES` = 4 MiB; ``SKV_MAX_BODY_BYTES``, ``--max-body-bytes``) before
  reading it in full: at once when ``Content-Length`` says so, else as soon as the bytes
  received pass the limit. 4 MiB of text is about a million tokens.
- Body time: :class:`BodyLimit` answers 408 (and closes the connection) when a request's body
  has not arrived in full ``read_timeout_s`` after its headers (default
  :data:`DEFAULT_BODY_READ_TIMEOUT_S` = 30 s; ``SKV_BODY_READ_TIMEOUT_SECONDS``,
  ``--body-read-timeout``): a client that stops sending mid-body cannot hold a connection (and
  a slot under the connection cap, :func:`skv.services._common.server_options`) for longer.
- JSON: :func:`parse_json_object` (run off the event loop) accepts one JSON object; it refuses
  ``NaN`` / ``Infinity`` literals and numbers out of float range (they cannot be forwarded as
  JSON), nesting deeper than :data:`MAX_JSON_DEPTH`, and strings holding lone UTF-16
  surrogates (``"\\ud800"``: no UTF-8 encoding exists). All give 400.
- Headers: :func:`forward_headers` refuses a non-ASCII header value (400): it could not be
  forwarded unchanged.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skv.services._common import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    env_float,
    env_int,
    openai_error,
)

#: request body limit unless configured (``SKV_MAX_BODY_BYTES``; 4 MiB ~ a million tokens)
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


#: deepest nesting of arrays/objects accepted in a request body (chat bodies nest ~5 levels,
#: tool JSON schemas a few more)
MAX_JSON_DEPTH = 64


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


def body_read_timeout_from_env() -> float:
    """``SKV_BODY_READ_TIMEOUT_SECONDS`` or :data:`DEFAULT_BODY_READ_TIMEOUT_S`."""
    return env_float("SKV_BODY_READ_TIMEOUT_SECONDS", DEFAULT_BODY_READ_TIMEOUT_S)


def max_body_bytes_from_env() -> int:
    """``SKV_MAX_BODY_BYTES`` or :data:`DEFAULT_MAX_BODY_BYTES`."""
    return env_int("SKV_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)


class _TooLarge(Exception):
    """Raised from ``receive`` once a body passes the limit; :class:`BodyLimit` answers 413."""


class _TooSlow(Exception):
    """Raised from ``receive`` when the body is not in by its deadline; answered 408."""


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 without being read
    in full (a ``Content-Length`` over the limit: unread; otherwise once the bytes received
    pass it); a body not in full ``read_timeout_s`` after the request's headers is answered 408
    with ``Connection: close`` (the server then closes the connection). Bodies within the
    limits reach the app unchanged."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        read_timeout_s: float | None = DEFAULT_BODY_READ_TIMEOUT_S,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_bytes}")
        if read_timeout_s is not None and not (
            math.isfinite(read_timeout_s) and read_timeout_s > 0
        ):
            raise ValueError(f"body read timeout must be > 0 seconds, got {read_timeout_s}")
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

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
        body_done = False
        deadline = None if self.read_timeout_s is None else time.monotonic() + self.read_timeout_s

        async def limited() -> Message:
            nonlocal seen, body_done
            if body_done or deadline is None:  # e.g. a stream listening for a disconnect
                message = await receive()
            else:
                try:
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        message = await receive()
                except TimeoutError:
                    raise _TooSlow from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
                body_done = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:  # bodies are read before any answer starts: nothing was sent yet
            await too_large(scope, receive, send)
        except _TooSlow:
            slow = self._error(
                408,
                f"request body not received within {self.read_timeout_s:g} s "
                "(SKV_BODY_READ_TIMEOUT_SECONDS)",
            )
            slow.headers["connection"] = "close"  # the rest of the body is never read
            await slow(scope, receive, send)


def install_body_limit(
    app: FastAPI, max_bytes: int, read_timeout_s: float | None = DEFAULT_BODY_READ_TIMEOUT_S
) -> None:
    """Every route of ``app`` answers 413 to a request body over ``max_bytes`` and 408 to one
    that takes longer than ``read_timeout_s`` to arrive (None: no limit). Bad limits are a
    ValueError here, when the app is made, not at its first request."""
    BodyLimit(app, max_bytes, read_timeout_s)  # checks them
    app.add_middleware(BodyLimit, max_bytes=max_bytes, read_timeout_s=read_timeout_s)


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
