"""``arc`` and ``sieve``: hand-computed traces (flat: one single-block request per access, where
they must be the classic algorithms), leaf-only behaviour on small trees, and ARC's bounds under
pinning. Their equality with libCacheSim on longer flat traces: tests/test_libcachesim.py."""

from __future__ import annotations

import pytest
from helpers import check_tree
from helpers import rb as chain_request
from test_policies import _leased_replay, cached, one, play

from skv.policies.registry import make_cache

# --- arc --------------------------------------------------------------------------------------

# c = 3. Each row: key, hit?, then T1, T2, B1, B2 (LRU first) and p after the access, worked out
# by hand from Fig. 4 of the ARC paper (a ghost hit is a miss).
ARC_TRACE = [
    ("a", False, "a", "", "", "", 0),
    ("a", True, "", "a", "", "", 0),  # case I: T1 -> T2
    ("b", False, "b", "a", "", "", 0),
    ("b", True, "", "ab", "", "", 0),
    ("c", False, "c", "ab", "", "", 0),  # full
    ("d", False, "d", "ab", "c", "", 0),  # IV.B: |T1| = 1 > p = 0, c -> B1
    ("e", False, "e", "ab", "cd", "", 0),
    ("c", False, "e", "bc", "d", "a", 1),  # II: p += max(0/2, 1); |T1| = p, not B2: T2's a -> B2
    ("d", False, "e", "cd", "", "ab", 2),  # II: p += max(1/1, 1); |T1| < p: T2's b -> B2
    ("a", False, "", "cda", "e", "b", 1),  # III: p -= 1 -> |T1| == p and a in B2: T1's e goes
    ("e", False, "", "dae", "", "bc", 2),  # II: p += max(1/1, 1); T1 empty: T2's c -> B2
    ("f", False, "f", "ae", "", "bcd", 2),  # IV.B: 5 < 2c keys: no trim; T2's d -> B2
    ("g", False, "fg", "e", "", "cda", 2),  # IV.B: 6 = 2c keys: B2's b dropped; T2's a -> B2
    ("d", False, "g", "ed", "f", "ca", 1),  # III: p -= max(0/3, 1); |T1| = 2 > 1: f -> B1
    ("f", False, "g", "df", "", "cae", 3),  # II: p += max(2/1, 1) = 2 (capped at c = 3)
]


def _lists(cache) -> tuple[str, str, str, str]:
    got = cache.policy.lists()
    return tuple("".join(got[name]) for name in ("T1", "T2", "B1", "B2"))


def _flat(key, i: int):
    return one(key, float(i), index=i)


def test_arc_hand_computed_trace():
    cache = make_cache("arc", 3)
    for i, (key, hit, t1, t2, b1, b2, p) in enumerate(ARC_TRACE):
        before = cache.stats.hit_blocks
        cache.access(_flat(key, i), float(i))
        assert (cache.stats.hit_blocks > before) == hit, (i, key)
        assert _lists(cache) == (t1, t2, b1, b2), (i, key)
        assert cache.policy.p == p, (i, key)
    assert cache.policy.metrics() == {"p": 3.0, "t1": 1.0, "t2": 2.0, "b1": 0.0, "b2": 3.0}


def test_arc_p_is_real():
    """delta is a ratio, not rounded (the paper; libCacheSim's ARC too)."""
    cache = make_cache("arc", 5)
    for i, key in enumerate("iadcjjcbgabhdef"):
        cache.access(_flat(key, i), float(i))
    assert _lists(cache) == ("hef", "bd", "ig", "jca") and cache.policy.p == 2.0
    cache.access(_flat("i", 15), 15.0)
    # B1 hit with |B1| = 2, |B2| = 3: p = 2 + 3/2 (rounding down would give 3); then |T1| = 3
    # < p: T2's b -> B2
    assert cache.policy.p == 3.5
    assert _lists(cache) == ("hef", "di", "g", "jcab")


