"""skv's classic policies agree with libCacheSim on flat traces.

A flat trace has one single-block request per access and every block is its own chain root, so
pinning and leaf-only eviction never bind and skv's radix cache is a plain object cache of
``capacity_blocks`` unit-size objects. libCacheSim is driven request by request with objects of
size 1 and a cache size in objects. ``lru``, ``fifo`` and ``belady`` must give exactly
libCacheSim's miss counts; ``lfu`` is required to be within 1 percentage point. skv's LFU breaks
frequency ties by least recent use (``skv/policies/lfu.py``), which is libCacheSim's rule too,
so in practice it matches exactly as well. ``s3fifo`` matches libCacheSim's ``S3FIFO`` exactly;
``wtinylfu`` is within 2 points of its ``WTinyLFU``, whose TinyLFU differs by definition (see the
comment above that test). Each libCacheSim policy used for the new ones is first checked on a
trace worked out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import LCS_NEVER, skv_misses
from helpers import flat_trace as _flat_trace
from helpers import lcs_misses as _lcs_misses

from skv.policies.registry import make_cache

lcs = pytest.importorskip("libcachesim")

N_REQUESTS = 4000
SIZES = (16, 64, 256)
NEVER = LCS_NEVER


def _keys(seed: int) -> list[int]:
    """A seeded mix: 70% Zipf(1.2) over 400 hot keys, 30% uniform over 3000 keys."""
    rng = np.random.default_rng(seed)
    zipf = rng.zipf(1.2, N_REQUESTS) % 400
    uniform = 400 + rng.integers(0, 3000, N_REQUESTS)
    pick = rng.random(N_REQUESTS) < 0.7
    return np.where(pick, zipf, uniform).tolist()


def _skv_misses(policy: str, keys: list[int], size: int) -> int:
    return skv_misses(policy, _flat_trace(keys), size)


# arc and sieve too: libCacheSim's ARC and Sieve are checked first on the hand-computed traces
# of tests/test_policies_arc_sieve.py (its ARC keeps p real, as the paper does)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("policy", "algo"),
    [
        ("lru", "LRU"),
        ("fifo", "FIFO"),
        ("belady", "Belady"),
        ("arc", "ARC"),
        ("sieve", "Sieve"),
    ],
)
def test_exact_miss_ratio_matches_libcachesim(policy: str, algo: str, size: int, seed: int):
    keys = _keys(seed)
    assert _skv_misses(policy, keys, size) == _lcs_misses(algo, keys, size)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("size", SIZES)
def test_lfu_miss_ratio_within_one_point_of_libcachesim(size: int, seed: int):
    keys = _keys(seed)
    ours = _skv_misses("lfu", keys, size) / len(keys)
    theirs = _lcs_misses("LFU", keys, size) / len(keys)
    assert abs(ours - theirs) <= 0.01, (ours, theirs)


def _lcs_hits(cache, keys: list[int]) -> list[bool]:
    out = []
    for i, key in enumerate(keys):
        req = lcs.Request()
        req.obj_id = key
        req.obj_size = 1
        req.clock_time = i
        req.next_access_vtime = NEVER
        out.append(bool(cache.get(req)))
    return out


def _skv_hits(policy: str, keys: list[int], size: int) -> list[bool]:
    cache = make_cache(policy, size)
    out = []
    for rb in _flat_trace(keys):
        before = cache.stats.hit_blocks
        cache.access(rb, rb.arrival_s)
        out.append(cache.stats.hit_blocks > before)
    return out


#: capacity 20: S holds 2 (int(20 x 0.1)), M 18, the ghost 19 keys (int(20 x 0.9) + 1)
S3FIFO_HAND_KEYS = [*range(1, 21), 21, 22, 1, 23, 3, 2, 4, 1, 24, 5, 4]
S3FIFO_HAND_HITS = (
    [False] * 20  # warm-up: 1, 2 fill S, then 3..20 go straight to M
    + [False, False]  # 21, 22: S evicts 1, then 2, to the ghost
    + [False]  # 1: a ghost hit (S evicts 21 first): 1 goes to M, which is now over its 18
    + [False]  # 23: M evicts its head 3 (no hit); nothing enters the ghost
    + [False]  # 3: not in the ghost, so into S (S evicts 22)
    + [False]  # 2: a ghost hit again (S evicts 23): into M
    + [True, True]  # 4 and 1 hit in M (freq 1)
    + [False]  # 24: M evicts: 4 (freq 1) goes back to the tail with freq 0, 5 is evicted
    + [False, True]  # 5 missed (S evicts 3); 4 was kept by the reinsertion
)


def test_libcachesim_s3fifo_on_a_hand_computed_trace():
    """libCacheSim's S3FIFO is the reference only if it does what the paper says on a trace
    worked out by hand (the warm-up rule, one-hit wonders to the ghost, ghost hits to M, M's
    reinsertion); skv's s3fifo gives the same hits."""
    assert _lcs_hits(lcs.S3FIFO(20), S3FIFO_HAND_KEYS) == S3FIFO_HAND_HITS
    assert _skv_hits("s3fifo", S3FIFO_HAND_KEYS, 20) == S3FIFO_HAND_HITS


