"""``lru``: evict the unpinned leaf whose last use ended longest ago, in O(1).

A block's recency is the time its last holder released it (a block in use is in use until its
request finishes), ties broken tail first. Blocks sit in one ordered dict in release order; a
block that is pinned keeps its old place (no work on pin) and moves to the back when released,
and eviction skips pinned blocks it meets at the front. Every access to a block also holds its
parent and a request releases its blocks tail first, so a parent always sits behind all of its
children: the first unpinned block at the front is a leaf (checked, never assumed).
"""

from __future__ import annotations

from collections import OrderedDict

from skv.cache.block import Block
from skv.policies.base import Policy


class LRU(Policy):
    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, Block] = OrderedDict()

    def on_unpin(self, b: Block, now: float) -> None:
        order = self._order
        order[b.key] = b
        order.move_to_end(b.key)

    def victim(self) -> Block | None:
        order = self._order
        while order:
            _, b = order.popitem(last=False)
            if b.ref == 0:
                if b.n_children:
                    raise AssertionError(f"lru ordering invariant broken: {b} has children")
                return b
            # pinned: out of the order until its release puts it back at the end
        return None
