"""Cases of vLLM's policy-ordered block pool (``skv/cache/policy_pool.py``) and of the free-queue
order it shares with the vLLM eviction plugin (``skv/cache/free_order.py``) that mutation testing
showed unpinned: the policy hooks' blocks and times (prompt, hit, decode, eviction, ghost hit),
the pin rule of a hit, a block's reuse count and times, the counters that accumulate (evictions,
by type and reason, ghost hits, uncached prompt blocks), ``FreeOrder.state`` (the plugin's run
log), the fallback's log message, the errors' messages, the smallest pool, ``holders``, the
``prompt_len - 1`` hit cap, ``replay``'s range, and evicting a duplicate that is not the oldest.
Expected values are worked by hand in each docstring (block size 4 unless told; a pool of
capacity n has blocks 1..n-1, block 0 being vLLM's null block, taken in that order while
unhashed ones are left)."""

from __future__ import annotations

import logging

import pytest
from helpers import rb

from skv.cache.free_order import FreeOrder
from skv.cache.policy_pool import PolicyBlockPool
from skv.model import TYPE_INDEX, SemanticType
from skv.policies.lru import LRU
from skv.policies.registry import make_vllm_pool

T = SemanticType
BS = 4
SYSTEM, UNKNOWN = TYPE_INDEX[T.SYSTEM], TYPE_INDEX[T.UNKNOWN]


class GhostLRU(LRU):
    """LRU that asks for a ghost list (as adaptive_semantic does) and reports, as its learned
    value, the ghost hits it heard of."""

    uses_ghost_list = True

    def __init__(self) -> None:
        super().__init__()
        self.heard = 0

    def on_ghost_hit(self, b, ghost, now):
        self.heard += 1

    def metrics(self):
        return {"ghost_hits_heard": float(self.heard)}


class Recorder(GhostLRU):
    """GhostLRU that records every hook the pool calls, with its block's key and the time."""

    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def on_request(self, rb, now):
        self.calls.append(("request", rb.index, now))

    def on_extend(self, rb, now):
        self.calls.append(("extend", rb.index, now))

    def on_insert(self, b, now):
        self.calls.append(("insert", b.key, now))

    def on_hit(self, b, now):
        self.calls.append(("hit", b.key, now))

    def on_pin(self, b):
        self.calls.append(("pin", b.key))

    def on_unpin(self, b, now):
        self.calls.append(("unpin", b.key, now))
        super().on_unpin(b, now)

    def on_evict(self, b, now):
        self.calls.append(("evict", b.key, now))

    def on_ghost_hit(self, b, ghost, now):
        self.calls.append(("ghost", b.key, ghost.evicted_at, now))
        super().on_ghost_hit(b, ghost, now)


# ---------------------------------------------------------------- FreeOrder on its own


def test_a_new_free_order_has_evicted_nothing_and_keeps_no_ghost_list():
    """``FreeOrder(policy)`` without a ghost capacity: its state is all zeros, no block was
    evicted yet; a key hashed into block 5, freed, evicted and hashed again is not a ghost hit
    (there is no ghost list); the eviction is counted once, under the block's type."""
    order = FreeOrder(LRU())
    assert order.last_evicted is None
    assert order.state() == {
        "evictions": 0,
        "evictions_by_type": {},
        "ghost_hits": 0,
        "fallbacks": 0,
        "cached_blocks": 0,
        "metrics": {},
    }
    req = rb([1])
    order.hashed(5, 1, BS, SYSTEM, 0, req, 1, 0.0)
    order.freed(5, 1.0)
    assert order.evict(2.0) == 5 and order.last_evicted.key == 1
    order.hashed(5, 1, BS, SYSTEM, 0, req, 1, 3.0)
    assert order.ghost.capacity == 0 and order.ghost_hits == 0
    assert order.evictions == 1 and order.evictions_by_type[SYSTEM] == 1


