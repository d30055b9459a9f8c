"""The radix block cache (``BlockCache``): hits, chain runs, pinning, capacity, leaf-only
eviction, eviction records and the ghost list. Generic behaviours run for every registered
radix policy whose module exists; ordering details are pinned down with ``lru``."""

from __future__ import annotations

import pytest
from helpers import RADIX_POLICIES, check_tree, new_cache, rb, req, seg

from skv.blocks import request_blocks
from skv.cache.block import GhostEntry
from skv.cache.policy import Policy
from skv.cache.radix import BlockCache
from skv.model import TYPE_INDEX, SemanticType
from skv.policies.lru import LRU

T = SemanticType


@pytest.fixture(params=RADIX_POLICIES)
def policy(request):
    return request.param


def trace_of(*key_lists, **kw):
    """Prefix-chained requests over ``key_lists``, indexed in order (Belady needs the index)."""
    return [rb(keys, index=i, arrival_s=float(i), **kw) for i, keys in enumerate(key_lists)]


def flat_trace(first_key: int, n: int, start_index: int = 0):
    return [
        rb([first_key + j], index=start_index + j, arrival_s=float(start_index + j))
        for j in range(n)
    ]


# ---------------------------------------------------------------- construction


def test_capacity_below_one_block_is_rejected():
    with pytest.raises(ValueError, match="capacity_blocks"):
        BlockCache(0, LRU())


def test_a_policy_that_is_not_leaf_only_is_rejected():
    class Anywhere(LRU):
        name = "anywhere"
        leaf_only = False

    with pytest.raises(ValueError, match="anywhere"):
        BlockCache(4, Anywhere())


# ---------------------------------------------------------------- hits


def test_hits_are_counted_in_blocks_and_tokens(policy):
    a = rb([1, 2, 3], tokens=[4, 4, 2], index=0)
    b = rb([1, 2, 5], tokens=[4, 4, 4], index=1)
    cache = new_cache(policy, 16, [a, b])
    assert cache.access(a, 0.0).hit_blocks == 0
    lease = cache.access(b, 1.0)
    assert (lease.hit_blocks, lease.hit_tokens) == (2, 8)
    s = cache.stats
    assert (s.requests, s.blocks, s.hit_blocks) == (2, 6, 2)
    assert (s.prompt_tokens, s.hit_tokens) == (22, 8)
    assert s.block_hit_rate == pytest.approx(2 / 6)
    assert s.token_hit_rate == pytest.approx(8 / 22)


def test_hits_are_counted_per_semantic_type(policy):
    types = [T.SYSTEM, T.SYSTEM, T.USER_QUERY]
    a = rb([1, 2, 3], tokens=[4, 4, 3], stypes=types, index=0)
    cache = new_cache(policy, 16, [a, a])
    cache.access(a, 0.0)
    cache.access(a, 1.0)
    s = cache.stats
    assert s.hit_tokens_by_type[TYPE_INDEX[T.SYSTEM]] == 8
    assert s.hit_blocks_by_type[TYPE_INDEX[T.SYSTEM]] == 2
    assert s.hit_tokens_by_type[TYPE_INDEX[T.USER_QUERY]] == 3
    assert s.hit_blocks_by_type[TYPE_INDEX[T.USER_QUERY]] == 1
    assert sum(s.hit_tokens_by_type) == s.hit_tokens


def test_a_partial_last_block_is_cached_and_hit_by_the_same_prompt(policy):
    a = rb([1, 2], tokens=[4, 1])
    cache = new_cache(policy, 16, [a])
    cache.access(a, 0.0)
    assert cache.lookup(a) == 2


def test_a_run_stops_at_the_first_miss(policy):
    a = rb([1, 2, 3], index=0)
    cache = new_cache(policy, 16, [a])
    cache.access(a, 0.0)
    assert cache.lookup(rb([1, 2, 9, 3])) == 2
    assert cache.lookup(rb([9, 1, 2])) == 0


