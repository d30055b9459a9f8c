"""``lhd`` (Least Hit Density, NSDI'18): the density model on hand-made histograms, the victims
on tiny traces worked out by hand, leaf-only eviction, seeded determinism, and the scan-resistant
case where it beats LRU."""

from __future__ import annotations

import random

import pytest
from helpers import check_tree, rb

from skv.cache.block import Block
from skv.model import TYPE_INDEX, SemanticType
from skv.policies.lhd import LHD, _rebin, hit_density, prior_density
from skv.policies.registry import make_cache, make_vllm_pool

ST = SemanticType
S1 = 1  # a SYSTEM block reused every few accesses
#: a hand-checkable setting: ages in plain accesses (shift 0 while <= 16 blocks are cached)
SMALL = {"features": "stype", "max_age": 16, "coarsening_tolerance": 1.0}


def one(key: int, i: int, stype: SemanticType = ST.UNKNOWN, session: str | None = None):
    return rb([key], stypes=[stype], index=i, arrival_s=float(i), session=session)


def play(cache, accesses: list[tuple[int, SemanticType]], start: int = 0) -> None:
    for i, (key, st) in enumerate(accesses, start):
        cache.access(one(key, i, st), float(i))


def evicted(cache) -> list[int]:
    return [key for _, key, _, _ in cache.eviction_log]


# ---------------------------------------------------------------- (1) the density model


