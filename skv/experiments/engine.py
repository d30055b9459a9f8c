"""What every study on a real vLLM engine shares: its config sections, a seeded hash-id trace,
the simulator's view of that trace, and the comparison of measured with simulated hits.

The engine-free parts (:func:`synthetic_trace`, :func:`simulate_hits`, :func:`compare_hits`) are
unit-tested on their own; :func:`engine_missing` says why a study must skip (no engine venv).
The studies (``skv.experiments.fidelity``, ``skv.experiments.routing``) add what they measure.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skv.model import Request, Segment, SemanticType

#: hash ids for generated tokens: far above any id a trace or :func:`synthetic_trace` uses
OUTPUT_ID_BASE = 1 << 40

#: Bounds on the numbers an engine-study config may set: key -> (low, high, why). The
#: synthetic trace's ids fix two: document ``d``'s block ``k`` is ``100000 + 1000 d + k`` and a
#: request's own blocks count from 900000, so ``k < 1000`` and ``d < 800`` keep them apart.
#: ``doc_blocks`` and ``own_blocks`` are ``[low, high]`` pairs within their bounds.
LIMITS: dict[str, tuple[float, float, str]] = {
    "seed": (0, 2**63 - 1, "a 64-bit seed"),
    "num_requests": (1, 100_000, "sent one at a time to a CPU engine; the studies use 40-120"),
    "num_docs": (1, 800, "document ids (100000 + 1000 d) stay below the own-block ids"),
    "doc_blocks": (0, 999, "a document's block k has id 100000 + 1000 d + k"),
    "own_blocks": (1, 1000, "every request has a (partial) block of its own"),
    "zipf_s": (0, 10, "a popularity exponent; 10 already puts all weight on one document"),
    "block_size": (1, 4096, "tokens per KV block, as experiment configs"),
    "num_gpu_blocks": (2, 10_000_000, "the engine's KV blocks, the null block included"),
    "max_model_len": (1, 1 << 24, "skv.traces.MAX_TOKENS: above any model's context window"),
    "max_output_tokens": (1, 1 << 24, "skv.traces.MAX_TOKENS"),
    "replicas": (1, 64, "one CPU engine each, as experiment configs' replicas"),
    "router_cache_tokens": (1, 1 << 34, "a router-side cache size in tokens"),
    "startup_timeout_s": (0, 86_400, "a day"),
    "request_timeout_s": (0, 86_400, "a day"),
    "event_wait_s": (0, 86_400, "a day"),
}


def _check_value(key: str, value: Any, default: Any, where: str) -> None:
    """``value`` has the type of ``default`` (any finite number for a float or a duration in
    seconds) and lies within :data:`LIMITS`; else a ConfigError naming ``where`` and ``key``."""
    from skv.experiments.config import ConfigError, _quote

    def bad(msg: str) -> None:
        raise ConfigError(f"{where}.{key}: {msg} (got {_quote(value)})")

    def number(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    if default is None and value is None:
        return
    if isinstance(default, bool) or default is None:
        kind_ok = isinstance(value, bool) if isinstance(default, bool) else True
    elif isinstance(default, float) or (isinstance(default, int) and key.endswith("_s")):
        kind_ok = number(value)  # seconds may be fractional whatever the default
    elif isinstance(default, int):
        kind_ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        kind_ok = isinstance(value, type(default))
    if not kind_ok:
        bad(f"expected {type(default).__name__}, like the default {default!r}")
    if key not in LIMITS:
        return
    lo, hi, why = LIMITS[key]
    if isinstance(default, list):
        ok = (
            len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and lo <= value[0] <= value[1] <= hi
        )
        if not ok:
            bad(f"expected [low, high] integers with {lo:g} <= low <= high <= {hi:g} ({why})")
    elif not (number(value) and lo <= value <= hi):
        bad(f"must be in [{lo:g}, {hi:g}] ({why})")


def load_section(
    path: str | Path | None,
    section: str,
    defaults: dict[str, Any],
    *,
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An engine experiment's config: ``defaults``, then the file's ``section`` mapping (keys it
    does not know are an error naming the file), then (``quick``) its ``quick:`` mapping, then
    ``overrides`` (None values ignored).

    The file is read by :func:`skv.experiments.config.read_yaml` (size bounds); every value,
    from the file or an override, must have its default's type and lie within :data:`LIMITS`
    (a ``ConfigError`` naming the file, section and key)."""
    from skv.experiments.config import ConfigError, read_yaml

    cfg = dict(defaults)
    if path is not None:
        data = read_yaml(path, "engine-study config") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
        for part in (section, "quick"):
            values = data.get(part) or {}
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: {part}: expected a mapping")
            unknown = set(values) - set(defaults)
            if unknown:
                raise ConfigError(f"{path}: {part}: unknown keys {sorted(unknown)}")
            for key, value in values.items():
                _check_value(key, value, defaults[key], f"{path}: {part}")
        cfg.update(data.get(section) or {})
        if quick:
            cfg.update(data.get("quick") or {})
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key, value in given.items():
        if key in defaults:
            _check_value(key, value, defaults[key], "override")
    cfg.update(given)
    return cfg