def test_arc_case_iv_a_drops_t1_lru_without_ghost_when_t1_is_full():
    cache = make_cache("arc", 2)
    play(cache, [1, 2, 3, 1])  # |T1| = c: 1 then 2 go without ghosts; 1 comes back as new
    assert cached(cache) == {3, 1}
    assert cache.policy.lists() == {"T1": [3, 1], "T2": [], "B1": [], "B2": []}


def test_arc_case_iv_a_trims_b1_when_l1_is_full():
    cache = make_cache("arc", 3)
    for i, key in enumerate(["a", "a", "b", "b", "c", "d", "e", "x"]):
        cache.access(_flat(key, i), float(i))
    # |T1| + |B1| = 1 + 2 = c on x: B1's LRU c is dropped, then REPLACE moves e to B1
    assert _lists(cache) == ("x", "ab", "de", "")


def test_arc_prefers_the_other_list_when_its_choice_is_all_pinned():
    cache = make_cache("arc", 3)
    play(cache, [1, 1])  # 1 in T2
    pinned = [cache.acquire(one(k, 2.0), 2.0) for k in (2, 3)]  # in T1, held
    play(cache, [4], t0=3.0)  # REPLACE prefers T1 (|T1| = 2 > p = 0): all pinned -> T2's 1
    assert cached(cache) == {2, 3, 4}
    assert cache.policy.lists()["B2"] == [1]
    for lease in pinned:
        cache.release(lease, 4.0)


def test_arc_never_evicts_a_parent_before_its_children():
    """A parent sits in T2 while its new child is in T1; once p (grown by B1 ghost hits)
    makes REPLACE prefer T2, T2's least recently released block is that parent: not a leaf, so
    T2's next evictable block goes instead (classic ARC would evict the parent)."""
    cache = make_cache("arc", 4)
    steps = [[1], [1], [5], [6], [7], [8], [5], [5], [1, 2], [6], [9]]
    for t, keys in enumerate(steps):
        cache.access(chain_request(keys, arrival_s=float(t)), float(t))
        check_tree(cache)
    # [8]: 5 -> B1; [5]: B1 hit, p = 1, 6 -> B1; [1, 2]: 7 -> B1, T2 = 5, 1 and T1 = 8, 2;
    # [6]: B1 hit, p = 2, T2's 5 -> B2, T2 = 1, 6; [9]: |T1| = 2 = p: T2, whose LRU 1 has a
    # child: 6 goes
    assert cached(cache) == {1, 2, 8, 9}
    assert cache.policy.p == 2.0
    assert cache.policy.lists()["B2"] == [5, 6]
    for k in range(20, 40):
        cache.access(chain_request([k], arrival_s=float(k)), float(k))
        check_tree(cache)
        assert 2 not in cache.blocks or 1 in cache.blocks


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_arc_bounds_hold_under_pinning(seed: int):
    """On trees with overlapping leases: T1 + T2 are the cached blocks, |T1| + |B1| <= c and
    all four lists hold at most 2c keys (ARC's invariants), p stays in [0, c]."""
    cap = 10
    cache = make_cache("arc", cap)
    pol = cache.policy
    for _ in _leased_replay(cache, seed):
        assert pol.n1 + pol.n2 == len(cache)
        assert sum(b.pdata == 1 for b in cache.blocks.values()) == pol.n1
        if pol.c:
            assert pol.c == cap
            assert pol.n1 + len(pol.b1) <= cap
            assert pol.n1 + pol.n2 + len(pol.b1) + len(pol.b2) <= 2 * cap
            assert not (set(pol.b1) | set(pol.b2)) & set(cache.blocks)
        assert 0.0 <= pol.p <= cap
    assert cache.stats.evictions > 50 and cache.stats.ghost_hits == 0  # cache ghosts stay off


# --- sieve ------------------------------------------------------------------------------------

# c = 3: key, hit?, cached afterwards. Queue oldest -> newest; the hand starts at the oldest.
SIEVE_TRACE = [
    ("a", False, "a"),
    ("b", False, "ab"),
    ("c", False, "abc"),
    ("a", True, "abc"),  # a visited
    ("d", False, "acd"),  # hand: a visited -> cleared; b unvisited: evicted; hand at c
    ("b", False, "adb"),  # hand at c: unvisited, evicted; hand at d
    ("d", True, "adb"),
    ("e", False, "ade"),  # hand: d cleared, b evicted (LRU and FIFO would evict a); wraps
    ("a", True, "ade"),  # a visited again
    ("f", False, "aef"),  # from the oldest: a cleared, d (cleared before) evicted
]


