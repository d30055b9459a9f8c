"""``s3fifo``: S3-FIFO (Yang, Zhang, Qiu, Yue, Vinayak: "FIFO queues are all you need for cache
eviction", SOSP 2023), as libCacheSim's ``S3FIFO`` implements it.

The algorithm in two lines: new blocks enter a small FIFO ``S`` (10% of the cache); a block
leaving ``S`` moves to the main FIFO ``M`` if it was reused at least ``move_to_main_threshold``
times there, else it is evicted and its key remembered in a ghost FIFO ``G`` (keys only, 90% of
the cache, plus one as in libCacheSim), and a block whose key is in ``G`` is inserted straight
into ``M``; ``M`` is a FIFO with reinsertion (a 2-bit CLOCK): its head is reinserted at the
tail with ``freq - 1`` while ``freq > 0``, and evicted at 0. Hits only bump a per-block
counter capped at 3.

libCacheSim's details, followed here: eviction takes from ``M`` when ``M`` holds more than its
share (``capacity - int(capacity * small_ratio)``) or ``S`` is empty, else from ``S``; leaving
``S`` goes on (more heads move to ``M``) until one block is evicted or ``S`` is empty, then ``M``
evicts; a block moved into ``M`` starts there with ``freq = 0``; and until the first eviction a
block that finds ``S`` full (``int(capacity * small_ratio)`` blocks) is inserted into ``M``
instead (libCacheSim's current ``S3FIFO.c``; its ``S3FIFOv0`` would keep filling ``S``).
The capacity is ``capacity_blocks`` or, when not given, the number of cached blocks at the first
eviction (the cache is full then): before that no block is evicted, so blocks are simply queued
in ``S`` in insertion order and the first eviction keeps the first ``int(capacity *
small_ratio)`` of them in ``S`` and moves the rest, in order, to ``M``: the same queues the
warm-up rule would have built. On a flat trace (one single-block request per access) the
evictions are exactly libCacheSim's (``tests/test_libcachesim.py``).

Prefix trees (only unpinned leaves are evictable): moving a head from ``S`` to ``M`` and
reinserting an ``M`` head are not evictions, so they happen whether the block is pinned or has
children. A head that would be *evicted* but is not evictable (pinned, or an inner node whose
children are cached) leaves its queue instead: it keeps its queue label, frequency and ghost
membership, and is appended at that queue's tail again when it becomes evictable (``on_unpin``
once unpinned and childless, ``on_leaf`` when its last child goes). So a busy block gets a
second pass through its queue rather than being skipped in place.

Ordering invariant: each queue is in order of (re)entry into it; ``S`` and ``M`` partition the
cached blocks (``b.pdata`` is the queue, ``b.pseq`` the frequency); a block is on its queue's
list exactly when ``b.link_next is not None``.

Complexity: O(1) per insert, hit and release; ``victim`` is O(1) amortised: every head it
passes over is moved (``S`` -> ``M``, at most once per stay in ``S``), reinserted in ``M`` (at
most 3 times per hit, since each pass lowers ``freq`` and hits raise it by one), or detached
(at most once per release or ``on_leaf`` event, which is what reattaches it). No randomness.
"""

from __future__ import annotations

from typing import Any

import cython

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.block_queue import KeyQueue, link_before, sentinel, unlink

SMALL = 0
MAIN = 1


