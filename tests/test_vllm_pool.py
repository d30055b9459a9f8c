"""vLLM V1's block pool, block for block: null block, free queue order (LRU on free time,
tail first), lazy eviction, the prompt_len - 1 hit cap, duplicates, orphans and the partial
last block that goes to the front of the free queue. Block size 4 throughout."""

from __future__ import annotations

import pytest
from helpers import rb

from skv.cache.vllm_pool import NULL_BLOCK, VllmBlockPool
from skv.model import TYPE_INDEX, SemanticType
from skv.policies.registry import make_cache

T = SemanticType
BS = 4


def full(*keys: int, **kw):
    """A block-aligned request: every block full."""
    return rb(keys, block_size=BS, **kw)


def with_partial(*keys: int, last_tokens: int = 2, **kw):
    """A request whose last key is a partial block of ``last_tokens`` tokens."""
    tokens = [BS] * (len(keys) - 1) + [last_tokens]
    return rb(keys, tokens=tokens, block_size=BS, **kw)


def evicted(pool: VllmBlockPool) -> list[int]:
    assert pool.eviction_log is not None
    return [key for _, key, _, _ in pool.eviction_log]


def pool_of(n: int, ghost_capacity: int = 0) -> VllmBlockPool:
    return VllmBlockPool(n, record_evictions=True, ghost_capacity=ghost_capacity)


# ---------------------------------------------------------------- construction, null block


def test_the_registry_builds_the_pool_for_vllm():
    assert isinstance(make_cache("vllm", 8), VllmBlockPool)


def test_the_pool_takes_no_policy_parameters():
    with pytest.raises(ValueError, match="vllm"):
        make_cache("vllm", 8, {"alpha": 1})


def test_fewer_than_two_blocks_is_rejected():
    with pytest.raises(ValueError, match="null block"):
        VllmBlockPool(1)


def test_the_null_block_is_never_handed_out():
    pool = pool_of(4)
    for k in range(1, 30):
        lease = pool.access(full(k), float(k))
        assert NULL_BLOCK not in lease.blocks
    assert pool.hash[NULL_BLOCK] is None
    assert NULL_BLOCK not in pool.free


def test_capacity_n_gives_n_minus_1_usable_blocks():
    pool = pool_of(4)
    lease = pool.acquire(full(1, 2, 3, 4), 0.0)
    assert len(lease.blocks) == 3
    assert pool.stats.uncached_blocks == 1
    assert len(pool) == 3


def test_block_aligned_prompts_keep_n_minus_1_blocks_cached():
    pool = pool_of(6)
    for k in range(1, 21):
        pool.access(full(k), float(k))
        assert len(pool) <= 5
    assert len(pool) == 5
    assert set(pool.cached) == set(range(16, 21))


# ---------------------------------------------------------------- free queue order


def test_a_freed_requests_last_block_is_evicted_first():
    pool = pool_of(5)  # 4 usable blocks
    pool.access(full(1, 2, 3, 4), 0.0)
    pool.access(full(9), 1.0)
    assert evicted(pool) == [4]
    assert set(pool.cached) == {1, 2, 3, 9}


def test_freed_blocks_are_evicted_in_free_order_tail_first():
    pool = pool_of(5)
    pool.access(full(1, 2), 0.0)
    pool.access(full(3, 4), 1.0)
    pool.access(full(5, 6, 7, 8), 2.0)
    assert evicted(pool) == [2, 1, 4, 3]


def test_a_hit_refreshes_a_block_to_the_back_of_the_free_queue():
    pool = pool_of(4)  # 3 usable
    pool.access(full(1), 0.0)
    pool.access(full(2), 1.0)
    pool.access(with_partial(1, 50), 2.0)  # hits 1; its partial block goes to the front
    pool.access(full(3), 3.0)  # takes the partial's free block: nothing evicted
    assert evicted(pool) == []
    pool.access(full(4), 4.0)
    assert evicted(pool) == [2]