def test_hit_density_is_expected_hits_over_expected_remaining_lifetime():
    """Three blocks reach age 0: two are hit at age 1 (lifetime 2 buckets each), one is evicted
    at age 2 (lifetime 3): 2 hits / 7 buckets at age 0; at age 1, 2 hits / (1 + 1 + 2) = 1/2;
    at age 2 only the eviction is left: 0; the last bucket is the overflow bucket: 0."""
    assert hit_density([0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]) == pytest.approx(
        [2 / 7, 1 / 2, 0.0, 0.0]
    )
    # hits at age 3 only: H = 1.8 up to age 3, lifetimes 4, 3, 2, 1 buckets of 1.8 each
    hits = [0.0, 0.0, 0.0, 1.8, 0.0, 0.0]
    assert hit_density(hits, [0.0] * 6) == pytest.approx([0.25, 1 / 3, 0.5, 1.0, 0.0, 0.0])
    # nothing ever seen that old (E <= 1e-5): density 0, not a division by zero
    assert hit_density([0.0] * 4, [1.0, 0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0, 0.0]


def test_events_in_the_overflow_bucket_still_count_as_lifetime():
    """Hits [0, 0, 1], evictions [1, 0, 0]: one block evicted at age 0 (lifetime 1 bucket), one
    hit in the overflow bucket, age 2 (lifetime 3): 1 hit / 4 buckets at age 0; at age 1 only
    the hit one is left, 2 buckets to go: 1/2."""
    assert hit_density([0.0, 0.0, 1.0], [1.0, 0.0, 0.0]) == pytest.approx([0.25, 0.5, 0.0])


def test_prior_is_older_lower_and_more_hits_higher():
    assert prior_density(0, 4) == pytest.approx([1.0, 0.5, 1 / 3, 0.0])
    assert prior_density(2, 3) == pytest.approx([3.0, 1.5, 0.0])


def test_rebinning_merges_or_spreads_buckets_and_keeps_the_overflow():
    assert _rebin([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0], 1) == [
        3.0,
        7.0,
        11.0,
        7.0,
        0.0,
        0.0,
        0.0,
        100.0,
    ]
    assert _rebin([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 100.0], -1) == [
        0.5,
        0.5,
        1.0,
        1.0,
        1.5,
        1.5,
        2.0,
        102.0,  # bucket 3's second half lands past the last bucket: overflow
    ]


# ---------------------------------------------------------------- (2) victims by hand

# S1 is hit at age 3 twice while USER blocks are evicted at age 3 (the prior evicts the oldest);
# the 9th access reconfigures. Ages count the accesses since a block's release (S1 released at
# 1, hit at access 4: age 3).
LEARN = [(S1, ST.SYSTEM)] + [(101 + i, ST.USER_QUERY) for i in range(3)]
LEARN += [(S1, ST.SYSTEM)] + [(104 + i, ST.USER_QUERY) for i in range(3)] + [(S1, ST.SYSTEM)]
AFTER = [(107 + i, ST.USER_QUERY) for i in range(4)] + [(S1, ST.SYSTEM)]


def _learned(seed: int = 0, policy: str = "lhd", **over):
    params = {**SMALL, "reconfigure_interval": 9, "seed": seed, **over}
    cache = make_cache(policy, 4, params if policy == "lhd" else None, record_evictions=True)
    play(cache, LEARN)
    return cache


def test_prior_then_learned_densities_worked_by_hand():
    cache = _learned()
    p = cache.policy
    # prior phase: 1/(1 + age), oldest first: U101, U102, U103 go, each at age 3
    assert evicted(cache) == [101, 102, 103]
    assert p.metrics()["reconfigurations"] == 1.0 and p.metrics()["age_shift"] == 0.0
    sys_cl = cache.blocks[S1].pdata
    user_cl = cache.blocks[104].pdata
    # histograms after one EWMA decay: S1's two hits at age 3 (1.8), three evictions (2.7)
    assert sys_cl.hits[3] == pytest.approx(1.8) and sum(sys_cl.hits) == pytest.approx(1.8)
    assert user_cl.evictions[3] == pytest.approx(2.7) and sum(user_cl.hits) == 0.0
    assert sys_cl.density[:5] == pytest.approx([0.25, 1 / 3, 0.5, 1.0, 0.0])
    assert user_cl.density == [0.0] * 16
    # clock 9: S1 released at 9 (age 0), U104..U106 released at 6, 7, 8
    assert [p.density(cache.blocks[k]) for k in (S1, 104, 105, 106)] == pytest.approx(
        [0.25, 0.0, 0.0, 0.0]
    )
    # a class first met after the reconfiguration has seen nothing: density 0 until the next
    cache.access(one(50, 9, ST.TOOL_OUTPUT), 9.0)
    assert cache.blocks[50].pdata.density == [0.0] * 16


def test_learned_class_hit_young_is_kept_over_a_class_never_hit():
    """After learning, S1 (density 1.0 at age 3) outlives U107 although S1 is the block released
    longest ago (lru evicts it); equal densities (0) go to the oldest release; S1 then hits."""
    cache = _learned()
    play(cache, AFTER, start=len(LEARN))
    assert evicted(cache) == [101, 102, 103, 104, 105, 106, 107]
    assert S1 in cache.blocks and cache.stats.hit_blocks == 3  # hits at access 4, 8, 13

    lru = _learned(policy="lru")
    play(lru, AFTER, start=len(LEARN))
    assert evicted(lru)[:7] == [101, 102, 103, 104, 105, 106, S1]
    assert lru.stats.hit_blocks == 2


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
@pytest.mark.parametrize("associativity", [4, 64])
def test_with_associativity_over_the_evictable_blocks_the_victim_is_the_argmin(seed, associativity):
    """Every evictable block (at most 4 here) is examined: the seed changes nothing."""
    cache = _learned(seed, associativity=associativity)
    play(cache, AFTER, start=len(LEARN))
    assert evicted(cache) == [101, 102, 103, 104, 105, 106, 107]


def test_a_hit_is_recorded_in_the_class_the_block_had():
    """Classes by hits: S1's hit at age 2 belongs to class 'never hit' (its lifetime ran there);
    afterwards S1 is in class 'hit once', which has recorded nothing yet."""
    cache = make_cache("lhd", 8, {**SMALL, "features": "hits"})
    play(cache, [(S1, ST.SYSTEM), (2, ST.SYSTEM), (3, ST.SYSTEM), (S1, ST.SYSTEM)])
    p = cache.policy
    never, once = p._classes[0], p._classes[1]
    assert cache.blocks[S1].pdata is once
    assert never.hits[2] == 1.0 and sum(never.hits) == 1.0
    assert sum(once.hits) == 0.0


def test_reuse_classes_bucket_the_last_two_hit_ages_as_the_reference():
    """max_age 16: about log2(16 / (last two hit ages)), capped at hit_classes - 1 = 15."""
    p = LHD(features="reuse", max_age=16)
    assert [p._reuse_class(x) for x in (16.0, 40.0, 8.0, 5.0, 1.0, 0.0)] == [0, 0, 1, 2, 4, 15]
    cache = make_cache("lhd", 8, {**SMALL, "features": "reuse"})
    play(cache, [(S1, ST.UNKNOWN), (2, ST.UNKNOWN), (3, ST.UNKNOWN), (S1, ST.UNKNOWN)])
    assert cache.blocks[2].pdata is cache.policy._classes[0]  # never hit: 0 + max_age
    assert cache.blocks[S1].pdata is cache.policy._classes[3]  # hit at age 2: log2(16 / 2)
    play(cache, [(S1, ST.UNKNOWN)], start=4)  # hit at age 0: 2 + 0 -> still 3
    assert cache.blocks[S1].pdata is cache.policy._classes[3]
    play(cache, [(S1, ST.UNKNOWN)], start=5)  # 0 + 0 -> the top bucket
    assert cache.blocks[S1].pdata is cache.policy._classes[15]


# ---------------------------------------------------------------- (3) only unpinned leaves


def test_only_the_unpinned_leaf_is_taken_and_none_when_all_are_pinned():
    cache = make_cache("lhd", 4, SMALL, record_evictions=True)
    lease = cache.acquire(rb([1, 2, 3], index=0), 0.0)  # a held chain
    cache.access(one(4, 1), 1.0)
    cache.access(one(5, 2), 2.0)  # full: only block 4 is evictable
    assert evicted(cache) == [4]
    cache.access(one(6, 3), 3.0)  # 1, 2, 3 pinned, 5 is the leaf
    assert evicted(cache) == [4, 5]
    lease2 = cache.acquire(one(7, 4), 4.0)
    held = cache.acquire(one(8, 5), 5.0)  # all four pinned: computed, not cached
    assert cache.stats.uncached_blocks == 1 and 8 not in cache.blocks
    assert evicted(cache) == [4, 5, 6]  # 7 took 6's place
    for x in (lease, lease2, held):
        cache.release(x, 6.0)
    cache.access(rb([1, 9], index=6), 7.0)  # 1 hit, 9 new: the victim must be a leaf
    assert evicted(cache)[:3] == [4, 5, 6] and evicted(cache)[3] in {3, 7}
    check_tree(cache)


def test_a_block_pinned_behind_the_policys_back_is_never_returned():
    """victim() checks what it returns: a block whose pin the policy was not told of is dropped
    from its array, not evicted."""
    p = LHD(**SMALL)
    a = Block(1, None, 4, 0, 0, None, 0.0)
    b = Block(2, None, 4, 0, 0, None, 0.0)
    for x in (a, b):
        x.ref = 1
        p.on_insert(x, 0.0)
        x.ref = 0
        p.on_unpin(x, 0.0)
    a.ref = 1  # a is older or equal: the argmin, but pinned
    assert p.victim() is b
    assert p.victim() is None
    assert p.metrics()["evictable"] == 0.0
    a.ref = 0
    p.on_unpin(a, 0.0)
    p.on_evict(a, 0.0)  # evicted without victim() naming it (a pool's fallback): dropped too
    assert p.metrics()["evictable"] == 0.0 and p.victim() is None


def test_the_overflow_bucket_goes_first_even_an_explorer():
    """max_age 4: ages >= 3 are the overflow bucket (density -inf, as the reference). Block 1
    (released at 1) is age 4 at clock 5; even with an explorer's +1 it goes before block 2
    (age 1, prior 1/2). A hit older than the last bucket is recorded in the last bucket."""
    cache = make_cache(
        "lhd",
        3,
        {"features": "", "max_age": 4, "coarsening_tolerance": 1.0, "explore_fraction": 0.0},
        record_evictions=True,
    )
    play(cache, [(1, ST.UNKNOWN), (2, ST.UNKNOWN), (3, ST.UNKNOWN), (2, ST.UNKNOWN)])
    play(cache, [(3, ST.UNKNOWN)], start=4)
    p = cache.policy
    cache.blocks[1].pk2 = 1.0  # an explorer
    assert p.density(cache.blocks[1]) == float("-inf")
    assert p.density(cache.blocks[2]) == pytest.approx(0.5)
    play(cache, [(4, ST.UNKNOWN)], start=5)
    assert evicted(cache) == [1]
    play(cache, [(4, ST.UNKNOWN), (4, ST.UNKNOWN), (2, ST.UNKNOWN)], start=6)  # 2: age 4
    assert p._active[0].hits == [2.0, 2.0, 0.0, 1.0]  # 4 twice at 0; 2, 3 at 1; 2 at 4 -> 3


def _tree_trace(seed: int, n: int = 400) -> list:
    """Prefix chains over a small tree of shared prefixes, random types per block."""
    rng = random.Random(seed)
    kinds = [ST.SYSTEM, ST.USER_QUERY, ST.TOOL_OUTPUT, ST.OUTPUT]
    out = []
    for i in range(n):
        keys, prefix = [], 0
        for d in range(rng.randint(1, 6)):
            prefix = prefix * 7 + rng.choice((1, 1, 2, 3, 4, 5)) + d * 1000
            keys.append(prefix)
        stypes = [kinds[k % 4] for k in keys]
        out.append(rb(keys, stypes=stypes, index=i, arrival_s=float(i)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_array_holds_exactly_the_unpinned_leaves_under_overlapping_leases(seed):
    """Up to 4 requests in flight on shared chains, learning on, few samples: after every
    step the policy's candidates are exactly the cache's unpinned leaves, and every victim was
    one."""
    cache = make_cache(
        "lhd",
        12,
        {"associativity": 3, "reconfigure_interval": 50, "seed": seed},
        record_evictions=True,
    )
    p = cache.policy
    victims = []
    real_victim = p.victim

    def checked():
        b = real_victim()
        assert b is None or (b.ref == 0 and b.n_children == 0), f"victim {b} is not evictable"
        victims.append(b)
        return b

    p.victim = checked
    rng = random.Random(seed)
    in_flight = []
    for r in _tree_trace(seed):
        in_flight.append(cache.acquire(r, r.arrival_s))
        while len(in_flight) > 3 or (in_flight and rng.random() < 0.4):
            cache.release(in_flight.pop(rng.randrange(len(in_flight))), r.arrival_s)
        leaves = {id(b) for b in cache.blocks.values() if b.ref == 0 and b.n_children == 0}
        assert {id(b) for b in p._leaves} == leaves
        assert all(p._leaves[i].version == i + 1 for i in range(len(p._leaves)))
        assert_leaf_copies_exact(p)
        check_tree(cache)
    assert len(victims) > 100 and p.metrics()["reconfigurations"] >= 10


def assert_leaf_copies_exact(p: LHD) -> None:
    """victim() reads the evictable blocks' last touch, class and bonus from compact copies:
    each must equal its block's."""
    for i, b in enumerate(p._leaves):
        got = (p._leaf_t[i], p._leaf_c[i], p._leaf_x[i])
        assert got == (b.pseq, b.pdata.cid, b.pk2), f"leaf {i}: copy {got} of {b}"


@pytest.mark.parametrize("pool", ["radix", "vllm"])
def test_the_leaf_copies_stay_exact_past_the_arrays_growth(pool):
    """Hundreds of evictable blocks (the arrays start at 64 and double), explorers and
    reconfigurations on: after every request the copies equal the blocks, in the prefix tree
    and in vLLM's flat pool."""
    params = {"associativity": 8, "reconfigure_interval": 200, "seed": 5}
    trace = _tree_trace(7, 1500)
    cache = (
        make_cache("lhd", 400, params) if pool == "radix" else make_vllm_pool(400, "lhd", params)
    )
    p = cache.policy
    explorer_seen = False  # an evictable explorer, whose bonus must be in its copy
    for r in trace:
        cache.release(cache.acquire(r, r.arrival_s), r.arrival_s)
        assert_leaf_copies_exact(p)
        explorer_seen |= any(b.pk2 for b in p._leaves)
    if pool == "vllm":
        assert cache.order.fallbacks == 0
    assert len(p._leaf_t) > 64 and len(p._leaves) > 64
    assert p.metrics()["reconfigurations"] >= 5 and explorer_seen


# ---------------------------------------------------------------- (4) seeded determinism


def _sampled_run(seed: int) -> list[int]:
    trace = _tree_trace(3, 600)
    cache = make_cache(
        "lhd",
        20,
        {"associativity": 2, "reconfigure_interval": 100, "seed": seed},
        record_evictions=True,
    )
    for r in trace:
        cache.access(r, r.arrival_s)
    return evicted(cache)


def test_same_seed_same_evictions_and_another_seed_differs():
    a, b, c = _sampled_run(0), _sampled_run(0), _sampled_run(1)
    assert len(a) > 300
    assert a == b
    assert a != c


# ---------------------------------------------------------------- (5) scan + working set


def _scan_mix(n: int = 20000, working_set: int = 100, seed: int = 1) -> list[int]:
    """Half the accesses go to a working set of 100 keys (uniformly), half to new keys never
    used again (a scan)."""
    rng = random.Random(seed)
    keys, fresh = [], 10**6
    for _ in range(n):
        if rng.random() < 0.5:
            keys.append(rng.randrange(working_set))
        else:
            keys.append(fresh)
            fresh += 1
    return keys


def _hit_rate(policy: str, keys: list[int], cap: int, params: dict | None = None) -> float:
    cache = make_cache(policy, cap, params)
    for i, k in enumerate(keys):
        cache.access(one(k, i), float(i))
    return cache.stats.block_hit_rate


def test_lhd_beats_lru_on_a_scan_mixed_into_a_working_set():
    """Capacity 120 for a working set of 100 with one scan block per reuse: lru keeps every scan
    block ~120 accesses and loses working-set blocks (0.249); lhd learns that never-hit blocks
    are rarely hit and hit ones are, and keeps the working set (0.327; 0.50 is the ceiling).
    Classes by hits so far, the feature this lesson needs (the default's reuse classes, from
    the last two hit ages, separate the two kinds only once blocks have been hit twice)."""
    keys = _scan_mix()
    lru = _hit_rate("lru", keys, 120)
    lhd = _hit_rate("lhd", keys, 120, {"reconfigure_interval": 1000, "features": "hits+stype"})
    assert lru == pytest.approx(0.2492, abs=0.002)
    assert lhd - lru >= 0.05, (lhd, lru)


# ---------------------------------------------------------------- parameters, metrics, pools


def test_params_are_the_documented_defaults_and_normalised():
    assert make_cache("lhd", 4).policy.params() == {
        "associativity": 64,
        "reconfigure_interval": 16384,
        "max_age": 1024,
        "coarsening_tolerance": 0.01,
        "ewma_decay": 0.9,
        "hit_classes": 16,
        "features": "reuse+stype",
        "explore_fraction": 0.01,
        "explore_inverse_probability": 32,
        "seed": 0,
    }
    p = LHD(features="session + hits", associativity=8.0, ewma_decay=1)
    assert p.params()["features"] == "hits+session"
    assert p.params()["associativity"] == 8 and p.params()["ewma_decay"] == 1.0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"associativity": 0}, "associativity must be >= 1"),
        ({"reconfigure_interval": 0}, "reconfigure_interval must be >= 1"),
        ({"max_age": 1}, "max_age must be >= 2"),
        ({"coarsening_tolerance": 0}, "coarsening_tolerance must be > 0"),
        ({"ewma_decay": 1.5}, r"ewma_decay must be in \[0, 1\]"),
        ({"hit_classes": 0}, "hit_classes must be >= 1"),
        ({"features": "hits+size"}, "features must be"),
        ({"features": "hits+hits"}, "features must be"),
        ({"explore_fraction": -0.1}, r"explore_fraction must be in \[0, 1\]"),
        ({"explore_inverse_probability": 0}, "explore_inverse_probability must be >= 1"),
    ],
)
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        make_cache("lhd", 4, params)


