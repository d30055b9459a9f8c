"""Cases of the caches (``skv/cache``) that mutation testing showed unpinned (issue 11):
``BlockCache.extend`` (a request growing by its output), the policy hooks' arguments, reuse
counts, uncached and ghost-hit counts that accumulate, replay ranges, the counters' eviction
reasons, the ghost record of an evicted block, and vLLM's pool at block size 1, on extension and
in its eviction log. Expected values are worked by hand in each docstring."""

from __future__ import annotations

import pytest
from helpers import check_tree, rb

from skv.cache.block import Block, Counters, GhostEntry, GhostList, Lease
from skv.cache.radix import BlockCache
from skv.cache.vllm_pool import VllmBlockPool
from skv.model import NUM_TYPES, TYPE_INDEX, SemanticType
from skv.policies.lru import LRU

T = SemanticType
BS = 4


def keys_of(lease) -> list[int]:
    return [b.key for b in lease.blocks]


# ---------------------------------------------------------------- BlockCache.extend


@pytest.mark.parametrize("prompt", [[1], [1, 2]])
def test_extend_grows_a_lease_by_its_new_blocks_pinned_and_uncounted(prompt):
    """A prompt of 1 or 2 blocks in flight; its output grows the chain to [1, 2, 3, 4], extended
    from block ``len(prompt)`` on: the new blocks are pinned with the lease, each a child of the
    one before (the lease's last block first), inserted at the extension's time; the lookups
    and hits counted are the prompt's only (1 request, len(prompt) blocks, no hit). After
    release, [1, 2, 3, 4, 5] hits 4."""
    cache = BlockCache(8, LRU())
    lease = cache.acquire(rb(prompt), 0.0)
    cache.extend(lease, rb([1, 2, 3, 4]), len(prompt), 1.0)
    assert keys_of(lease) == [1, 2, 3, 4]
    for k in (2, 3, 4):
        assert cache.blocks[k].parent is cache.blocks[k - 1]
    assert [cache.blocks[k].n_children for k in (1, 2, 3, 4)] == [1, 1, 1, 0]
    assert [cache.blocks[k].ref for k in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert [cache.blocks[k].inserted_at for k in (3, 4)] == [1.0, 1.0]
    assert cache.pinned_blocks == 4
    s = cache.stats
    assert (s.requests, s.blocks, s.hit_blocks) == (1, len(prompt), 0)
    check_tree(cache)
    cache.release(lease, 2.0)
    assert cache.pinned_blocks == 0
    assert cache.access(rb([1, 2, 3, 4, 5]), 3.0).hit_blocks == 4


def test_extend_through_blocks_another_request_cached_hits_them_in_its_run():
    """[1, 2, 3] is cached (released); a request holding [1] (start 1) grows to [1, 2, 3, 4]:
    2 and 3 are found in the run that continues its block 1 (no broken-chain error), pinned, and
    4 is added under 3; nothing is counted as a lookup or hit of a new request."""
    cache = BlockCache(8, LRU())
    cache.access(rb([1, 2, 3]), 0.0)
    lease = cache.acquire(rb([1]), 1.0)
    cache.extend(lease, rb([1, 2, 3, 4]), 1, 2.0)
    assert keys_of(lease) == [1, 2, 3, 4]
    assert [cache.blocks[k].ref for k in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert cache.blocks[4].parent is cache.blocks[3]
    s = cache.stats
    assert (s.requests, s.blocks, s.hit_blocks) == (2, 4, 1)  # [1, 2, 3] and [1] only
    check_tree(cache)


def test_extend_does_nothing_when_the_output_does_not_continue_the_lease():
    """No-ops: start 0 (also on an empty lease); start at or past the end of the grown
    request; a lease shorter than start; a grown request whose block ``start`` is not a child
    of the lease's block ``start - 1``."""
    cache = BlockCache(8, LRU())
    lease = cache.acquire(rb([1, 2]), 0.0)
    other = rb([1, 9, 3], parents=[None, 1, 9])  # block 2 of `other` continues 9, not 2
    for grown, start in [
        (rb([1, 2, 3]), 0),
        (rb([1, 2]), 2),
        (rb([1, 2, 3]), 3),
        (rb([1, 2, 3]), 4),
        (rb([1, 2, 3, 4]), 3),
        (other, 2),
    ]:
        cache.extend(lease, grown, start, 1.0)
        assert keys_of(lease) == [1, 2], (start, grown.keys)
        assert sorted(cache.blocks) == [1, 2]
    empty = cache.acquire(rb([]), 2.0)
    cache.extend(empty, rb([5]), 0, 3.0)
    assert empty.blocks == [] and sorted(cache.blocks) == [1, 2]


# ---------------------------------------------------------------- hooks, counts


class Recorder(LRU):
    """LRU that records the hooks the cache calls, with their block key and time."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def on_request(self, rb, now):
        self.calls.append(("request", now))

    def on_insert(self, b, now):
        self.calls.append(("insert", b.key, now))

    def on_hit(self, b, now):
        self.calls.append(("hit", b.key, now))

    def on_pin(self, b):
        self.calls.append(("pin", b.key))

    def on_unpin(self, b, now):
        self.calls.append(("unpin", b.key, now))
        super().on_unpin(b, now)

    def on_leaf(self, b, now):
        self.calls.append(("leaf", b.key, now))

    def on_evict(self, b, now):
        self.calls.append(("evict", b.key, now))


def test_the_cache_calls_every_policy_hook_with_the_block_and_the_time():
    """Capacity 2. [1, 2] at t=1, released at 2 (tail first). [1, 3] at t=3: 1 hits (pinned
    first), 3 misses with the cache full: the LRU leaf 2 goes (1 is pinned: no leaf call), 3
    is inserted; released at 3. [4] at t=4: 3 goes, its parent 1 (unpinned) becomes a leaf at
    4, then 4 is inserted."""
    pol = Recorder()
    cache = BlockCache(2, pol)
    lease = cache.acquire(rb([1, 2]), 1.0)
    cache.release(lease, 2.0)
    cache.access(rb([1, 3]), 3.0)
    cache.access(rb([4]), 4.0)
    assert pol.calls == [
        ("request", 1.0), ("insert", 1, 1.0), ("insert", 2, 1.0),
        ("unpin", 2, 2.0), ("unpin", 1, 2.0),
        ("request", 3.0), ("pin", 1), ("hit", 1, 3.0), ("evict", 2, 3.0), ("insert", 3, 3.0),
        ("unpin", 3, 3.0), ("unpin", 1, 3.0),
        ("request", 4.0), ("leaf", 1, 4.0), ("evict", 3, 4.0), ("insert", 4, 4.0),
        ("unpin", 4, 4.0),
    ]  # fmt: skip


def test_a_block_counts_its_reuses_and_its_last_use():
    """[1] (4 tokens) inserted at t=0, hit at 1 and 5: 2 reuses (the insertion is not one),
    last used at 5, inserted at 0; the cache counts 2 hit blocks, 8 hit tokens."""
    cache = BlockCache(4, LRU())
    for t in (0.0, 1.0, 5.0):
        cache.access(rb([1]), t)
    b = cache.blocks[1]
    assert (b.hits, b.last_access, b.inserted_at) == (2, 5.0, 0.0)
    assert (cache.stats.hit_blocks, cache.stats.hit_tokens) == (2, 2 * 4)


def test_uncached_blocks_accumulate_and_a_later_chain_root_still_hits():
    """Capacity 3, all pinned: [20] and [1, 2] in flight. A segment-keyed request with chains
    [10, 11] and [20]: 10 cannot be cached (nothing evictable), so neither can 11; its second
    chain still hits 20 (1 block, 4 tokens). The same request again: 2 more uncached, 4 in all."""
    cache = BlockCache(3, LRU())
    cache.acquire(rb([20]), 0.0)
    cache.acquire(rb([1, 2]), 0.0)
    two_chains = rb([10, 11, 20], parents=[None, 10, None])
    lease = cache.access(two_chains, 1.0)
    assert (lease.hit_blocks, lease.hit_tokens, keys_of(lease)) == (1, 4, [20])
    assert cache.stats.uncached_blocks == 2
    cache.access(two_chains, 2.0)
    assert cache.stats.uncached_blocks == 4 and sorted(cache.blocks) == [1, 2, 20]


def test_an_uncachable_chains_later_blocks_leave_their_ghosts_alone():
    """Capacity 3, ghost list of 8. [10, 11] then [30, 31, 32] (evicts 11 then 10: ghosts),
    then [20] and [1, 2] held (evict 32, 31, 30). [10, 11 | 20] now: 10's ghost is looked up
    (and dropped) before its failed insertion; 11 is not even looked up. Once everything is
    released, [10, 11] is cached again: 10 no longer has a ghost, 11 does: one ghost hit."""
    cache = BlockCache(3, LRU(), ghost_capacity=8)
    cache.access(rb([10, 11]), 0.0)
    cache.access(rb([30, 31, 32]), 1.0)
    held = [cache.acquire(rb([20]), 2.0), cache.acquire(rb([1, 2]), 2.0)]
    assert 10 in cache.ghost and 11 in cache.ghost
    cache.access(rb([10, 11, 20], parents=[None, 10, None]), 3.0)
    assert 10 not in cache.ghost and 11 in cache.ghost
    for lease in held:
        cache.release(lease, 4.0)
    cache.access(rb([10, 11]), 5.0)
    assert cache.stats.ghost_hits == 1


def test_ghost_hits_accumulate():
    """Capacity 1, ghost list of 4: [1], [2] (evicts 1), [1] (ghost hit, evicts 2),
    [2] (ghost hit): 2."""
    cache = BlockCache(1, LRU(), ghost_capacity=4)
    for t, k in enumerate([1, 2, 1, 2]):
        cache.access(rb([k]), float(t))
    assert cache.stats.ghost_hits == 2


def test_the_ghost_list_remembers_what_the_policy_tagged():
    """An evicted block's record: its type, the eviction time, its reuses, tokens, position
    and the policy's tag (pdata)."""
    b = Block(7, None, 3, TYPE_INDEX[T.SYSTEM], 2, None, 0.0)
    b.hits, b.pdata = 4, "queue-2"
    ghosts = GhostList(2)
    ghosts.remember(b, 9.0)
    entry = ghosts.pop(7)
    assert entry == GhostEntry(TYPE_INDEX[T.SYSTEM], 9.0, 4, 3, 2, "queue-2")
    assert entry != GhostEntry(TYPE_INDEX[T.SYSTEM], 9.0, 4, 3, 2, None)
    assert 7 not in ghosts and ghosts.pop(7) is None


@pytest.mark.parametrize("cls", ["radix", "vllm"])
def test_replay_covers_exactly_start_to_stop(cls):
    """Four one-block requests [1], [2], [3], [4] at t = 0..3: replay(trace) all 4,
    replay(trace, 1, 3) requests 1 and 2, replay(trace, 2) requests 2 and 3."""

    def new():
        return BlockCache(8, LRU()) if cls == "radix" else VllmBlockPool(9)

    def cached(c):
        return sorted(c.blocks) if cls == "radix" else sorted(c.cached)

    trace = [rb([k + 1], index=k, arrival_s=float(k)) for k in range(4)]
    for args, keys in [((), [1, 2, 3, 4]), ((1, 3), [2, 3]), ((2,), [3, 4])]:
        c = new()
        c.replay(trace, *args)
        assert (c.stats.requests, cached(c)) == (len(keys), keys), args


def test_replay_evicts_at_each_requests_arrival_time():
    """vLLM pool of 2 (1 usable block): [1] at t=0, [2] at t=5 evicts 1 at 5."""
    pool = VllmBlockPool(2, record_evictions=True)
    pool.replay([rb([1], arrival_s=0.0), rb([2], index=1, arrival_s=5.0)])
    assert pool.eviction_log == [(5.0, 1, TYPE_INDEX[T.UNKNOWN], "capacity")]


@pytest.mark.skipif(
    not hasattr(Counters(), "eviction"),
    reason="compiled, Counters.eviction is a C method (cdef): pure-Python build only",
)
def test_counters_count_evictions_by_reason_capacity_being_the_rest():
    """Two evictions for "ttl" and one for "capacity" (types 0, 1, 0): 3 evictions,
    by reason {capacity: 1, ttl: 2} (sorted), by type [2, 1, 0, ...]."""
    c = Counters()
    c.eviction(0, "ttl")
    c.eviction(1, "capacity")
    c.eviction(0, "ttl")
    s = c.snapshot()
    assert s.evictions == 3
    assert s.evictions_by_reason == {"capacity": 1, "ttl": 2}
    assert list(s.evictions_by_reason) == ["capacity", "ttl"]
    assert s.evictions_by_type == [2, 1] + [0] * (NUM_TYPES - 2)
    only_ttl = Counters()
    only_ttl.eviction(0, "ttl")
    assert only_ttl.snapshot().evictions_by_reason == {"ttl": 1}


# ---------------------------------------------------------------- vLLM pool


def test_the_pool_records_evictions_only_when_asked():
    assert VllmBlockPool(4).eviction_log is None
    assert VllmBlockPool(4, record_evictions=True).eviction_log == []


def test_the_pool_at_block_size_one_never_hits_the_last_token():
    """Block size 1: a 1-token prompt can hit nothing (its last token is computed), a
    2-token prompt at most 1 block."""
    pool = VllmBlockPool(8)
    one, two = rb([7], block_size=1), rb([7, 8], block_size=1)
    pool.access(two, 0.0)
    assert pool.lookup(one) == 0 and pool.access(one, 1.0).hit_blocks == 0
    assert pool.lookup(two) == 1


def test_the_pool_refuses_segment_keyed_requests_and_says_why():
    pool = VllmBlockPool(8)
    with pytest.raises(ValueError) as err:
        pool.acquire(rb([1, 2], parents=[None, None], index=3), 0.0)
    assert str(err.value) == (
        "request #3: vllm models exact prefix caching; replay it with prefix keying "
        "(segment keying restarts chains, which vLLM cannot reuse)"
    )


def test_decoding_into_a_partial_block_that_stays_partial_hashes_nothing():
    """Prompt [1, 2 (partial, 2 tokens)]; 1 decoded token: block 2 has 3 of 4 tokens: still
    unhashed, nothing new allocated, 1 cached block."""
    pool = VllmBlockPool(8)
    lease = pool.acquire(rb([1, 2], tokens=[BS, 2], block_size=BS), 0.0)
    pool.extend(lease, rb([1, 21], tokens=[BS, 3], block_size=BS), 1, 1.0)
    assert len(lease.blocks) == 2 and pool.hash[lease.blocks[1]] is None
    assert len(pool) == 1 and sorted(pool.cached) == [1]


def test_decoding_evicts_at_its_time_and_counts_nothing_uncached():
    """Pool of 3 (2 usable): [5] cached and freed at 0; [1] in flight; its output [1, 2] at
    t=4 takes the last free block, evicting 5 at 4. Growing to [1, 2, 3] with no block free:
    the output is not cached and not counted as uncached (only prompts are)."""
    pool = VllmBlockPool(3, record_evictions=True)
    pool.access(rb([5], block_size=BS), 0.0)
    lease = pool.acquire(rb([1], block_size=BS), 1.0)
    pool.extend(lease, rb([1, 2], block_size=BS), 1, 4.0)
    assert pool.eviction_log == [(4.0, 5, TYPE_INDEX[T.UNKNOWN], "capacity")]
    pool.extend(lease, rb([1, 2, 3], block_size=BS), 2, 5.0)
    assert len(lease.blocks) == 2 and pool.stats.uncached_blocks == 0


def test_the_pools_uncached_blocks_and_ghost_hits_accumulate():
    """Pool of 3 (2 usable) with [1, 2] held: [3, 4, 5] and [6, 7] get no block: 3 + 2 = 5
    uncached. Ghosts: pool of 2 (1 usable), ghost list of 4: [1], [2] (evicts 1), [1] (ghost
    hit, evicts 2), [2] (ghost hit): 2."""
    pool = VllmBlockPool(3)
    pool.acquire(rb([1, 2]), 0.0)
    pool.access(rb([3, 4, 5]), 1.0)
    pool.access(rb([6, 7]), 2.0)
    assert pool.stats.uncached_blocks == 5
    ghosts = VllmBlockPool(2, ghost_capacity=4)
    for t, k in enumerate([1, 2, 1, 2]):
        ghosts.access(rb([k]), float(t))
    assert ghosts.stats.ghost_hits == 2


def test_the_pools_ghost_record_of_an_evicted_hash():
    """Pool of 2, ghost list of 4: a system block [9] (4 tokens) is evicted at t=6 by [8]:
    its record is (type SYSTEM, evicted at 6, 0 reuses, 4 tokens, position 0)."""
    pool = VllmBlockPool(2, ghost_capacity=4)
    pool.access(rb([9], stypes=[T.SYSTEM]), 0.0)
    pool.access(rb([8]), 6.0)
    entry = pool.ghost.pop(9)
    fields = (entry.stype, entry.evicted_at, entry.hits, entry.tokens, entry.pos, entry.pdata)
    assert fields == (TYPE_INDEX[T.SYSTEM], 6.0, 0, BS, 0, None)
    assert entry == GhostEntry(TYPE_INDEX[T.SYSTEM], 6.0, 0, BS, 0)


def test_a_lease_holds_its_blocks_and_hits():
    lease = Lease([3, 4], 1, 16)
    assert (lease.blocks, lease.hit_blocks, lease.hit_tokens) == ([3, 4], 1, 16)
    assert repr(lease) == "Lease(blocks=2, hit_blocks=1)"


def test_evicting_one_of_three_duplicates_keeps_the_other_two():
    """Pool of 4 (blocks 1-3 usable). A one-block prompt never hits (the last token is
    computed), so three [1] in flight hold hash 1 three times: blocks 1, 2, 3. Released in that
    order, they are evicted in that order: [2] takes block 1 (hash 1 stays in 2 and 3), [3] takes
    block 2 (hash 1 stays in 3)."""
    pool = VllmBlockPool(4)
    leases = [pool.acquire(rb([1]), 0.0) for _ in range(3)]
    assert pool.holders(1) == [1, 2, 3]
    for lease in leases:
        pool.release(lease, 1.0)
    pool.access(rb([2]), 2.0)
    assert pool.holders(1) == [2, 3] and len(pool) == 3
    pool.access(rb([3]), 3.0)
    assert pool.holders(1) == [3] and len(pool) == 3
