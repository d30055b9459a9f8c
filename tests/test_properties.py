"""Properties every cache must keep on random small traces, for every registered policy.

Traces are random prefix trees: each request extends a prefix of an earlier one with segments
drawn from a small alphabet, so requests share prefixes (and, in segment keying, documents).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers import ONLINE_POLICIES, check_tree, new_cache, rb, req, require_policy, seg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skv.cache.vllm_pool import VllmBlockPool
from skv.model import SemanticType
from skv.policies.registry import POLICIES
from skv.replay import compile_trace, replay_one, trace_totals

T = SemanticType
ALL_POLICIES = list(POLICIES)
SEG_TYPES = [T.SYSTEM, T.RETRIEVED_CONTEXT, T.USER_QUERY, T.ASSISTANT_HISTORY, T.TOOL_OUTPUT]

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workloads(draw: st.DrawFn, *, prefix_only: bool = False) -> dict[str, Any]:
    """A random prefix tree of requests, compiled to blocks."""
    n_seg = draw(st.integers(2, 6))
    alphabet = [
        seg(draw(st.sampled_from(SEG_TYPES)), draw(st.integers(1, 9)), f"seg{i}")
        for i in range(n_seg)
    ]
    paths: list[list[int]] = []
    for _ in range(draw(st.integers(1, 20))):
        base: list[int] = []
        if paths and draw(st.booleans()):
            parent = paths[draw(st.integers(0, len(paths) - 1))]
            base = parent[: draw(st.integers(0, len(parent)))]
        ext = draw(st.lists(st.integers(0, n_seg - 1), min_size=0 if base else 1, max_size=3))
        paths.append(base + ext if base + ext else [0])
    tenants = draw(
        st.lists(st.sampled_from([None, "a", "b"]), min_size=len(paths), max_size=len(paths))
    )
    requests = [
        req(*(alphabet[s] for s in path), request_id=f"r{i}", tenant_id=tenants[i])
        for i, path in enumerate(paths)
    ]
    for i, r in enumerate(requests):
        r.arrival_s = float(i)
    block_size = draw(st.sampled_from([2, 4]))
    mode = "prefix" if prefix_only else draw(st.sampled_from(["prefix", "segment"]))
    trace = compile_trace(requests, block_size, mode, salt_by_tenant=draw(st.booleans()))
    holds = draw(st.lists(st.integers(0, 2), min_size=len(trace), max_size=len(trace)))
    capacity = draw(st.integers(2, 12))
    return {"trace": trace, "holds": holds, "capacity": capacity, "mode": mode}


@st.composite
def flat_traces(draw: st.DrawFn) -> list[int]:
    """Keys of single-block requests over a small alphabet."""
    n_keys = draw(st.integers(2, 10))
    return draw(st.lists(st.integers(1, n_keys), min_size=1, max_size=60))


def flat(keys: list[int], unhashed_tail: int = 0):
    """One-block requests; ``unhashed_tail`` prompt tokens follow the block (never cached, as
    a hash-id trace's partial last block), so vLLM's prompt_len - 1 cap lets the block hit."""
    out = [rb([k], index=i, arrival_s=float(i)) for i, k in enumerate(keys)]
    for r in out:
        r.prompt_tokens += unhashed_tail
    return out


def lru_hits(keys: list[int], slots: int) -> int:
    """Hits of a plain LRU cache of ``slots`` keys, computed directly."""
    cache: list[int] = []
    hits = 0
    for k in keys:
        if k in cache:
            hits += 1
            cache.remove(k)
        cache.append(k)
        if len(cache) > slots:
            cache.pop(0)
    return hits


def for_each_policy(names: list[str]) -> Callable:
    return pytest.mark.parametrize("name", names)


# ---------------------------------------------------------------- invariants under pinning


def _snapshot(cache: Any, lease: Any) -> list:
    if isinstance(cache, VllmBlockPool):
        return [(blk, cache.hash[blk]) for blk in lease.blocks]
    return list(lease.blocks)


def _still_held(cache: Any, snap: list) -> None:
    if isinstance(cache, VllmBlockPool):
        for blk, key in snap:
            assert cache.ref[blk] > 0
            assert cache.hash[blk] == key, f"held block {blk} lost its hash {key}"
            if key is not None:
                assert blk in cache.holders(key)
        return
    for b in snap:
        assert b.ref > 0
        assert cache.blocks.get(b.key) is b, f"pinned {b} was evicted"


def _check_capacity(cache: Any, capacity: int) -> None:
    if isinstance(cache, VllmBlockPool):
        assert len(cache) <= capacity - 1  # the null block holds nothing
        assert sum(1 for h in cache.hash if h is not None) == len(cache)
    else:
        assert len(cache) <= capacity


@for_each_policy(ALL_POLICIES)
def test_capacity_and_pins_hold_with_requests_in_flight(name):
    require_policy(name)

    @PROPERTY
    @given(w=workloads(prefix_only=name == "vllm"))
    def check(w):
        trace, holds, capacity = w["trace"], w["holds"], w["capacity"]
        cache = new_cache(name, capacity, trace)
        in_flight: list[tuple[int, Any, list]] = []
        for i, r in enumerate(trace):
            lease = cache.acquire(r, r.arrival_s)
            in_flight.append((i + holds[i], lease, _snapshot(cache, lease)))
            _check_capacity(cache, capacity)
            for _, _, snap in in_flight:
                _still_held(cache, snap)
            if not isinstance(cache, VllmBlockPool):
                check_tree(cache)
            due = [x for x in in_flight if x[0] <= i]
            in_flight = [x for x in in_flight if x[0] > i]
            for _, lease_, _ in due:
                cache.release(lease_, r.arrival_s + 0.5)
        for _, lease_, _ in in_flight:
            cache.release(lease_, len(trace) + 1.0)
        _check_capacity(cache, capacity)
        if isinstance(cache, VllmBlockPool):
            assert all(ref == 0 for ref in cache.ref)
            assert len(cache.free) == capacity - 1
        else:
            assert cache.pinned_blocks == 0
            check_tree(cache)

    check()


@for_each_policy(ALL_POLICIES)
def test_no_policy_beats_the_infinite_cache_ceiling(name):
    require_policy(name)

    @PROPERTY
    @given(w=workloads(prefix_only=name == "vllm"))
    def check(w):
        trace, capacity = w["trace"], w["capacity"]
        totals = trace_totals(trace)
        row = replay_one(trace, name, capacity, totals=totals, progress=False)
        assert row["hit_blocks"] <= totals.ceiling_hit_blocks
        assert row["hit_tokens"] <= totals.ceiling_hit_tokens
        assert row["block_hit_rate"] <= row["ceiling_block_hit_rate"] + 1e-12
        assert row["token_hit_rate"] <= row["ceiling_token_hit_rate"] + 1e-12

    check()


@for_each_policy([n for n in ALL_POLICIES if n != "vllm"])
def test_a_cache_larger_than_the_trace_reaches_the_ceiling(name):
    require_policy(name)

    @PROPERTY
    @given(w=workloads())
    def check(w):
        trace = w["trace"]
        totals = trace_totals(trace)
        big = max(1, sum(r.num_blocks for r in trace))
        row = replay_one(trace, name, big, totals=totals, progress=False)
        assert row["hit_blocks"] == totals.ceiling_hit_blocks
        assert row["evictions"] == 0

    check()


# ---------------------------------------------------------------- flat traces


@for_each_policy([n for n in ONLINE_POLICIES])
def test_no_online_policy_beats_belady_on_flat_traces(name):
    require_policy(name)
    require_policy("belady")
    # vLLM never hits a one-block prompt (hits are capped at prompt_len - 1 tokens), so its
    # requests carry one unhashed token after the block; then it is exactly an LRU of the
    # capacity - 1 blocks that are not the null block
    tail = 1 if name == "vllm" else 0
    hits: list[int] = []

    @PROPERTY
    @given(keys=flat_traces(), capacity=st.integers(1, 8))
    def check(keys, capacity):
        cap = max(capacity, 2) if name == "vllm" else capacity
        online = replay_one(flat(keys, tail), name, cap, progress=False)
        best = replay_one(flat(keys, tail), "belady", cap, progress=False)
        assert online["hit_blocks"] <= best["hit_blocks"]
        if name == "vllm":
            assert online["hit_blocks"] == lru_hits(keys, cap - 1)
        hits.append(online["hit_blocks"])

    check()
    assert any(hits), f"{name} never hit a block: the comparison with belady was vacuous"


@PROPERTY
@given(keys=flat_traces(), capacity=st.integers(1, 8), extra=st.integers(1, 4))
def test_lru_hit_rate_is_monotone_in_capacity_on_flat_traces(keys, capacity, extra):
    small = replay_one(flat(keys), "lru", capacity, progress=False)
    large = replay_one(flat(keys), "lru", capacity + extra, progress=False)
    assert small["hit_blocks"] <= large["hit_blocks"]


@PROPERTY
@given(keys=flat_traces(), capacity=st.integers(1, 8))
def test_belady_on_flat_traces_matches_a_brute_force_min(keys, capacity):
    """Belady's MIN with forced insertion, computed directly, for the exact hit count."""
    cache: set[int] = set()
    hits = 0
    for i, k in enumerate(keys):
        if k in cache:
            hits += 1
            continue
        if len(cache) >= capacity:

            def next_use(key: int, i: int = i) -> int:
                for j in range(i + 1, len(keys)):
                    if keys[j] == key:
                        return j
                return len(keys) + 1

            cache.remove(max(sorted(cache), key=next_use))
        cache.add(k)
    require_policy("belady")
    assert replay_one(flat(keys), "belady", capacity, progress=False)["hit_blocks"] == hits
