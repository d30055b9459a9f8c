"""What an eviction policy is: a small class that says which evictable block to drop.

The cache owns the blocks, the tree, pinning and capacity; a policy only keeps an ordering of the
blocks the cache offers it (SGLang's split: policies know *what to prefer*, the cache knows *how
to evict*). The cache calls, for every block:

- ``on_insert(b, now)`` when the block is first cached (it is pinned at that moment),
- ``on_hit(b, now)`` when a request reuses it (pinned),
- ``on_pin(b)`` when its pin count goes 0 -> 1, ``on_unpin(b, now)`` when it goes back to 0,
- ``on_leaf(b, now)`` when an unpinned block loses its last cached child (leaf-only caches),
- ``victim()`` to get one evictable block (or ``None``), then ``on_evict(b, now)``,
- ``on_ghost_hit(b, ghost, now)`` when a key evicted recently is inserted again.

A block is evictable when ``b.ref == 0`` and, for leaf-only caches, ``b.n_children == 0``.
Optional: ``prepare(trace)`` for offline policies, ``metrics()`` for values to log over time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks
    from skv.cache.block import Block, GhostEntry


class Policy:
    """Base class with no-op hooks; subclasses override what they need."""

    name: ClassVar[str] = "base"
    #: Only unpinned leaves may be evicted (SGLang radix semantics); every BlockCache policy is.
    leaf_only: ClassVar[bool] = True

    def on_insert(self, b: Block, now: float) -> None:
        pass

    def on_hit(self, b: Block, now: float) -> None:
        pass

    def on_pin(self, b: Block) -> None:
        pass

    def on_unpin(self, b: Block, now: float) -> None:
        pass

    def on_leaf(self, b: Block, now: float) -> None:
        pass

    def victim(self) -> Block | None:
        raise NotImplementedError

    def on_evict(self, b: Block, now: float) -> None:
        pass

    def on_ghost_hit(self, b: Block, ghost: GhostEntry, now: float) -> None:
        pass

    def prepare(self, trace: Sequence[RequestBlocks]) -> None:
        """Called once with the whole trace before replay (offline policies only)."""

    def metrics(self) -> dict[str, float]:
        """Values worth logging over time (e.g. learned weights)."""
        return {}

    def params(self) -> dict[str, Any]:
        """The policy's configuration, written next to its results."""
        return {}


class PriorityPolicy(Policy):
    """A min-heap over evictable blocks with lazy deletion: the lowest priority is evicted.

    Subclasses implement ``priority(b, now)``. A heap entry is ``(priority, seq, version, block)``
    and is valid only while the block is still evictable and ``version`` matches: pinning,
    re-pushing and evicting all bump ``b.version``, so stale entries are skipped on pop. Equal
    priorities pop in push order; a request's blocks are unpinned tail first, so ties evict a
    request's tail before its head. The heap is compacted when stale entries outnumber live ones.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int, int, Block]] = []
        self._seq = 0
        self._live = 0

    def priority(self, b: Block, now: float) -> Any:
        raise NotImplementedError

    def push(self, b: Block, now: float) -> None:
        self.push_key(b, self.priority(b, now))

    def push_key(self, b: Block, key: Any) -> None:
        """Push ``b`` with an already computed priority (saves a call on hot paths)."""
        b.version = version = b.version + 1
        self._seq = seq = self._seq + 1
        heap = self._heap
        heapq.heappush(heap, (key, seq, version, b))
        if len(heap) > 2 * self._live + 4096:
            self._compact()

    def on_insert(self, b: Block, now: float) -> None:
        self._live += 1

    def on_pin(self, b: Block) -> None:
        b.version += 1

    def on_unpin(self, b: Block, now: float) -> None:
        if b.n_children == 0:
            self.push(b, now)

    def on_leaf(self, b: Block, now: float) -> None:
        self.push(b, now)

    def on_evict(self, b: Block, now: float) -> None:
        self._live -= 1

    def victim(self) -> Block | None:
        heap = self._heap
        while heap:
            _, _, version, b = heapq.heappop(heap)
            if version == b.version and b.ref == 0 and b.n_children == 0:
                b.version += 1
                return b
        return None

    def refresh(self, now: float) -> None:
        """Recompute every live entry's priority (for priorities that drift with time).

        Entries keep their push sequence, so equal priorities still pop in push order.
        """
        priority = self.priority
        self._heap = [
            (priority(b, now), seq, version, b)
            for _, seq, version, b in self._heap
            if version == b.version
        ]
        heapq.heapify(self._heap)

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2] == e[3].version]
        heapq.heapify(self._heap)
