"""Telemetry proxy: forwards OpenAI-compatible requests upstream and records an skv trace.

Observability only: it never controls the backend's cache. Per request it segments the prompt
(``skv.segmenter.Segmenter``; redacted by default: hashes, token counts, labels, timing), forwards
the request to ``SKV_UPSTREAM_BASE_URL`` (streams pass through event by event), measures
proxy-level TTFT (first content token; a non-streaming answer's whole latency) and total
latency, and appends one native skv record (:mod:`skv.traces.native`) to
``SKV_TRACE_OUTPUT_DIR/proxy-<stamp>.jsonl``, flushed per record: the file is a readable
trace at any time (``skv.traces.load_trace``; its header has no request count).

Configuration (env; the ``skv proxy`` CLI sets the same fields):

- ``SKV_UPSTREAM_BASE_URL`` (default ``http://127.0.0.1:8001``)
- ``SKV_TRACE_OUTPUT_DIR`` (default ``outputs/live_traces``)
- ``SKV_REDACT_TEXT`` (default true: no prompt or response text is stored)
- upstream timeouts (:class:`skv.services.relay.Timeouts`; 504 when one runs out):
  ``SKV_PROXY_CONNECT_TIMEOUT_SECONDS`` (default 5), ``SKV_PROXY_FIRST_BYTE_TIMEOUT_SECONDS``
  (default 60: response headers, a non-streaming answer's whole wait, and the longest silence
  inside a stream), ``SKV_PROXY_TIMEOUT_SECONDS`` (default 600: arrival to last byte)
- ``SKV_MAX_BODY_BYTES`` (default 4 MiB; larger request bodies get 413)
- ``SKV_BODY_READ_TIMEOUT_SECONDS`` (default 30: a slower request body gets 408 and its
  connection closed; request headers get as long) and ``SKV_MAX_CONNECTIONS`` (default 512,
  for ``skv services proxy``: beyond it new requests get 503)
- tenancy (:mod:`skv.services.tenancy`, ``docs/tenancy.md``): ``SKV_TENANT_ISOLATION``
  (default false), ``SKV_TENANT_SOURCE`` (``key``, default: the tenant of the client's API key;
  ``header``: ``X-Tenant-ID`` set by a trusted gateway), ``SKV_TENANT_KEYS_FILE`` /
  ``SKV_TENANT_KEYS`` (hashed keys), ``SKV_UPSTREAM_API_KEY``, ``SKV_TENANT_SALT_SECRET``.
  With isolation on every forwarded body carries the tenant's vLLM ``cache_salt`` (replacing
  the client's); with isolation on or keys configured a missing or unknown key is a 401 and
  neither ``X-Tenant-ID`` nor the client's ``Authorization`` is forwarded; off, bodies and
  headers are forwarded as sent

Headers: ``X-Session-ID`` goes to the record's ``session_id``, the tenant (above; isolation off
and no keys: ``X-Tenant-ID`` as sent) to its ``tenant_id``; two ``X-Tenant-ID`` headers are a
400;
``X-Request-ID`` names the record (else a fresh id). Records of one session are linked through
``parent_id``. ``observed_cached_tokens`` comes from ``usage.prompt_tokens_details`` (streams:
the proxy asks for ``stream_options.include_usage`` and strips that chunk again when the client
did not ask for it). Segments count tokens with skv's tokenizer (``SKV_TOKENIZER``; point it at the
model's ``tokenizer.json`` to count like the engine); when the engine's ``prompt_tokens`` differs
(another tokenizer, chat-template tokens), ``observed_cached_tokens`` is the engine's hit carried
over as the same fraction of the prompt, and ``extra`` keeps the engine's own
``engine_prompt_tokens`` / ``engine_cached_tokens``. ``extra`` also holds ``total_latency_ms``,
``status``, ``endpoint``, ``stream``.

Failures: see :mod:`skv.services._common` (502 connect/5xx, 504 timeout, SSE error event for a
dropped stream, 499 ``client_gone``). Every request that was forwarded, or failed while being
forwarded, is recorded, with ``extra.error = {kind, message, status}`` and no TTFT; replays that
should only see served requests filter on it. Requests refused before forwarding (400: body,
headers or prompt unreadable; 401: no valid API key; 408: body too slow; 413: body too large)
are answered, not recorded.

Redaction (``SKV_REDACT_TEXT``, default on): nothing the client sent reaches the trace except its
identifiers (``X-Request-ID``, ``X-Session-ID``, ``X-Tenant-ID``): segments keep hashes and token
counts, error messages are the proxy's own words, and an upstream's error body (which may echo
the prompt) is dropped; unredacted, its first 500 characters are kept in ``extra.error.body``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from skv.model import Request as SkvRequest
from skv.model import content_hash
from skv.segmenter import Segmenter
from skv.services.typed import forward_types_from_env, with_semantic_xargs
from skv.traces.native import SKV_TRACE_VERSION, _to_record

from ._common import (
    JsonlAppender,
    add_completion_routes,
    env_bool,
    env_float,
    env_str,
    openai_error,
    run_stamp,
)
from .checks import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    body_read_timeout_from_env,
    encode_json,
    forward_headers,
    install_body_limit,
    json_object_body,
    max_body_bytes_from_env,
)
from .relay import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_FIRST_BYTE_TIMEOUT_S,
    DEFAULT_TOTAL_TIMEOUT_S,
    Outcome,
    Timeouts,
    UpstreamError,
    open_upstream,
    relay_response,
)
from .tenancy import (
    DEFAULT_TENANT_SOURCE,
    TenantPolicy,
    TenantRefused,
    cache_salt,
    policy_env,
    refusal,
    with_cache_salt,
)

log = logging.getLogger(__name__)

DEFAULT_UPSTREAM = "http://127.0.0.1:8001"
DEFAULT_TRACE_DIR = Path("outputs") / "live_traces"


@dataclass
class ProxyConfig:
    upstream_base_url: str = DEFAULT_UPSTREAM
    trace_output_dir: Path = DEFAULT_TRACE_DIR
    redact_text: bool = True
    timeout_s: float = DEFAULT_TOTAL_TIMEOUT_S  # total: arrival to last byte
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    first_byte_timeout_s: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tokenizer: str | None = None
    trace_name: str | None = None  # file stem; default proxy-<stamp>
    meta: dict[str, Any] = field(default_factory=dict)
    tenant_isolation: bool = False  # forward each tenant's cache_salt (skv.services.tenancy)
    tenant_salt_secret: str | None = None  # HMAC key of the salts (None: a public constant)
    tenant_source: str = DEFAULT_TENANT_SOURCE  # "key" (API keys) or "header" (a gateway's)
    tenant_keys_file: Path | None = None  # "<sha256 hex> <tenant>" lines
    tenant_keys: str | None = None  # the same entries, comma-separated (SKV_TENANT_KEYS)
    upstream_api_key: str | None = None  # sent upstream as Authorization: Bearer
    forward_types: bool = False  # add the prompt's semantic types as vllm_xargs (services.typed)
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S  # 408 for a slower request body

    @classmethod
    def from_env(cls) -> ProxyConfig:
        return cls(
            upstream_base_url=env_str("SKV_UPSTREAM_BASE_URL", DEFAULT_UPSTREAM)
            or DEFAULT_UPSTREAM,
            trace_output_dir=Path(env_str("SKV_TRACE_OUTPUT_DIR", str(DEFAULT_TRACE_DIR)) or "."),
            redact_text=env_bool("SKV_REDACT_TEXT", True),
            timeout_s=env_float("SKV_PROXY_TIMEOUT_SECONDS", DEFAULT_TOTAL_TIMEOUT_S),
            connect_timeout_s=env_float(
                "SKV_PROXY_CONNECT_TIMEOUT_SECONDS", DEFAULT_CONNECT_TIMEOUT_S
            ),
            first_byte_timeout_s=env_float(
                "SKV_PROXY_FIRST_BYTE_TIMEOUT_SECONDS", DEFAULT_FIRST_BYTE_TIMEOUT_S
            ),
            max_body_bytes=max_body_bytes_from_env(),
            tokenizer=env_str("SKV_TOKENIZER"),
            forward_types=forward_types_from_env(),
            body_read_timeout_s=body_read_timeout_from_env(),
            **policy_env(),
        )

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.connect_timeout_s, self.first_byte_timeout_s, self.timeout_s)

    @property
    def trace_path(self) -> Path:
        return self.trace_output_dir / f"{self.trace_name or 'proxy-' + run_stamp()}.jsonl"


class TraceWriter:
    """Turns relayed requests into native skv records, appended and flushed one by one."""

    def __init__(self, cfg: ProxyConfig, segmenter: Segmenter) -> None:
        self.cfg = cfg
        self.segmenter = segmenter
        self.path = cfg.trace_path
        header = {
            "skv_trace": SKV_TRACE_VERSION,
            "num_requests": None,
            "meta": {
                "collector": "skv.services.proxy",
                "upstream": cfg.upstream_base_url,
                "redacted": cfg.redact_text,
                "tokenizer": getattr(
                    segmenter.tokenizer, "name", type(segmenter.tokenizer).__name__
                ),
                "timing": "observed_ttft_ms: proxy-measured time to the first content token "
                "(non-streaming: to the whole answer); extra.total_latency_ms: to the last byte",
                "cached_tokens": "the upstream's usage.prompt_tokens_details.cached_tokens, as a "
                "fraction of its prompt_tokens applied to this record's prompt (raw: extra)",
                **({"tenant_isolation": True} if cfg.tenant_isolation else {}),
                **cfg.meta,
            },
        }
        self.out = JsonlAppender(self.path, header)
        self._t0 = time.perf_counter()
        self._last_in_session: dict[str, str] = {}
        self._lock = threading.Lock()

    def arrival(self) -> float:
        return round(time.perf_counter() - self._t0, 6)

    def record(
        self,
        rid: str,
        arrival_s: float,
        segments: list[Any],
        session_id: str | None,
        tenant_id: str | None,
        endpoint: str,
        outcome: Outcome,
    ) -> SkvRequest:
        prompt = sum(s.num_tokens for s in segments)
        usage = outcome.usage or {}
        answer = outcome.content.strip()
        out_tokens = usage.get("completion_tokens")
        if not isinstance(out_tokens, int):
            out_tokens = self.segmenter.tokenizer.count(answer) if answer else 0
        cached = outcome.cached_tokens
        engine_prompt = usage.get("prompt_tokens")
        if not isinstance(engine_prompt, int) or engine_prompt <= 0:
            engine_prompt = None
        if cached is not None:
            # the record counts skv tokenizer tokens; the engine counts its own (and its chat
            # template's): carry its hit over as the same FRACTION of the prompt
            if engine_prompt is not None and engine_prompt != prompt:
                cached = round(cached * prompt / engine_prompt)
            cached = max(0, min(cached, prompt))
        extra: dict[str, Any] = {
            "endpoint": endpoint,
            "stream": outcome.stream,
            "status": outcome.status,
            "total_latency_ms": round(outcome.total_ms or 0.0, 3),
            "wall_time": round(time.time(), 3),
        }
        if outcome.upstream_status is not None:
            extra["upstream_status"] = outcome.upstream_status
        if outcome.upstream:
            extra["upstream"] = outcome.upstream
        if engine_prompt is not None and engine_prompt != prompt:
            extra["engine_prompt_tokens"] = engine_prompt
            if outcome.cached_tokens is not None:
                extra["engine_cached_tokens"] = outcome.cached_tokens
        if outcome.error_kind is not None:
            extra["error"] = {
                "kind": outcome.error_kind,
                "message": (outcome.error or "")[:500],
                "status": outcome.status,
            }
            if outcome.error_body and not self.cfg.redact_text:  # it may echo the prompt
                extra["error"]["body"] = outcome.error_body
        if not self.cfg.redact_text and answer:
            extra["response_text"] = outcome.content
        with self._lock:
            parent = self._last_in_session.get(session_id) if session_id is not None else None
            if session_id is not None and outcome.ok:
                self._last_in_session[session_id] = rid
        req = SkvRequest(
            request_id=rid,
            arrival_s=arrival_s,
            segments=segments,
            output_tokens=int(out_tokens),
            session_id=session_id,
            tenant_id=tenant_id,
            parent_id=parent,
            templated=any(s.stype.value == "template" for s in segments),
            observed_ttft_ms=round(outcome.ttft_ms, 3) if outcome.ok and outcome.ttft_ms else None,
            observed_cached_tokens=cached,
            output_hash=content_hash(answer) if answer and outcome.ok else None,
            extra=extra,
        )
        self.out.append_line(_to_record(req).model_dump_json(exclude_defaults=True))
        return req


def segment_body(segmenter: Segmenter, body: dict[str, Any], chat: bool) -> list[Any]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError("'messages' must be a list")
        return segmenter.messages(messages, body.get("tools"))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        prompt = "\n".join(prompt)
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string or a list of strings")
    return segmenter.text(prompt)


def with_usage(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The body with ``stream_options.include_usage`` on for streams; True when it was added."""
    if not body.get("stream"):
        return body, False
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        return body, False
    new = copy.copy(body)
    new["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    return new, True


def create_app(
    config: ProxyConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None
) -> FastAPI:
    cfg = config or ProxyConfig.from_env()
    timeouts = cfg.timeouts
    tenancy = TenantPolicy.from_config(cfg)
    segmenter = Segmenter(cfg.tokenizer, redact=cfg.redact_text)
    writer = TraceWriter(cfg, segmenter)
    base = cfg.upstream_base_url.rstrip("/")
    client = httpx.AsyncClient(
        timeout=timeouts.client(), limits=timeouts.limits(), transport=transport
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()
        writer.out.close()

    app = FastAPI(title="skv telemetry proxy", version="1", lifespan=lifespan)
    install_body_limit(app, cfg.max_body_bytes, cfg.body_read_timeout_s)
    app.state.config = cfg
    app.state.writer = writer
    app.state.client = client

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "upstream": base,
            "trace": str(writer.path),
            "records": writer.out.count,
        }

    async def handle(request: Request, endpoint: str, chat: bool) -> Response:
        """Check, segment (off the event loop), forward, relay; record once forwarded."""
        start = time.perf_counter()
        arrival = writer.arrival()
        try:  # who the tenant is: from the headers, before the body is read
            tenant = tenancy.identify(request.headers)
        except TenantRefused as exc:
            return refusal(exc)
        body = await json_object_body(request)
        if isinstance(body, Response):
            return body
        try:
            headers = tenancy.upstream_headers(forward_headers(request.headers))
            payload, added_usage = with_usage(body)
            if cfg.tenant_isolation:
                assert tenant is not None  # isolation always names one
                payload = with_cache_salt(payload, cache_salt(tenant, cfg.tenant_salt_secret))
            segments = await run_in_threadpool(segment_body, segmenter, body, chat)
            session = request.headers.get("x-session-id")
            if cfg.forward_types:
                payload = with_semantic_xargs(payload, segments, session)
            content = encode_json(payload)
        except ValueError as exc:
            return openai_error(400, f"cannot forward the request: {exc}", "invalid_request_error")
        rid = request.headers.get("x-request-id") or f"req-{uuid.uuid4().hex[:16]}"
        outcome = Outcome(upstream=base)
        recorded = False

        def done(o: Outcome) -> None:  # once per request, however it ends
            nonlocal recorded
            if recorded:
                return
            recorded = True
            try:
                writer.record(rid, arrival, segments, session, tenant, endpoint, o)
            except Exception:  # a trace failure must not break serving
                log.exception("could not record request %s", rid)

        def fail(status: int, kind: str, message: str, body: str | None = None) -> None:
            outcome.status, outcome.error_kind, outcome.error = status, kind, message
            outcome.error_body = body
            outcome.total_ms = (time.perf_counter() - start) * 1e3
            done(outcome)

        deadline = start + timeouts.total_s
        try:
            resp = await open_upstream(
                client, base + endpoint, content, headers, outcome, timeouts, deadline
            )
            return await relay_response(
                resp, outcome, start, done, deadline=deadline, strip_usage_chunk=added_usage
            )
        except UpstreamError as err:
            fail(err.status, err.kind, err.message, err.body)
            return openai_error(err.status, err.client_message, err.kind)
        except asyncio.CancelledError:
            fail(499, "client_gone", "cancelled while waiting for the upstream")
            raise
        except Exception as exc:  # a bug: recorded, logged, answered
            log.exception("request %s: forwarding failed", rid)
            fail(500, "proxy_error", f"forwarding failed: {type(exc).__name__}")
            return openai_error(500, "the proxy failed to forward the request", "proxy_error")

    add_completion_routes(app, handle)

    return app


def __getattr__(name: str) -> Any:  # ``uvicorn skv.services.proxy:app``
    if name == "app":
        return create_app()
    raise AttributeError(name)