def test_a_block_hashed_twice_without_an_eviction_is_refused_and_says_which():
    order = FreeOrder(LRU())
    order.hashed(5, 1, BS, UNKNOWN, 0, rb([1]), 1, 0.0)
    with pytest.raises(AssertionError) as err:
        order.hashed(5, 2, BS, UNKNOWN, 1, rb([1, 2]), 1, 1.0)
    assert str(err.value) == "block 5 hashed twice without an eviction"


def test_evicting_with_no_free_cached_block_is_an_error_naming_the_policy():
    """Nothing cached at all, then one cached block that is still held: no block to give."""
    order = FreeOrder(LRU())
    with pytest.raises(RuntimeError) as err:
        order.evict(0.0)
    assert str(err.value) == "lru: the pool needs a block but none is free"
    order.hashed(5, 1, BS, UNKNOWN, 0, rb([1]), 1, 0.0)
    with pytest.raises(RuntimeError) as err:
        order.evict(1.0)
    assert str(err.value) == "lru: the pool needs a block but none is free"


# ---------------------------------------------------------------- the policy's hooks


def test_the_pool_calls_every_policy_hook_with_the_block_and_the_time():
    """Pool of 3 (2 usable), a policy with a ghost list (of 3). [1, 2] at t=1 takes blocks 1
    and 2 and hashes both, released at 2 (tail first). [1, 3] at t=3: at most (8 - 1) // 4 = 1
    block hits: 1 (free: pinned, then hit); 3 needs a block, none is unhashed: the LRU victim is
    2 (1 is pinned), 3 is inserted; released at 3. [2] at t=4 (a one-block prompt never hits):
    3 is evicted (released before 1), 2 is inserted and was evicted at 3: a ghost hit."""
    pol = Recorder()
    pool = PolicyBlockPool(3, pol)
    lease = pool.acquire(rb([1, 2], index=0), 1.0)
    pool.release(lease, 2.0)
    pool.access(rb([1, 3], index=1), 3.0)
    pool.access(rb([2], index=2), 4.0)
    assert pol.calls == [
        ("request", 0, 1.0), ("insert", 1, 1.0), ("insert", 2, 1.0),
        ("unpin", 2, 2.0), ("unpin", 1, 2.0),
        ("request", 1, 3.0), ("pin", 1), ("hit", 1, 3.0), ("evict", 2, 3.0), ("insert", 3, 3.0),
        ("unpin", 3, 3.0), ("unpin", 1, 3.0),
        ("request", 2, 4.0), ("evict", 3, 4.0), ("insert", 2, 4.0), ("ghost", 2, 3.0, 4.0),
        ("unpin", 2, 4.0),
    ]  # fmt: skip
    assert pool.stats.ghost_hits == pool.order.ghost_hits == pol.heard == 1


def test_a_hit_pins_a_block_only_when_no_request_held_it():
    """[1, 2] cached and free. Two requests [1, 2] in flight (t=1, t=2) each hit block 1 (the
    cap is 1 block): the first hit pins it (on_pin, then on_hit), the second only hits it;
    the block is then held twice."""
    pol = Recorder()
    pool = PolicyBlockPool(8, pol)
    pool.access(rb([1, 2]), 0.0)
    del pol.calls[:]
    pool.acquire(rb([1, 2], index=1), 1.0)
    pool.acquire(rb([1, 2], index=2), 2.0)
    assert [c for c in pol.calls if c[0] in ("request", "pin", "hit")] == [
        ("request", 1, 1.0), ("pin", 1), ("hit", 1, 1.0),
        ("request", 2, 2.0), ("hit", 1, 2.0),
    ]  # fmt: skip
    assert pool.order.blocks[pool.cached[1]].ref == pool.ref[pool.cached[1]] == 2