def test_lookup_has_no_side_effects(policy):
    a = rb([1, 2, 3])
    cache = new_cache(policy, 16, [a])
    cache.access(a, 0.0)
    before = (len(cache), cache.stats.requests, cache.stats.hit_blocks)
    assert cache.lookup(rb([1, 2, 4])) == 2
    assert (len(cache), cache.stats.requests, cache.stats.hit_blocks) == before
    assert 4 not in cache.blocks


def test_a_lookup_run_restarts_at_each_chain_root(policy):
    # three chains in one request: [10], [20, 21], [30]; only the middle one is cached
    cached = rb([20, 21], index=0)
    probe = rb([10, 20, 21, 30], parents=[None, None, 20, None], index=1)
    cache = new_cache(policy, 16, [cached, probe])
    cache.access(cached, 0.0)
    assert cache.lookup(probe) == 2
    assert cache.access(probe, 1.0).hit_blocks == 2


def test_segment_mode_hits_a_document_after_a_different_system_prompt(policy):
    def rag(system):
        return req(
            seg(T.SYSTEM, 6, system), seg(T.RETRIEVED_CONTEXT, 10, "doc"), seg(T.USER_QUERY, 5, "q")
        )

    a = request_blocks(rag("sys-a"), 4, "segment", index=0)
    b = request_blocks(rag("sys-b"), 4, "segment", index=1)
    cache = new_cache(policy, 64, [a, b])
    cache.access(a, 0.0)
    lease = cache.access(b, 1.0)
    # the system prompt misses; the document (10 tokens) and the chained query (5) hit
    assert (lease.hit_blocks, lease.hit_tokens) == (5, 15)
    s = cache.stats
    assert s.hit_tokens_by_type[TYPE_INDEX[T.RETRIEVED_CONTEXT]] == 10
    assert s.hit_tokens_by_type[TYPE_INDEX[T.USER_QUERY]] == 5
    assert s.hit_tokens_by_type[TYPE_INDEX[T.SYSTEM]] == 0


def test_prefix_mode_misses_a_document_after_a_different_system_prompt(policy):
    def rag(system):
        return req(seg(T.SYSTEM, 6, system), seg(T.RETRIEVED_CONTEXT, 10, "doc"))

    a = request_blocks(rag("sys-a"), 4, "prefix", index=0)
    b = request_blocks(rag("sys-b"), 4, "prefix", index=1)
    cache = new_cache(policy, 64, [a, b])
    cache.access(a, 0.0)
    assert cache.access(b, 1.0).hit_blocks == 0


# ---------------------------------------------------------------- pinning and capacity


def test_pinned_blocks_are_never_evicted(policy):
    held = rb([1, 2], index=0)
    others = flat_trace(100, 20, start_index=1)
    cache = new_cache(policy, 4, [held, *others])
    lease = cache.acquire(held, 0.0)
    for r in others:
        cache.access(r, r.arrival_s)
        assert cache.blocks[1] is lease.blocks[0]
        assert cache.blocks[2] is lease.blocks[1]
        assert len(cache) <= 4
    assert cache.stats.evictions >= 16
    assert cache.pinned_blocks == 2


def test_a_block_held_by_two_requests_stays_pinned_until_both_release(policy):
    a = rb([1, 2], index=0)
    others = flat_trace(100, 10, start_index=2)
    cache = new_cache(policy, 3, [a, a, *others])
    first = cache.acquire(a, 0.0)
    second = cache.acquire(a, 1.0)
    assert second.hit_blocks == 2
    cache.release(first, 2.0)
    for r in others:
        cache.access(r, r.arrival_s)
        assert 1 in cache.blocks and 2 in cache.blocks
    cache.release(second, 3.0)
    assert cache.pinned_blocks == 0