def test_the_coarsening_shift_makes_max_age_span_the_cached_blocks_over_the_tolerance():
    """4 cached blocks, 16 buckets, tolerance 0.01: a bucket should be 4 / 0.16 = 25 accesses
    wide, so shift 5 (32); with tolerance 1, 0.25 -> shift 0."""
    for tol, shift in ((0.01, 5.0), (1.0, 0.0)):
        cache = make_cache(
            "lhd", 4, {"max_age": 16, "coarsening_tolerance": tol, "reconfigure_interval": 6}
        )
        play(cache, [(k, ST.UNKNOWN) for k in range(6)])
        p = cache.policy
        assert p.metrics()["age_shift"] == shift
        ev = p._active[0].evictions  # keys 0 and 1 evicted at age 3, decayed to 0.9 each
        if shift:  # rebinned: ages 0..31 are now bucket 0
            assert ev[0] == pytest.approx(1.8) and sum(ev) == pytest.approx(1.8)
        else:
            assert ev[3] == pytest.approx(1.8) and sum(ev) == pytest.approx(1.8)


def test_explorers_stay_within_their_budget_and_get_a_density_bonus():
    none = make_cache("lhd", 200, {"explore_fraction": 0.0})
    play(none, [(k, ST.UNKNOWN) for k in range(300)])
    assert none.policy.metrics()["explorers"] == 0.0
    every = make_cache("lhd", 50, {"explore_inverse_probability": 1, "explore_fraction": 1.0})
    play(every, [(k, ST.UNKNOWN) for k in range(3)])
    p = every.policy
    assert p.metrics()["explorers"] == 3.0
    assert p.density(every.blocks[2]) == pytest.approx(1.0 + 1.0)  # prior at age 0, plus 1
    some = make_cache("lhd", 300, {"reconfigure_interval": 100})
    play(some, [(k % 350, ST.UNKNOWN) for k in range(3000)])
    n = some.policy.metrics()["explorers"]
    assert 0 < n <= 0.01 * len(some)
    assert n == sum(1 for b in some.blocks.values() if b.pk2 == 1.0)


