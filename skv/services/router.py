"""Cache-locality router: an OpenAI-compatible front for several backend replicas.

It only chooses which replica gets a request; it never controls a backend's cache. For the
cache-aware policies it keeps an *approximate* cache per replica: an skv ``lru`` ``BlockCache``
(prefix keying, like vLLM's prefix cache) fed with every request successfully routed there.

Policies (``SKV_ROUTING_POLICY``): the shared routers of :mod:`skv.routing`, which rank the
replicas; this service keeps health, failover, in-flight bookkeeping and the decision log. A
router reads per replica the requests in flight through this service (``load``), those routed
there (``routed``) and the approximate cache (``match``); ties go by (load, routed, index).

- ``round_robin``: replicas in turn.
- ``least_loaded``: fewest requests in flight through this router.
- ``prefix_locality``: the replica whose approximate cache holds the longest prefix of the
  request's blocks; ties (no match anywhere included) go to the least loaded.
- ``semantic_locality``: like ``prefix_locality``, but the matched prefix is scored by tokens
  weighted by semantic type (``SEMANTIC_WEIGHTS``: system prompts, tool schemas and templates
  count most, one-off user text least).

- ``precise``: the replica whose engine REPORTS (KV-cache events, ``SKV_KV_EVENTS``: one ZMQ
  endpoint per replica, same order) the longest cached prefix of the request's real tokens, in
  full engine blocks (llm-d's precise prefix scorer; its score ``matched / total`` orders replicas
  the same way). The router gets the token ids from a replica's ``/tokenize`` (vLLM's endpoint;
  the request's chat options are passed on so the chat template matches), or takes them as sent
  when a completion prompt is token ids. That costs one extra local round trip per request and
  knows nothing of requests still in prefill (their blocks are reported when they are stored).
  See :mod:`skv.vllm.kv_events` for how engine blocks are matched by content.

The locality policies (``precise`` included) give up locality when the chosen replica has
more than ``max_imbalance`` (8) more requests in flight than the least loaded one (then: least
loaded).

Failover: a connection error, timeout or 5xx *before any byte reached the client* makes the
router try the next candidate (every replica at most once); a replica that failed is tried last
for ``cooldown_s``. A 4xx answer is the client's doing: passed on, the replica stays healthy.
Every decision is one JSONL line in ``SKV_ROUTING_OUTPUT_DIR``
(``outputs/routing/routing-<stamp>.jsonl``): chosen replica, scores, in-flight counts, attempts.

Tenant isolation (``SKV_TENANT_ISOLATION``, ``--tenant-isolation``; default off; see
:mod:`skv.services.tenancy` and ``docs/tenancy.md``): the tenant is the one of the client's API
key (``SKV_TENANT_SOURCE=key``, the default; keys from ``SKV_TENANT_KEYS_FILE`` /
``SKV_TENANT_KEYS``, a missing or unknown key is a 401), or, behind a gateway that strips and
sets it, ``X-Tenant-ID`` (``SKV_TENANT_SOURCE=header``; none: ``default``). The router
never scores a tenant's request against another tenant's cache state: the approximate caches
key blocks with the tenant's salt, exactly as :mod:`skv.blocks` does for ``salt_by_tenant``
(one tenant's blocks are never another's keys), and ``precise`` counts only blocks the tenant
owns on a replica (:class:`skv.services.tenant_index.TenantKVIndex`). Every forwarded body
carries the tenant's ``cache_salt`` (replacing the client's), so the engines isolate too.
Off: bodies are forwarded as sent and all tenants share the caches, as before.

Invariant: a replica's in-flight count goes up once per attempt and down exactly once, however
the attempt ends (answered, failed over, client gone, cancelled, a bug): ``Dispatcher.attempt``
releases it in ``finally`` unless the relay's completion callback has taken it over.

``GET /metrics``: Prometheus text format: requests routed per replica (labelled with the policy),
failed attempts per replica, failovers, requests every replica failed, in-flight per replica.

Env: ``SKV_REPLICAS`` (comma-separated base URLs), ``SKV_ROUTING_POLICY`` (default
``round_robin``), ``SKV_ROUTING_OUTPUT_DIR``, upstream timeouts per attempt
(:class:`skv.services.relay.Timeouts`) ``SKV_ROUTER_CONNECT_TIMEOUT_SECONDS`` (default 5),
``SKV_ROUTER_FIRST_BYTE_TIMEOUT_SECONDS`` (default 60) and ``SKV_ROUTER_TIMEOUT_SECONDS``
(total, arrival to last byte, all attempts together; default 600), ``SKV_MAX_BODY_BYTES``
(request bodies over it get 413; default 4 MiB),
``SKV_ROUTER_CACHE_TOKENS`` (approximate cache per replica, default 50000), ``SKV_KV_EVENTS``
(``precise``: comma-separated ZMQ endpoints, e.g. ``ipc:///tmp/r0.sock``), ``SKV_KV_EVENTS_TOPIC``
(default ``kv-events``), ``SKV_KV_BLOCK_SIZE`` (block size until the events report it),
``SKV_TENANT_ISOLATION`` (default false), ``SKV_TENANT_SALT_SECRET`` (the salts' HMAC key),
``SKV_TENANT_SOURCE``, ``SKV_TENANT_KEYS_FILE``, ``SKV_TENANT_KEYS``, ``SKV_UPSTREAM_API_KEY``,
``SKV_BODY_READ_TIMEOUT_SECONDS`` (default 30: 408 and close for a slower request body) and,
for ``skv services router``, ``SKV_MAX_CONNECTIONS`` (default 512; beyond: 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from skv.blocks import DEFAULT_BLOCK_SIZE, RequestBlocks, request_blocks
from skv.model import Request as SkvRequest
from skv.model import Segment, SemanticType, content_hash
from skv.routing import LOCALITY, ROUTERS, FixedView, make_router
from skv.routing.semantic_locality import SEMANTIC_WEIGHTS
from skv.segmenter import Segmenter
from skv.services.typed import forward_types_from_env, with_semantic_xargs

from ._common import (
    JsonlAppender,
    add_completion_routes,
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
from .proxy import segment_body
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
    DEFAULT_TENANT,
    DEFAULT_TENANT_SOURCE,
    TenantPolicy,
    TenantRefused,
    cache_salt,
    policy_env,
    refusal,
    with_cache_salt,
)
from .tenant_index import TenantKVIndex

log = logging.getLogger(__name__)

#: the routing policies: the shared router registry's names (skv.routing)
POLICIES: tuple[str, ...] = tuple(ROUTERS)
DEFAULT_ROUTING_DIR = Path("outputs") / "routing"


@dataclass
class RouterConfig:
    replicas: list[str] = field(default_factory=list)
    policy: str = "round_robin"
    routing_output_dir: Path | None = DEFAULT_ROUTING_DIR  # None: no decision log
    timeout_s: float = DEFAULT_TOTAL_TIMEOUT_S  # total: arrival to last byte
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    first_byte_timeout_s: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cache_tokens: int = 50_000
    block_size: int = DEFAULT_BLOCK_SIZE
    max_imbalance: int = 8
    cooldown_s: float = 2.0
    tokenizer: str | None = None
    weights: dict[SemanticType, float] = field(default_factory=lambda: dict(SEMANTIC_WEIGHTS))
    kv_events: list[str] = field(default_factory=list)  # precise: one endpoint per replica
    kv_events_topic: str = "kv-events"
    kv_block_size: int | None = None  # precise: until the events report the engine's
    tenant_isolation: bool = False  # per-tenant scoring and cache_salt (skv.services.tenancy)
    tenant_salt_secret: str | None = None  # HMAC key of the salts (None: a public constant)
    tenant_source: str = DEFAULT_TENANT_SOURCE  # "key" (API keys) or "header" (a gateway's)
    tenant_keys_file: Path | None = None  # "<sha256 hex> <tenant>" lines
    tenant_keys: str | None = None  # the same entries, comma-separated (SKV_TENANT_KEYS)
    upstream_api_key: str | None = None  # sent to the replicas as Authorization: Bearer
    forward_types: bool = False  # add the prompt's semantic types as vllm_xargs (services.typed)
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S  # 408 for a slower request body

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"unknown routing policy {self.policy!r}; known: {', '.join(POLICIES)}"
            )
        self.replicas = [r.strip().rstrip("/") for r in self.replicas if r.strip()]
        if not self.replicas:
            raise ValueError("no replicas (set SKV_REPLICAS=http://127.0.0.1:8101,...)")
        self.kv_events = [e.strip() for e in self.kv_events if e.strip()]
        if self.policy == "precise" and len(self.kv_events) != len(self.replicas):
            raise ValueError(
                f"policy precise needs one KV-event endpoint per replica (SKV_KV_EVENTS): "
                f"{len(self.kv_events)} endpoints for {len(self.replicas)} replicas"
            )
        self.timeouts  # noqa: B018  (checks them)

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.connect_timeout_s, self.first_byte_timeout_s, self.timeout_s)

    @classmethod
    def from_env(cls) -> RouterConfig:
        out = env_str("SKV_ROUTING_OUTPUT_DIR", str(DEFAULT_ROUTING_DIR))
        return cls(
            replicas=(env_str("SKV_REPLICAS", "") or "").split(","),
            policy=env_str("SKV_ROUTING_POLICY", "round_robin") or "round_robin",
            routing_output_dir=Path(out) if out else None,
            timeout_s=env_float("SKV_ROUTER_TIMEOUT_SECONDS", DEFAULT_TOTAL_TIMEOUT_S),
            connect_timeout_s=env_float(
                "SKV_ROUTER_CONNECT_TIMEOUT_SECONDS", DEFAULT_CONNECT_TIMEOUT_S
            ),
            first_byte_timeout_s=env_float(
                "SKV_ROUTER_FIRST_BYTE_TIMEOUT_SECONDS", DEFAULT_FIRST_BYTE_TIMEOUT_S
            ),
            max_body_bytes=max_body_bytes_from_env(),
            cache_tokens=int(env_float("SKV_ROUTER_CACHE_TOKENS", 50_000)),
            tokenizer=env_str("SKV_TOKENIZER"),
            kv_events=(env_str("SKV_KV_EVENTS", "") or "").split(","),
            kv_events_topic=env_str("SKV_KV_EVENTS_TOPIC", "kv-events") or "kv-events",
            kv_block_size=int(env_float("SKV_KV_BLOCK_SIZE", 0)) or None,
            forward_types=forward_types_from_env(),
            body_read_timeout_s=body_read_timeout_from_env(),
            **policy_env(),
        )


def _constant(value: float) -> Callable[[RequestBlocks], float]:
    """A match function that answers ``value`` whatever the request (precise: computed from the
    prompt's token ids before ranking)."""
    return lambda _rb: value


def router_params(cfg: RouterConfig) -> dict[str, Any]:
    """The shared router's parameters for the service's policy: the locality routers give way
    to the least loaded beyond ``max_imbalance``; ``semantic_locality`` takes the weights."""
    params: dict[str, Any] = {}
    if cfg.policy in LOCALITY:
        params["max_imbalance"] = cfg.max_imbalance
    if cfg.policy == "semantic_locality":
        params["weights"] = cfg.weights
    return params


class RouterState:
    """Replica bookkeeping and the routing decision (no I/O; unit-testable on its own)."""

    def __init__(self, cfg: RouterConfig) -> None:
        from skv.policies.registry import make_cache
        from skv.vllm.kv_events import KVIndex

        self.cfg = cfg
        #: precise: what each replica's engine reports (fed by KV-event subscribers); under
        #: isolation also which tenant owns which blocks there
        index_class = TenantKVIndex if cfg.tenant_isolation else KVIndex
        self.index = index_class(block_size=cfg.kv_block_size) if cfg.policy == "precise" else None
        n = len(cfg.replicas)
        self.in_flight = [0] * n
        self.routed = [0] * n
        self.failures = [0] * n
        self.down_until = [0.0] * n
        self.failovers = 0  # times a failed attempt moved a request on to the next replica
        self.errors = 0  # requests answered with an error because every replica failed
        self.caches = [
            make_cache("lru", max(1, cfg.cache_tokens // cfg.block_size)) for _ in range(n)
        ]
        #: the shared router (skv.routing) that ranks replicas; it keeps its own state
        self.router = make_router(cfg.policy, **router_params(cfg))
        self._clock = 0
        self._lock = threading.Lock()

    def blocks(
        self, segments: list[Any], session: str | None, tenant: str | None = None
    ) -> RequestBlocks:
        """``arrival_s``: this process's monotonic clock (routers that plan per period, like
        ``cacheroute``, read time from the request). Under isolation the keys carry the
        tenant's salt (``salt_by_tenant``): no key of one tenant equals a key of another."""
        isolate = self.cfg.tenant_isolation
        req = SkvRequest(
            "route", time.monotonic(), list(segments), session_id=session,
            tenant_id=(tenant or DEFAULT_TENANT) if isolate else None,
        )  # fmt: skip
        return request_blocks(req, self.cfg.block_size, "prefix", salt_by_tenant=isolate)

    def healthy_first(self) -> list[int]:
        """Replica indices, those not cooling down after a failure first."""
        now = time.monotonic()
        return sorted(range(len(self.cfg.replicas)), key=lambda i: self.down_until[i] > now)

    def views(self, tokens: list[int] | None = None, tenant: str | None = None) -> list[FixedView]:
        """What the router reads per replica (call under the lock): in-flight load, requests
        routed, and the match: the approximate cache, or (``precise``) the leading full engine
        blocks of ``tokens`` the replica's engine reports as cached (none without tokens);
        under isolation only those ``tenant`` owns there."""
        n = len(self.cfg.replicas)
        if self.index is None:
            lookups = [cache.lookup for cache in self.caches]
        else:
            if not tokens:
                held = {}
            elif isinstance(self.index, TenantKVIndex):
                held = self.index.tenant_overlaps(tokens, tenant or DEFAULT_TENANT)
            else:
                held = self.index.token_overlaps(tokens)
            lookups = [_constant(float(held.get(i, 0))) for i in range(n)]
        return [FixedView(self.in_flight[i], self.routed[i], lookups[i]) for i in range(n)]

    def candidates(
        self, rb: RequestBlocks, tokens: list[int] | None = None, tenant: str | None = None
    ) -> tuple[list[int], list[float] | None, str]:
        """Replicas in the order to try them (the router's ranking, healthy replicas before
        those cooling down after a failure), the scores used, and why the first was chosen.
        ``tokens``: the prompt's engine token ids (``precise`` only); ``tenant``: whose cache
        state counts (isolation only)."""
        with self._lock:
            ranking = self.router.rank(rb, self.views(tokens, tenant))
            now = time.monotonic()
            cooling = {i for i in ranking.order if self.down_until[i] > now}
            order = [i for i in ranking.order if i not in cooling]
            order += [i for i in ranking.order if i in cooling]
            return order, ranking.scores, ranking.reason

    def start(self, i: int) -> None:
        with self._lock:
            self.in_flight[i] += 1

    def finish(self, i: int, rb: RequestBlocks | None, ok: bool) -> None:
        with self._lock:
            self.in_flight[i] = max(0, self.in_flight[i] - 1)
            if ok:
                self.routed[i] += 1
                if rb is not None and rb.keys and self.index is None:
                    self._clock += 1
                    self.caches[i].access(rb, float(self._clock))
            else:
                self.failures[i] += 1
                self.down_until[i] = time.monotonic() + self.cfg.cooldown_s

    def release(self, i: int) -> None:
        """Free replica ``i``'s in-flight slot with no verdict on the replica (the attempt was
        abandoned: client gone, cancelled, a router bug)."""
        with self._lock:
            self.in_flight[i] = max(0, self.in_flight[i] - 1)

    def record_failover(self) -> None:
        with self._lock:
            self.failovers += 1

    def record_error(self) -> None:
        with self._lock:
            self.errors += 1

    def metrics_text(self) -> str:
        """Prometheus text exposition (format 0.0.4) of the routing counters, so the router can
        be scraped like the engines behind it."""
        policy = _label_value(self.cfg.policy)
        with self._lock:
            routed, failures = list(self.routed), list(self.failures)
            in_flight = list(self.in_flight)
            failovers, errors = self.failovers, self.errors
        reps = [_label_value(url) for url in self.cfg.replicas]
        lines = [
            "# HELP skv_router_routed_total Requests answered by a replica.",
            "# TYPE skv_router_routed_total counter",
            *(
                f'skv_router_routed_total{{replica="{r}",policy="{policy}"}} {routed[i]}'
                for i, r in enumerate(reps)
            ),
            "# HELP skv_router_replica_failures_total Attempts a replica failed (no answer, "
            "or an error status).",
            "# TYPE skv_router_replica_failures_total counter",
            *(
                f'skv_router_replica_failures_total{{replica="{r}"}} {failures[i]}'
                for i, r in enumerate(reps)
            ),
            "# HELP skv_router_in_flight Requests in flight through the router, per replica.",
            "# TYPE skv_router_in_flight gauge",
            *(f'skv_router_in_flight{{replica="{r}"}} {in_flight[i]}' for i, r in enumerate(reps)),
            "# HELP skv_router_failovers_total Failed attempts after which the request was sent "
            "to the next replica.",
            "# TYPE skv_router_failovers_total counter",
            f'skv_router_failovers_total{{policy="{policy}"}} {failovers}',
            "# HELP skv_router_errors_total Requests answered with an error because every "
            "replica failed.",
            "# TYPE skv_router_errors_total counter",
            f'skv_router_errors_total{{policy="{policy}"}} {errors}',
        ]
        return "\n".join(lines) + "\n"

    def snapshot(self) -> dict[str, Any]:
        reps = []
        for i, url in enumerate(self.cfg.replicas):
            rep: dict[str, Any] = {
                "url": url,
                "in_flight": self.in_flight[i],
                "routed": self.routed[i],
                "failures": self.failures[i],
            }
            if self.index is None:
                rep["approx_cached_blocks"] = len(self.caches[i])
            else:
                rep["kv_events"] = self.index.state(i).stats()
            reps.append(rep)
        return {"policy": self.cfg.policy, "replicas": reps}


def _label_value(value: str) -> str:
    """A Prometheus label value, escaped as the text format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


#: chat options that change how /tokenize renders the prompt (vLLM's TokenizeChatRequest)
_CHAT_TOKENIZE_KEYS = ("messages", "tools", "add_generation_prompt", "continue_final_message",
                       "add_special_tokens", "chat_template", "chat_template_kwargs")  # fmt: skip


def token_prompt(body: dict[str, Any]) -> list[int] | None:
    """A completion prompt given as token ids (``[1, 2]`` or ``[[1, 2]]``: the first), else None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if not all(0 <= t < 1 << 32 for t in prompt):
            raise ValueError("token ids must be in [0, 2**32)")
        return prompt
    return None


def tokenize_request(body: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """The ``/tokenize`` body giving the engine's token ids for this request (None: cannot)."""
    out: dict[str, Any] = {"model": body["model"]} if "model" in body else {}
    if chat:
        out.update({k: body[k] for k in _CHAT_TOKENIZE_KEYS if k in body})
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch: route on its first prompt
    if not isinstance(prompt, str):
        return None
    out["prompt"] = prompt
    out["add_special_tokens"] = body.get("add_special_tokens", True)
    return out


async def engine_tokens(
    client: httpx.AsyncClient, urls: list[str], body: dict[str, Any], chat: bool
) -> tuple[list[int] | None, str | None]:
    """The prompt's token ids from the first replica whose ``/tokenize`` answers; or the reason
    there are none."""
    if not chat and (ids := token_prompt(body)) is not None:
        return ids, None
    req = tokenize_request(body, chat)
    if req is None:
        return None, "prompt is neither text nor token ids"
    why = "no replica"
    for url in urls:
        try:
            resp = await client.post(url + "/tokenize", json=req)
        except httpx.HTTPError as exc:
            why = f"{url}/tokenize: {type(exc).__name__}"
            continue
        if resp.status_code != 200:
            why = f"{url}/tokenize: HTTP {resp.status_code}"
            continue
        try:
            tokens = resp.json().get("tokens")
        except (ValueError, AttributeError):  # not JSON, or not an object
            tokens = None
        if isinstance(tokens, list) and all(type(t) is int for t in tokens):
            return tokens, None
        why = f"{url}/tokenize: no 'tokens' in the answer"
    return None, why


def token_segments(tokens: list[int], block_size: int) -> list[Any]:
    """A token-id prompt as one opaque segment per block (the router cannot type its content;
    per-block content hashes keep prompts that share a block prefix sharing keys)."""
    return [
        Segment(SemanticType.UNKNOWN, len(chunk), content_hash=content_hash(chunk))
        for i in range(0, len(tokens), block_size)
        if (chunk := tokens[i : i + block_size])
    ]


def request_segments(
    segmenter: Segmenter, body: dict[str, Any], chat: bool, block_size: int
) -> list[Any]:
    """A request's typed segments: one per block for a token-id completion prompt (matched by
    block prefix), else the segmenter's reading of the messages or prompt text."""
    ids = None if chat else token_prompt(body)
    if ids is not None:
        return token_segments(ids, block_size)
    return segment_body(segmenter, body, chat)


def record_decision(
    decision: dict[str, Any],
    replicas: list[str],
    chosen: int | None,
    outcome: Outcome | None,
    log_out: JsonlAppender | None,
) -> None:
    """Complete one decision record with its outcome and append it to the decision log (a
    failed write is logged, never raised: routing goes on)."""
    decision["chosen"] = chosen
    decision["replica"] = replicas[chosen] if chosen is not None else None
    if outcome is not None:
        decision["status"] = outcome.status
        decision["cached_tokens"] = outcome.cached_tokens
        decision["ttft_ms"] = round(outcome.ttft_ms, 3) if outcome.ttft_ms else None
        decision["total_ms"] = round(outcome.total_ms, 3) if outcome.total_ms else None
        if outcome.error_kind:
            decision["error"] = outcome.error_kind
    if log_out is not None:
        try:
            log_out.append(decision)
        except OSError:
            log.exception("cannot write routing decision")


@dataclass
class _Call:
    """One client request on its way through the router."""

    endpoint: str
    content: bytes  # the body as forwarded
    headers: dict[str, str]
    rb: RequestBlocks
    start: float  # time.perf_counter() at arrival
    deadline: float  # same clock: the last byte, all attempts together
    decision: dict[str, Any]  # the decision-log line, completed when the request ends
    logged: bool = False  # one line per request, however it ends
    tenant: str | None = None  # isolation: whose cache state the request counts against
    tokens: list[int] | None = None  # precise: the prompt's engine token ids
    stamp: int | None = None  # precise + isolation: the TenantKVIndex stamp of the request

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return self.decision["attempts"]


class Dispatcher:
    """The router's request path, in named steps: :meth:`blocks` (segment, in a worker
    thread), :meth:`rank` (health ordering), :meth:`attempt` (forward to one replica),
    :meth:`attempt_failed` (failover bookkeeping), :meth:`give_up` (every replica failed),
    :meth:`done` (an answer ended; ``precise`` under isolation: :meth:`claim` the served
    blocks for the tenant); :meth:`handle` strings them together. The decision log gets one
    line per request (:meth:`log`), which also lets go of an unclaimed index stamp."""

    def __init__(
        self,
        cfg: RouterConfig,
        state: RouterState,
        client: httpx.AsyncClient,
        log_out: JsonlAppender | None,
    ) -> None:
        self.cfg, self.state, self.client, self.log_out = cfg, state, client, log_out
        self.timeouts = cfg.timeouts
        self.tenancy = TenantPolicy.from_config(cfg)
        self.segmenter = Segmenter(cfg.tokenizer, redact=True)

    def blocks(
        self, body: dict[str, Any], chat: bool, session: str | None, tenant: str | None = None
    ) -> tuple[list[Any], RequestBlocks]:
        """The request's typed segments and prefix-keyed blocks (CPU work: called in a worker
        thread)."""
        segments = request_segments(self.segmenter, body, chat, self.cfg.block_size)
        return segments, self.state.blocks(segments, session, tenant)

    async def rank(
        self, body: dict[str, Any], chat: bool, rb: RequestBlocks, tenant: str | None = None
    ) -> tuple[list[int], list[float] | None, str, dict[str, Any], list[int] | None]:
        """Health ordering: the replicas to try, best first (healthy before those cooling down),
        the scores, why the first, the step report, the prompt's engine tokens; ``precise``
        first asks a replica's ``/tokenize`` (healthy first) for the token ids."""
        tokens: list[int] | None = None
        precise: dict[str, Any] = {}
        if self.state.index is not None:
            t0 = time.perf_counter()
            urls = [self.cfg.replicas[i] for i in self.state.healthy_first()]
            tokens, why = await engine_tokens(self.client, urls, body, chat)
            precise = {"engine_tokens": len(tokens) if tokens is not None else None,
                       "tokenize_ms": round((time.perf_counter() - t0) * 1e3, 3)}  # fmt: skip
            if why:
                precise["tokenize_error"] = why
        order, scores, reason = self.state.candidates(rb, tokens, tenant)
        return order, scores, reason, precise, tokens

    def log(self, call: _Call, chosen: int | None, outcome: Outcome | None) -> None:
        """The request ended (once): its decision line; an unclaimed stamp is let go."""
        self.end(call)
        if not call.logged:
            call.logged = True
            record_decision(call.decision, self.cfg.replicas, chosen, outcome, self.log_out)

    def new_decision(
        self,
        request: Request,
        endpoint: str,
        rb: RequestBlocks,
        ranking: tuple[list[int], list[float] | None, str, dict[str, Any], list[int] | None],
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """The decision-log line as routing starts (outcome fields come at the end)."""
        _order, scores, reason, precise, _tokens = ranking
        return {
            "ts": round(time.time(), 3),
            "request_id": request.headers.get("x-request-id") or f"req-{uuid.uuid4().hex[:16]}",
            "session_id": request.headers.get("x-session-id"),
            "tenant_id": tenant,
            "endpoint": endpoint,
            "policy": self.cfg.policy,
            "reason": reason,
            "prompt_tokens": rb.prompt_tokens,
            "num_blocks": rb.num_blocks,
            "scores": scores,
            **precise,
            "in_flight": list(self.state.in_flight),
            "attempts": [],
        }

    def done(self, call: _Call, i: int, o: Outcome) -> None:
        """An answer from replica ``i`` ended (relay callback, exactly once): free its slot;
        a prefilled prompt (served, dropped stream, client gone) updates its approximate cache;
        a 4xx is the client's doing; anything else counts against the replica."""
        if o.error_kind is None and call.stamp is not None:  # served: the tenant owns it
            self.claim(call, i)
        # the decision line first: once a slot is free its request is on record (a reader that
        # waits for in_flight == 0 sees every line)
        self.log(call, i, o)
        if o.error_kind in (None, "dropped_stream", "client_gone"):
            self.state.finish(i, call.rb, ok=True)
        elif o.upstream_status is not None and o.upstream_status < 500 and o.status < 500:
            self.state.finish(i, None, ok=True)
        else:
            self.state.finish(i, None, ok=False)

    def claim(self, call: _Call, i: int) -> None:
        """Precise + isolation: replica ``i`` served the call's prompt, so its tenant owns those
        blocks there (once per request: the stamp is spent)."""
        index, stamp = self.state.index, call.stamp
        call.stamp = None
        if stamp is None or not isinstance(index, TenantKVIndex):
            return
        if call.tokens and call.tenant is not None:
            index.claim(i, call.tenant, call.tokens, stamp)
        else:
            index.end(stamp)

    def end(self, call: _Call) -> None:
        """The call is over without a claim: its stamp (if any) no longer holds removals."""
        if call.stamp is not None and isinstance(self.state.index, TenantKVIndex):
            self.state.index.end(call.stamp)
        call.stamp = None

    async def attempt(self, call: _Call, i: int) -> Response | UpstreamError:
        """Forward one attempt to replica ``i``: the client's response, or the error to fail
        over on. The replica's in-flight slot is released exactly once (see the invariant)."""
        url = self.cfg.replicas[i]
        outcome = Outcome(upstream=url)
        released = handed_off = False

        def release(o: Outcome | None) -> None:
            nonlocal released
            if released:
                return
            released = True
            if o is None:
                self.state.release(i)
            else:
                self.done(call, i, o)

        self.state.start(i)
        try:
            try:
                resp = await open_upstream(
                    self.client, url + call.endpoint, call.content, call.headers, outcome,
                    self.timeouts, call.deadline,
                )  # fmt: skip
            except UpstreamError as err:
                released = True
                self.state.finish(i, None, ok=False)
                return err
            call.attempts.append({"replica": i, "status": resp.status_code})
            response = await relay_response(
                resp, outcome, call.start, release, deadline=call.deadline
            )
            handed_off = True  # the relay calls release() when the answer ends
            return response
        finally:
            if not handed_off:  # failed after routing (client gone, a bug): free the slot
                release(None)

    def attempt_failed(self, call: _Call, i: int, err: UpstreamError, more: bool) -> None:
        """Failover bookkeeping after replica ``i`` failed (its slot is already released)."""
        call.attempts.append({"replica": i, "error": err.kind, "status": err.upstream_status})
        if more:
            self.state.record_failover()

    def give_up(self, call: _Call, last: UpstreamError, tried: int) -> Response:
        """Every candidate failed: log it, count it, answer the last error."""
        fail = Outcome(status=last.status, error_kind=last.kind, error=last.message)
        fail.total_ms = (time.perf_counter() - call.start) * 1e3
        self.log(call, None, fail)
        self.state.record_error()
        message = f"all {tried} replicas failed; last: {last.client_message}"
        return openai_error(last.status, message, last.kind)

    def abandoned(self, call: _Call, i: int, status: int, kind: str) -> None:
        """An attempt ended by no answer (client gone, a bug): logged as such."""
        o = Outcome(status=status, error_kind=kind, upstream=self.cfg.replicas[i])
        o.total_ms = (time.perf_counter() - call.start) * 1e3
        self.log(call, i, o)

    async def handle(self, request: Request, endpoint: str, chat: bool) -> Response:
        """Check and segment the request, rank the replicas, try them in order."""
        start = time.perf_counter()
        try:  # who the tenant is: from the headers, before the body is read
            tenant = self.tenancy.identify(request.headers)
        except TenantRefused as exc:
            return refusal(exc)
        body = await json_object_body(request)
        if isinstance(body, Response):
            return body
        session = request.headers.get("x-session-id")
        try:
            headers = self.tenancy.upstream_headers(forward_headers(request.headers))
            payload = body
            if self.cfg.tenant_isolation:
                assert tenant is not None  # isolation always names one
                payload = with_cache_salt(body, cache_salt(tenant, self.cfg.tenant_salt_secret))
            segments, rb = await run_in_threadpool(self.blocks, body, chat, session, tenant)
            if self.cfg.forward_types:
                payload = with_semantic_xargs(payload, segments, session)
            content = encode_json(payload)
        except ValueError as exc:
            return openai_error(400, f"cannot route the request: {exc}", "invalid_request_error")
        ranking = await self.rank(body, chat, rb, tenant)
        order, tokens = ranking[0], ranking[4]
        decision = self.new_decision(request, endpoint, rb, ranking, tenant)
        deadline = start + self.timeouts.total_s
        call = _Call(endpoint, content, headers, rb, start, deadline, decision, tenant=tenant)
        if tenant is not None and isinstance(self.state.index, TenantKVIndex):
            call.tokens = tokens
            call.stamp = self.state.index.begin()  # before any engine can store this prompt
        last: UpstreamError | None = None
        for k, i in enumerate(order):
            try:
                result = await self.attempt(call, i)
            except asyncio.CancelledError:
                self.abandoned(call, i, 499, "client_gone")
                raise
            except Exception:  # a bug: logged, answered, the slot already released
                log.exception("request %s: routing to replica %d failed", decision["request_id"], i)
                self.abandoned(call, i, 500, "router_error")
                return openai_error(500, "the router failed to forward the request", "router_error")
            if not isinstance(result, UpstreamError):
                return result
            last = result
            self.attempt_failed(call, i, result, more=k + 1 < len(order))
        assert last is not None
        return self.give_up(call, last, len(order))


def create_app(
    config: RouterConfig | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    mounts: Mapping[str, httpx.AsyncBaseTransport] | None = None,
) -> FastAPI:
    """``mounts``: URL prefix -> transport (e.g. ``httpx.ASGITransport`` of in-process replicas)."""
    cfg = config or RouterConfig.from_env()
    state = RouterState(cfg)
    log_out = (
        JsonlAppender(cfg.routing_output_dir / f"routing-{run_stamp()}.jsonl")
        if cfg.routing_output_dir is not None
        else None
    )
    client = httpx.AsyncClient(
        timeout=cfg.timeouts.client(),
        limits=cfg.timeouts.limits(),
        transport=transport,
        mounts=dict(mounts or {}) or None,
    )
    subscribers = start_kv_subscribers(cfg, state)
    dispatcher = Dispatcher(cfg, state, client, log_out)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        for sub in subscribers:
            sub.close()
        await client.aclose()
        if log_out is not None:
            log_out.close()

    app = FastAPI(title="skv cache-locality router", version="1", lifespan=lifespan)
    install_body_limit(app, cfg.max_body_bytes, cfg.body_read_timeout_s)
    app.state.router = state
    app.state.client = client
    app.state.decisions = log_out
    app.state.kv_subscribers = subscribers

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **state.snapshot()}

    @app.get("/router/state")
    async def router_state() -> dict[str, Any]:
        return state.snapshot()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics_text(), media_type="text/plain; version=0.0.4")

    add_completion_routes(app, dispatcher.handle)

    return app


def start_kv_subscribers(cfg: RouterConfig, state: RouterState) -> list[Any]:
    """``precise``: one background KV-event subscriber per replica, feeding ``state.index``
    (replica ``i`` is the index's key). They live until the app shuts down (or ``close()``)."""
    if state.index is None:
        return []
    from skv.vllm.kv_events import KVEventSubscriber

    subs = []
    for i, endpoint in enumerate(cfg.kv_events):
        state.index.state(i)  # known from the start, even before its first event
        sub = KVEventSubscriber(endpoint, cfg.kv_events_topic, replica=i, index=state.index)
        subs.append(sub.start())
        log.info("replica %d (%s): KV events from %s", i, cfg.replicas[i], endpoint)
    return subs


def __getattr__(name: str) -> Any:  # ``uvicorn skv.services.router:app``
    if name == "app":
        return create_app()
    raise AttributeError(name)
