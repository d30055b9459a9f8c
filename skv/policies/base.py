"""Heap bases for eviction policies (the interface itself, :class:`skv.cache.policy.Policy`, is
what the cache calls; it lives with the cache so the cache never imports a policy).

Two heap bases: ``PriorityPolicy`` (any priority, updated eagerly; ``refresh`` for priorities
that drift with time) and ``MonotonePriorityPolicy`` (priorities that never decrease while a
block is cached, kept lazily: fewer heap operations, the same victims).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import cython

from skv.cache.policy import Policy

if TYPE_CHECKING:
    from skv.cache.block import Block


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


class HeapEntry:
    """One heap entry: a block under the key it had when the entry was made."""

    def __init__(self, k1: cython.double, k2: cython.double, seq: cython.longlong, b: Block):
        self.k1 = k1
        self.k2 = k2
        self.seq = seq
        self.b = b


def _before(x: HeapEntry, y: HeapEntry) -> cython.bint:
    if x.k1 != y.k1:
        return x.k1 < y.k1
    if x.k2 != y.k2:
        return x.k2 < y.k2
    return x.seq < y.seq


class KeyHeap:
    """A binary min-heap of blocks keyed by two doubles and a sequence number.

    Compiled, comparisons are on C doubles (no tuple comparisons, no ``heapq`` calls): the
    difference between a heap policy at a few hundred thousand and over a million accesses/s.
    """

    def __init__(self) -> None:
        self._items: list = []

    def __len__(self) -> int:
        return len(self._items)

    def push(self, k1: cython.double, k2: cython.double, seq: cython.longlong, b: Block) -> None:
        items: list = self._items
        e: HeapEntry = HeapEntry.__new__(HeapEntry)
        e.k1, e.k2, e.seq, e.b = k1, k2, seq, b
        items.append(e)
        i: cython.Py_ssize_t = len(items) - 1
        parent: HeapEntry
        while i > 0:
            j: cython.Py_ssize_t = (i - 1) >> 1
            parent = items[j]
            if not _before(e, parent):
                break
            items[i] = parent
            i = j
        items[i] = e

    def top(self) -> HeapEntry | None:
        return self._items[0] if self._items else None

    def pop(self) -> HeapEntry:
        items: list = self._items
        top: HeapEntry = items[0]
        last: HeapEntry = items.pop()
        if items:
            self._sift_down(last)
        return top

    def replace_top(self, k1: cython.double, k2: cython.double, seq: cython.longlong) -> None:
        """Re-key the top entry (same block) and restore the heap order."""
        e: HeapEntry = self._items[0]
        e.k1, e.k2, e.seq = k1, k2, seq
        self._sift_down(e)

    def _sift_down(self, e: HeapEntry) -> None:
        items: list = self._items
        n: cython.Py_ssize_t = len(items)
        i: cython.Py_ssize_t = 0
        child: HeapEntry
        other: HeapEntry
        while True:
            c: cython.Py_ssize_t = 2 * i + 1
            if c >= n:
                break
            child = items[c]
            if c + 1 < n:
                other = items[c + 1]
                if _before(other, child):
                    c += 1
                    child = other
            if not _before(child, e):
                break
            items[i] = child
            i = c
        items[i] = e


def key_pair(key: object) -> tuple[float, float]:
    """A policy key (a number, or a pair compared lexicographically) as two floats."""
    if isinstance(key, tuple):
        return float(key[0]), (float(key[1]) if len(key) > 1 else 0.0)
    return float(key), 0.0


class MonotonePriorityPolicy(Policy):
    """A min-heap over evictable blocks for priorities that never decrease while a block is cached.

    Most priorities only grow as a block is reused (recency stamps, hit counts, GreedyDual's H),
    so the heap is kept lazily, with at most one entry per block and no stale entries: nothing
    happens on pin; on release the block's new key is only recorded (``b.pk1, b.pk2, b.pseq``)
    and pushed if the block has no entry yet; when an entry reaches the top it is dropped if its
    block is pinned or has children (the block comes back on release or ``on_leaf``), re-keyed if
    the block was reused since (its key grew, so it sinks), and otherwise its block is the victim.
    Because keys only grow, the first current top is the block with the smallest key: the same
    victims as a heap updated eagerly (``PriorityPolicy``), with fewer heap operations.

    Subclasses implement ``key(b, now)``: a number, or a pair ``(primary, secondary)`` compared
    lexicographically. ``b.pseq`` counts releases, so equal keys go in release order (a request's
    tail before its head) and a block that becomes a leaf keeps the place of its last release.
    ``b.version`` is odd exactly while the block has an entry (push and drop each add 1).
    """

    def __init__(self) -> None:
        self._heap = KeyHeap()
        self._seq = 0

    def key(self, b: Block, now: float) -> Any:
        raise NotImplementedError

    def on_unpin(self, b: Block, now: float) -> None:
        k = self.key(b, now)
        if isinstance(k, tuple):
            b.pk1, b.pk2 = key_pair(k)
        else:
            b.pk1 = k
            b.pk2 = 0.0
        self._seq += 1
        b.pseq = self._seq
        if not b.version & 1 and not b.n_children:
            b.version += 1
            self._heap.push(b.pk1, b.pk2, b.pseq, b)

    def on_leaf(self, b: Block, now: float) -> None:
        self.offer(b)

    def offer(self, b: Block) -> None:
        """Push ``b`` with its current key unless it already has an entry."""
        if not b.version & 1:
            b.version += 1
            self._heap.push(b.pk1, b.pk2, b.pseq, b)

    def victim(self) -> Block | None:
        heap: KeyHeap = self._heap
        e: HeapEntry
        b: Block
        while len(heap):
            e = heap.top()
            b = e.b
            if b.ref or b.n_children:
                heap.pop()
                b.version += 1
            elif b.pseq != e.seq:
                heap.replace_top(b.pk1, b.pk2, b.pseq)
            else:
                heap.pop()
                b.version += 1
                return b
        return None
