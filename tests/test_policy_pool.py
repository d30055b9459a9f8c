"""vLLM's block pool with a policy-ordered free queue (skv.cache.policy_pool, skv.cache.free_order):
the simulator side of the vLLM eviction plugin. No engine needed."""

from __future__ import annotations

import pytest
from helpers import rb as make_rb

from skv.blocks import request_blocks
from skv.cache.policy_pool import PolicyBlockPool
from skv.cache.vllm_pool import VllmBlockPool
from skv.experiments.engine import (
    OUTPUT_ID_BASE,
    simulate_hits,
    synthetic_trace,
    with_output_blocks,
)
from skv.policies.lru import LRU
from skv.policies.registry import OFFLINE, POLICIES, make_cache, make_policy, make_vllm_pool
from skv.replay import compile_trace, replay_one

CFG = {
    "num_requests": 250,
    "num_docs": 24,
    "doc_blocks": [2, 8],
    "zipf_s": 1.1,
    "own_blocks": [1, 4],
    "block_size": 32,
    "num_gpu_blocks": 64,
    "max_output_tokens": 40,
    "types": "agent",
}


def trace(seed: int, **over):
    return synthetic_trace({**CFG, "seed": seed, **over})


def run(pool, tr, bs=32):
    """Per-request hits, acquiring, decoding the answer and releasing as the engine does."""
    hits, next_id = [], OUTPUT_ID_BASE
    for r, rb in zip(tr, compile_trace(tr, bs), strict=True):
        lease = pool.acquire(rb, rb.arrival_s)
        ext = with_output_blocks(r, bs, next_id)
        if ext is not None:
            next_id += len(ext.hash_ids)
            pool.extend(
                lease, request_blocks(ext, bs, "prefix"), r.prompt_tokens // bs, rb.arrival_s
            )
        pool.release(lease, rb.arrival_s)
        hits.append(lease.hit_tokens)
    return hits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lru_order_is_stock_vllm(seed):
    """With lru, the policy-ordered pool makes stock vLLM's choices: same hits per request,
    same evictions, same cached content at the end (decode and duplicates included)."""
    tr = trace(seed)
    stock, ours = make_cache("vllm", 64), make_cache("vllm", 64, {"eviction": "lru"})
    assert isinstance(ours, PolicyBlockPool)
    assert run(stock, tr) == run(ours, tr)
    assert stock.stats == ours.stats and stock.stats.evictions > 500
    assert set(stock.cached) == set(ours.cached)
    assert ours.pinned_blocks == 0 and len(ours.unhashed) + ours.free_cached == 63


def test_the_two_pools_count_alike_when_a_decode_finds_no_free_block():
    """Pool of 3 (2 usable): a 3-block prompt leaves one block uncached; then a request holds
    one block and decodes two more with nothing free. vLLM counts prompts only: 1 uncached,
    in both pools (the policy pool used to count the two output blocks too)."""
    stock, ours = VllmBlockPool(3), PolicyBlockPool(3, LRU())
    for pool in (stock, ours):
        pool.access(make_rb([3, 4, 5]), 0.0)
        pool.acquire(make_rb([9], index=1), 1.0)
        lease = pool.acquire(make_rb([1], index=2), 2.0)
        pool.extend(lease, make_rb([1, 2, 3], index=2), 1, 3.0)
    assert ours.stats == stock.stats and stock.stats.uncached_blocks == 1


def test_a_decoded_block_back_from_the_ghost_list_is_the_policys_not_a_reported_hit():
    """Pool of 5 (4 usable; a ghost list of 5 evictions), adaptive_semantic (learns from its
    ghost list): [1, 2] is cached, then evicted by [7, 8, 9, 10]; [1] comes back as a prompt
    (a reported ghost hit) and decodes into [1, 2] (a ghost hit the policy hears of, not
    reported: vLLM's pool reports prompt blocks only)."""
    pool = make_vllm_pool(5, "adaptive_semantic")
    pool.access(make_rb([1, 2]), 0.0)
    pool.access(make_rb([7, 8, 9, 10], index=1), 1.0)
    lease = pool.acquire(make_rb([1], index=2), 2.0)
    assert pool.stats.ghost_hits == pool.order.ghost_hits == 1
    pool.extend(lease, make_rb([1, 2], index=2), 1, 3.0)
    assert pool.stats.ghost_hits == 1 and pool.order.ghost_hits == 2


@pytest.mark.parametrize("policy", ["lru", "adaptive_semantic"])
def test_replay_runs_the_policy_ordered_pool(policy):
    """``replay_one`` reads the cache's ghost list; the policy pool's is its free order's
    (replaying it used to raise AttributeError). With lru it replays as stock vLLM does."""
    tr = compile_trace(trace(3), 32)
    stock = replay_one(tr, "vllm", 40, progress=False)
    ours = replay_one(tr, "vllm", 40, params={"eviction": policy}, progress=False)
    assert ours["requests"] == stock["requests"] == len(tr)
    if policy == "lru":
        drop = {"replay_seconds", "policy", "params"}
        assert {k: v for k, v in ours.items() if k not in drop} == {
            k: v for k, v in stock.items() if k not in drop
        }
        assert ours["ghost_hits"] is None  # lru keeps no ghost list
    else:
        assert isinstance(ours["ghost_hits"], int)


