"""Simulation API: segment one request and run it against a stateful simulated cache.

``GET /health``; ``POST /v1/simulate/request`` with ``{"request_id"?, "session_id"?,
"tenant_id"?, "messages": [...] | "prompt": "...", "tools"?}`` returns the typed segments,
the prefix-keyed blocks (each with its type, tokens and whether it hit), hit totals and an
ESTIMATED TTFT from the latency model (no engine runs; the cache holds metadata, not KV
tensors). The cache persists across calls (``POST /v1/simulate/reset`` empties it;
``GET /v1/simulate/stats`` shows totals).

``request_id``, ``session_id`` and ``tenant_id`` are strings (or absent/null); anything else,
and any body the segmenter cannot read, is a 400. Bodies over ``max_body_bytes`` get 413 (see
:mod:`skv.services._common`). Simulation runs off the event loop, one request at a time.

Env: ``SKV_SIM_POLICY`` (default ``lru``), ``SKV_SIM_CACHE_TOKENS`` (default 20000),
``SKV_SIM_LATENCY`` (default ``linear``), ``SKV_MAX_BODY_BYTES`` (default 4 MiB).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from skv.blocks import DEFAULT_BLOCK_SIZE, request_blocks
from skv.latency import make_latency_model
from skv.model import TYPES, SemanticType
from skv.model import Request as SkvRequest

from ._common import env_float, env_str, openai_error
from .checks import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    body_read_timeout_from_env,
    install_body_limit,
    json_object_body,
    max_body_bytes_from_env,
)
from .proxy import segment_body


@dataclass
class SimConfig:
    policy: str = "lru"
    cache_tokens: int = 20_000
    block_size: int = DEFAULT_BLOCK_SIZE
    latency: str = "linear"
    tokenizer: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S

    @classmethod
    def from_env(cls) -> SimConfig:
        return cls(
            policy=env_str("SKV_SIM_POLICY", "lru") or "lru",
            cache_tokens=int(env_float("SKV_SIM_CACHE_TOKENS", 20_000)),
            latency=env_str("SKV_SIM_LATENCY", "linear") or "linear",
            tokenizer=env_str("SKV_TOKENIZER"),
            max_body_bytes=max_body_bytes_from_env(),
            body_read_timeout_s=body_read_timeout_from_env(),
        )


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"'{key}' must be a string, got {type(value).__name__}")
    return value


class Simulator:
    def __init__(self, cfg: SimConfig) -> None:
        from skv.policies.registry import policy_class
        from skv.segmenter import Segmenter

        policy_class(cfg.policy)  # unknown names fail at start
        if cfg.policy == "belady":
            raise ValueError("belady needs the whole trace in advance; pick an online policy")
        self.cfg = cfg
        self.segmenter = Segmenter(cfg.tokenizer, redact=True)
        self.latency = make_latency_model(cfg.latency)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        from skv.policies.registry import make_cache

        cache = make_cache(self.cfg.policy, max(1, self.cfg.cache_tokens // self.cfg.block_size))
        with self._lock:
            self.cache = cache
            self.requests = 0
            self.prompt_tokens = 0
            self.hit_tokens = 0

    def simulate(self, body: dict[str, Any]) -> dict[str, Any]:
        """One request against the cache (ValueError: a body it cannot read). Thread-safe."""
        chat = "messages" in body
        rid = _optional_str(body, "request_id") or f"sim-{uuid.uuid4().hex[:12]}"
        session, tenant = _optional_str(body, "session_id"), _optional_str(body, "tenant_id")
        segments = segment_body(self.segmenter, body, chat)
        with self._lock:
            idx = self.requests
            req = SkvRequest(rid, float(idx), segments, session_id=session, tenant_id=tenant)
            rb = request_blocks(req, self.cfg.block_size, "prefix", index=idx)
            lease = self.cache.access(rb, float(idx))
            self.requests += 1
            prompt = req.prompt_tokens
            hit = max(0, min(int(lease.hit_tokens), prompt))
            self.prompt_tokens += prompt
            self.hit_tokens += hit
        blocks = []
        by_type: dict[str, dict[str, int]] = {}
        for i in range(rb.num_blocks):
            st = rb.stypes[i]
            name = (TYPES[st] if isinstance(st, int) else SemanticType(st)).value
            is_hit = i < lease.hit_blocks
            blocks.append({"index": i, "stype": name, "tokens": rb.tokens[i], "hit": is_hit})
            agg = by_type.setdefault(name, {"tokens": 0, "hit_tokens": 0})
            agg["tokens"] += rb.tokens[i]
            agg["hit_tokens"] += rb.tokens[i] if is_hit else 0
        return {
            "request_id": rid,
            "session_id": session,
            "prompt_tokens": prompt,
            "num_blocks": rb.num_blocks,
            "hit_blocks": int(lease.hit_blocks),
            "hit_tokens": hit,
            "hit_rate": round(hit / prompt, 6) if prompt else 0.0,
            "estimated_ttft_ms": round(self.latency.ttft_ms(prompt - hit, hit), 3),
            "estimated_ttft_no_cache_ms": round(self.latency.ttft_ms(prompt, 0), 3),
            "segments": [
                {"stype": s.stype.value, "num_tokens": s.num_tokens, "content_hash": s.content_hash}
                for s in segments
            ],
            "blocks": blocks,
            "hits_by_type": by_type,
            "cache": {
                "policy": self.cfg.policy,
                "blocks": len(self.cache),
                "capacity_blocks": self.cfg.cache_tokens // self.cfg.block_size,
            },
            "latency_model": self.latency.describe(),
            "note": "TTFT is estimated by a latency model; the cache holds metadata only",
        }

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "prompt_tokens": self.prompt_tokens,
                "hit_tokens": self.hit_tokens,
                "hit_rate": self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
                "cached_blocks": len(self.cache),
                "policy": self.cfg.policy,
            }


def create_app(config: SimConfig | None = None) -> FastAPI:
    sim = Simulator(config or SimConfig.from_env())
    app = FastAPI(title="skv simulation API", version="1")
    install_body_limit(app, sim.cfg.max_body_bytes, sim.cfg.body_read_timeout_s)
    app.state.sim = sim

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "policy": sim.cfg.policy, "cache_tokens": sim.cfg.cache_tokens}

    @app.post("/v1/simulate/request")
    async def simulate(request: Request) -> Response:
        body = await json_object_body(request)
        if isinstance(body, Response):
            return body
        try:
            return JSONResponse(await run_in_threadpool(sim.simulate, body))
        except ValueError as exc:
            return openai_error(400, str(exc), "invalid_request_error")

    @app.post("/v1/simulate/reset")
    async def reset() -> dict[str, Any]:
        await run_in_threadpool(sim.reset)
        return {"status": "reset"}

    @app.get("/v1/simulate/stats")
    async def stats() -> dict[str, Any]:
        return sim.stats()

    return app


def __getattr__(name: str) -> Any:  # ``uvicorn skv.services.sim_api:app``
    if name == "app":
        return create_app()
    raise AttributeError(name)