def test_decoding_tells_the_policy_it_extends_evicts_and_inserts_at_the_decode_time():
    """Pool of 3 (2 usable): [5] cached and freed at 0; [1] in flight from t=1; its output
    [1, 2] at t=4 is an extension of request 7 at 4, takes the last free block by evicting 5
    at 4, and inserts 2 at 4."""
    pol = Recorder()
    pool = PolicyBlockPool(3, pol)
    pool.access(rb([5]), 0.0)
    lease = pool.acquire(rb([1], index=7), 1.0)
    del pol.calls[:]
    pool.extend(lease, rb([1, 2], index=7), 1, 4.0)
    assert pol.calls == [("extend", 7, 4.0), ("evict", 5, 4.0), ("insert", 2, 4.0)]
    assert len(lease.blocks) == 2 and sorted(pool.cached) == [1, 2]


def test_a_cached_block_counts_its_reuses_and_its_last_use():
    """[1, 2] inserted at t=0, then sent again at 1 and 5: block 1 hits each time (the cap is
    1 block): 2 reuses (the insertion is not one), last used at 5, inserted at 0."""
    pool = PolicyBlockPool(8, LRU())
    for t in (0.0, 1.0, 5.0):
        pool.access(rb([1, 2]), t)
    b = pool.order.blocks[pool.cached[1]]
    assert (b.hits, b.last_access, b.inserted_at) == (2, 5.0, 0.0)
    assert (pool.stats.hit_blocks, pool.stats.hit_tokens) == (2, 2 * BS)


# ---------------------------------------------------------------- counters and state


@pytest.mark.parametrize("ghosts", [True, False])
def test_ghost_hits_accumulate_only_for_a_policy_that_uses_a_ghost_list(ghosts):
    """Pool of 2 (1 usable): [1], [2] (evicts 1), [1] (evicts 2; 1 was evicted: a ghost hit),
    [2] (a ghost hit): 2 with a ghost list, none for plain LRU (which asks for none)."""
    pool = PolicyBlockPool(2, GhostLRU() if ghosts else LRU())
    for t, k in enumerate([1, 2, 1, 2]):
        pool.access(rb([k], index=t), float(t))
    expected = 2 if ghosts else 0
    assert pool.stats.ghost_hits == pool.order.ghost_hits == expected
    assert pool.order.ghost.capacity == (2 if ghosts else 0)
    assert pool.stats.evictions == 3


def test_state_reports_evictions_by_type_ghost_hits_fallbacks_and_cached_blocks():
    """What the plugin writes to its run log. Pool of 3 (2 usable), LRU with a ghost list: 1
    and 2 (system), 3 and 4 (unknown), then 1 again, one request each: 3 evicts 1, 4 evicts 2,
    1 evicts 3 and is a ghost hit. 3 evictions (2 system, 1 unknown), 1 ghost hit, no
    fallback, 2 blocks cached (4 and 1); the policy's learned values are its metrics."""
    pool = PolicyBlockPool(3, GhostLRU())
    stypes = [T.SYSTEM, T.SYSTEM, T.UNKNOWN, T.UNKNOWN, T.SYSTEM]
    for t, (k, st) in enumerate(zip([1, 2, 3, 4, 1], stypes, strict=True)):
        pool.access(rb([k], stypes=[st], index=t), float(t))
    assert pool.order.state() == {
        "evictions": 3,
        "evictions_by_type": {"system": 2, "unknown": 1},
        "ghost_hits": 1,
        "fallbacks": 0,
        "cached_blocks": 2,
        "metrics": {"ghost_hits_heard": 1.0},
    }
    assert sorted(pool.cached) == [1, 4]
    assert pool.stats.evictions_by_type[SYSTEM] == 2
    assert pool.stats.evictions_by_reason == {"capacity": 3}