def test_eviction_is_lazy_a_freed_block_keeps_its_hash_until_reused():
    pool = pool_of(4)
    lease = pool.access(full(1, 2), 0.0)
    assert all(pool.ref[b] == 0 and b in pool.free for b in lease.blocks)
    assert set(pool.cached) == {1, 2}
    assert pool.lookup(full(1, 2, 3)) == 2


def test_held_blocks_are_never_evicted():
    pool = pool_of(5)
    held = pool.acquire(full(1, 2), 0.0)
    for k in range(10, 30):
        pool.access(full(k), float(k))
        assert [pool.hash[b] for b in held.blocks] == [1, 2]
    assert pool.lookup(full(1, 2, 3)) == 2


def test_when_every_block_is_held_the_request_is_not_cached():
    pool = pool_of(3)  # 2 usable
    pool.acquire(full(1, 2), 0.0)
    lease = pool.acquire(full(3, 4), 1.0)
    assert lease.blocks == []
    assert pool.stats.uncached_blocks == 2
    assert len(pool) == 2


def test_a_released_request_frees_every_block_it_held():
    pool = pool_of(5)
    lease = pool.acquire(with_partial(1, 2, 3), 0.0)
    assert len(pool.free) == 1
    pool.release(lease, 1.0)
    assert len(pool.free) == 4
    assert all(r == 0 for r in pool.ref)


# ---------------------------------------------------------------- hits


def test_a_fully_cached_block_aligned_prompt_hits_all_but_its_last_block():
    pool = pool_of(16)
    a = full(1, 2, 3, 4)
    pool.access(a, 0.0)
    assert pool.lookup(a) == 3
    lease = pool.access(a, 1.0)
    assert (lease.hit_blocks, lease.hit_tokens) == (3, 12)


def test_a_prompt_ending_in_a_partial_block_hits_all_its_full_blocks():
    pool = pool_of(16)
    a = with_partial(1, 2, 3, 4, last_tokens=2)
    pool.access(a, 0.0)
    assert pool.lookup(a) == 3
    lease = pool.access(a, 1.0)
    assert (lease.hit_blocks, lease.hit_tokens) == (3, 12)


def test_a_one_token_partial_block_still_lets_every_full_block_hit():
    pool = pool_of(16)
    pool.access(full(1, 2), 0.0)
    assert pool.lookup(with_partial(1, 2, 9, last_tokens=1)) == 2


def test_a_single_full_block_prompt_never_hits():
    pool = pool_of(8)
    pool.access(full(1), 0.0)
    assert pool.access(full(1), 1.0).hit_blocks == 0


def test_partial_blocks_are_never_cached():
    pool = pool_of(8)
    pool.access(with_partial(1, 2), 0.0)
    assert set(pool.cached) == {1}
    assert len(pool) == 1


def test_a_lookup_stops_at_the_first_miss():
    pool = pool_of(16)
    pool.access(full(1, 2, 3, 4), 0.0)
    assert pool.lookup(full(1, 9, 3, 4, 5)) == 1


def test_hits_are_counted_per_type():
    pool = pool_of(16)
    a = rb([1, 2, 3], tokens=[4, 4, 1], stypes=[T.SYSTEM, T.CODE, T.USER_QUERY], block_size=BS)
    pool.access(a, 0.0)
    pool.access(a, 1.0)
    s = pool.stats
    assert s.hit_tokens_by_type[TYPE_INDEX[T.SYSTEM]] == 4
    assert s.hit_tokens_by_type[TYPE_INDEX[T.CODE]] == 4
    assert s.hit_tokens_by_type[TYPE_INDEX[T.USER_QUERY]] == 0
    assert (s.hit_blocks, s.hit_tokens, s.blocks, s.prompt_tokens) == (2, 8, 6, 18)


