"""Cluster workloads for the CacheRoute study: seeded request streams at any offered rate.

Each workload is a function ``(params, rate, seed) -> list[Request]`` registered in
:data:`WORKLOADS`. Requests are hash-id requests (as the Mooncake reader makes them): one id
per ``block_tokens``-token block, prefix-chained by construction, so the simulator keys them
without tokenising (a 6k-token prompt is 12 blocks, not 375; the hit rate differs from 16-token
blocks only at a prefix's partial last block, and prefixes here are whole blocks).

Rates and seeds. A workload draws everything (keys, lengths, unit-rate exponential gaps) from
``seed`` alone and divides the gaps by ``rate``: the same seed at two rates is the same request
sequence, compressed in time (common random numbers), which makes the QPS search's p99 TTFT a
much smoother function of the rate than fresh draws at each rate would. Each quantity has its
own generator (spawned from ``seed``), so the first ``k`` requests are the same whatever
``num_requests`` is: a longer run at a higher rate extends the sequence, never redraws it.

- ``aggregate``: CacheRoute's semi-synthetic aggregate: ``keys`` shared prefixes with Zipf
  (``key_zipf``) request shares (heavy-tailed per-key rates), each key a prefix of
  ``prefix_blocks`` whole blocks (uniform in the range, drawn once per key), then a unique
  suffix of log-normal length and a log-normal answer; Poisson arrivals. With
  ``shared_share`` below 1, that share of requests keeps its key's prefix and the others get
  a private prefix of the same length (no sharing; the regime map's axis).
- ``dominant_key``: the aggregate stream with a ``dominant_share`` of requests on one key (rank
  1): affinity concentrates that key's load on its destinations.
- ``shifting_skew``: the aggregate stream whose key ranks are re-drawn (a fresh random
  permutation) every ``shift_every_s`` seconds of simulated time: what was hot goes cold, and a
  router's learned placement is stale after each shift. Phases are in seconds, so at another
  rate a request may fall in another phase (the permutations themselves depend on the seed
  only).
- ``mooncake``: the Mooncake conversation trace (``mooncake/conversation_trace.jsonl`` under
  the trace directory), ``num_requests`` consecutive requests from a seeded start (seed ``s``
  starts at request ``s * stride``, wrapping), arrival times scaled by one factor so the whole
  trace's mean rate is ``rate`` (a window keeps its own bursts and lulls); its own 512-token
  hash ids.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from skv.model import Request, Segment, SemanticType
from skv.runtime import no_cyclic_gc

#: hash ids of generated requests: prefixes use ``key * _KEY_STRIDE + position`` (below
#: ``_SUFFIX_BASE``), suffix blocks count up from ``_SUFFIX_BASE``
_KEY_STRIDE = 1 << 8
_SUFFIX_BASE = 1 << 40


class SyntheticParams(BaseModel):
    """Parameters of the generated workloads (``aggregate`` and its two variants)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    num_requests: int = Field(default=6000, ge=1, le=2_000_000)
    keys: int = Field(default=2000, ge=1, le=1_000_000)
    key_zipf: float = Field(default=1.1, ge=0, le=4, description="per-key share ~ rank^-s")
    prefix_blocks: tuple[int, int] = (4, 16)
    suffix_median: float = Field(default=256, gt=0, le=1e6)
    suffix_sigma: float = Field(default=1.0, ge=0, le=4)
    suffix_max: int = Field(default=4096, ge=1, le=1_000_000)
    output_median: float = Field(default=128, gt=0, le=1e6)
    output_sigma: float = Field(default=0.8, ge=0, le=4)
    output_max: int = Field(default=1024, ge=1, le=1_000_000)
    block_tokens: int = Field(default=512, ge=1, le=65_536)
    #: share of requests on a shared prefix; the others get a private prefix of the same
    #: length (drawn as their key's, its blocks never seen again)
    shared_share: float = Field(default=1.0, ge=0, le=1, description="requests on shared keys")
    dominant_share: float = Field(default=0.5, ge=0, le=1, description="dominant_key only")
    shift_every_s: float = Field(default=30.0, gt=0, description="shifting_skew only")

    @model_validator(mode="after")
    def _ranges(self) -> SyntheticParams:
        lo, hi = self.prefix_blocks
        if not 1 <= lo <= hi < _KEY_STRIDE:
            raise ValueError(f"prefix_blocks: need 1 <= low <= high < {_KEY_STRIDE}, got {lo, hi}")
        return self