def test_an_explorer_outlives_an_older_plain_block():
    """Budget floor(0.5 x cached): block 2 is the only explorer among 1, 2, 3 (then 4, 5 are
    not: 2 <= 1.5 fails). Inserting 4 evicts 1 (age 2: 1/3, the lowest); inserting 5 at clock
    4: block 2 (age 2, 1/3 + 1) outlives block 3 (age 1, 1/2), which lru would keep."""
    params = {"features": "", "explore_inverse_probability": 1, "explore_fraction": 0.5}
    cache = make_cache("lhd", 3, {**SMALL, **params}, record_evictions=True)
    play(cache, [(k, ST.UNKNOWN) for k in (1, 2, 3, 4, 5)])
    assert evicted(cache) == [1, 3]
    assert [cache.blocks[k].pk2 for k in (2, 4, 5)] == [1.0, 0.0, 0.0]
    # the status lasts until the block's next access, which may grant it again (not here)
    cache.policy.explore_inverse_probability = 10**9
    play(cache, [(2, ST.UNKNOWN)], start=5)
    assert cache.blocks[2].pk2 == 0.0 and cache.policy.metrics()["explorers"] == 0.0


def test_sessions_are_a_class_and_missing_metadata_degrades_to_one_class():
    cache = make_cache("lhd", 8, {**SMALL, "features": "session"})
    cache.access(one(1, 0, session="s"), 0.0)
    cache.access(one(2, 1), 1.0)
    assert cache.blocks[1].pdata is not cache.blocks[2].pdata
    p = LHD(features="session")
    b = Block(3, None, 4, TYPE_INDEX[ST.UNKNOWN], 0, None, 0.0)  # no request at all
    b.ref = 1
    p.on_insert(b, 0.0)
    assert b.pdata is p._classes[0]


def test_orders_vllms_free_queue_with_no_fallback():
    pool = make_vllm_pool(16, "lhd", {"reconfigure_interval": 40})
    for i in range(200):
        r = rb([i % 23, 1000 + i], index=i, arrival_s=float(i), block_size=4)
        pool.release(pool.acquire(r, r.arrival_s), r.arrival_s)
    assert pool.order.fallbacks == 0 and pool.stats.evictions > 50
    assert pool.policy.metrics()["reconfigurations"] >= 5