def test_an_empty_request_hits_nothing():
    pool = pool_of(8)
    pool.access(full(1, 2), 0.0)
    empty = rb([], block_size=BS)
    assert pool.lookup(empty) == 0
    lease = pool.access(empty, 1.0)
    assert (lease.hit_blocks, lease.hit_tokens) == (0, 0)
    assert pool.stats.hit_blocks == 0


# ---------------------------------------------------------------- duplicates and orphans


def test_a_recomputed_block_whose_hash_is_cached_becomes_a_duplicate():
    pool = pool_of(16)
    a = full(1, 2, 3, 4)
    first = pool.access(a, 0.0)
    second = pool.access(a, 1.0)
    assert len(pool) == 5  # 4 hashes, the last one held by two blocks
    assert len(pool.holders(4)) == 2
    assert second.blocks[:3] == first.blocks[:3]
    assert second.blocks[3] != first.blocks[3]
    assert pool.stats.evictions == 0


def test_evicting_one_duplicate_keeps_the_hash_cached():
    pool = pool_of(6)  # 5 usable: 4 + the duplicate
    a = full(1, 2, 3, 4)
    pool.access(a, 0.0)
    pool.access(a, 1.0)  # free queue now: old 4, dup 4, 3, 2, 1
    pool.access(full(9), 2.0)
    assert evicted(pool) == [4]
    assert len(pool.holders(4)) == 1
    assert pool.lookup(full(1, 2, 3, 4, 5)) == 4


def test_an_orphaned_child_stays_cached_but_unreachable_and_is_evicted_in_lru_order():
    """Evicting a parent does not cascade to its children.

    Tail-first freeing keeps a parent behind its children in the free queue, so to evict a
    parent first the test refreshes the child alone, with a request that starts at the child's
    key (the pool knows blocks by hash only).
    """
    pool = pool_of(6)  # 5 usable
    pool.access(with_partial(1, 2, 3, last_tokens=1), 0.0)  # parent 1, child 2
    pool.access(with_partial(2, 50, last_tokens=1), 1.0)  # refreshes the child only
    pool.access(full(10, 11, 12, 13), 2.0)  # 3 free blocks + the LRU one: the parent's
    assert evicted(pool) == [1]
    assert 2 in pool.cached  # no cascade
    assert pool.lookup(with_partial(1, 2, 60)) == 0  # the lookup stops at the parent
    assert len(pool) == 5
    pool.access(full(20), 3.0)  # the orphan is the least recently freed block
    assert evicted(pool) == [1, 2]


# ---------------------------------------------------------------- the partial last block


def test_a_partial_last_block_is_freed_to_the_front_and_reused_first():
    pool = pool_of(8)
    a = pool.access(with_partial(1, 2, 3), 0.0)
    b = pool.access(full(7), 1.0)
    assert b.blocks == [a.blocks[2]]
    assert evicted(pool) == []


def test_with_partial_prompts_cached_content_lives_in_n_minus_2_blocks():
    n = 6
    pool = pool_of(n)
    for k in range(1, 21):
        pool.access(with_partial(100 + k, 200 + k), float(k))
        assert len(pool) <= n - 2
    assert len(pool) == n - 2
    assert set(pool.cached) == {100 + k for k in range(17, 21)}
    assert pool.lookup(with_partial(120, 999)) == 1
    assert pool.lookup(with_partial(116, 999)) == 0


# ---------------------------------------------------------------- keying and records


def test_segment_keyed_requests_raise():
    pool = pool_of(8)
    seg_keyed = rb([1, 2, 3], parents=[None, None, 2], block_size=BS)
    with pytest.raises(ValueError, match="prefix"):
        pool.acquire(seg_keyed, 0.0)