class MooncakeParams(BaseModel):
    """Parameters of the ``mooncake`` workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    num_requests: int = Field(default=6000, ge=1, le=2_000_000)
    stride: int = Field(default=1000, ge=0, description="seed s starts at request s * stride")
    trace: str = "mooncake/conversation_trace.jsonl"


def _key_shares(p: SyntheticParams) -> np.ndarray:
    w = 1.0 / np.arange(1, p.keys + 1, dtype=float) ** p.key_zipf
    return w / w.sum()


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int, top: int):
    x = rng.lognormal(np.log(median), sigma, n)
    return np.clip(np.rint(x), 1, top).astype(np.int64)


def _build(p: SyntheticParams, rate: float, seed: int, ranks: Callable) -> list[Request]:
    """Requests whose key rank per request comes from ``ranks(rng, times)``; rank 0 = hottest,
    mapped to a key id by a seeded permutation (so key ids carry no rank)."""
    _check_rate(rate)
    g_keys, g_gaps, g_rank, g_suffix, g_output = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)
    )
    lo, hi = p.prefix_blocks
    prefix = g_keys.integers(lo, hi + 1, size=p.keys)
    key_of_rank = g_keys.permutation(p.keys)
    gaps = g_gaps.exponential(1.0, p.num_requests)
    times = np.cumsum(gaps) / rate
    rank = ranks(g_rank, times)
    suffix = _lognormal(g_suffix, p.suffix_median, p.suffix_sigma, p.num_requests, p.suffix_max)
    output = _lognormal(g_output, p.output_median, p.output_sigma, p.num_requests, p.output_max)
    # its own generator, drawn only when some prefixes are private: every other draw (and so
    # every request of a shared_share 1 run) is the same as without the parameter
    private = (
        np.random.default_rng(np.random.SeedSequence([seed, 2])).random(p.num_requests)
        >= p.shared_share
        if p.shared_share < 1
        else np.zeros(p.num_requests, bool)
    ).tolist()
    bt = p.block_tokens
    out: list[Request] = []
    next_id = _SUFFIX_BASE
    # Python scalars up front (indexing numpy arrays one element at a time is slow); the
    # requests are long-lived plain data, built without the cyclic collector
    keys, prefix_of = key_of_rank[rank].tolist(), prefix.tolist()
    times_l, suffix_l, output_l = times.tolist(), suffix.tolist(), output.tolist()
    with no_cyclic_gc():
        for i in range(p.num_requests):
            key = keys[i]
            pb = prefix_of[key]
            sfx = suffix_l[i]
            sb = -(-sfx // bt)
            if private[i]:
                ids = list(range(next_id, next_id + pb))
                next_id += pb
            else:
                ids = [key * _KEY_STRIDE + j for j in range(pb)]
            ids.extend(range(next_id, next_id + sb))
            next_id += sb
            out.append(
                Request(
                    f"{seed}:{i}",
                    times_l[i],
                    [
                        Segment(SemanticType.SYSTEM, pb * bt),
                        Segment(SemanticType.USER_QUERY, sfx),
                    ],
                    output_tokens=output_l[i],
                    session_id=f"private{seed}:{i}" if private[i] else f"key{key}",
                    hash_ids=ids,
                    hash_block_size=bt,
                )
            )
    return out


def aggregate(params: SyntheticParams, rate: float, seed: int) -> list[Request]:
    shares = _key_shares(params)
    return _build(params, rate, seed, lambda rng, t: rng.choice(params.keys, size=len(t), p=shares))


def dominant_key(params: SyntheticParams, rate: float, seed: int) -> list[Request]:
    """Rank 0 gets ``dominant_share`` of the requests; the rest follow ``aggregate``'s shares
    over ranks 1.. (rank 0 excluded)."""
    shares = _key_shares(params)
    rest = shares[1:] / shares[1:].sum() if params.keys > 1 else shares

    def ranks(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
        n = len(t)
        u = rng.random((n, 2))  # per request: dominant or not, then which other key
        other = np.searchsorted(np.cumsum(rest), u[:, 1] * rest.sum(), side="right")
        other = np.minimum(other, len(rest) - 1) + (1 if params.keys > 1 else 0)
        return np.where(u[:, 0] < params.dominant_share, 0, other)

    return _build(params, rate, seed, ranks)


def shifting_skew(params: SyntheticParams, rate: float, seed: int) -> list[Request]:
    """``aggregate``'s shares over ranks, but rank r means a different key in every phase of
    ``shift_every_s`` seconds (one seeded permutation per phase)."""
    shares = _key_shares(params)

    def ranks(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
        r = rng.choice(params.keys, size=len(t), p=shares)
        phase = np.floor(t / params.shift_every_s).astype(np.int64)
        # phase k's permutation from its own generator: the same whatever the run's length
        perm_seeds = np.random.SeedSequence([seed, 1]).spawn(int(phase.max()) + 1)
        perms = [np.random.default_rng(s).permutation(params.keys) for s in perm_seeds]
        return np.array([perms[ph][x] for ph, x in zip(phase, r, strict=True)], dtype=np.int64)

    return _build(params, rate, seed, ranks)


@lru_cache(maxsize=2)
def _mooncake_trace(path: str) -> tuple[Request, ...]:
    from skv.traces import load_trace

    return tuple(load_trace(path))


def mooncake(params: MooncakeParams, rate: float, seed: int) -> list[Request]:
    """A seeded window of the Mooncake trace at mean rate ``rate`` (its own arrival pattern,
    time-scaled: bursts stay bursts)."""
    from skv.traces import find_trace

    _check_rate(rate)
    trace = _mooncake_trace(str(find_trace(params.trace)))
    n = min(params.num_requests, len(trace))
    start = (seed * params.stride) % max(1, len(trace) - n + 1)
    window = trace[start : start + n]
    t0 = window[0].arrival_s
    span = trace[-1].arrival_s - trace[0].arrival_s
    # the trace's native mean rate is (len - 1) / span; one factor brings it to ``rate``
    scale = (len(trace) - 1) / (span * rate) if span > 0 and len(trace) > 1 else 1.0
    out = []
    for r in window:
        out.append(
            Request(
                r.request_id,
                (r.arrival_s - t0) * scale,
                r.segments,
                output_tokens=r.output_tokens,
                hash_ids=r.hash_ids,
                hash_block_size=r.hash_block_size,
            )
        )
    return out


#: the workloads whose requests at any rate are their unit-rate ones (rate 1.0) with the arrival
#: times :func:`at_rate` gives: ``_build`` draws each quantity from its own generator (so the
#: first ``n`` requests do not depend on ``num_requests``), draws nothing from the times (their
#: ranks use only how many there are) and times request ``i`` at ``cumsum(gaps)[i] / rate``. Not
#: ``shifting_skew`` (its phases are in seconds) nor ``mooncake`` (its window depends on ``n``).
RATE_SCALED = frozenset({"aggregate", "dominant_key"})


def at_rate(unit_times: np.ndarray, n: int, rate: float) -> list[float]:
    """The arrival times of the first ``n`` requests of a :data:`RATE_SCALED` workload at
    ``rate``, from its unit-rate run's (``unit_times``, float64): ``_build``'s own expression and
    floats. Its unit-rate times are ``cumsum(gaps) / 1.0``, the cumsum itself, which is computed
    in order (its first ``n`` sums are the same whatever the length), and ``cumsum / rate`` is one
    IEEE division per element either way; times never decrease, so the requests keep their
    order."""
    _check_rate(rate)
    if n > len(unit_times):
        raise ValueError(f"at_rate: {n} requests asked of a unit run of {len(unit_times)}")
    return (unit_times[:n] / rate).tolist()


def _check_rate(rate: float) -> None:
    if not (rate > 0 and np.isfinite(rate)):
        raise ValueError(f"rate must be a finite number of requests/s > 0, got {rate}")


#: workload name -> (parameter model, generator)
WORKLOADS: dict[str, tuple[type[BaseModel], Callable[[Any, float, int], list[Request]]]] = {
    "aggregate": (SyntheticParams, aggregate),
    "dominant_key": (SyntheticParams, dominant_key),
    "shifting_skew": (SyntheticParams, shifting_skew),
    "mooncake": (MooncakeParams, mooncake),
}


def generate(name: str, params: dict[str, Any], rate: float, seed: int) -> list[Request]:
    """Requests of workload ``name`` with ``params`` (validated) at ``rate`` requests/s."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown cluster workload {name!r}; known: {', '.join(WORKLOADS)}")
    model, gen = WORKLOADS[name]
    return gen(model(**params), rate, seed)


def needs_traces(name: str, params: dict[str, Any]) -> tuple[str, ...]:
    """The real traces a workload reads (names under the trace directory)."""
    if name == "mooncake":
        return (MooncakeParams(**params).trace,)
    return ()