def test_when_everything_is_pinned_the_request_is_not_cached(policy):
    held = rb([1, 2, 3], index=0)
    late = rb([4, 5], index=1)
    cache = new_cache(policy, 3, [held, late])
    cache.acquire(held, 0.0)
    lease = cache.acquire(late, 1.0)
    assert lease.blocks == []
    assert cache.stats.uncached_blocks == 2
    assert len(cache) == 3
    assert 4 not in cache.blocks and 5 not in cache.blocks
    assert cache.stats.blocks == 5  # the uncached blocks still count as accesses


def test_the_blocks_past_the_last_free_slot_are_not_cached(policy):
    held = rb([1, 2, 3], index=0)
    late = rb([4, 5, 6], index=1)
    cache = new_cache(policy, 4, [held, late])
    cache.acquire(held, 0.0)
    lease = cache.acquire(late, 1.0)
    assert [b.key for b in lease.blocks] == [4]
    assert cache.stats.uncached_blocks == 2
    assert len(cache) == 4
    assert cache.stats.evictions == 0


def test_uncached_requests_release_cleanly_and_space_is_reused(policy):
    held = rb([1, 2, 3], index=0)
    late = rb([4, 5], index=1)
    after = rb([6], index=2)
    cache = new_cache(policy, 3, [held, late, after])
    lease_held = cache.acquire(held, 0.0)
    cache.release(cache.acquire(late, 1.0), 1.5)
    cache.release(lease_held, 2.0)
    cache.access(after, 3.0)
    assert 6 in cache.blocks
    assert len(cache) == 3
    assert cache.pinned_blocks == 0
    check_tree(cache)


def test_capacity_is_never_exceeded_with_mixed_requests(policy):
    trace = trace_of([1, 2, 3], [1, 2, 4], [5, 6], [1, 7], [5, 6, 8, 9], [1, 2, 3], [10])
    cache = new_cache(policy, 3, trace)
    for r in trace:
        cache.access(r, r.arrival_s)
        assert len(cache) <= 3
        check_tree(cache)


# ---------------------------------------------------------------- leaf-only eviction


def test_an_internal_block_is_never_evicted_while_it_has_cached_children(policy):
    # 1 is the parent of 2 and of 3 (and hit once); then unrelated single blocks, each used
    # three times (so frequency-based policies rank them above 1 too), push everything out
    trace = trace_of([1, 2], [1, 3], *[[100 + j] for j in range(12) for _ in range(3)])
    cache = new_cache(policy, 3, trace, record_evictions=True)
    for r in trace:
        cache.access(r, r.arrival_s)
        check_tree(cache)
        if 1 not in cache.blocks:
            assert 2 not in cache.blocks and 3 not in cache.blocks
    order = [key for _, key, _, _ in cache.eviction_log]
    assert 1 in order, f"{policy} kept block 1: the leaf-only check never ran"
    assert order.index(1) > order.index(2)
    assert order.index(1) > order.index(3)


def test_a_chain_reused_twice_then_pushed_out_evicts_the_child_first(policy):
    # the parent is promoted/refreshed by each reuse; the child's release must not strand it
    trace = trace_of([3], [3, 32], [3, 32], [2])
    cache = new_cache(policy, 2, trace, record_evictions=True)
    for r in trace:
        cache.access(r, r.arrival_s)
        check_tree(cache)
    assert [key for _, key, _, _ in cache.eviction_log] == [32]


def test_lru_evicts_both_children_before_their_shared_parent():
    trace = trace_of([1, 2], [1, 3], [100], [101], [102])
    cache = new_cache("lru", 3, trace, record_evictions=True)
    for r in trace:
        cache.access(r, r.arrival_s)
    assert [key for _, key, _, _ in cache.eviction_log] == [2, 3, 1]


def test_lru_evicts_a_requests_tail_first():
    trace = trace_of([1, 2, 3, 4], [100])
    cache = new_cache("lru", 4, trace, record_evictions=True)
    for r in trace:
        cache.access(r, r.arrival_s)
    assert [key for _, key, _, _ in cache.eviction_log] == [4]
    assert cache.lookup(rb([1, 2, 3, 4])) == 3


