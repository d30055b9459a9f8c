"""``lfu``: evict the evictable leaf with the fewest hits; ties go to the least recently used.

Ordering invariant: key = ``(b.hits, t_release)``, lowest first. ``b.hits`` counts the times a
request reused the block while it stayed cached (0 right after insertion; the count restarts
when the block is evicted and inserted again: in-cache LFU). ``t_release`` is the time the
block's last holder released it, the same recency ``lru`` uses.

Tie-breaking: equal hit counts evict the least recently released block first (LRU among equal
frequencies); blocks released at the same instant go in release order, i.e. a request's tail
before its head. This is libCacheSim's ``LFU`` rule (frequency, then LRU), so on a flat trace
of single-block requests the two make the same evictions (``tests/test_libcachesim.py``).
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.policies.base import MonotonePriorityPolicy


class LFU(MonotonePriorityPolicy):
    name = "lfu"

    def key(self, b: Block, now: float) -> tuple[int, float]:
        return (b.hits, now)

    def params(self) -> dict[str, Any]:
        return {}
