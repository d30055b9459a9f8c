"""What a simulation produces: per-request metrics, a run summary, and series over time.

All latencies are SIMULATED by the latency model named in ``latency`` (never measured); the
summary says so in ``simulated``. Tables are plain lists of dicts so they go straight to CSV/JSON
or pandas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import cython
import numpy as np

from skv.model import NUM_TYPES, TYPES
from skv.sim.replica import RequestState

if TYPE_CHECKING:
    from skv.latency.base import LatencyModel
    from skv.sim.config import SimConfig
    from skv.sim.replica import Replica


@dataclass
class SimResult:
    requests: list[dict[str, Any]]
    summary: dict[str, Any]
    memory: list[dict[str, float]] = field(default_factory=list)
    policy_series: list[dict[str, float]] = field(default_factory=list)
    latency: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    #: with ``simulate(..., columns=True)`` (then ``requests`` is empty): :func:`request_columns`
    columns: dict[str, np.ndarray] = field(default_factory=dict)


def _request_row(st: RequestState) -> dict[str, Any]:
    assert st.admitted_s is not None and st.first_token_s is not None
    assert st.finished_s is not None
    gen: cython.longlong = st.generated
    return {
        "request_id": st.request.request_id,
        "replica": st.replica,
        "arrival_s": st.arrival_s,
        "queue_ms": (st.admitted_s - st.arrival_s) * 1e3,
        "ttft_ms": (st.first_token_s - st.arrival_s) * 1e3,
        "tpot_ms": (st.finished_s - st.first_token_s) * 1e3 / (gen - 1) if gen > 1 else None,
        "e2e_ms": (st.finished_s - st.arrival_s) * 1e3,
        "prompt_tokens": st.prompt_tokens,
        "cached_tokens": st.cached_tokens,
        "computed_tokens": st.prefill_total,
        "output_tokens": gen,
        "blocks": st.rb.num_blocks,
        "hit_blocks": st.hit_blocks,
    }


#: what :func:`request_columns` gives per request, named as the rows' fields
COLUMNS = ("arrival_s", "ttft_ms", "e2e_ms", "prompt_tokens", "cached_tokens", "replica")


def request_columns(states: list[RequestState]) -> dict[str, np.ndarray]:
    """Per request, in ``states`` order, the row fields a load point's metrics read
    (:data:`COLUMNS`) as arrays, each value computed by :func:`_request_row`'s own expression
    (the same floats), without building a dict per request: for callers that summarise many
    runs themselves (the CacheRoute points)."""
    n: cython.Py_ssize_t = len(states)
    arrival = np.empty(n)
    ttft = np.empty(n)
    e2e = np.empty(n)
    prompt = np.empty(n, dtype=np.int64)
    cached = np.empty(n, dtype=np.int64)
    replica = np.empty(n, dtype=np.int64)
    a: cython.double[:] = arrival
    t: cython.double[:] = ttft
    e: cython.double[:] = e2e
    p: cython.longlong[:] = prompt
    c: cython.longlong[:] = cached
    r: cython.longlong[:] = replica
    st: RequestState
    i: cython.Py_ssize_t
    for i in range(n):
        st = states[i]
        if st.first_token_s is None or st.finished_s is None:
            raise ValueError(f"request {st.index} has not finished")
        a[i] = st.arrival_s
        t[i] = (st.first_token_s - st.arrival_s) * 1e3
        e[i] = (st.finished_s - st.arrival_s) * 1e3
        p[i] = st.prompt_tokens
        c[i] = st.cached_tokens
        r[i] = st.replica
    return dict(zip(COLUMNS, (arrival, ttft, e2e, prompt, cached, replica), strict=True))


def _type_totals(states: list[RequestState]) -> tuple[list[int], list[int]]:
    """Prompt tokens and blocks per semantic type (index ``TYPE_INDEX``) over all requests."""
    type_tokens = [0] * NUM_TYPES
    type_blocks = [0] * NUM_TYPES
    st: RequestState
    i: cython.Py_ssize_t
    t: cython.Py_ssize_t
    for st in states:
        tokens: list = st.rb.tokens
        stypes: list = st.rb.stypes
        if len(tokens) != len(stypes):
            raise ValueError(f"request {st.index}: {len(tokens)} block sizes, {len(stypes)} types")
        for i in range(len(tokens)):
            t = stypes[i]
            if not 0 <= t < NUM_TYPES:  # compiled, the lists below are indexed unchecked
                raise ValueError(f"request {st.index}: block type {t} is not a type index")
            type_tokens[t] += tokens[i]
            type_blocks[t] += 1
    return type_tokens, type_blocks


def mean_or_nan(values: Any) -> float:
    """The mean of ``values`` (a list or an array), NaN when there are none: how every mean of
    a run's summary is taken, for callers that summarise its columns themselves."""
    return float(np.mean(values)) if len(values) else float("nan")


