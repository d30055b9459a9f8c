"""Trace collection: wrap a request handler, segment its prompts, record timing as an skv trace.

This is observability tooling: it records what a serving stack did (arrival, TTFT, cached
tokens) next to a typed, hashed view of each prompt, so the same traffic can be replayed offline
through every eviction policy (``skv replay``). It never controls a backend's cache.

Pieces:

- :class:`TraceCollector` wraps any *handler*: a callable ``handler(messages, tools=None)`` that
  takes OpenAI-style chat messages and returns a :class:`HandlerResponse` (or an OpenAI chat
  completion dict). Per call it segments the messages (:class:`skv.segmenter.Segmenter`,
  ``redact=True`` by default: only content hashes, token counts, semantic labels and timing
  are kept), calls the handler, and appends one native skv record (:mod:`skv.traces.native`)
  to ``<path>.partial``, flushed per record, so a crash keeps what was recorded (that file is a
  readable trace; its header has no request count). ``close()`` writes the final file
  atomically, with the count in its header, and removes the partial one.
- :class:`MockHandler` is a deterministic stand-in for a serving engine: it keeps a prefix cache
  (skv's own ``BlockCache`` under ``lru``, prefix keying) and reports a TTFT from a known linear
  model of uncached and cached prompt tokens, with seeded multiplicative jitter. Its TTFTs are
  SIMULATED by that model, not measured, and the trace's header says so.
- :func:`mock_calls` plans a seeded mix of chat, RAG and tool-agent sessions;
  :func:`collect_mock` runs them through a collector wrapping a ``MockHandler``.

Timing: a handler response that carries ``ttft_ms`` is recorded as is (the mock's simulated
TTFT, or a proxy's measured one); otherwise the collector measures the call's wall-clock time
(a non-streaming handler's total latency, an upper bound on TTFT). ``arrival_s`` is the caller's
when given, else seconds since the collector was created.

Token counts: segments are counted by the collector's tokenizer; an engine's own count differs
(chat-template tokens, another tokenizer). An engine-reported ``cached_tokens`` above the
segmented prompt length is clipped to it (so calibration stays consistent) and the engine's own
prompt count is kept in ``extra["engine_prompt_tokens"]`` when it differs.
"""

from __future__ import annotations

import heapq
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from skv.blocks import DEFAULT_BLOCK_SIZE, request_blocks
from skv.model import Request, content_hash
from skv.segmenter import Segmenter
from skv.tokenize import Tokenizer, get_tokenizer
from skv.traces.native import SKV_TRACE_VERSION, SkvHeader, _to_record, write_skv_trace

log = logging.getLogger(__name__)

DEFAULT_LIVE_DIR = Path("outputs") / "live_traces"


# --------------------------------------------------------------------------- handler protocol


@dataclass(frozen=True)
class HandlerResponse:
    """What a handler returns. ``None`` fields are unknown (the collector fills what it can)."""

    content: str
    ttft_ms: float | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


Handler = Callable[..., Any]


def normalize_response(resp: Any) -> HandlerResponse:
    """A :class:`HandlerResponse` from one, or from an OpenAI chat-completion dict.

    From a dict: ``choices[0].message.content``, ``usage.prompt_tokens``,
    ``usage.completion_tokens`` and ``usage.prompt_tokens_details.cached_tokens`` (what vLLM and
    OpenAI report); a top-level ``ttft_ms`` is taken when a proxy added one.
    """
    if isinstance(resp, HandlerResponse):
        return resp
    if isinstance(resp, str):
        return HandlerResponse(resp)
    if isinstance(resp, Mapping):
        choices = resp.get("choices") or [{}]
        msg = choices[0].get("message") or {}
        usage = resp.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        ttft = resp.get("ttft_ms")
        return HandlerResponse(
            content=msg.get("content") or "",
            ttft_ms=float(ttft) if ttft is not None else None,
            cached_tokens=details.get("cached_tokens"),
            prompt_tokens=usage.get("prompt_tokens"),
            output_tokens=usage.get("completion_tokens"),
        )
    raise TypeError(
        f"handler returned {type(resp).__name__}; expected HandlerResponse, str or an OpenAI "
        "chat-completion dict"
    )


