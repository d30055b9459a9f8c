"""``fifo``: evict the evictable leaf that was inserted earliest; hits do not matter.

Ordering invariant: a block's key is its insertion sequence number (a counter the policy assigns
in ``on_insert``), so among unpinned leaves the one cached first goes first, however recently or
often it was reused. Sequence numbers are unique, so there are no ties. A block keeps its number
while it stays cached (a pinned block met at the heap top leaves the heap and comes back with the
same number on release); evicted and re-inserted, it gets a new one. On a flat trace (one block
per request) this is exactly classic FIFO.
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.policies.base import MonotonePriorityPolicy


class FIFO(MonotonePriorityPolicy):
    name = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self._inserted = 0

    def on_insert(self, b: Block, now: float) -> None:
        self._inserted += 1
        b.pk1 = self._inserted  # the key never changes while the block stays cached
        b.pk2 = 0.0
        b.pseq = self._inserted

    def key(self, b: Block, now: float) -> float:
        return b.pk1

    def on_unpin(self, b: Block, now: float) -> None:
        if not b.n_children:
            self.offer(b)

    def params(self) -> dict[str, Any]:
        return {}
