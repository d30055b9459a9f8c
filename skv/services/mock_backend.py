"""A mock OpenAI-compatible serving engine: skv's prefix cache + a latency model, over HTTP.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming SSE and not) segment the
prompt, key its blocks by exact prefix (vLLM-style), look them up in one skv cache (``lru`` by
default; hits pinned, misses cached) and answer with a deterministic text seeded by the prompt.
``usage.prompt_tokens_details.cached_tokens`` reports the hit tokens like vLLM does. A
``cache_salt`` (a non-empty string, else 400, as in vLLM) salts the prompt's block chain as
vLLM does (:mod:`skv.blocks` ``salt_by_tenant``): requests with different salts never share
cached blocks, so tenant isolation can be tested on the mock. The TTFT
is SIMULATED by the latency model (``linear`` by default); the server actually waits
``time_scale * ttft`` before the first token (``time_scale=0``: answer at once) and
``time_scale * itl_ms`` between tokens. A non-standard ``skv_mock`` object in each response
carries the simulated TTFT.

``GET /health``; ``GET /metrics`` (Prometheus text, vLLM counter names:
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` in tokens,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``,
``vllm:num_requests_running``).

Fault injection (tests): ``Faults`` on ``app.state.engine.faults``, also ``GET/POST /mock/faults``
(a JSON object with some of the same fields): ``delay_s`` (sleep before answering, headers
included; 0 to 3600), ``fail_status`` (answer that HTTP error status, 400 to 599, to the next
``fail_count`` requests; ``-1``: all; null: none), ``drop_after_chunks`` (streams: break the
connection after that many content chunks; null: never). A POST is checked as a whole: any
wrong field is a 400 and changes nothing.

Requests: bodies over ``MockConfig.max_body_bytes`` get 413, malformed JSON 400 (see
:mod:`skv.services._common`); segmentation and the cache lookup run off the event loop.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from skv.blocks import DEFAULT_BLOCK_SIZE, request_blocks
from skv.latency import make_latency_model
from skv.model import Request as SkvRequest
from skv.model import content_hash
from skv.segmenter import Segmenter
from skv.services.collect import _Words

from ._common import openai_error
from .checks import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    install_body_limit,
    json_object_body,
)

#: fault -> (lowest, highest or None, null allowed); delay_s is a number, the others integers
_FAULT_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "delay_s": (0.0, 3600.0, False),
    "fail_status": (400, 599, True),
    "fail_count": (-1, None, False),
    "drop_after_chunks": (0, None, True),
}


def check_fault(key: str, value: Any) -> Any:
    """``value`` as the fault ``key`` takes it, or ValueError naming what is wrong."""
    if key not in _FAULT_RANGES:
        raise ValueError(f"unknown fault {key!r}; known: {', '.join(_FAULT_RANGES)}")
    lo, hi, nullable = _FAULT_RANGES[key]
    if value is None and nullable:
        return None
    number = int | float if key == "delay_s" else int
    if isinstance(value, bool) or not isinstance(value, number):
        kind = "a number" if key == "delay_s" else "an integer"
        raise ValueError(f"fault {key}: expected {kind}{' or null' if nullable else ''}")
    bad_float = isinstance(value, float) and not math.isfinite(value)
    if bad_float or value < lo or (hi is not None and value > hi):
        raise ValueError(f"fault {key}={value!r}: must be in [{lo}, {'inf' if hi is None else hi}]")
    return float(value) if key == "delay_s" else value


@dataclass
class Faults:
    """Injected faults; every field is checked (:func:`check_fault`), on creation and update."""

    delay_s: float = 0.0
    fail_status: int | None = None
    fail_count: int = -1  # with fail_status: how many requests fail (-1: every one)
    drop_after_chunks: int | None = None

    def __post_init__(self) -> None:
        for key in _FAULT_RANGES:
            setattr(self, key, check_fault(key, getattr(self, key)))

    def update(self, data: Mapping[str, Any]) -> None:
        """Set the given faults, all or none (ValueError: nothing changed)."""
        checked = {key: check_fault(key, value) for key, value in data.items()}
        for key, value in checked.items():
            setattr(self, key, value)

    def take_failure(self) -> int | None:
        if self.fail_status is None or self.fail_count == 0:
            return None
        if self.fail_count > 0:
            self.fail_count -= 1
        return int(self.fail_status)


@dataclass
class MockConfig:
    model: str = "skv-mock"
    policy: str = "lru"
    cache_tokens: int = 20_000
    block_size: int = DEFAULT_BLOCK_SIZE
    latency: str = "linear"
    latency_params: dict[str, Any] = field(default_factory=dict)
    time_scale: float = 0.0
    itl_ms: float = 0.0
    max_tokens: int = 24
    seed: int = 0
    tokenizer: str | None = None
    name: str = "mock"  # shown in responses and metrics (which replica answered)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies: 413
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S  # slower request bodies: 408


@dataclass
class MockResult:
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float
    words: list[str]


class MockEngine:
    """The engine state behind the app: one cache, one latency model, counters."""

    def __init__(self, config: MockConfig | None = None, faults: Faults | None = None) -> None:
        from skv.policies.registry import make_cache

        self.config = cfg = config or MockConfig()
        if cfg.cache_tokens < cfg.block_size:
            raise ValueError(
                f"cache_tokens ({cfg.cache_tokens}) must hold a block ({cfg.block_size})"
            )
        self.faults = faults or Faults()
        self.segmenter = Segmenter(cfg.tokenizer, redact=True)
        self.cache = make_cache(cfg.policy, cfg.cache_tokens // cfg.block_size)
        self.latency = make_latency_model(cfg.latency, **cfg.latency_params)
        self._lock = threading.Lock()
        self.calls = 0
        self.running = 0
        self.counters = {
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "request_success": 0,
            "request_failure": 0,
        }

    def process(
        self, segments: Sequence[Any], max_tokens: int | None, salt: str | None = None
    ) -> MockResult:
        """One prompt through the cache; ``salt`` (vLLM's ``cache_salt``) isolates its chain."""
        cfg = self.config
        with self._lock:
            idx = self.calls
            self.calls += 1
            req = SkvRequest(f"mock-{idx}", float(idx), list(segments), tenant_id=salt)
            rb = request_blocks(
                req, cfg.block_size, "prefix", index=idx, salt_by_tenant=salt is not None
            )
            lease = self.cache.access(rb, float(idx))
            prompt = req.prompt_tokens
            cached = max(0, min(int(lease.hit_tokens), prompt))
            self.counters["prefix_cache_queries"] += prompt
            self.counters["prefix_cache_hits"] += cached
            self.counters["prompt_tokens"] += prompt
        ttft = float(self.latency.ttft_ms(prompt - cached, cached))
        prompt_id = content_hash("|".join(s.content_hash or "" for s in segments))
        w = _Words(f"answer:{cfg.seed}:{prompt_id}")
        n = max(1, min(max_tokens if max_tokens else cfg.max_tokens, cfg.max_tokens))
        words = w.sentences(n).split(" ")[:n]
        return MockResult(prompt, cached, ttft, words)


def _usage(res: MockResult) -> dict[str, Any]:
    return {
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": len(res.words),
        "total_tokens": res.prompt_tokens + len(res.words),
        "prompt_tokens_details": {"cached_tokens": res.cached_tokens},
    }


def metrics_text(engine: MockEngine) -> str:
    """``/metrics`` in Prometheus text format, with vLLM's counter names (the harness scrapes
    the mock and a real engine alike)."""
    cfg, c = engine.config, engine.counters
    q = c["prefix_cache_queries"]
    rate = c["prefix_cache_hits"] / q if q else 0.0
    lab = f'{{model_name="{cfg.model}",engine="{cfg.name}"}}'
    lines = [
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{lab} {c['prefix_cache_queries']}",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{lab} {c['prefix_cache_hits']}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{lab} {c['prompt_tokens']}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{lab} {c['generation_tokens']}",
        "# TYPE vllm:request_success_total counter",
        f"vllm:request_success_total{lab} {c['request_success']}",
        "# TYPE skv_mock:request_failure_total counter",
        f"skv_mock:request_failure_total{lab} {c['request_failure']}",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{lab} {engine.running}",
        "# TYPE vllm:gpu_prefix_cache_hit_rate gauge",
        f"vllm:gpu_prefix_cache_hit_rate{lab} {rate}",
    ]
    return "\n".join(lines) + "\n"


def prompt_segments(engine: MockEngine, body: dict[str, Any], chat: bool) -> list[Any]:
    """The typed segments of a chat (``messages``, ``tools``) or completion (``prompt``)
    body; ValueError names the field that is wrong."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError("'messages' must be a list")
        return engine.segmenter.messages(messages, body.get("tools"))
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "\n".join(str(p) for p in prompt)
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string or a list of strings")
    return engine.segmenter.text(prompt)


def run_prompt(engine: MockEngine, body: dict[str, Any], chat: bool) -> MockResult:
    """Segment the body and look it up in the cache (CPU work: called in a worker thread)."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError("'cache_salt' must be a non-empty string if provided")
    segments = prompt_segments(engine, body, chat)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    return engine.process(segments, int(max_tokens) if isinstance(max_tokens, int) else None, salt)


def token_ids(engine: MockEngine, body: dict[str, Any]) -> list[int]:
    """``/tokenize``: the ids of the prompt's segment texts (ValueError: no usable prompt)."""
    messages = body.get("messages")
    if messages is None and isinstance(body.get("prompt"), str):
        messages = [{"role": "user", "content": body["prompt"]}]
    if not isinstance(messages, list):
        raise ValueError("need 'messages' or a string 'prompt'")
    pieces = engine.segmenter.pieces(messages, body.get("tools"))
    encode = engine.segmenter.tokenizer.encode
    return [t for _stype, text in pieces for t in encode(text)]


@dataclass
class _Reply:
    """What one completion answers: ids, the simulated result and the ``skv_mock`` extras."""

    chat: bool
    rid: str
    created: int
    model: str
    res: Any
    extra: dict[str, Any]

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


async def complete(engine: MockEngine, reply: _Reply) -> JSONResponse:
    """A non-streamed answer, held for the simulated time when the engine runs in real time."""
    cfg, res = engine.config, reply.res
    engine.running += 1
    try:
        if cfg.time_scale > 0:
            wait = res.ttft_ms + cfg.itl_ms * max(0, len(res.words) - 1)
            await asyncio.sleep(cfg.time_scale * wait / 1e3)
    finally:
        engine.running -= 1
    text = " ".join(res.words)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    if reply.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    engine.counters["request_success"] += 1
    return JSONResponse(
        {
            "id": reply.rid,
            "object": "chat.completion" if reply.chat else "text_completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [choice],
            "usage": _usage(res),
            "skv_mock": reply.extra,
        }
    )


def _sse(reply: _Reply, choices: list[dict[str, Any]], **more: Any) -> bytes:
    import json

    data = {"id": reply.rid, "object": reply.object, "created": reply.created,
            "model": reply.model, "choices": choices, **more}  # fmt: skip
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _piece(
    chat: bool, text: str | None, finish: str | None = None, role: bool = False
) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}