# --------------------------------------------------------------------------- the collector


class TraceCollector:
    """Wraps ``handler``; every call is segmented, timed and recorded as one skv request.

    Use as a context manager (``close()`` on exit) or call ``close()`` yourself. ``path=None``
    keeps the requests in memory only (``self.requests``).
    """

    def __init__(
        self,
        handler: Handler,
        path: str | Path | None = None,
        *,
        redact: bool = True,
        tokenizer: Tokenizer | str | None = None,
        meta: Mapping[str, Any] | None = None,
        request_prefix: str = "req-",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.handler = handler
        self.path = Path(path) if path is not None else None
        self.redact = redact
        self.tokenizer = get_tokenizer(tokenizer)
        self.segmenter = Segmenter(self.tokenizer, redact=redact)
        self.request_prefix = request_prefix
        self.requests: list[Request] = []
        self.meta: dict[str, Any] = {
            "collector": "skv.services.collect.TraceCollector",
            "redacted": redact,
            "tokenizer": getattr(self.tokenizer, "name", type(self.tokenizer).__name__),
            "timing": "observed_ttft_ms: the handler's ttft_ms when it reports one, else the "
            "call's wall-clock time",
            **(meta or {}),
        }
        self._clock = clock
        self._t0 = clock()
        self._last_in_session: dict[str, str] = {}
        self._partial: TextIO | None = None
        self._closed = False

    @property
    def partial_path(self) -> Path | None:
        return self.path.with_name(self.path.name + ".partial") if self.path else None

    def __enter__(self) -> TraceCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        arrival_s: float | None = None,
        session_id: str | None = None,
        tenant_id: str | None = None,
        turn: int | None = None,
        request_id: str | None = None,
    ) -> HandlerResponse:
        """Forward one chat request to the handler, record it, return the handler's response."""
        if self._closed:
            raise RuntimeError("TraceCollector is closed")
        start = self._clock()
        arrival = (start - self._t0) if arrival_s is None else float(arrival_s)
        segments = self.segmenter.messages(messages, tools)  # before the call: a bad request
        resp = normalize_response(self.handler(messages, tools=tools))  # fails unrecorded
        elapsed_ms = (self._clock() - start) * 1e3
        prompt = sum(s.num_tokens for s in segments)
        answer = resp.content.strip()
        out_tokens = (
            resp.output_tokens if resp.output_tokens is not None else self.tokenizer.count(answer)
        )
        cached = resp.cached_tokens
        if cached is not None:
            cached = max(0, min(int(cached), prompt))
        extra: dict[str, Any] = {}
        if resp.prompt_tokens is not None and resp.prompt_tokens != prompt:
            extra["engine_prompt_tokens"] = int(resp.prompt_tokens)
        if not self.redact:
            extra["response_text"] = resp.content
        ttft = resp.ttft_ms if resp.ttft_ms is not None else elapsed_ms
        rid = request_id or f"{self.request_prefix}{len(self.requests):06d}"
        parent = self._last_in_session.get(session_id) if session_id is not None else None
        req = Request(
            request_id=rid,
            arrival_s=round(arrival, 6),
            segments=segments,
            output_tokens=int(out_tokens),
            session_id=session_id,
            tenant_id=tenant_id,
            turn=turn,
            parent_id=parent,
            templated=any(s.stype.value == "template" for s in segments),
            observed_ttft_ms=round(float(ttft), 3),
            observed_cached_tokens=cached,
            # the answer's identity: a later turn quoting it verbatim (assistant history) has
            # the same trimmed text, hence the same hash, as the segmenter gives that message
            output_hash=content_hash(answer) if answer else None,
            extra=extra,
        )
        if session_id is not None:
            self._last_in_session[session_id] = rid
        self.requests.append(req)
        self._append(req)
        return resp

    def _append(self, req: Request) -> None:
        if self.path is None:
            return
        if self._partial is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            assert self.partial_path is not None
            self._partial = open(self.partial_path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            head = SkvHeader(skv_trace=SKV_TRACE_VERSION, num_requests=None, meta=self.meta)
            self._partial.write(head.model_dump_json() + "\n")
        self._partial.write(_to_record(req).model_dump_json(exclude_defaults=True) + "\n")
        self._partial.flush()

    def close(self) -> Path | None:
        """Write the final trace atomically (header with the request count); returns its path."""
        if self._closed:
            return self.path
        self._closed = True
        if self._partial is not None:
            self._partial.close()
            self._partial = None
        if self.path is None:
            return None
        write_skv_trace(self.path, self.requests, self.meta)
        assert self.partial_path is not None
        self.partial_path.unlink(missing_ok=True)
        return self.path


# --------------------------------------------------------------------------- the mock engine


class MockHandler:
    """A deterministic mock serving engine with a prefix cache and a known TTFT model.

    Per call: segment the messages, key their blocks by exact prefix (vLLM-style), look them up
    in an ``lru`` ``BlockCache`` of ``cache_tokens`` tokens (hits are pinned, misses cached),
    and report::

        ttft_ms = (base_ms + ms_per_uncached_token * uncached + ms_per_cached_token * cached)
                  * (1 + jitter * N(0, 1))        (clipped at >= 0.5 * the noiseless value)

    The answer is seeded by the prompt's hash, so equal prompts get equal answers. Only prompts
    are cached (not answers); a later turn hits its session's earlier prompt as a prefix. The
    cache's clock is the call count (LRU needs only order).
    """

    name = "mock"

    def __init__(
        self,
        *,
        base_ms: float = 30.0,
        ms_per_uncached_token: float = 0.12,
        ms_per_cached_token: float = 0.01,
        jitter: float = 0.03,
        cache_tokens: int = 20_000,
        block_size: int = DEFAULT_BLOCK_SIZE,
        answer_words: tuple[int, int] = (15, 60),
        seed: int = 0,
        tokenizer: Tokenizer | str | None = None,
    ) -> None:
        from skv.policies.registry import make_cache

        if cache_tokens < block_size:
            raise ValueError(f"cache_tokens ({cache_tokens}) must hold a block ({block_size})")
        self.base_ms = base_ms
        self.ms_per_uncached_token = ms_per_uncached_token
        self.ms_per_cached_token = ms_per_cached_token
        self.jitter = jitter
        self.cache_tokens = cache_tokens
        self.block_size = block_size
        self.answer_words = answer_words
        self.seed = seed
        self.segmenter = Segmenter(tokenizer, redact=True)
        self.cache = make_cache("lru", cache_tokens // block_size)
        self._rng = random.Random(f"mock-handler:{seed}")
        self.calls = 0

    def describe(self) -> dict[str, Any]:
        return {
            "handler": self.name,
            "ttft_formula": "ttft_ms = (base_ms + ms_per_uncached_token * uncached"
            " + ms_per_cached_token * cached) * (1 + jitter * N(0,1))",
            "base_ms": self.base_ms,
            "ms_per_uncached_token": self.ms_per_uncached_token,
            "ms_per_cached_token": self.ms_per_cached_token,
            "jitter": self.jitter,
            "cache": f"lru BlockCache, prefix keying, {self.cache_tokens} tokens "
            f"({self.cache_tokens // self.block_size} blocks of {self.block_size})",
            "seed": self.seed,
        }

    def __call__(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> HandlerResponse:
        segments = self.segmenter.messages(messages, tools)
        req = Request(f"mock-{self.calls}", float(self.calls), segments)
        rb = request_blocks(req, self.block_size, "prefix", index=self.calls)
        lease = self.cache.access(rb, float(self.calls))
        self.calls += 1
        prompt = req.prompt_tokens
        cached = min(int(lease.hit_tokens), prompt)
        clean = (
            self.base_ms
            + self.ms_per_uncached_token * (prompt - cached)
            + self.ms_per_cached_token * cached
        )
        noisy = clean * (1.0 + self.jitter * self._rng.gauss(0.0, 1.0))
        ttft = max(noisy, 0.5 * clean)
        prompt_id = content_hash("|".join(s.content_hash or "" for s in segments))
        words = _Words(f"answer:{self.seed}:{prompt_id}")
        answer = words.sentences(words.rng.randint(*self.answer_words))
        return HandlerResponse(
            content=answer,
            ttft_ms=ttft,
            cached_tokens=cached,
            prompt_tokens=prompt,
            output_tokens=self.segmenter.tokenizer.count(answer),
        )


# --------------------------------------------------------------------------- mock traffic

_WORDS = tuple(
    """
    about above access account action active adjust agent agree allow amount answer apply
    area audit basis batch before budget build buyer cache call case change check choose
    claim client close cloud code common cost count credit data date deal debt delay design
    detail device direct doctor early effect energy engine entry error event expert export
    factor field file final firm flow focus format frame fund gain group growth guide handle
    health index input issue item label layer level limit local logic market memory method
    metric model module motion network normal number object office option order output owner
    page panel patch period phase plan policy power price print profit query queue range rate
    record region report result review risk route rule sample scale search server share signal
    simple source space stage state status store stream supply system table target task team
    tenant term test token total trace trade update usage user value vendor volume window worker
    """.split()  # noqa: SIM905 (a word list reads better as prose)
)


class _Words:
    """Seeded prose: sentences of common short words (one SimpleTokenizer token per word)."""

    def __init__(self, key: str) -> None:
        self.rng = random.Random(key)  # str seeds hash with sha512: stable across processes

    def sentences(self, n_words: int) -> str:
        out: list[str] = []
        left = n_words
        while left > 0:
            k = min(left, self.rng.randint(6, 14))
            words = [self.rng.choice(_WORDS) for _ in range(k)]
            out.append(" ".join(words).capitalize() + ".")
            left -= k
        return " ".join(out)


@dataclass
class MockCall:
    """One planned request: when, in which session, and the new message(s) it adds."""

    arrival_s: float
    session_id: str
    tenant_id: str
    kind: str  # chat | rag | agent
    turn: int
    new_messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    system: str = ""


SESSION_KINDS = ("chat", "rag", "agent")


def _doc(seed: int, k: int, words: tuple[int, int]) -> str:
    w = _Words(f"doc:{seed}:{k}")
    return f"Document {k}:\n" + w.sentences(w.rng.randint(*words))


def _tools(seed: int, tenant: int) -> list[dict[str, Any]]:
    w = _Words(f"tools:{seed}:{tenant}")
    return [
        {
            "type": "function",
            "function": {
                "name": f"{w.rng.choice(_WORDS)}_{w.rng.choice(_WORDS)}",
                "description": w.sentences(w.rng.randint(10, 25)),
                "parameters": {
                    "type": "object",
                    "properties": {
                        p: {"type": "string", "description": w.sentences(6)}
                        for p in sorted({w.rng.choice(_WORDS) for _ in range(3)})
                    },
                },
            },
        }
        for _ in range(3)
    ]


def mock_calls(
    n: int,
    *,
    seed: int = 0,
    tenants: int = 3,
    session_rate_rps: float = 0.5,
    think_time_s: float = 4.0,
    turns: tuple[int, int] = (1, 6),
    num_docs: int = 16,
    doc_words: tuple[int, int] = (120, 320),
    docs_per_turn: tuple[int, int] = (2, 3),
    zipf_alpha: float = 1.1,
    kinds: Sequence[str] = SESSION_KINDS,
) -> list[MockCall]:
    """``n`` requests from seeded sessions, in arrival order.

    Sessions start as a Poisson process (``session_rate_rps``); each picks a tenant (its own
    system prompt and, for agents, tool schemas), a kind and a number of turns; turns follow
    each other after exponential think times. ``rag`` turns cite documents (``docs_per_turn``
    draws, duplicates merged) from a Zipf-popular corpus of ``num_docs`` documents of
    ``doc_words`` words (shared across sessions and tenants), then ask a question; ``chat``
    turns add a short user message; ``agent`` sessions open with a task and then feed tool
    outputs back. Same arguments give the same calls.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    bad = sorted(set(kinds) - set(SESSION_KINDS))
    if bad or not kinds:
        raise ValueError(f"unknown session kind(s) {bad}; known: {', '.join(SESSION_KINDS)}")
    rng = random.Random(f"mock-calls:{seed}")
    weights = [1.0 / (i + 1) ** zipf_alpha for i in range(num_docs)]
    systems = {}
    for t in range(tenants):
        w = _Words(f"system:{seed}:{t}")
        systems[t] = f"You are the assistant of tenant {t}. " + w.sentences(w.rng.randint(60, 140))
    calls: list[MockCall] = []
    start = 0.0
    s = 0
    while n:
        start += rng.expovariate(session_rate_rps)
        # a session's calls arrive at or after its start: once a start is later than the n-th
        # earliest planned arrival, no further session can enter the first n
        if len(calls) >= n and start > heapq.nsmallest(n, (c.arrival_s for c in calls))[-1]:
            break
        tenant = rng.randrange(tenants)
        kind = kinds[rng.randrange(len(kinds))]
        sid = f"s{s:04d}"
        s += 1
        t_arr = start
        for turn in range(rng.randint(*turns)):
            if turn:
                t_arr += rng.expovariate(1.0 / think_time_s)
            w = _Words(f"user:{seed}:{sid}:{turn}")
            if kind == "rag":
                k = rng.randint(*docs_per_turn)
                docs = sorted(set(rng.choices(range(num_docs), weights, k=k)))
                body = "\n\n".join(_doc(seed, d, doc_words) for d in docs)
                q = w.sentences(w.rng.randint(8, 30))
                new = [{"role": "user", "content": f"{body}\n\nQuestion: {q}"}]
            elif kind == "agent" and turn:
                new = [{"role": "tool", "content": w.sentences(w.rng.randint(60, 200))}]
            else:
                new = [{"role": "user", "content": w.sentences(w.rng.randint(10, 50))}]
            calls.append(
                MockCall(
                    arrival_s=round(t_arr, 6),
                    session_id=sid,
                    tenant_id=f"tenant-{tenant}",
                    kind=kind,
                    turn=turn,
                    new_messages=new,
                    tools=_tools(seed, tenant) if kind == "agent" else None,
                    system=systems[tenant],
                )
            )
    calls.sort(key=lambda c: (c.arrival_s, c.session_id, c.turn))
    return calls[:n]


def collect_mock(
    n: int,
    path: str | Path | None,
    *,
    seed: int = 0,
    redact: bool = True,
    tokenizer: Tokenizer | str | None = None,
    handler: MockHandler | None = None,
    meta: Mapping[str, Any] | None = None,
    **plan: Any,
) -> list[Request]:
    """Plan ``n`` mock calls, serve them with ``handler`` (a :class:`MockHandler` by default)
    through a :class:`TraceCollector`, write the trace to ``path``; returns the requests."""
    handler = handler or MockHandler(seed=seed, tokenizer=tokenizer)
    calls = mock_calls(n, seed=seed, **plan)
    info = {
        "source": "skv collect-mock (synthetic traffic, mock handler)",
        "seed": seed,
        "requests": n,
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(plan.items())},
        "observed_ttft": "SIMULATED by the mock handler's linear model (not a real engine)",
        "mock_handler": handler.describe() if hasattr(handler, "describe") else str(handler),
        **(meta or {}),
    }
    history: dict[str, list[dict[str, Any]]] = {}
    with TraceCollector(handler, path, redact=redact, tokenizer=tokenizer, meta=info) as col:
        for c in calls:
            msgs = history.setdefault(c.session_id, [{"role": "system", "content": c.system}])
            msgs.extend(c.new_messages)
            resp = col(
                list(msgs),
                tools=c.tools,
                arrival_s=c.arrival_s,
                session_id=c.session_id,
                tenant_id=c.tenant_id,
                turn=c.turn,
            )
            msgs.append({"role": "assistant", "content": resp.content})
    return col.requests


__all__ = [
    "DEFAULT_LIVE_DIR",
    "HandlerResponse",
    "MockCall",
    "MockHandler",
    "TraceCollector",
    "collect_mock",
    "mock_calls",
    "normalize_response",
]