def test_lru_evicts_the_least_recently_released_leaf():
    trace = trace_of([1], [2], [3], [1], [4])
    cache = new_cache("lru", 3, trace, record_evictions=True)
    for r in trace:
        cache.access(r, r.arrival_s)
    assert [key for _, key, _, _ in cache.eviction_log] == [2]


def test_lru_recency_is_release_time_not_acquire_time():
    a, b, c = rb([1], index=0), rb([2], index=1), rb([3], index=2)
    cache = new_cache("lru", 2, [a, b, c], record_evictions=True)
    lease_a = cache.acquire(a, 0.0)
    cache.access(b, 1.0)
    cache.release(lease_a, 2.0)  # 1 was acquired first but released last
    cache.access(c, 3.0)
    assert [key for _, key, _, _ in cache.eviction_log] == [2]


# ---------------------------------------------------------------- eviction records


def test_evictions_are_recorded_by_semantic_type_and_reason(policy):
    a = rb([1, 2], stypes=[T.SYSTEM, T.USER_QUERY], index=0)
    trace = [a, *flat_trace(100, 4, start_index=1)]
    cache = new_cache(policy, 2, trace, record_evictions=True)
    for r in trace:
        cache.access(r, r.arrival_s)
    s = cache.stats
    assert s.evictions == 4
    assert s.evictions_by_reason == {"capacity": 4}
    assert sum(s.evictions_by_type) == 4
    assert len(cache.eviction_log) == 4
    for now, key, stype, reason in cache.eviction_log:
        assert reason == "capacity"
        assert now in {1.0, 2.0, 3.0, 4.0}
        if key == 1:
            assert stype == TYPE_INDEX[T.SYSTEM]
        elif key == 2:
            assert stype == TYPE_INDEX[T.USER_QUERY]
        else:
            assert stype == TYPE_INDEX[T.UNKNOWN]


def test_lru_eviction_counts_by_type():
    a = rb([1, 2], stypes=[T.SYSTEM, T.USER_QUERY], index=0)
    trace = [a, rb([100], index=1), rb([101], index=2)]
    cache = new_cache("lru", 2, trace)
    for r in trace:
        cache.access(r, r.arrival_s)
    s = cache.stats
    assert s.evictions_by_type[TYPE_INDEX[T.SYSTEM]] == 1
    assert s.evictions_by_type[TYPE_INDEX[T.USER_QUERY]] == 1
    assert s.evictions_by_type[TYPE_INDEX[T.UNKNOWN]] == 0


def test_eviction_log_is_off_by_default():
    cache = new_cache("lru", 1)
    cache.access(rb([1]), 0.0)
    cache.access(rb([2]), 1.0)
    assert cache.eviction_log is None
    assert cache.stats.evictions == 1


# ---------------------------------------------------------------- ghost list


class GhostRecordingLRU(LRU):
    uses_ghost_list = True

    def __init__(self) -> None:
        super().__init__()
        self.ghost_hits: list[tuple[int, GhostEntry, float]] = []

    def on_ghost_hit(self, b, ghost, now):
        self.ghost_hits.append((b.key, ghost, now))


def test_reinserting_a_recently_evicted_key_counts_a_ghost_hit(policy):
    trace = trace_of([1], [2], [1])
    cache = new_cache(policy, 1, trace, ghost_capacity=4)
    for r in trace:
        cache.access(r, r.arrival_s)
    assert cache.stats.ghost_hits == 1
    assert 2 in cache.ghost and 1 not in cache.ghost


def test_a_key_evicted_exactly_ghost_capacity_evictions_ago_is_still_a_ghost_hit():
    cache = BlockCache(1, LRU(), ghost_capacity=1)
    for i, k in enumerate([1, 2, 1]):
        cache.access(rb([k]), float(i))
    assert cache.stats.ghost_hits == 1


