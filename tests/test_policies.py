"""Eviction policies: each one's ordering on small traces where the victim is known, plus the
invariants every registered radix policy must keep (capacity, pinning, leaf-only)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from helpers import RADIX_POLICIES, require_policy
from helpers import rb as chain_request

from skv.blocks import RequestBlocks
from skv.cache.radix import BlockCache
from skv.model import SemanticType
from skv.policies.base import PriorityPolicy
from skv.policies.registry import OFFLINE, make_cache
from skv.replay import annotate_next_use

ST = SemanticType


def one(
    key: int,
    t: float = 0.0,
    *,
    stype: SemanticType = ST.UNKNOWN,
    tokens: int = 4,
    seg_tokens: int | None = None,
    index: int = 0,
) -> RequestBlocks:
    """A single-block request (its block is its own chain root)."""
    return chain_request(
        [key],
        parents=[None],
        tokens=[tokens],
        stypes=[stype],
        block_size=4,
        index=index,
        arrival_s=t,
        seg_tokens=None if seg_tokens is None else [seg_tokens],
        session=None,
    )


def chain(keys: list[int], t: float = 0.0, *, index: int = 0) -> RequestBlocks:
    n = len(keys)
    return RequestBlocks(
        index, t, list(keys), [None, *keys[:-1]], [4] * n, [0] * n, [4 * n] * n, None, 0, False, 4
    )


def play(cache, keys: list[int], t0: float = 0.0, **kw) -> None:
    """Access single-block requests one per second from ``t0``."""
    for i, key in enumerate(keys):
        cache.access(one(key, t0 + i, **kw), t0 + i)


def cached(cache) -> set[int]:
    return set(cache.blocks)


# --- fifo -------------------------------------------------------------------------------------


def test_fifo_evicts_oldest_inserted_even_if_recently_hit():
    cache = make_cache("fifo", 2)
    play(cache, [1, 2, 1, 1, 3])
    assert cached(cache) == {2, 3}


def test_fifo_reinserted_block_gets_a_new_place():
    cache = make_cache("fifo", 2)
    play(cache, [1, 2, 3, 1, 4])  # 3 evicts 1; 1 evicts 2 and is now the newest; 4 evicts 3
    assert cached(cache) == {1, 4}


# --- lfu --------------------------------------------------------------------------------------


def test_lfu_keeps_the_frequent_block():
    cache = make_cache("lfu", 2)
    play(cache, [1, 1, 1, 2, 3])
    assert cached(cache) == {1, 3}


def test_lfu_breaks_frequency_ties_by_least_recent_use():
    cache = make_cache("lfu", 2)
    play(cache, [1, 2, 2, 1, 3])  # 1 and 2 have one hit each; 2 was used longer ago
    assert cached(cache) == {1, 3}


# --- size_lru ---------------------------------------------------------------------------------


def test_size_lru_evicts_small_segment_first_at_equal_recency():
    cache = make_cache("size_lru", 2, {"beta_s": 1.0})
    cache.access(one(1, seg_tokens=4096), 0.0)
    cache.access(one(2, seg_tokens=8), 0.0)
    cache.access(one(3, seg_tokens=8), 0.0)
    assert cached(cache) == {1, 3}


def test_size_lru_large_segment_goes_once_staler_than_its_bonus():
    # 4096 vs 8 tokens: 9 doublings -> a 9 s head start at beta_s = 1
    cache = make_cache("size_lru", 2, {"beta_s": 1.0})
    cache.access(one(1, seg_tokens=4096), 0.0)
    cache.access(one(2, seg_tokens=8), 10.0)
    cache.access(one(3, seg_tokens=8), 10.0)
    assert cached(cache) == {2, 3}


def test_size_lru_with_zero_beta_is_lru():
    cache = make_cache("size_lru", 2, {"beta_s": 0.0})
    cache.access(one(1, seg_tokens=4096), 0.0)
    cache.access(one(2, seg_tokens=8), 1.0)
    cache.access(one(3, seg_tokens=8), 2.0)
    assert cached(cache) == {2, 3}


# --- gdsf -------------------------------------------------------------------------------------


def test_gdsf_keeps_frequent_blocks_and_inflates_l():
    cache = make_cache("gdsf", 2)
    play(cache, [1, 1, 1, 2, 3])  # H(1) = 3 * 4, H(2) = 4
    assert cached(cache) == {1, 3}
    assert cache.policy.metrics()["L"] == 4.0


def test_gdsf_evicts_partial_block_before_full_one():
    cache = make_cache("gdsf", 2)
    cache.access(one(1, tokens=4), 0.0)
    cache.access(one(2, tokens=1), 1.0)  # saves only 1 token of prefill
    cache.access(one(3, tokens=4), 2.0)
    assert cached(cache) == {1, 3}


# --- slru -------------------------------------------------------------------------------------


def test_slru_protects_reused_blocks():
    cache = make_cache("slru", 3)
    play(cache, [1, 1, 2, 3, 4])  # 1 is the oldest but was reused: protected
    assert cached(cache) == {1, 3, 4}


def test_slru_demotes_oldest_protected_block_when_segment_is_full():
    cache = make_cache("slru", 4, {"protected_fraction": 0.5})  # at most 2 protected
    play(cache, [1, 2, 3, 4, 1, 2, 3])  # 3 protected; the first eviction demotes the oldest, 1
    play(cache, [5], t0=10)  # probation, oldest first: 4 never reused
    assert cached(cache) == {1, 2, 3, 5}
    play(cache, [6], t0=11)  # then the demoted 1
    assert cached(cache) == {2, 3, 5, 6}


def test_slru_sglang_mode_needs_two_hits():
    cache = make_cache("slru", 3, {"protected_fraction": 1.0, "promote_hits": 2})
    play(cache, [1, 1, 2, 2, 2, 3, 4])  # 1 has one hit (probation), 2 has two (protected)
    assert cached(cache) == {2, 3, 4}


# --- static_semantic --------------------------------------------------------------------------


def test_static_semantic_keeps_system_over_user_query_at_equal_recency():
    cache = make_cache("static_semantic", 2)
    cache.access(one(1, stype=ST.SYSTEM), 0.0)
    cache.access(one(2, stype=ST.USER_QUERY), 0.0)
    cache.access(one(3, stype=ST.USER_QUERY), 0.0)
    assert cached(cache) == {1, 3}


def test_static_semantic_weight_buys_half_life_times_log2_weight_seconds():
    # system (8) vs user query (1) with a 10 s half-life: a 30 s head start
    for gap, survivor in ((29.0, 1), (31.0, 2)):
        cache = make_cache("static_semantic", 2, {"half_life_s": 10.0})
        cache.access(one(1, stype=ST.SYSTEM), 0.0)
        cache.access(one(2, stype=ST.USER_QUERY), gap)
        cache.access(one(3, stype=ST.USER_QUERY), gap)
        assert cached(cache) == {survivor, 3}


def test_static_semantic_rejects_unknown_type_names():
    with pytest.raises(ValueError, match="unknown semantic type"):
        make_cache("static_semantic", 2, {"weights": {"sytem": 2.0}})


# --- adaptive_semantic ------------------------------------------------------------------------


def test_adaptive_semantic_learns_from_ghost_hits_and_unreused_evictions():
    """Documents come back after eviction (ghost hits): their weight rises. User queries are
    evicted unused and never return: theirs falls."""
    start = {"retrieved_context": 4.0, "user_query": 4.0}
    cache = make_cache(
        "adaptive_semantic",
        2,
        {"initial_weights": start, "eta": 0.5, "update_every": 4},
        ghost_capacity=64,
    )
    t = 0.0
    for i in range(40):
        cache.access(one(100 + i % 3, stype=ST.RETRIEVED_CONTEXT), t)
        cache.access(one(1000 + i, stype=ST.USER_QUERY), t + 0.5)
        t += 1.0
    m = cache.policy.metrics()
    assert cache.stats.ghost_hits > 0
    assert m["w_retrieved_context"] > 4.0
    assert m["w_user_query"] < 4.0
    assert m["weight_updates"] >= 5
    assert {f"w_{t.value}" for t in ST} <= set(m)


def test_adaptive_semantic_weight_change_reranks_cached_blocks():
    cache = make_cache("adaptive_semantic", 2, {"initial_weights": {"code": 1.0, "output": 1.0}})
    cache.access(one(1, stype=ST.CODE), 0.0)
    cache.access(one(2, stype=ST.OUTPUT), 1.0)
    cache.policy.set_weights({"code": 4.0})  # code was older; now worth 4x: output goes
    cache.access(one(3, stype=ST.OUTPUT), 2.0)
    assert cached(cache) == {1, 3}


def test_adaptive_semantic_params_round_trip():
    params = {"half_life_s": 5.0, "eta": 0.2, "update_every": 8}
    p = make_cache("adaptive_semantic", 2, params).policy.params()
    assert {k: p[k] for k in params} == params
    assert p["initial_weights"]["system"] == 8.0


# --- sglang -----------------------------------------------------------------------------------


def _long_request_released_late(policy: str, params: dict | None = None) -> set[int]:
    """A long request holds block 1 from t=0 to t=5; block 2 is used and released at t=1."""
    cache = make_cache(policy, 3, params)
    long_lease = cache.acquire(one(1), 0.0)
    cache.access(one(2), 1.0)
    cache.release(long_lease, 5.0)
    cache.access(one(3), 6.0)
    cache.access(one(4), 7.0)  # full: one of 1 (used t=0, released t=5) and 2 (t=1) goes
    return cached(cache)


def test_sglang_lru_without_finish_insert_stamps_last_access_not_release():
    assert _long_request_released_late("lru") == {1, 3, 4}
    assert _long_request_released_late("sglang_lru", {"touch_on_release": False}) == {2, 3, 4}


def test_sglang_lru_default_refreshes_at_finish_like_lru():
    assert _long_request_released_late("sglang_lru") == {1, 3, 4}


def test_sglang_lfu_orders_by_hits_then_last_access():
    cache = make_cache("sglang_lfu", 2)
    play(cache, [1, 1, 2, 3])
    assert cached(cache) == {1, 3}
    cache = make_cache("sglang_lfu", 2, {"touch_on_release": False})
    lease = cache.acquire(one(1), 0.0)
    cache.access(one(2), 1.0)
    cache.release(lease, 5.0)
    cache.access(one(3), 6.0)
    assert cached(cache) == {2, 3}


# --- belady -----------------------------------------------------------------------------------


def test_belady_evicts_farthest_next_use():
    keys = [1, 2, 3, 1, 2, 4, 3, 1]  # at 4: next uses 1 -> 7, 2 -> never, 3 -> 6
    trace = [one(k, float(i), index=i) for i, k in enumerate(keys)]
    cache = make_cache("belady", 3)
    cache.prepare(trace)
    assert trace[0].next_use is not None
    for rb in trace[:6]:
        cache.access(rb, rb.arrival_s)
    assert cached(cache) == {1, 3, 4}


def test_belady_prepare_keeps_existing_annotation():
    trace = [one(k, float(i), index=i) for i, k in enumerate([1, 2, 1])]
    annotate_next_use(trace)
    marker = trace[0].next_use
    make_cache("belady", 2).prepare(trace)
    assert trace[0].next_use is marker


# --- every policy -----------------------------------------------------------------------------


def _tree_trace(seed: int, n: int = 300) -> list[RequestBlocks]:
    """Prefix chains drawn from a small tree of shared prefixes (so blocks have children)."""
    rng = random.Random(seed)
    trace = []
    for i in range(n):
        depth = rng.randint(1, 6)
        keys, prefix = [], 0
        for d in range(depth):
            prefix = prefix * 7 + rng.choice((1, 1, 2, 3, 4, 5)) + d * 1000
            keys.append(prefix)
        trace.append(chain(keys, float(i) * 0.5, index=i))
    return trace


def _leased_replay(cache: BlockCache, seed: int) -> Iterator[RequestBlocks]:
    """Play :func:`_tree_trace` with up to 4 requests in flight, releasing a random one at a
    time (seeded); yields each request once its releases are done."""
    rng = random.Random(seed)
    in_flight = []
    for rb in _tree_trace(seed):
        in_flight.append(cache.acquire(rb, rb.arrival_s))
        while len(in_flight) > 3 or (in_flight and rng.random() < 0.4):
            cache.release(in_flight.pop(rng.randrange(len(in_flight))), rb.arrival_s)
        yield rb


def _check_capacity_and_pinning(policy: str, params: dict | None, seed: int, cap: int) -> None:
    trace = _tree_trace(seed)
    cache = make_cache(policy, cap, params, record_evictions=True)
    if policy in OFFLINE:
        cache.prepare(trace)
    rng = random.Random(seed)
    in_flight = []
    for rb in trace:
        lease = cache.acquire(rb, rb.arrival_s)
        assert len(cache) <= cap
        in_flight.append(lease)
        for held in in_flight:
            for b in held.blocks:
                assert cache.blocks.get(b.key) is b, f"{policy}: pinned {b} was evicted"
        while len(in_flight) > 3 or (in_flight and rng.random() < 0.4):
            done = in_flight.pop(rng.randrange(len(in_flight)))
            cache.release(done, rb.arrival_s + 0.25)
    for lease in in_flight:
        cache.release(lease, 1e6)
    assert cache.stats.evictions > 0
    assert all(b.ref == 0 for b in cache.blocks.values())
    for b in cache.blocks.values():  # whole chains stay cached
        assert b.parent is None or cache.blocks.get(b.parent.key) is b.parent


@pytest.mark.parametrize("policy", RADIX_POLICIES)
def test_never_exceeds_capacity_nor_evicts_pinned_blocks(policy: str):
    """Overlapping leases on shared prefix chains; leaf-only ordering checks fire inside."""
    require_policy(policy)
    for seed, cap in ((0, 8), (1, 20)):
        _check_capacity_and_pinning(policy, None, seed, cap)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slru_small_protected_segment_keeps_leaf_only_order(seed: int):
    """Demotions under heavy pinning (a pinned protected block must not be demoted)."""
    _check_capacity_and_pinning("slru", {"protected_fraction": 0.2}, seed, 10)


@pytest.mark.parametrize("policy", RADIX_POLICIES)
def test_params_and_metrics_are_plain_dicts(policy: str):
    require_policy(policy)
    cache = make_cache(policy, 4)
    play(cache, [1, 2, 3, 4, 5, 1])
    assert isinstance(cache.policy.params(), dict)
    m = cache.policy.metrics()
    assert all(isinstance(v, float) for v in m.values())


class _SettablePriority(PriorityPolicy):
    """An eager-heap policy whose priorities the test sets by key."""

    def __init__(self) -> None:
        super().__init__()
        self.prio: dict[int, int] = {}

    def priority(self, b, now):
        return self.prio[b.key]


def test_priority_refresh_keeps_push_order_for_ties():
    pol = _SettablePriority()
    pol.prio = {k: 10 - k for k in range(1, 6)}  # pushed 1..5, heap top is 5
    cache = BlockCache(5, pol)
    play(cache, [1, 2, 3, 4, 5])
    pol.prio = dict.fromkeys(range(1, 7), 0)  # now all tie: push order decides
    pol.refresh(10.0)
    play(cache, [6], t0=10)
    assert cached(cache) == {2, 3, 4, 5, 6}


class _EagerTwin(PriorityPolicy):
    """The same keys as a MonotonePriorityPolicy, kept in an eagerly updated heap."""

    def __init__(self, lazy) -> None:
        super().__init__()
        self.lazy = lazy
        self.n = 0

    def priority(self, b, now):
        return b.pdata

    def on_unpin(self, b, now):
        self.n += 1
        b.pdata = (self.lazy.key(b, now), self.n)
        if not b.n_children:
            self.push_key(b, b.pdata)

    def on_leaf(self, b, now):
        self.push_key(b, b.pdata)


@pytest.mark.parametrize("policy", ["lfu", "size_lru", "static_semantic", "sglang_lru"])
def test_lazy_heap_evicts_exactly_like_an_eager_heap(policy: str):
    from skv.policies.registry import policy_class

    cls = policy_class(policy)
    for seed, cap in ((0, 8), (3, 15)):
        logs = []
        for pol in (cls(), _EagerTwin(cls())):
            cache = BlockCache(cap, pol, record_evictions=True)
            for _ in _leased_replay(cache, seed):
                pass
            logs.append(cache.eviction_log)
        assert len(logs[0]) > 50
        assert logs[0] == logs[1]