def synthetic_trace(cfg: dict[str, Any]) -> list[Request]:
    """Seeded hash-id trace in engine units (``hash_block_size = block_size``).

    Request ``i``: a document ``d`` (Zipf over ``num_docs``) of ``doc_blocks`` blocks (ids
    ``100000 + 1000 d + k``), then ``own_blocks`` unique blocks (ids ``900000+``); the prompt
    ends in a partial block (1..B-1 tokens of its last block), as the ``vllm`` policy's
    ``N - 2`` usable-block accounting assumes.
    """
    rng = random.Random(int(cfg["seed"]))
    bs = int(cfg["block_size"])
    n_docs = int(cfg["num_docs"])
    lo, hi = cfg["doc_blocks"]
    doc_len = [rng.randint(int(lo), int(hi)) for _ in range(n_docs)]
    weights = [1.0 / (k + 1) ** float(cfg["zipf_s"]) for k in range(n_docs)]
    olo, ohi = cfg["own_blocks"]
    uid = 900_000
    kind = cfg.get("types", "rag")
    turns: dict[int, int] = {}
    out: list[Request] = []
    for i in range(int(cfg["num_requests"])):
        d = rng.choices(range(n_docs), weights)[0]
        shared = [100_000 + 1000 * d + k for k in range(doc_len[d])]
        own = list(range(uid, uid + rng.randint(int(olo), int(ohi))))
        uid += len(own)
        ids = shared + own
        tokens = bs * (len(ids) - 1) + rng.randint(1, bs - 1)  # partial last block
        # agent: each shared prefix is one agent's session (its tool calls are the turns)
        turn = turns[d] = turns.get(d, -1) + 1
        out.append(
            Request(
                f"fid:{i}",
                0.01 * i,
                _typed_segments(kind, bs, len(shared), tokens),
                output_tokens=int(cfg["max_output_tokens"]),
                hash_ids=ids,
                hash_block_size=bs,
                session_id=f"agent-{d}" if kind == "agent" else None,
                turn=turn if kind == "agent" else None,
            )
        )
    return out


#: how :func:`synthetic_trace` types a prompt (config key ``types``)
TRACE_TYPES = ("rag", "agent")