def test_uncached_prompt_blocks_accumulate_and_a_lease_counts_its_hits():
    """Pool of 3 (2 usable) with [1, 2] in flight, so nothing is free: [3, 4, 5] gets no block
    (3 uncached); [1, 2, 6] hits 1 and 2 (the cap is (12 - 1) // 4 = 2 blocks) and gets no
    block for 6 (1 more): 4 uncached in all, and its lease has 2 hit blocks, 8 hit tokens."""
    pool = PolicyBlockPool(3, LRU())
    pool.acquire(rb([1, 2]), 0.0)
    pool.access(rb([3, 4, 5], index=1), 1.0)
    assert pool.stats.uncached_blocks == 3
    lease = pool.access(rb([1, 2, 6], index=2), 2.0)
    assert (lease.hit_blocks, lease.hit_tokens, len(lease.blocks)) == (2, 2 * BS, 2)
    assert pool.stats.uncached_blocks == 4


# ---------------------------------------------------------------- fallback


def test_the_fallback_logs_what_the_policy_gave(caplog):
    """A policy whose victim() names nothing, and one whose victim() names a held block: both
    are served by the oldest free cached block, counted, and logged once with the policy's name
    and what it gave. Pool of 3 (2 usable): [1] cached and freed, [2] held (its block is the
    last one inserted); [3] needs a block."""

    class NoVictim(LRU):
        name = "no_victim"

        def victim(self):
            return None

    class PinnedVictim(LRU):
        name = "pinned_victim"

        def on_insert(self, b, now):
            self.last = b

        def victim(self):
            return self.last

    tail = "not a free cached block; taking the oldest free cached block instead"
    for cls, gave in [(NoVictim, "None"), (PinnedVictim, "a block with ref 1")]:
        caplog.clear()
        pool = PolicyBlockPool(3, cls())
        pool.access(rb([1]), 0.0)
        pool.acquire(rb([2], index=1), 1.0)
        with caplog.at_level(logging.ERROR, logger="skv.cache.free_order"):
            pool.access(rb([3], index=2), 2.0)
        assert [r.getMessage() for r in caplog.records] == [
            f"{cls.name}: victim() gave {gave}, {tail} (counted as fallbacks)"
        ]
        assert pool.order.fallbacks == 1 and sorted(pool.cached) == [2, 3]


# ---------------------------------------------------------------- the pool's interface


def test_the_smallest_pool_has_the_null_block_and_one_usable_block():
    """Capacity 2 works (block 1 serves every request: [1], then [2] evicts 1); 1 is refused."""
    pool = PolicyBlockPool(2, LRU())
    assert pool.usable_blocks == 1
    pool.access(rb([1]), 0.0)
    assert pool.access(rb([2], index=1), 1.0).blocks == [1]
    assert sorted(pool.cached) == [2] and pool.stats.evictions == 1
    with pytest.raises(ValueError) as err:
        PolicyBlockPool(1, LRU())
    assert str(err.value) == "vllm needs >= 2 blocks (one is the null block), got 1"


def test_the_pool_exposes_the_policy_that_orders_its_free_queue():
    """``pool.policy`` is what a replay asks for the policy's metrics and parameters."""
    pool = make_vllm_pool(8, "static_semantic")
    assert pool.policy is pool.order.policy and pool.policy.name == "static_semantic"


def test_a_pool_whose_requests_are_all_done_pins_nothing():
    """Pool of 16: three requests come and go; no block is referenced any more, the ones never
    used included, and the pool counts every usable block free."""
    pool = PolicyBlockPool(16, LRU())
    for t, keys in enumerate([[1, 2], [1, 2, 3], [7]]):
        pool.access(rb(keys, index=t), float(t))
    assert pool.ref == [0] * 16
    assert pool.pinned_blocks == 0 and all(b.ref == 0 for b in pool.order.blocks.values())


def test_holders_lists_the_blocks_of_a_key_cached_once_or_not_at_all():
    pool = PolicyBlockPool(8, LRU())
    lease = pool.access(rb([1, 2]), 0.0)
    assert pool.holders(2) == [lease.blocks[1]]
    assert pool.holders(9) == []