def test_duplicates_are_kept_and_the_oldest_is_looked_up():
    """A recomputed block whose hash is still cached becomes a second holder, as in vLLM: here
    static_semantic evicts a chain's head (a user query, weight 1) before its child (a system
    prompt, weight 8), so the next request with that prefix misses at the head, recomputes the
    child, and the child's hash then has two blocks; lookups use the oldest."""
    from skv.model import Request, Segment, SemanticType

    uq, sy = SemanticType.USER_QUERY, SemanticType.SYSTEM

    def req(i, t, segs, ids):
        return Request(
            f"r{i}", t, [Segment(k, n) for k, n in segs], hash_ids=ids, hash_block_size=32
        )

    tr = [
        req(0, 0.0, [(uq, 32), (sy, 32), (uq, 5)], [1, 2, 3]),
        req(1, 1.0, [(uq, 69)], [10, 11, 12]),
        req(2, 2.0, [(uq, 37)], [20, 21]),  # evicts block 1's head (lowest key)
        req(3, 3.0, [(uq, 32), (sy, 32), (uq, 5)], [1, 2, 30]),  # head missed: 2 recomputed
        req(4, 4.0, [(uq, 32), (sy, 32), (uq, 5)], [1, 2, 40]),
    ]
    pool = make_vllm_pool(6, "static_semantic", {"half_life_s": 1.0})
    rbs = compile_trace(tr, 32)
    hits = [pool.access(rb, rb.arrival_s).hit_tokens for rb in rbs[:4]]
    assert hits == [0, 0, 0, 0]
    key_b = rbs[0].keys[1]
    assert len(pool.holders(key_b)) == 2
    first, copies = pool.cached[key_b], list(pool._copies[key_b])
    assert len(copies) == 1 and first != copies[0]
    lease = pool.acquire(rbs[4], 4.0)
    assert lease.hit_tokens == 64 and lease.blocks[1] == first  # the oldest holder
    pool.release(lease, 4.0)
    pool._drop_hash(first)  # evicting the oldest promotes the copy
    assert pool.cached[key_b] == copies[0] and key_b not in pool._copies


def test_semantic_policy_changes_the_choices():
    """Not a relabelled LRU: on the typed workload static_semantic keeps the shared system
    prompts and tool schemas, and hits more."""
    tr = trace(0)
    lru = sum(run(make_cache("vllm", 64, {"eviction": "lru"}), tr))
    sem = sum(run(make_cache("vllm", 64, {"eviction": "static_semantic"}), tr))
    assert sem > lru * 1.05


@pytest.mark.parametrize("policy", ["static_semantic", "gdsf", "lfu"])
def test_victim_is_the_policys_minimum_over_free_cached_blocks(policy):
    """Brute force: at every eviction, the victim has the smallest (key, release order) among
    ALL free cached blocks: the lazy heap never returns a stale or pinned block."""
    pool = make_vllm_pool(48, policy)
    order = pool.order
    real_evict = order.evict
    checked = 0

    def evict(now):
        nonlocal checked
        free = [b for b in order.blocks.values() if b.ref == 0]
        best = min((b.pk1, b.pk2, b.pseq) for b in free)
        bid = real_evict(now)
        b = order.last_evicted
        assert b.ref == 0 and (b.pk1, b.pk2, b.pseq) == best
        assert bid not in order.blocks and pool.hash[bid] is not None
        checked += 1
        return bid

    order.evict = evict
    run(pool, trace(4))
    assert checked > 300


def test_refcounts_mirror_the_pool():
    """Invariant: a cached block's Block.ref equals the pool's count of its holders, and the
    policy knows exactly the hashed blocks."""
    pool = make_vllm_pool(64, "saecache")
    tr = trace(5, num_requests=120)
    leases = []
    for rb in compile_trace(tr, 32):
        leases.append(pool.acquire(rb, rb.arrival_s))
        if len(leases) > 3:  # a few requests in flight at once: shared hits
            pool.release(leases.pop(0), rb.arrival_s)
        hashed = {i for i, h in enumerate(pool.hash) if h is not None}
        assert set(pool.order.blocks) == hashed
        for bid, b in pool.order.blocks.items():
            assert b.ref == pool.ref[bid]


def test_simulate_hits_with_eviction_matches_the_pool():
    tr = trace(6, num_requests=80)
    assert simulate_hits(tr, 32, 64, eviction="lru") == simulate_hits(tr, 32, 64)


