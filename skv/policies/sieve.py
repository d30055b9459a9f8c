"""``sieve``: SIEVE (Zhang, Yang, Yue, Vigfusson, Rashmi, "SIEVE is Simpler than LRU: an
Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI 2024), with leaf-only eviction.

The algorithm: blocks sit in one FIFO queue in insertion order, each with a visited bit that a
hit sets; a hand moves from the oldest end towards the newest, clearing visited bits, and
evicts the first unvisited block it meets, staying there for the next eviction (wrapping back to
the oldest end after the newest). New blocks enter at the newest end, unvisited; hits never
move a block.

On a flat trace (one single-block request per access) this is exactly SIEVE, and libCacheSim's
``Sieve`` makes the same evictions (``tests/test_libcachesim.py``): the queue is insertion order,
the hand starts at the oldest block, after an eviction it points at the evicted block's newer
neighbour, and when it passes the newest block it restarts from the oldest.

What was adapted for prefix trees: only unpinned leaves may be evicted. When the hand reaches a
block that is pinned or has cached children, it takes that block out of the queue (its visited
bit unchanged) and moves on; when the block becomes evictable again (released as a leaf, or its
last child evicted: ``on_unpin`` / ``on_leaf``) it rejoins the queue just behind the hand, as if
the hand had just passed it, so the hand examines it again one sweep later. A pinned block is in
use, so surviving the sweep that meets it is the visited-bit treatment it would get anyway; a
parent survives while its children are cached.

Ordering invariant: the queue (a circular intrusive list through ``link_prev``/``link_next``
with a sentinel between the newest and the oldest block) holds insertion order, except that a
block taken out by the hand re-enters behind it; ``pdata`` is the visited bit. Every block in
the queue is cached; a cached block is out of the queue only while it is not evictable (checked
by the hand, never assumed).

Complexity: O(1) per insert, hit, release and ``on_leaf``; ``victim()`` is amortised O(1): each
step of the hand clears a visited bit (set by a hit), takes out a non-evictable block (which
entered the queue by an insert or a re-entry, O(1) events that each pay for one such step) or
evicts, so the hand's steps are bounded by hits + inserts + re-entries + evictions. A single
eviction can still walk the whole queue (as in SIEVE itself, when every block is visited).
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.block_queue import link_before, sentinel, unlink


class Sieve(Policy):
    name = "sieve"

    def __init__(self) -> None:
        self._s = s = sentinel()  # s.link_next is the oldest block
        self._hand = s  # the next block to examine; the sentinel: start from the oldest
        self.hand_steps = 0  # blocks the hand has examined, over the whole run

    def on_insert(self, b: Block, now: float) -> None:
        b.pdata = False
        link_before(b, self._s)  # the newest end

    def on_hit(self, b: Block, now: float) -> None:
        b.pdata = True

    def on_unpin(self, b: Block, now: float) -> None:
        if b.link_next is None and not b.n_children:
            link_before(b, self._hand)  # just behind the hand

    def on_leaf(self, b: Block, now: float) -> None:
        if b.link_next is None:
            link_before(b, self._hand)

    def victim(self) -> Block | None:
        s: Block = self._s
        b: Block = self._hand
        while True:
            self.hand_steps += 1
            if b is s:
                b = s.link_next
                if b is s:  # nothing evictable is queued
                    self._hand = s
                    return None
            nxt: Block = b.link_next
            if b.ref or b.n_children:  # out of the queue until it is evictable again
                unlink(b)
            elif b.pdata:
                b.pdata = False
            else:
                self._hand = nxt
                unlink(b)
                return b
            b = nxt

    def on_evict(self, b: Block, now: float) -> None:
        if b.link_next is not None:  # not the block victim() gave (a pool's fallback)
            if self._hand is b:
                self._hand = b.link_next
            unlink(b)

    def metrics(self) -> dict[str, float]:
        return {"hand_steps": float(self.hand_steps)}

    def params(self) -> dict[str, Any]:
        return {}