def test_libcachesim_wtinylfu_keeps_a_frequent_key_through_a_scan():
    """libCacheSim's WTinyLFU checked by hand: at capacity 100 a key read 9 times while in the
    main cache survives a scan of 300 keys read once (TinyLFU refuses each scanned key against
    it), where LRU loses it; skv's wtinylfu does the same. (The reads are placed after the first
    eviction has moved the key to the main cache: libCacheSim does not count window hits.)"""
    keys = [5000, *range(1, 101)] + [5000] * 9 + list(range(101, 401)) + [5000]
    assert _lcs_hits(lcs.WTinyLFU(100), keys)[-1]
    assert not _lcs_hits(lcs.LRU(100), keys)[-1]
    assert _skv_hits("wtinylfu", keys, 100)[-1]
    assert not _skv_hits("lru", keys, 100)[-1]


# libCacheSim's S3FIFO needs a small queue of at least 2 objects (it refuses to insert an
# object as large as the small queue, and aborts below 10 objects), so the sizes start at 20
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("size", [20, 64, 256])
def test_s3fifo_matches_libcachesim_exactly(size: int, seed: int):
    keys = _keys(seed)
    assert _skv_misses("s3fifo", keys, size) == _lcs_misses("S3FIFO", keys, size)


# W-TinyLFU: not identically defined. libCacheSim's TinyLFU is a minimal-increment counting
# Bloom filter (sized for the main cache at 0.1% error) that counts misses and main-cache hits
# but not window hits, plus every window block weighed at an eviction, halved after 32 x main
# size main hits; one of its evictions can drop several blocks (each winning window block evicts
# a main block, until one loses); its SLRU fills the protected segment first and can evict on a
# demotion. skv's is the paper's/Caffeine's (skv/policies/wtinylfu.py). libCacheSim's 1% window
# is 0 objects below capacity 100 (it then caches nothing), so the sizes start at 128. Measured:
# seed 0: +1.47 / +0.92 / +0.57 points at 128 / 256 / 512, seed 1: +0.38 / -0.03 / +0.03; the
# bound is 2 points, not the 0.5, for those definitional differences.
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("size", [128, 256, 512])
def test_wtinylfu_within_two_points_of_libcachesim(size: int, seed: int):
    keys = _keys(seed)
    ours = _skv_misses("wtinylfu", keys, size) / len(keys)
    theirs = _lcs_misses("WTinyLFU", keys, size) / len(keys)
    assert abs(ours - theirs) <= 0.02, (ours, theirs)


def test_flat_trace_is_not_trivial():
    """The trace exercises eviction: misses well above cold misses, ordering matters."""
    keys = _keys(0)
    lru = _skv_misses("lru", keys, SIZES[0])
    opt = _skv_misses("belady", keys, SIZES[0])
    assert lru > len(set(keys)) and opt < lru
