"""What an eviction policy is, as the cache calls it: a small class that says which evictable
block to drop. Implementations live in :mod:`skv.policies` (heap bases in ``policies/base.py``).

The cache owns the blocks, the tree, pinning and capacity; a policy only keeps an ordering of the
blocks the cache offers it (SGLang's split: policies know *what to prefer*, the cache knows *how
to evict*). The cache calls, for every block:

- ``on_request(rb, now)`` when a request arrives, before its lookup (sessions, turn gaps),
- ``on_extend(rb, now)`` when an in-flight request grows by its generated answer (the
  simulator's output blocks): the same request, not a new one; its inserts follow,
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
    #: The cache keeps a ghost list of evicted keys only for policies that learn from it.
    uses_ghost_list: ClassVar[bool] = False

    def on_request(self, rb: RequestBlocks, now: float) -> None:
        pass

    def on_extend(self, rb: RequestBlocks, now: float) -> None:
        pass

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