def _typed_segments(kind: str, bs: int, shared_blocks: int, tokens: int) -> list[Segment]:
    """``rag``: the shared document is retrieved context, the rest the user's query.
    ``agent``: the shared part is a system prompt (its first half, at least one block) and the
    tool schemas, the request's own full blocks are a one-off tool output and its last
    (partial) block the user's query: shared instructions vs one-off tool results, the case
    where semantic eviction is meant to matter."""
    doc = bs * shared_blocks
    if kind == "rag":
        return [
            Segment(SemanticType.RETRIEVED_CONTEXT, doc),
            Segment(SemanticType.USER_QUERY, tokens - doc),
        ]
    if kind != "agent":
        raise ValueError(f"types {kind!r}: expected one of {', '.join(TRACE_TYPES)}")
    system = bs * max(1, shared_blocks // 2) if shared_blocks else 0
    own_full = bs * ((tokens - doc) // bs)
    segs = [
        Segment(SemanticType.SYSTEM, system),
        Segment(SemanticType.TOOL_SCHEMA, doc - system),
        Segment(SemanticType.TOOL_OUTPUT, own_full),
        Segment(SemanticType.USER_QUERY, tokens - doc - own_full),
    ]
    return [s for s in segs if s.num_tokens]


def with_output_blocks(r: Request, block_size: int, first_id: int) -> Request | None:
    """``r`` grown by its answer, as vLLM caches it: KV exists for ``prompt + output - 1``
    tokens (the last sampled token is never fed back), the prompt's partial last block fills
    up with the answer's first tokens, and every block from there on holds content no other
    request has (fresh hash ids ``first_id, first_id + 1, ...``). None when the answer adds
    nothing to the prompt's blocks."""
    if r.hash_ids is None or r.output_tokens <= 1:
        return None
    bs = block_size
    prompt = r.prompt_tokens
    total = prompt + r.output_tokens - 1
    n_full = prompt // bs
    n_blocks = -(-total // bs)
    if n_blocks <= n_full:
        return None
    fresh = list(range(first_id, first_id + n_blocks - n_full))
    out_seg = Segment(SemanticType.OUTPUT, total - prompt)
    return Request(
        r.request_id,
        r.arrival_s,
        [*r.segments, out_seg],
        hash_ids=list(r.hash_ids[:n_full]) + fresh,
        hash_block_size=bs,
        session_id=r.session_id,
        turn=r.turn,
        templated=r.templated,
    )


def simulate_hits(
    trace: Sequence[Request],
    block_size: int,
    capacity_blocks: int,
    *,
    decode: bool = True,
    eviction: str | None = None,
    eviction_params: dict[str, Any] | None = None,
) -> list[int]:
    """Per-request hit tokens of skv's ``vllm`` policy, cache-only, in trace order. With
    ``decode``, each request also decodes its ``output_tokens`` into blocks before it frees
    them (:func:`with_output_blocks`), as the engine does. With ``eviction``, the pool reuses
    free cached blocks in that policy's order (what ``skv vllm serve --eviction`` runs)."""
    from skv.blocks import request_blocks
    from skv.policies.registry import make_cache
    from skv.replay import compile_trace

    blocks = compile_trace(trace, block_size)
    params = {"eviction": eviction, "eviction_params": eviction_params} if eviction else None
    cache = make_cache("vllm", capacity_blocks, params)
    hits = []
    next_id = OUTPUT_ID_BASE
    for r, rb in zip(trace, blocks, strict=True):
        lease = cache.acquire(rb, rb.arrival_s)
        ext = with_output_blocks(r, block_size, next_id) if decode else None
        if ext is not None:
            next_id += len(ext.hash_ids)  # answers never share blocks
            erb = request_blocks(ext, block_size, "prefix")
            cache.extend(lease, erb, r.prompt_tokens // block_size, rb.arrival_s)
        cache.release(lease, rb.arrival_s)
        hits.append(int(lease.hit_tokens))
    return hits


def compare_hits(
    prompt_tokens: Sequence[int], measured: Sequence[int | None], simulated: Sequence[int]
) -> dict[str, Any]:
    """Measured vs simulated cached tokens: token hit rates (of all prompt tokens), the gap in
    points, and per-request agreement. Requests without a measurement are left out of both."""
    if not (len(prompt_tokens) == len(measured) == len(simulated)):
        raise ValueError("compare_hits: sequences differ in length")
    rows = [
        (p, int(m), int(s))
        for p, m, s in zip(prompt_tokens, measured, simulated, strict=True)
        if m is not None
    ]
    total = sum(p for p, _, _ in rows)
    m_tot = sum(m for _, m, _ in rows)
    s_tot = sum(s for _, _, s in rows)
    m_rate = m_tot / total if total else 0.0
    s_rate = s_tot / total if total else 0.0
    diffs = [m - s for _, m, s in rows]
    exact = sum(1 for d in diffs if d == 0)
    return {
        "requests_compared": len(rows),
        "prompt_tokens": total,
        "measured_hit_tokens": m_tot,
        "simulated_hit_tokens": s_tot,
        "measured_hit_rate": m_rate,
        "simulated_hit_rate": s_rate,
        "hit_rate_gap_pts": 100.0 * abs(m_rate - s_rate),
        "exact_agreement": exact / len(rows) if rows else 0.0,
        "requests_disagreeing": len(rows) - exact,
        "mean_abs_diff_tokens": sum(abs(d) for d in diffs) / len(rows) if rows else 0.0,
        "measured_hit_requests": sum(1 for _, m, _ in rows if m > 0),
    }


def engine_setup(cfg: dict[str, Any], trace: Sequence[Request], work: Path) -> tuple[Any, Any, Any]:
    """What every engine study starts from: the engine venv's interpreter, the tiny model
    (built once under ``work``) and ``trace`` planned as a hash replay at the config's block
    size, context length and output length (seeded)."""
    from skv.vllm.hashreplay import HashReplayConfig, plan_hash_replay
    from skv.vllm.server import build_tiny_model, find_engine_python

    py = find_engine_python()
    model = build_tiny_model(work / "tiny-llama", py)
    plan = plan_hash_replay(
        trace,
        HashReplayConfig(
            block_size=int(cfg["block_size"]),
            max_model_len=int(cfg["max_model_len"]),
            max_output_tokens=int(cfg["max_output_tokens"]),
            seed=int(cfg["seed"]),
        ),
    )
    return py, model, plan


def server_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """The engine options every study's servers share: block size, cache size, context length
    and startup timeout, from the config."""
    return {
        "block_size": int(cfg["block_size"]),
        "num_gpu_blocks": int(cfg["num_gpu_blocks"]),
        "max_model_len": int(cfg["max_model_len"]),
        "startup_timeout": float(cfg["startup_timeout_s"]),
    }


def reset_prefix_cache(srv: Any, timeout_s: float = 30.0) -> None:
    """Empty ``srv``'s prefix cache (:meth:`skv.vllm.server.VllmServer.reset_prefix_cache`;
    its ``ServerError`` is a ``RuntimeError``)."""
    srv.reset_prefix_cache(timeout_s)


def start_and_replay(
    srv: Any,
    plan: Any,
    cfg: dict[str, Any],
    *,
    concurrency: int = 1,
    typed: bool = False,
    warmup: dict[str, Any] | None = None,
) -> tuple[list[Any], float]:
    """Start ``srv`` (a :class:`skv.vllm.server.VllmServer` whose context the caller holds),
    send ``plan`` with ``concurrency`` requests in flight (``typed``: with the segments' types),
    after the ``warmup`` request if given; the results and the replay's wall time in s."""
    import time

    from skv.vllm.client import StreamingClient
    from skv.vllm.hashreplay import replay_plan

    async def go():
        async with StreamingClient(
            srv.base_url, srv.model_name, timeout=float(cfg["request_timeout_s"])
        ) as c:
            if warmup is not None:
                await c.request(warmup, max_tokens=1)
            return await replay_plan(c, plan, concurrency=concurrency, typed=typed)

    srv.start()
    t0 = time.perf_counter()
    results = run_coroutine(go)
    return results, time.perf_counter() - t0


def engine_missing() -> str | None:
    """Why the engine cannot run here, or None."""
    from skv.vllm.server import find_engine_python, setup_hint

    if find_engine_python() is None:
        return f"vLLM engine venv absent: {setup_hint()}"
    return None


def run_coroutine(make):
    """``asyncio.run(make())``, in a worker thread when this thread already runs an event loop
    (a Jupyter kernel does)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