class S3FIFO(Policy):
    name = "s3fifo"

    @cython.annotation_typing(False)  # the arguments are checked and converted as plain Python
    def __init__(
        self,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        move_to_main_threshold: int = 2,
        max_freq: int = 3,
        capacity_blocks: int | None = None,
    ) -> None:
        if not 0.0 <= small_ratio < 1.0:
            raise ValueError(f"s3fifo: small_ratio must be in [0, 1), got {small_ratio}")
        if ghost_ratio < 0.0:
            raise ValueError(f"s3fifo: ghost_ratio must be >= 0, got {ghost_ratio}")
        if move_to_main_threshold < 1 or max_freq < 1:
            raise ValueError("s3fifo: move_to_main_threshold and max_freq must be >= 1")
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError(f"s3fifo: capacity_blocks must be >= 1, got {capacity_blocks}")
        self.small_ratio = float(small_ratio)
        self.ghost_ratio = float(ghost_ratio)
        self.move_to_main_threshold = int(move_to_main_threshold)
        self.max_freq = int(max_freq)
        self.capacity_blocks = capacity_blocks
        self._small = sentinel()
        self._main = sentinel()
        self._n_small = 0  # blocks labelled SMALL (on the list or detached)
        self._n_main = 0
        self._live = 0
        self._main_cap = 0
        self._ghost_cap = 0
        self._started = False  # set at the first eviction
        self._ghost = KeyQueue()
        self.moved_to_main = 0
        self.ghost_admits = 0

    # -- hooks ---------------------------------------------------------------------------------

    def on_insert(self, b: Block, now: float) -> None:
        self._live += 1
        b.pseq = 0
        ghost: KeyQueue = self._ghost
        if ghost and b.key in ghost:
            ghost.remove(b.key)
            self.ghost_admits += 1
            b.pdata = MAIN
            self._n_main += 1
            link_before(b, self._main)
        else:
            b.pdata = SMALL
            self._n_small += 1
            link_before(b, self._small)

    def on_hit(self, b: Block, now: float) -> None:
        if b.pseq < self.max_freq:
            b.pseq += 1

    def on_unpin(self, b: Block, now: float) -> None:
        if b.link_next is None and not b.n_children:
            link_before(b, self._main if b.pdata == MAIN else self._small)

    def on_leaf(self, b: Block, now: float) -> None:
        if b.link_next is None:
            link_before(b, self._main if b.pdata == MAIN else self._small)

    def on_evict(self, b: Block, now: float) -> None:
        self._live -= 1
        if b.pdata == MAIN:
            self._n_main -= 1
        else:
            self._n_small -= 1
            if self._ghost_cap:
                ghost: KeyQueue = self._ghost
                if len(ghost) >= self._ghost_cap:
                    ghost.pop_oldest()
                ghost.add(b.key)

    # -- eviction ------------------------------------------------------------------------------

    def _start(self) -> None:
        """The first eviction: fix the queue sizes and apply the warm-up rule."""
        self._started = True
        cap = self.capacity_blocks if self.capacity_blocks is not None else self._live
        small_cap = int(cap * self.small_ratio)
        self._main_cap = cap - small_cap
        # libCacheSim's ghost FIFO holds one key more than int(capacity x ghost_ratio): with
        # exactly that many the flat traces differ from it, with one more they match
        ghost_cap = int(cap * self.ghost_ratio)
        self._ghost_cap = ghost_cap + 1 if ghost_cap > 0 else 0
        # until now every insert went to S in order; libCacheSim would have sent all but the
        # first small_cap of them to M (M is empty: no ghost entries before an eviction)
        if self._n_small > small_cap:
            small, main = self._small, self._main
            b: Block = small.link_next
            for _ in range(small_cap):
                b = b.link_next
            while b is not small:
                nxt: Block = b.link_next
                unlink(b)
                b.pdata = MAIN
                link_before(b, main)
                b = nxt
            self._n_main += self._n_small - small_cap
            self._n_small = small_cap

    def victim(self) -> Block | None:
        if not self._started:
            self._start()
        small: Block = self._small
        b: Block
        if self._n_main > self._main_cap or small.link_next is small:
            b = self._evict_main()
            if b is None:
                b = self._evict_small()
        else:
            b = self._evict_small()
            if b is None:
                b = self._evict_main()
        return b

    def _evict_small(self) -> Block | None:
        small: Block = self._small
        main: Block = self._main
        threshold: cython.longlong = self.move_to_main_threshold
        b: Block = small.link_next
        nxt: Block
        while b is not small:
            nxt = b.link_next
            unlink(b)
            if b.pseq >= threshold:  # reused in S: on to M, starting over at freq 0
                b.pdata = MAIN
                b.pseq = 0
                self._n_small -= 1
                self._n_main += 1
                self.moved_to_main += 1
                link_before(b, main)
            elif b.ref == 0 and b.n_children == 0:
                return b
            # else: pinned or inner: off the list until on_unpin/on_leaf puts it back
            b = nxt
        return None

    def _evict_main(self) -> Block | None:
        main: Block = self._main
        b: Block = main.link_next
        while b is not main:
            unlink(b)
            if b.pseq > 0:  # second chance: to the tail, one use spent
                b.pseq -= 1
                link_before(b, main)
            elif b.ref == 0 and b.n_children == 0:
                return b
            b = main.link_next
        return None

    # -- reporting -----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return {
            "small_blocks": float(self._n_small),
            "main_blocks": float(self._n_main),
            "ghost_keys": float(len(self._ghost)),
            "moved_to_main": float(self.moved_to_main),
            "ghost_admits": float(self.ghost_admits),
        }

    def params(self) -> dict[str, Any]:
        return {
            "small_ratio": self.small_ratio,
            "ghost_ratio": self.ghost_ratio,
            "move_to_main_threshold": self.move_to_main_threshold,
            "max_freq": self.max_freq,
            "capacity_blocks": self.capacity_blocks,
        }