def test_evictions_are_recorded_by_type_and_reason():
    pool = pool_of(3)
    pool.access(rb([1, 2], stypes=[T.SYSTEM, T.TOOL_OUTPUT], block_size=BS), 0.0)
    pool.access(full(3, 4), 5.0)
    s = pool.stats
    assert s.evictions == 2
    assert s.evictions_by_reason == {"capacity": 2}
    assert s.evictions_by_type[TYPE_INDEX[T.SYSTEM]] == 1
    assert s.evictions_by_type[TYPE_INDEX[T.TOOL_OUTPUT]] == 1
    assert pool.eviction_log == [
        (5.0, 2, TYPE_INDEX[T.TOOL_OUTPUT], "capacity"),
        (5.0, 1, TYPE_INDEX[T.SYSTEM], "capacity"),
    ]


def test_a_hash_evicted_and_recomputed_counts_a_ghost_hit():
    pool = pool_of(2, ghost_capacity=4)  # 1 usable
    pool.access(with_partial(1, 50, last_tokens=1), 0.0)
    pool.access(full(2), 1.0)
    pool.access(with_partial(1, 50, last_tokens=1), 2.0)
    assert pool.stats.ghost_hits == 1


def test_recomputing_a_hash_that_was_never_lost_is_not_a_ghost_hit():
    pool = pool_of(3, ghost_capacity=4)  # 2 usable
    a = full(1, 2)
    for t in range(3):  # each time: hit 1, recompute 2 into the free block that holds 2
        pool.access(a, float(t))
    assert 2 in pool.cached
    assert 2 not in pool.ghost
    assert pool.stats.ghost_hits == 0


def test_the_pool_keeps_no_ghost_list_unless_asked():
    pool = pool_of(2)
    pool.access(with_partial(1, 50, last_tokens=1), 0.0)
    pool.access(full(2), 1.0)
    pool.access(with_partial(1, 50, last_tokens=1), 2.0)
    assert len(pool.ghost) == 0
    assert pool.stats.ghost_hits == 0


def test_evicting_one_of_two_duplicates_leaves_no_ghost():
    pool = pool_of(6, ghost_capacity=8)
    a = full(1, 2, 3, 4)
    pool.access(a, 0.0)
    pool.access(a, 1.0)  # 4 is held twice; the old copy is at the front of the free queue
    pool.access(full(9), 2.0)
    assert evicted(pool) == [4]
    assert 4 not in pool.ghost
    pool.access(a, 3.0)  # recomputes 4 as a duplicate again
    assert pool.stats.ghost_hits == 0


# ---------------------------------------------------------------- decoding (extend)


def test_decoding_fills_the_prompts_partial_block_in_place_then_allocates():
    pool = pool_of(8)  # 7 usable
    prompt = with_partial(1, 2, 3, last_tokens=2)  # 2 full blocks + 2 tokens
    lease = pool.acquire(prompt, 0.0)
    assert len(lease.blocks) == 3 and pool.hash[lease.blocks[2]] is None
    partial = lease.blocks[2]
    # prompt + 7 decoded tokens = 11 tokens: block 2 is full now (key 30), block 3 partial
    grown = rb([1, 2, 30, 40], tokens=[BS, BS, BS, 3], block_size=BS)
    pool.extend(lease, grown, 2, 1.0)
    assert len(lease.blocks) == 4  # one new block, not two
    assert lease.blocks[2] == partial and pool.hash[partial] == 30  # hashed in place
    assert pool.hash[lease.blocks[3]] is None  # still partial
    pool.release(lease, 2.0)
    assert pool.access(full(1, 2, 30, 99), 3.0).hit_tokens == 3 * BS  # the answer's block hits


def test_decoding_after_a_block_aligned_prompt_only_allocates():
    pool = pool_of(8)
    lease = pool.acquire(full(1, 2), 0.0)
    grown = rb([1, 2, 50], tokens=[BS, BS, BS], block_size=BS)
    pool.extend(lease, grown, 2, 1.0)
    assert len(lease.blocks) == 3 and pool.hash[lease.blocks[2]] == 50
    pool.release(lease, 2.0)
    assert sorted(k for k in pool.cached) == [1, 2, 50]
