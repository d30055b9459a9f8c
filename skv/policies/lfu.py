"""``lfu``: evict the evictable leaf with the fewest hits; ties go to the least recently used.

Ordering invariant: priority = ``(b.hits, t_release)``, lowest first. ``b.hits`` counts the
times a request reused the block while it stayed cached (0 right after insertion; the count
restarts when the block is evicted and inserted again: in-cache LFU). ``t_release`` is the time
the block's last holder released it, the same recency ``lru`` uses.

Tie-breaking: equal hit counts evict the least recently released block first (LRU among equal
frequencies); blocks released at the same instant go in release order, i.e. a request's tail
before its head. This is libCacheSim's ``LFU`` rule (frequency, then LRU), so on a flat trace
of single-block requests the two give the same evictions (``tests/test_libcachesim.py``).
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.policies.base import PriorityPolicy


class LFU(PriorityPolicy):
    name = "lfu"

    def priority(self, b: Block, now: float) -> tuple[int, float]:
        return (b.hits, b.pdata)  # type: ignore[return-value]

    def on_unpin(self, b: Block, now: float) -> None:
        b.pdata = now
        if b.n_children == 0:
            self.push_key(b, (b.hits, now))

    def on_leaf(self, b: Block, now: float) -> None:
        self.push_key(b, (b.hits, b.pdata))

    def params(self) -> dict[str, Any]:
        return {}