def test_registry_refuses_what_cannot_order_vllms_queue():
    with pytest.raises(ValueError, match="cannot order vLLM's free queue"):
        make_policy("belady")
    with pytest.raises(ValueError, match="cannot order vLLM's free queue"):
        make_cache("vllm", 16, {"eviction": "vllm"})
    with pytest.raises(ValueError, match="unknown policy"):
        make_cache("vllm", 16, {"eviction": "nope"})
    with pytest.raises(ValueError, match="eviction_params without eviction"):
        make_cache("vllm", 16, {"eviction_params": {"half_life_s": 3}})
    with pytest.raises(ValueError, match="only eviction and eviction_params"):
        make_cache("vllm", 16, {"capacity": 3})
    with pytest.raises(ValueError, match="bad parameters"):
        make_cache("vllm", 16, {"eviction": "static_semantic", "eviction_params": {"x": 1}})
    with pytest.raises(ValueError, match="null block"):
        make_vllm_pool(1, "lru")


def test_segment_keyed_requests_are_refused():
    from skv.model import Request, Segment, SemanticType

    r = Request(
        "a",
        0.0,
        [Segment(SemanticType.SYSTEM, 64, "aa"), Segment(SemanticType.RETRIEVED_CONTEXT, 64, "bb")],
    )
    rb = request_blocks(r, 32, "segment")
    with pytest.raises(ValueError, match="prefix keying"):
        make_vllm_pool(16, "lru").acquire(rb, 0.0)


ONLINE = [p for p in POLICIES if p != "vllm" and p not in OFFLINE]


@pytest.mark.parametrize("policy", ONLINE)
def test_every_online_policy_survives_duplicate_blocks(policy):
    """vLLM keeps several blocks per hash: a block-aligned prompt sent three times recomputes
    its last block (hits stop at prompt_len - 1) and caches a copy each time; every policy
    must keep ordering all copies (slru once indexed by key and lost them), with no fallback."""
    from skv.model import Request, Segment, SemanticType

    def req(i, ids, tokens):
        segs = [Segment(SemanticType.SYSTEM, tokens)]
        return Request(f"r{i}", float(i), segs, hash_ids=ids, hash_block_size=32)

    tr = [req(i, [1, 2], 64) for i in range(3)] + [req(3, [7, 8, 9, 10, 11], 160)]
    tr += [req(4 + i, [20 + i, 30 + i], 50) for i in range(6)]
    pool = make_vllm_pool(6, policy)
    for rb in compile_trace(tr, 32):
        pool.release(pool.acquire(rb, rb.arrival_s), rb.arrival_s)
    assert pool.order.fallbacks == 0 and pool.stats.evictions > 0
    assert set(pool.order.blocks) == {i for i, h in enumerate(pool.hash) if h is not None}


def test_a_policy_that_names_no_victim_does_not_stop_the_pool(caplog):
    """A policy bug must not kill a serving engine: the oldest free cached block is taken,
    counted and logged once."""
    from skv.policies.lru import LRU

    class NoVictim(LRU):
        def victim(self):
            return None

    pool = PolicyBlockPool(8, NoVictim())
    with caplog.at_level("ERROR", logger="skv.cache.free_order"):
        run(pool, trace(7, num_requests=30))
    assert pool.order.fallbacks > 0 and pool.stats.evictions == pool.order.fallbacks
    assert sum("victim() gave None" in r.message for r in caplog.records) == 1


def test_ghost_hits_count_only_a_keys_last_copy():
    """A key becomes a ghost when its last holder is evicted, not when one of several copies
    goes (adaptive_semantic learns from ghost hits)."""
    pool = make_vllm_pool(64, "adaptive_semantic")
    run(pool, trace(8))
    order = pool.order
    assert pool.stats.ghost_hits == order.ghost_hits > 0
    held = {}
    for b in order.blocks.values():
        held[b.key] = held.get(b.key, 0) + 1
    assert held == order._holders


@pytest.mark.parametrize("pool_kind", ["plugin", "radix"])
def test_growing_a_request_by_its_answer_is_an_extend_not_a_request(pool_kind):
    """A policy is told about a request once (``on_request``); the simulator caching its
    answer is ``on_extend`` for the same request, before the answer's inserts. (saecache
    learns one sample per request: an answer taken for a request was a false sample.)"""
    from skv.cache.radix import BlockCache
    from skv.model import Request, Segment, SemanticType, content_hash
    from skv.policies.lru import LRU

    calls = []

    class Recording(LRU):
        def on_request(self, rb, now):
            calls.append(("request", rb.index))

        def on_extend(self, rb, now):
            calls.append(("extend", rb.index))

        def on_insert(self, b, now):
            calls.append(("insert", b.key))
            super().on_insert(b, now)

    bs = 4
    prompt = Segment(SemanticType.USER_QUERY, 2 * bs, content_hash("p"))
    answer = Segment(SemanticType.OUTPUT, bs, content_hash("a"))
    rb = request_blocks(Request("r", 0.0, [prompt]), bs, "prefix", index=3)
    grown = request_blocks(Request("r", 0.0, [prompt, answer]), bs, "prefix", index=3)
    pool = PolicyBlockPool(8, Recording()) if pool_kind == "plugin" else BlockCache(8, Recording())
    lease = pool.acquire(rb, 0.0)
    pool.extend(lease, grown, 2, 1.0)
    assert calls == [
        ("request", 3),
        ("insert", rb.keys[0]),
        ("insert", rb.keys[1]),
        ("extend", 3),
        ("insert", grown.keys[2]),
    ]
