"""``belady``: offline; evict the evictable leaf whose next use is farthest in the future.

Ordering invariant: priority = ``-b.next_use``, lowest first, where ``b.next_use`` is the index
of the next request that uses the block's key (``skv.blocks.annotate_next_use``; the cache copies
it onto the block at every insert and hit). Keys never used again carry ``len(trace) + 1`` and go
first; among them, and among any other ties, the earliest pushed goes first (a request's tail
before its head). On a flat trace of single-block requests this is Belady's MIN, the optimal
miss ratio (checked against libCacheSim's ``Belady``). With multi-block requests, pinning and
leaf-only eviction it is the classic heuristic, an upper-bound reference rather than an optimum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skv.blocks import RequestBlocks, annotate_next_use
from skv.cache.block import Block
from skv.policies.base import PriorityPolicy


class Belady(PriorityPolicy):
    name = "belady"

    def prepare(self, trace: Sequence[RequestBlocks]) -> None:
        if trace and trace[0].next_use is None:
            annotate_next_use(trace)

    def priority(self, b: Block, now: float) -> int:
        return -b.next_use

    def on_unpin(self, b: Block, now: float) -> None:
        if b.n_children == 0:
            self.push_key(b, -b.next_use)

    def on_leaf(self, b: Block, now: float) -> None:
        self.push_key(b, -b.next_use)

    def params(self) -> dict[str, Any]:
        return {}