def test_a_ghost_hit_calls_the_policy_with_what_was_remembered():
    policy = GhostRecordingLRU()
    cache = BlockCache(1, policy, ghost_capacity=4)
    cache.access(rb([1], stypes=[T.CODE], tokens=[3]), 0.0)
    cache.access(rb([1], stypes=[T.CODE], tokens=[3]), 0.5)  # a hit: no ghost involved
    cache.access(rb([2]), 1.0)
    cache.access(rb([1], stypes=[T.CODE], tokens=[3]), 2.0)
    assert len(policy.ghost_hits) == 1
    key, ghost, now = policy.ghost_hits[0]
    assert (key, now) == (1, 2.0)
    assert ghost.stype == TYPE_INDEX[T.CODE]
    assert ghost.evicted_at == 1.0
    assert ghost.hits == 1
    assert ghost.tokens == 3
    assert ghost.pos == 0


def test_a_key_never_evicted_is_not_a_ghost_hit():
    policy = GhostRecordingLRU()
    cache = BlockCache(2, policy)
    for k in (1, 2, 3):
        cache.access(rb([k]), float(k))
    assert cache.stats.ghost_hits == 0
    assert policy.ghost_hits == []


def test_a_ghost_hit_is_counted_once():
    cache = BlockCache(1, LRU(), ghost_capacity=4)
    for i, k in enumerate([1, 2, 1, 1, 1]):
        cache.access(rb([k]), float(i))
    assert cache.stats.ghost_hits == 1


def test_the_ghost_list_is_bounded_and_keeps_the_most_recent_evictions():
    cache = BlockCache(1, LRU(), ghost_capacity=2)
    for k in range(1, 7):
        cache.access(rb([k]), float(k))
    assert len(cache.ghost) == 2
    assert 4 in cache.ghost and 5 in cache.ghost
    assert 3 not in cache.ghost


def test_the_ghost_list_defaults_to_the_cache_capacity_for_a_policy_that_learns_from_it():
    cache = BlockCache(3, GhostRecordingLRU())
    for k in range(1, 20):
        cache.access(rb([k]), float(k))
    assert len(cache.ghost) == 3


def test_the_ghost_list_is_off_by_default_for_a_policy_that_ignores_it():
    cache = BlockCache(3, LRU())
    for k in [1, 2, 3, 4, 1]:
        cache.access(rb([k]), float(k))
    assert len(cache.ghost) == 0
    assert cache.stats.ghost_hits == 0


def test_a_zero_capacity_ghost_list_records_nothing():
    policy = GhostRecordingLRU()
    cache = BlockCache(1, policy, ghost_capacity=0)
    for i, k in enumerate([1, 2, 1]):
        cache.access(rb([k]), float(i))
    assert len(cache.ghost) == 0
    assert cache.stats.ghost_hits == 0
    assert policy.ghost_hits == []


# ---------------------------------------------------------------- hooks


def test_hooks_a_policy_leaves_as_no_ops_are_still_correct():
    class Bare(Policy):
        """Evicts any unpinned leaf, found by scanning (tests the cache, not the policy)."""

        name = "bare"

        def __init__(self) -> None:
            self.cache: BlockCache | None = None

        def victim(self):
            assert self.cache is not None
            for b in self.cache.blocks.values():
                if b.ref == 0 and b.n_children == 0:
                    return b
            return None

    policy = Bare()
    cache = BlockCache(3, policy)
    policy.cache = cache
    for i, keys in enumerate([[1, 2, 3], [1, 2, 4], [5, 6, 7], [1, 8]]):
        cache.access(rb(keys), float(i))
        assert len(cache) <= 3
        check_tree(cache)


def test_every_request_is_announced_to_the_policy_before_its_lookup():
    seen = []

    class Announced(LRU):
        def on_request(self, r, now):
            seen.append((r.index, now, len(self_cache.blocks)))

    self_cache = BlockCache(4, Announced())
    self_cache.access(rb([1, 2], index=0), 0.0)
    self_cache.access(rb([1, 3], index=1), 1.0)
    assert seen == [(0, 0.0, 0), (1, 1.0, 2)]