def test_sieve_hand_computed_trace():
    cache = make_cache("sieve", 3)
    for i, (key, hit, after) in enumerate(SIEVE_TRACE):
        before = cache.stats.hit_blocks
        cache.access(_flat(key, i), float(i))
        assert (cache.stats.hit_blocks > before) == hit, (i, key)
        assert cached(cache) == set(after), (i, key)


def test_sieve_hits_do_not_reorder():
    cache = make_cache("sieve", 2)
    play(cache, [1, 2, 2, 3])  # 2 visited; the hand starts at 1: unvisited, evicted
    assert cached(cache) == {2, 3}
    play(cache, [4], t0=10)  # hand at 2 (visited): cleared; then 3: unvisited, evicted
    assert cached(cache) == {2, 4}


def test_sieve_skips_pinned_and_non_leaf_blocks():
    cache = make_cache("sieve", 4)
    cache.access(chain_request([1, 2, 3], arrival_s=0.0), 0.0)  # 1, 2 are not leaves
    held = cache.acquire(one(4, 1.0), 1.0)  # pinned
    cache.access(chain_request([5], arrival_s=2.0), 2.0)  # 1 and 2 out of the queue; 3 evicted
    assert cached(cache) == {1, 2, 4, 5}
    check_tree(cache)
    cache.access(chain_request([6], arrival_s=3.0), 3.0)  # 2 re-entered behind the hand
    assert cached(cache) == {1, 4, 5, 6} or cached(cache) == {1, 2, 4, 6}
    assert 4 in cache.blocks
    check_tree(cache)
    cache.release(held, 4.0)
    for k in range(10, 20):
        cache.access(chain_request([k], arrival_s=float(k)), float(k))
        check_tree(cache)
    assert cache.policy.victim() is not None  # the queue still holds evictable blocks


def test_sieve_evicts_a_chain_leaf_by_leaf():
    """Parents the hand took out of the queue come back as their children go (behind the
    hand), so the hand reaches them again."""
    cache = make_cache("sieve", 3)
    cache.access(chain_request([1, 2, 3], arrival_s=0.0), 0.0)
    gone = []
    # 10: the hand takes 1 and 2 out, evicts 3 and 2 comes back; 11: evicts 2, 1 comes back
    # behind the hand (at 10); 10 and 11 hit; 12: the hand clears 10 and 11, wraps, evicts 1
    for t, k in enumerate([10, 11, 10, 11, 12], start=1):
        cache.access(chain_request([k], arrival_s=float(t)), float(t))
        check_tree(cache)
        gone += [key for key in (1, 2, 3) if key not in cache.blocks and key not in gone]
    assert gone == [3, 2, 1]
    assert cached(cache) == {10, 11, 12}


def test_sieve_hand_steps_are_amortised():
    """A long chain (all but its tail are not leaves) and many evictions, every block hit once
    so that the hand wraps: the hand takes each non-leaf out of the queue once instead of
    stepping over it at every pass."""
    cache = make_cache("sieve", 210)
    cache.access(chain_request(list(range(10**6, 10**6 + 200)), arrival_s=0.0), 0.0)
    t = 1.0
    for k in range(2000):
        for _ in range(2):
            cache.access(chain_request([k], arrival_s=t), t)
            t += 1
    hits, evictions = cache.stats.hit_blocks, cache.stats.evictions
    assert hits == 2000 and evictions == 1990
    # each step clears a bit set by a hit, evicts, takes out a block that entered by an insert
    # or a re-entry (the chain's, each once as a leaf), or wraps; stepping over the chain at
    # every pass would take over 13,000
    assert cache.policy.metrics()["hand_steps"] <= hits + 2 * evictions + 2 * 200