def percentile_or_nan(values: Any, q: float) -> float:
    """The ``q``-th percentile of ``values`` (numpy's linear interpolation), NaN when there are
    none: how every percentile of a run's summary is taken."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _label(latency: LatencyModel) -> str:
    return f"latencies simulated by the {latency.name} latency model"


def column_result(
    states: list[RequestState],
    memory: list[dict[str, float]],
    policy_series: list[dict[str, float]],
    config: SimConfig,
    latency: LatencyModel,
) -> SimResult:
    """What ``simulate(..., columns=True)`` returns: no rows, a summary of the latency label
    and the request count only, and :func:`request_columns` in ``columns``."""
    summary = {"simulated": _label(latency), "requests": len(states)}
    return SimResult(
        [], summary, memory, policy_series, latency.describe(), asdict(config),
        request_columns(states),
    )  # fmt: skip


def summarize(
    states: list[RequestState],
    replicas: list[Replica],
    memory: list[dict[str, float]],
    policy_series: list[dict[str, float]],
    config: SimConfig,
    latency: LatencyModel,
) -> SimResult:
    rows = [_request_row(st) for st in states]
    ttft = [r["ttft_ms"] for r in rows]
    tpot = [r["tpot_ms"] for r in rows if r["tpot_ms"] is not None]
    e2e = [r["e2e_ms"] for r in rows]
    queue = [r["queue_ms"] for r in rows]
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    blocks = sum(r["blocks"] for r in rows)
    hit_blocks = sum(r["hit_blocks"] for r in rows)
    out_tokens = sum(r["output_tokens"] for r in rows)
    start = min((st.arrival_s for st in states), default=0.0)
    end = max((st.finished_s or 0.0 for st in states), default=0.0)
    span = max(end - start, 1e-9)
    stats = [rep.cache.stats for rep in replicas]
    type_tokens, type_blocks = _type_totals(states)
    hit_by_type = [sum(s.hit_tokens_by_type[t] for s in stats) for t in range(NUM_TYPES)]
    hit_blocks_by_type = [sum(s.hit_blocks_by_type[t] for s in stats) for t in range(NUM_TYPES)]
    evict_by_type = [sum(s.evictions_by_type[t] for s in stats) for t in range(NUM_TYPES)]
    util = [m["utilisation"] for m in memory]
    desc = latency.describe()
    summary = {
        "simulated": _label(latency),
        "requests": len(rows),
        "duration_s": span,
        "throughput_rps": len(rows) / span,
        "output_tokens_per_s": out_tokens / span,
        "ttft_ms_mean": mean_or_nan(ttft),
        "ttft_ms_p50": percentile_or_nan(ttft, 50),
        "ttft_ms_p90": percentile_or_nan(ttft, 90),
        "ttft_ms_p99": percentile_or_nan(ttft, 99),
        "tpot_ms_mean": mean_or_nan(tpot),
        "e2e_ms_mean": mean_or_nan(e2e),
        "e2e_ms_p99": percentile_or_nan(e2e, 99),
        "queue_ms_mean": mean_or_nan(queue),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_tokens": prompt - cached,
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "block_hit_rate": hit_blocks / blocks if blocks else 0.0,
        "hit_rate_by_type": {
            TYPES[t].value: hit_by_type[t] / type_tokens[t]
            for t in range(NUM_TYPES)
            if type_tokens[t]
        },
        "prompt_tokens_by_type": {
            TYPES[t].value: type_tokens[t] for t in range(NUM_TYPES) if type_tokens[t]
        },
        "block_hit_rate_by_type": {
            TYPES[t].value: hit_blocks_by_type[t] / type_blocks[t]
            for t in range(NUM_TYPES)
            if type_blocks[t]
        },
        "evictions": sum(s.evictions for s in stats),
        "evictions_by_type": {
            TYPES[t].value: evict_by_type[t] for t in range(NUM_TYPES) if evict_by_type[t]
        },
        "memory_utilisation_mean": mean_or_nan(util),
        "iterations": sum(rep.iterations for rep in replicas),
    }
    return SimResult(rows, summary, memory, policy_series, desc, asdict(config))
