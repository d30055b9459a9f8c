"""``arc``: Adaptive Replacement Cache (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead
Replacement Cache", FAST 2003), with leaf-only eviction.

The algorithm: resident blocks are split into T1 (seen once recently) and T2 (seen at least
twice); ghost lists B1 and B2 remember the keys recently evicted from each. A miss on a B1 ghost
grows the target size ``p`` of T1, a miss on a B2 ghost shrinks it, and REPLACE evicts the LRU
end of T1 while ``|T1| > p`` (or ``|T1| == p`` and the miss is a B2 ghost), else of T2.

Exactly as in the paper (case numbers are its Fig. 4): a hit moves a block to the MRU end of T2
(case I); a miss on a B1 / B2 ghost sets ``p = min(p + max(|B2| / |B1|, 1), c)`` / ``p = max(p -
max(|B1| / |B2|, 1), 0)`` (sizes before the key leaves its ghost list; ``p`` is real: the ratios
are not rounded), runs REPLACE and inserts into T2 (II, III); any other miss trims the ghosts
(``|T1| + |B1| = c``: drop B1's LRU key and REPLACE, or, when ``|T1| = c``, evict T1's LRU block
with no ghost; else, when all four lists hold ``2c``, drop B2's LRU key and REPLACE) and inserts
into T1 (IV). libCacheSim's ``ARC`` (0.3.5; it moved from an integer to a real ``p`` after a
cross-check with another implementation) is the same algorithm: on a flat trace (one
single-block request per access) this policy makes its choices exactly
(``tests/test_libcachesim.py``).

What was adapted for prefix trees and the cache's interface:

- *Recency* is release order (``lru``'s: a block is used until its request releases it), so
  "MRU end" means "released last"; ties go in release order, a request's tail first.
- *Leaf-only*: REPLACE takes the least recently released *evictable* block (unpinned, no cached
  children) of the list it prefers; if that list has none, the other list's (the victim's key
  then goes to the ghost list of the list it came from). ``|T1|`` and ``|T2|`` count every
  resident block, pinned or not, so ``p`` keeps its meaning.
- *Ghosts*: the policy keeps its own B1 and B2 (ordered sets of keys, LRU first: ``KeyQueue``
  of ``policies/block_queue.py``), not the cache's ghost list: ARC needs two lists, each
  trimmed by ARC's own rules (together at most ``2c`` keys with the resident ones), and needs to
  know at eviction time whether the key being inserted is a ghost, which the cache tells a
  policy only after the eviction (``on_ghost_hit``). So ``uses_ghost_list`` stays False.
- *The key being inserted*: the cache evicts before it inserts and does not say for which key,
  so the policy follows the request: ``on_request`` points at its first block, each hit or
  insert advances the pointer, and ``victim()`` reads the key there. This is exact in a
  ``BlockCache`` for a new request's blocks (always on a flat trace); after an extension
  (``on_extend``, whose first block the policy is not told), an uncachable run, or a second
  eviction for the same block (vLLM's pool evicts for all new blocks before hashing them), the
  key is unknown and the miss is treated as case IV; if the block turns out to be a ghost,
  ``on_insert`` still adapts ``p`` and puts it in T2 (no second eviction).
- *Capacity* ``c``: learned from the cache, the most blocks resident at any eviction (a
  ``BlockCache`` evicts only when full, so ``c`` is its capacity from the first eviction on;
  nothing needs ``c`` before it: there are no ghosts yet). An insert that no eviction preceded
  (vLLM's pool reuses free uncached blocks first) trims the ghosts to the same bounds.
  No parameters.

Ordering invariant: within T1 and within T2, the evictable block released least recently goes
first; ``p`` decides which list REPLACE prefers. Each list is a min-heap of blocks keyed by
release sequence (a ``KeyHeap``, ``policies/base.py``) with at most one entry per block: a
pinned or non-leaf block met at the top leaves the heap and comes back on release or
``on_leaf`` (a returning leaf keeps its old sequence, so its place is exact); an entry whose
block was released since is re-keyed when it reaches the top; an entry whose block moved to T2
or was evicted is dropped there, and the heap is rebuilt when such entries outnumber live
blocks. Keys are unique (a release sequence belongs to one block), so the heap's order is the
keys' order whatever its layout.

Complexity: O(log n) per release, ``on_leaf`` and eviction (heap operations; each entry is
pushed once per release or leaf event and popped once), O(1) per hit and ghost operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cython

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.base import HeapEntry, KeyHeap
from skv.policies.block_queue import KeyQueue

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks

_GONE = cython.declare(cython.int, 0)  # b.pdata of an evicted block: in neither list
_T1 = cython.declare(cython.int, 1)
_T2 = cython.declare(cython.int, 2)


class ARC(Policy):
    name = "arc"

    def __init__(self) -> None:
        self.p = 0.0  # target size of T1, in blocks (real, as in the paper)
        self.c = 0  # cache capacity in blocks, learned at the first eviction
        self.n1 = 0  # resident blocks labelled T1 (b.pdata == 1), pinned or not
        self.n2 = 0
        self._h1 = KeyHeap()  # T1's entries, by release sequence
        self._h2 = KeyHeap()  # T2's
        self.b1 = KeyQueue()  # ghost keys, LRU first
        self.b2 = KeyQueue()
        self._seq = 0
        self._keys: list | None = None  # the current request's keys
        self._cur = -1  # index in _keys of the block the next miss inserts; -1: unknown
        self._pending: object = None  # the ghost key whose case II/III ran in victim()
        self._victim: Block | None = None
        self._evicted = False  # victim() gave a block since the last insert (and kept the bounds)
        self._dest = _GONE  # where the key of the block victim() returned goes: B1, B2 or nowhere
        self._absent: object = None  # a key victim() found in neither B1 nor B2 (None: none)

    # --- following the request (which key is being inserted) ----------------------------------

    def on_request(self, rb: RequestBlocks, now: float) -> None:
        self._keys = rb.keys
        self._cur = 0
        self._pending = None

    def on_extend(self, rb: RequestBlocks, now: float) -> None:
        self._keys = rb.keys
        self._cur = -1  # the extension's first block is not told; an insert resynchronises
        self._pending = None

    def _incoming(self) -> object:
        keys: list = self._keys
        cur: cython.Py_ssize_t = self._cur
        self._cur = -1  # one eviction per insert; a second one before the insert: unknown
        if keys is None or cur < 0 or cur >= len(keys):
            return None
        return keys[cur]

    # --- resident blocks ------------------------------------------------------------------------

    def on_insert(self, b: Block, now: float) -> None:
        self._cur = b.pos + 1
        evicted = self._evicted
        self._evicted = False
        key = b.key
        if key == self._pending and self._pending is not None:  # case II/III ran in victim()
            self._pending = None
            b.pdata = _T2
            self.n2 += 1
            return
        # no need to look if victim() found the key in neither ghost list (on_evict, the only
        # place keys enter them, forgets that when it adds this key)
        maybe_ghost: cython.bint = self._absent is None or key != self._absent
        if maybe_ghost and key in self.b1:  # a ghost hit the eviction did not know of: adapt p,
            self._adapt_up()  # no REPLACE
            self.b1.remove(key)
            b.pdata = _T2
            self.n2 += 1
            return
        if maybe_ghost and key in self.b2:
            self._adapt_down()
            self.b2.remove(key)
            b.pdata = _T2
            self.n2 += 1
            return
        b.pdata = _T1
        self.n1 += 1
        c = self.c
        if c and not evicted:  # an insert with no eviction (a BlockCache that has evicted is
            # always full, vLLM's pool may not be): keep ARC's bounds as victim() does
            if self.n1 + len(self.b1) > c and self.b1:
                self.b1.pop_oldest()
            if self.n1 + self.n2 + len(self.b1) + len(self.b2) > 2 * c and self.b2:
                self.b2.pop_oldest()

    def on_hit(self, b: Block, now: float) -> None:
        if self._cur >= 0:
            self._cur += 1
        if b.pdata == _T1:  # case I: T1 -> T2 (its place is set when it is released)
            b.pdata = _T2
            self.n1 -= 1
            self.n2 += 1
            if b.version & 1:  # its T1 entry is now stale (dropped when met)
                b.version += 1

    def on_unpin(self, b: Block, now: float) -> None:
        self._seq += 1
        b.pseq = self._seq
        if not b.version & 1 and not b.n_children:
            self._push(b)

    def on_leaf(self, b: Block, now: float) -> None:
        if not b.version & 1:
            self._push(b)  # with its last release sequence: back in its exact place

    def _push(self, b: Block) -> None:
        b.version += 1
        label: cython.int = b.pdata
        heap: KeyHeap = self._h1 if label == _T1 else self._h2
        heap.push(0.0, 0.0, b.pseq, b)
        if len(heap) > 2 * (self.n1 if label == _T1 else self.n2) + 64:
            self._compact(label)

    def _compact(self, label: cython.int) -> None:
        """Rebuild a heap without its stale entries, each live one keyed by its block's current
        release sequence (the keys are unique, so the heap pops in the same order)."""
        old: KeyHeap = self._h1 if label == _T1 else self._h2
        heap: KeyHeap = KeyHeap()
        e: HeapEntry
        b: Block
        for e in old._items:
            b = e.b
            if b.pdata == label:
                heap.push(0.0, 0.0, b.pseq, b)
        if label == _T1:
            self._h1 = heap
        else:
            self._h2 = heap

    def _lru(self, label: cython.int) -> Block | None:
        """Take the least recently released evictable block of T1 or T2 out of its heap."""
        heap: KeyHeap = self._h1 if label == _T1 else self._h2
        e: HeapEntry
        b: Block
        while len(heap):
            e = heap.top()
            b = e.b
            if b.pdata != label:  # moved to T2 or evicted since: a stale entry
                heap.pop()
            elif b.ref or b.n_children:  # back on release / on_leaf
                heap.pop()
                b.version += 1
            elif e.seq != b.pseq:  # released again since: re-key (it sinks)
                heap.replace_top(0.0, 0.0, b.pseq)
            else:
                heap.pop()
                b.version += 1
                return b
        return None

    # --- eviction -------------------------------------------------------------------------------

    def _adapt_up(self) -> None:  # a B1 ghost hit (the key still counted in B1)
        self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), float(self.c))

    def _adapt_down(self) -> None:  # a B2 ghost hit
        self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)

    def _replace(self, in_b2: bool) -> Block | None:
        """REPLACE: the list ``p`` prefers, or the other one when it has no evictable block."""
        n1: cython.longlong = self.n1
        first: cython.int = _T1 if n1 > 0 and (n1 > self.p or (n1 == self.p and in_b2)) else _T2
        b = self._lru(first)
        if b is None:
            first = _T2 if first == _T1 else _T1
            b = self._lru(first)
        self._dest = first  # T1 -> B1, T2 -> B2
        return b

    def victim(self) -> Block | None:
        live: cython.longlong = self.n1 + self.n2
        if live > self.c:
            self.c = live
        c: cython.longlong = self.c
        x = self._incoming()
        b: Block
        if x is not None and x in self.b1:  # case II
            self._adapt_up()
            b = self._replace(False)
            if b is not None:
                self.b1.remove(x)
                self._pending = x
        elif x is not None and x in self.b2:  # case III
            self._adapt_down()
            b = self._replace(True)
            if b is not None:
                self.b2.remove(x)
                self._pending = x
        else:
            self._absent = x  # a ghost in neither list (on_insert need not look again)
            if self.n1 + len(self.b1) >= c:  # case IV.A: |L1| = c
                if self.n1 < c:
                    b = self._replace(False)
                    if b is not None:
                        self.b1.pop_oldest()
                else:  # B1 is empty: T1's LRU block goes, remembered nowhere
                    b = self._lru(_T1)
                    self._dest = _GONE
            else:  # case IV.B
                b = self._replace(False)
                if b is not None and live + len(self.b1) + len(self.b2) >= 2 * c:
                    self.b2.pop_oldest()
        self._victim = b
        self._evicted = b is not None
        return b

    def on_evict(self, b: Block, now: float) -> None:
        # the block victim() returned goes where REPLACE said; any other (a pool's fallback)
        # to the ghost list of its own list
        dest = self._dest if b is self._victim else b.pdata
        self._victim = None
        if b.pdata == _T1:
            self.n1 -= 1
        elif b.pdata == _T2:
            self.n2 -= 1
        b.pdata = _GONE
        if dest in (_T1, _T2):
            key = b.key
            if self._absent is not None and key == self._absent:
                self._absent = None  # it becomes a ghost now
            if dest == _T1:
                self.b1.add(key)
            else:
                self.b2.add(key)

    # --- reporting ------------------------------------------------------------------------------

    def lists(self) -> dict[str, list]:
        """T1, T2 (evictable blocks' keys, least recently released first) and B1, B2 (LRU first);
        for tests and debugging: O(n log n)."""
        out: dict[str, list] = {}
        heap: KeyHeap
        for name, label, heap in (("T1", _T1, self._h1), ("T2", _T2, self._h2)):
            blocks = [e.b for e in heap._items]
            entries = sorted({(b.pseq, id(b)): b for b in blocks if b.pdata == label}.items())
            out[name] = [b.key for _, b in entries]
        out["B1"] = list(self.b1)
        out["B2"] = list(self.b2)
        return out

    def metrics(self) -> dict[str, float]:
        return {
            "p": float(self.p),
            "t1": float(self.n1),
            "t2": float(self.n2),
            "b1": float(len(self.b1)),
            "b2": float(len(self.b2)),
        }

    def params(self) -> dict[str, Any]:
        return {}