async def stream_chunks(
    engine: MockEngine, reply: _Reply, include_usage: bool
) -> AsyncIterator[bytes]:
    """The answer as server-sent events, one word a chunk, at the simulated pace; a
    ``drop_after_chunks`` fault cuts the stream."""
    cfg, faults, res, chat = engine.config, engine.faults, reply.res, reply.chat
    engine.running += 1
    try:
        if chat:
            yield _sse(reply, [_piece(chat, "", role=True)])
        if cfg.time_scale > 0:
            await asyncio.sleep(cfg.time_scale * res.ttft_ms / 1e3)
        for i, word in enumerate(res.words):
            if faults.drop_after_chunks is not None and i >= faults.drop_after_chunks:
                engine.counters["request_failure"] += 1
                raise ConnectionAbortedError("injected dropped stream")
            if i and cfg.time_scale > 0 and cfg.itl_ms > 0:
                await asyncio.sleep(cfg.time_scale * cfg.itl_ms / 1e3)
            yield _sse(reply, [_piece(chat, word if i == 0 else " " + word)])
        yield _sse(reply, [_piece(chat, "" if not chat else None, finish="length")],
                   skv_mock=reply.extra)  # fmt: skip
        if include_usage:
            yield _sse(reply, [], usage=_usage(res))
        yield b"data: [DONE]\n\n"
        engine.counters["request_success"] += 1
    finally:
        engine.running -= 1


