"""Upstream relaying: forward one OpenAI-style request and answer the client, whatever the
upstream does.

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
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from skv.services._common import openai_error
from skv.vllm.client import KEEPALIVE_S

#: characters of an upstream error body kept (client message; unredacted traces)
ERROR_BODY_CHARS = 500


#: upstream timeout defaults, seconds (see :class:`Timeouts`)
DEFAULT_CONNECT_TIMEOUT_S = 5.0


DEFAULT_FIRST_BYTE_TIMEOUT_S = 60.0


DEFAULT_TOTAL_TIMEOUT_S = 600.0


#: seconds an idle upstream connection is kept for reuse: the harness client's limit (see
#: :data:`skv.vllm.client.KEEPALIVE_S`); a request sent on a connection its server is closing
#: fails with no response (the client sees a 502; a router would count it against the replica)
UPSTREAM_KEEPALIVE_S = KEEPALIVE_S


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

    def limits(self) -> httpx.Limits:
        """httpx's connection pool: idle connections let go after :data:`UPSTREAM_KEEPALIVE_S`."""
        return httpx.Limits(keepalive_expiry=UPSTREAM_KEEPALIVE_S)


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
