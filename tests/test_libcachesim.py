"""skv's classic policies agree with libCacheSim on flat traces.

A flat trace has one single-block request per access and every block is its own chain root, so
pinning and leaf-only eviction never bind and skv's radix cache is a plain object cache of
``capacity_blocks`` unit-size objects. libCacheSim is driven request by request with objects of
size 1 and a cache size in objects. ``lru``, ``fifo`` and ``belady`` must give exactly
libCacheSim's miss counts; ``lfu`` is required to be within 1 percentage point. skv's LFU breaks
frequency ties by least recent use (``skv/policies/lfu.py``), which is libCacheSim's rule too,
so in practice it matches exactly as well.
"""

from __future__ import annotations

import numpy as np
import pytest

from skv.blocks import RequestBlocks
from skv.policies.registry import make_cache
from skv.replay import annotate_next_use

lcs = pytest.importorskip("libcachesim")

N_REQUESTS = 4000
SIZES = (16, 64, 256)
NEVER = 1 << 62  # libCacheSim: next access vtime of an object not requested again


def _keys(seed: int) -> list[int]:
    """A seeded mix: 70% Zipf(1.2) over 400 hot keys, 30% uniform over 3000 keys."""
    rng = np.random.default_rng(seed)
    zipf = rng.zipf(1.2, N_REQUESTS) % 400
    uniform = 400 + rng.integers(0, 3000, N_REQUESTS)
    pick = rng.random(N_REQUESTS) < 0.7
    return np.where(pick, zipf, uniform).tolist()


def _flat_trace(keys: list[int]) -> list[RequestBlocks]:
    return [
        RequestBlocks(i, float(i), [key], [None], [1], [0], [1], None, 0, False, 1)
        for i, key in enumerate(keys)
    ]


def _skv_misses(policy: str, keys: list[int], size: int) -> int:
    trace = _flat_trace(keys)
    cache = make_cache(policy, size)
    if policy == "belady":
        annotate_next_use(trace)
        cache.prepare(trace)
    for rb in trace:
        cache.access(rb, rb.arrival_s)
    assert cache.stats.blocks == len(keys)
    return cache.stats.blocks - cache.stats.hit_blocks


def _lcs_misses(algo: str, keys: list[int], size: int) -> int:
    next_access = [NEVER] * len(keys)
    seen: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        next_access[i] = seen.get(keys[i], NEVER)
        seen[keys[i]] = i
    cache = getattr(lcs, algo)(size)
    misses = 0
    for i, key in enumerate(keys):
        req = lcs.Request()
        req.obj_id = key + 1
        req.obj_size = 1
        req.clock_time = i
        req.next_access_vtime = next_access[i]
        if not cache.get(req):
            misses += 1
    return misses


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("policy", "algo"), [("lru", "LRU"), ("fifo", "FIFO"), ("belady", "Belady")]
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


def test_flat_trace_is_not_trivial():
    """The trace exercises eviction: misses well above cold misses, ordering matters."""
    keys = _keys(0)
    lru = _skv_misses("lru", keys, SIZES[0])
    opt = _skv_misses("belady", keys, SIZES[0])
    assert lru > len(set(keys)) and opt < lru