def create_app(config: MockConfig | None = None, faults: Faults | None = None) -> FastAPI:
    """The mock engine's routes: health, models, faults, metrics, tokenize, completions."""
    engine = MockEngine(config, faults)
    cfg = engine.config
    app = FastAPI(title="skv mock engine", version="1")
    install_body_limit(app, cfg.max_body_bytes, cfg.body_read_timeout_s)
    app.state.engine = engine

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "name": cfg.name, "model": cfg.model}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": cfg.model, "object": "model", "owned_by": "skv"}]}

    @app.get("/mock/faults")
    async def get_faults() -> dict[str, Any]:
        return asdict(engine.faults)

    @app.post("/mock/faults")
    async def set_faults(request: Request) -> Response:
        body = await json_object_body(request)
        if isinstance(body, Response):
            return body
        try:
            engine.faults.update(body)
        except ValueError as exc:
            return openai_error(400, str(exc), "invalid_request_error")
        return JSONResponse(asdict(engine.faults))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(engine), media_type="text/plain; version=0.0.4")

    async def serve(request: Request, chat: bool) -> Response:
        """Body check, injected delay/failure, the simulated cache, then the answer."""
        body = await json_object_body(request)
        if isinstance(body, Response):
            return body
        faults = engine.faults
        if faults.delay_s > 0:
            await asyncio.sleep(float(faults.delay_s))
        status = faults.take_failure()
        if status is not None:
            engine.counters["request_failure"] += 1
            return openai_error(status, f"injected failure ({status})", "server_error")
        try:
            res = await run_in_threadpool(run_prompt, engine, body, chat)
        except ValueError as exc:
            return openai_error(400, str(exc), "invalid_request_error")
        reply = _Reply(
            chat=chat,
            rid=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
            created=int(time.time()),
            model=body.get("model") or cfg.model,
            res=res,
            extra={"simulated_ttft_ms": round(res.ttft_ms, 3), "engine": cfg.name},
        )
        engine.counters["generation_tokens"] += len(res.words)
        if not body.get("stream"):
            return await complete(engine, reply)
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        return StreamingResponse(
            stream_chunks(engine, reply, include_usage), media_type="text/event-stream"
        )

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """vLLM's ``/tokenize``: the prompt's token ids under skv's tokenizer (the segment texts
        in prompt order; no chat template), so a ``precise`` router can be tested on the mock."""
        body = await json_object_body(request)
        if isinstance(body, Response):
            return body
        try:
            tokens = await run_in_threadpool(token_ids, engine, body)
        except ValueError as exc:
            return openai_error(400, str(exc), "invalid_request_error")
        return JSONResponse({"count": len(tokens), "max_model_len": None, "tokens": tokens})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    return app


def __getattr__(name: str) -> Any:  # ``uvicorn skv.services.mock_backend:app``
    if name == "app":
        return create_app()
    raise AttributeError(name)
