"""``slru``: segmented LRU with a capped protected segment, in O(1).

Two LRU segments, each an ordered dict in release order (the recency ``lru`` uses):

- *probationary*: blocks with fewer than ``promote_hits`` hits; evicted first;
- *protected*: blocks reused at least ``promote_hits`` times (promotion happens on the hit);
  at most ``protected_fraction`` of the cache's capacity. When a promotion overflows that cap,
  the least recently released protected block is demoted to the most-recent end of the
  probationary segment. The policy learns the capacity at the first eviction (the cache is full
  then); while the cache fills there is no cap, and the first eviction demotes any excess.

Eviction takes the least recently released unpinned block of the probationary segment, and only
when that segment has none, of the protected one. Ties (same release time) go in release order,
a request's tail first. ``protected_fraction=1.0, promote_hits=2`` is SGLang's ``SLRUStrategy``
ordering ``(hit_count >= 2, last_access_time)`` with skv's release-time recency.

Why the front unpinned block is always a leaf (checked, like ``lru``): a request holds and
releases its whole chain tail first, so in either segment a parent sits behind its children; a
child's hit is also its parent's hit, so a protected child has a protected parent; and the
oldest unpinned protected block is demoted first (a pinned child pins its parent), so a child is
demoted before its parent. A pinned block met at a segment's front, by eviction or demotion,
leaves the order until its release puts it back.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

from skv.cache.block import Block
from skv.cache.policy import Policy


class SLRU(Policy):
    name = "slru"

    def __init__(self, protected_fraction: float = 0.8, promote_hits: int = 1) -> None:
        if not 0.0 <= protected_fraction <= 1.0:
            raise ValueError(
                f"slru: protected_fraction must be in [0, 1], got {protected_fraction}"
            )
        if promote_hits < 1:
            raise ValueError(f"slru: promote_hits must be >= 1, got {promote_hits}")
        self.protected_fraction = float(protected_fraction)
        self.promote_hits = int(promote_hits)
        # keyed by the block itself, not its key: in vLLM's pool (the vLLM plugin) two blocks
        # can hold the same key
        self._prob: OrderedDict[Block, Block] = OrderedDict()
        self._prot: OrderedDict[Block, Block] = OrderedDict()
        self._n_protected = 0  # blocks labelled protected (pdata True), in the dict or pinned
        self._live = 0
        self._cap = sys.maxsize  # protected_fraction x capacity, set at the first eviction

    def on_insert(self, b: Block, now: float) -> None:
        b.pdata = False
        self._live += 1

    def on_hit(self, b: Block, now: float) -> None:
        if not b.pdata and b.hits >= self.promote_hits:
            b.pdata = True
            self._n_protected += 1
            self._prob.pop(b, None)

    def on_unpin(self, b: Block, now: float) -> None:
        if b.pdata:
            prot = self._prot
            prot[b] = b
            prot.move_to_end(b)
            if self._n_protected > self._cap:
                self._demote()
        else:
            prob = self._prob
            prob[b] = b
            prob.move_to_end(b)

    def _demote(self) -> None:
        prot, prob = self._prot, self._prob
        while self._n_protected > self._cap and prot:
            _, b = prot.popitem(last=False)
            if b.ref:  # pinned: out of the order until its release puts it back (protected)
                continue
            b.pdata = False
            self._n_protected -= 1
            prob[b] = b

    def victim(self) -> Block | None:
        if self._cap == sys.maxsize:
            self._cap = int(self.protected_fraction * self._live)
            self._demote()
        for order in (self._prob, self._prot):
            while order:
                _, b = order.popitem(last=False)
                if b.ref == 0:
                    if b.n_children:
                        raise AssertionError(f"slru ordering invariant broken: {b} has children")
                    return b
        return None

    def on_evict(self, b: Block, now: float) -> None:
        self._live -= 1
        if b.pdata:
            self._n_protected -= 1

    def metrics(self) -> dict[str, float]:
        return {"protected_blocks": float(self._n_protected)}

    def params(self) -> dict[str, Any]:
        return {"protected_fraction": self.protected_fraction, "promote_hits": self.promote_hits}