def test_the_pool_never_hits_a_prompts_last_token():
    """Block size 1: a 1-token prompt can hit nothing, a 2-token prompt at most 1 block; block
    size 4: a cached 8-token prompt hits 1 block, not 2."""
    pool = PolicyBlockPool(8, LRU())
    one, two = rb([7], block_size=1), rb([7, 8], block_size=1)
    pool.access(two, 0.0)
    assert pool.lookup(one) == 0 and pool.access(one, 1.0).hit_blocks == 0
    assert pool.lookup(two) == 1
    aligned = PolicyBlockPool(8, LRU())
    aligned.access(rb([1, 2]), 0.0)
    assert aligned.lookup(rb([1, 2])) == 1 and aligned.lookup(rb([1, 2, 3])) == 2


def test_the_pool_refuses_segment_keyed_requests_and_says_why():
    pool = PolicyBlockPool(8, LRU())
    with pytest.raises(ValueError) as err:
        pool.acquire(rb([1, 2], parents=[None, None], index=3), 0.0)
    assert str(err.value) == (
        "request #3: vllm models exact prefix caching; replay it with prefix keying "
        "(segment keying restarts chains, which vLLM cannot reuse)"
    )


def test_extend_leaves_the_blocks_before_start_alone():
    """Prompt [1, 2 (partial, 2 tokens)] in flight. Extending from block 2 (past the grown
    request [1, 2] whose block 2 is now full) decodes nothing: block 2 stays unhashed and
    nothing is taken; extending from block 1 hashes it in place, as vLLM's pool does."""
    pool = PolicyBlockPool(8, LRU())
    lease = pool.acquire(rb([1, 2], tokens=[BS, 2]), 0.0)
    pool.extend(lease, rb([1, 2]), 2, 1.0)
    assert len(lease.blocks) == 2 and pool.hash[lease.blocks[1]] is None
    assert sorted(pool.cached) == [1]
    pool.extend(lease, rb([1, 2]), 1, 2.0)
    assert pool.hash[lease.blocks[1]] == 2 and sorted(pool.cached) == [1, 2]


def test_replay_covers_exactly_start_to_stop_at_each_arrival_time():
    """Four one-block requests [1], [2], [3], [4] at t = 0..3: replay(trace) all 4,
    replay(trace, 1, 3) requests 1 and 2, replay(trace, 2) requests 2 and 3, each inserted at
    its arrival time."""
    trace = [rb([k + 1], index=k, arrival_s=float(k)) for k in range(4)]
    for args, keys in [((), [1, 2, 3, 4]), ((1, 3), [2, 3]), ((2,), [3, 4])]:
        pol = Recorder()
        pool = PolicyBlockPool(9, pol)
        pool.replay(trace, *args)
        assert (pool.stats.requests, sorted(pool.cached)) == (len(keys), keys), args
        inserted = [c for c in pol.calls if c[0] == "insert"]
        assert inserted == [("insert", k, float(k - 1)) for k in keys], args


def test_evicting_a_duplicate_that_is_not_the_oldest_keeps_the_oldest():
    """Pool of 5 (blocks 1-4). [1, 2] twice: the second hits 1 only (the cap is 1 block) and
    recomputes 2 into block 3, a second holder of hash 2 (block 2 is the oldest). [1, 2, 3]
    in flight hits 1 and 2 (blocks 1, 2) and takes block 4. [9] then evicts the only free
    cached block, 3: hash 2 keeps its oldest holder, block 2, alone."""
    pool = PolicyBlockPool(5, LRU())
    pool.access(rb([1, 2]), 0.0)
    pool.access(rb([1, 2], index=1), 1.0)
    assert pool.holders(2) == [2, 3]
    lease = pool.acquire(rb([1, 2, 3], index=2), 2.0)
    assert lease.blocks == [1, 2, 4]
    assert pool.access(rb([9], index=3), 3.0).blocks == [3]
    assert pool.holders(2) == [2] and pool.holders(9) == [3]
    assert pool.stats.evictions_by_reason == {"capacity": 1}
