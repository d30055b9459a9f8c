"""``fifo``: evict the evictable leaf that was inserted earliest; hits do not matter.

Ordering invariant: a block's priority is its insertion sequence number (a counter the policy
assigns in ``on_insert``), so among unpinned leaves the one cached first goes first, however
recently or often it was reused. Sequence numbers are unique, so there are no ties. A block
keeps its number for as long as it stays cached (pin/unpin only re-offers it to the heap with
the same number); evicted and re-inserted, it gets a new one. On a flat trace (one block per
request) this is exactly classic FIFO.
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.policies.base import PriorityPolicy


class FIFO(PriorityPolicy):
    name = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self._inserted = 0

    def on_insert(self, b: Block, now: float) -> None:
        self._live += 1
        self._inserted = n = self._inserted + 1
        b.pdata = n

    def priority(self, b: Block, now: float) -> int:
        return b.pdata  # type: ignore[return-value]

    def on_unpin(self, b: Block, now: float) -> None:
        if b.n_children == 0:
            self.push_key(b, b.pdata)

    def on_leaf(self, b: Block, now: float) -> None:
        self.push_key(b, b.pdata)

    def params(self) -> dict[str, Any]:
        return {}
