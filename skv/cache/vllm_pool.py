"""vLLM V1's block pool, modelled block for block (``vllm/v1/core/block_pool.py``).

Invariants (as in vLLM 0.3x):
- ``num_gpu_blocks`` physical blocks; block 0 is the null block and never holds KV.
- Free blocks sit in one queue; allocation pops the front and, if the popped block still holds
  a cached hash, evicts that hash then (lazy eviction). A hit takes the block out of the queue.
- A finished request frees its blocks in reverse order (tail first) to the back of the queue,
  so the queue is LRU on the time a block was last freed, ties broken tail first. Its
  unhashed partial last block goes to the FRONT and is reused first.
- Only full blocks get a hash. No cascade: evicting a parent leaves its children cached but
  unreachable, since a lookup stops at the first miss. A recomputed block whose hash is still
  cached is cached again as a duplicate (vLLM keeps several blocks per hash).
- A hit is block-aligned and capped at ``prompt_len - 1`` tokens (the last token is computed).

So cached content lives in ``num_gpu_blocks - 2`` blocks when prompts end in a partial block
and ``num_gpu_blocks - 1`` when they are block-aligned.
"""

from __future__ import annotations

from array import array
from typing import Any

import cython

from skv.blocks import RequestBlocks
from skv.cache.block import CacheStats, Counters, GhostEntry, GhostList, Lease, new_lease

NULL_BLOCK = 0


def _zeros(n: int) -> array:
    return array("q", bytes(8 * n))


def flat_admission_need(pool: Any, rb: RequestBlocks) -> int:
    """Blocks admitting ``rb`` takes from a flat pool's free blocks (``VllmBlockPool`` and
    ``PolicyBlockPool``; no side effects): its misses plus the hits no request holds, which
    pinning removes from the free queue (vLLM v1's ``get_num_blocks_to_allocate`` counts them
    the same way)."""
    n_hit: cython.Py_ssize_t = pool.lookup(rb)
    ref = pool.ref  # read once: each read of a compiled pool's array makes a memoryview
    cached: dict = pool.cached
    keys: list = rb.keys
    unheld: cython.Py_ssize_t = 0
    i: cython.Py_ssize_t
    for i in range(n_hit):
        if ref[cached[keys[i]]] == 0:
            unheld += 1
    return len(keys) - n_hit + unheld


class VllmBlockPool:
    """Exact vLLM prefix caching; same ``acquire``/``release`` interface as ``BlockCache``.

    The free queue is a doubly linked list over block ids (``_prev``/``_next``, with a sentinel
    at index ``capacity_blocks``), as vLLM's ``FreeKVCacheBlockQueue``: O(1) to take a block out,
    pop the front, or append at either end. A block is in the queue exactly when its ``ref`` is
    0 (the null block excepted).
    """

    name = "vllm"

    def __init__(
        self,
        capacity_blocks: int,
        *,
        ghost_capacity: int | None = None,
        record_evictions: bool = False,
    ) -> None:
        if capacity_blocks < 2:
            raise ValueError(
                f"vllm needs >= 2 blocks (one is the null block), got {capacity_blocks}"
            )
        n = capacity_blocks
        self.capacity_blocks = n
        self.ref = _zeros(n)
        self.hash = [None] * n
        self.stype = _zeros(n)
        self.tokens = _zeros(n)
        self._prev = _zeros(n + 1)
        self._next = _zeros(n + 1)
        self._prev[n] = self._next[n] = n  # empty queue: the sentinel points at itself
        self._nfree = 0
        for blk in range(1, n):
            self._push_back(blk)
        #: hash -> the oldest block holding it (what a lookup gets)
        self.cached = {}
        #: hash -> later blocks holding the same hash (duplicates), oldest first
        self._copies = {}
        # vLLM has no ghost list; keep one only when asked (for "missed after eviction" counts)
        self.ghost = GhostList(ghost_capacity or 0)
        self.eviction_log = [] if record_evictions else None
        self.counters = Counters()

    # --- the free queue --------------------------------------------------------------------

    def _unlink(self, blk: cython.Py_ssize_t) -> None:
        p: cython.Py_ssize_t = self._prev[blk]
        q: cython.Py_ssize_t = self._next[blk]
        self._next[p] = q
        self._prev[q] = p
        self._nfree -= 1

    def _push_back(self, blk: cython.Py_ssize_t) -> None:
        s: cython.Py_ssize_t = self.capacity_blocks
        last: cython.Py_ssize_t = self._prev[s]
        self._next[last] = blk
        self._prev[blk] = last
        self._next[blk] = s
        self._prev[s] = blk
        self._nfree += 1

    def _push_front(self, blk: cython.Py_ssize_t) -> None:
        s: cython.Py_ssize_t = self.capacity_blocks
        first: cython.Py_ssize_t = self._next[s]
        self._prev[first] = blk
        self._next[blk] = first
        self._prev[blk] = s
        self._next[s] = blk
        self._nfree += 1

    @property
    def free(self) -> list[int]:
        """The free queue, front (next to be reused) first."""
        out = []
        blk = self._next[self.capacity_blocks]
        while blk != self.capacity_blocks:
            out.append(blk)
            blk = self._next[blk]
        return out

    # --- the interface shared with BlockCache ----------------------------------------------

    def __len__(self) -> int:
        """Blocks holding cached (hashed) content."""
        return len(self.cached) + sum(len(v) for v in self._copies.values())

    @property
    def usable_blocks(self) -> int:
        """Blocks that can hold KV (all but the null block)."""
        return self.capacity_blocks - 1

    @property
    def pinned_blocks(self) -> int:
        """Blocks held by in-flight requests (the null block aside, the rest are free)."""
        return self.capacity_blocks - 1 - self._nfree

    def holders(self, key: object) -> list[int]:
        """Every block holding ``key``, oldest first (several after a recompute)."""
        if key not in self.cached:
            return []
        return [self.cached[key], *self._copies.get(key, [])]

    @property
    def stats(self) -> CacheStats:
        return self.counters.snapshot()

    def prepare(self, trace: object) -> None:
        pass

    def lookup(self, rb: RequestBlocks) -> int:
        return self._hit_count(rb)

    def admission_need(self, rb: RequestBlocks) -> int:
        return flat_admission_need(self, rb)

    def _hit_count(self, rb: RequestBlocks) -> cython.Py_ssize_t:
        cached: dict = self.cached
        keys: list = rb.keys
        tokens: list = rb.tokens
        bs: cython.Py_ssize_t = rb.block_size
        hits: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            if tokens[i] != bs or keys[i] not in cached:
                break
            hits += 1
        return min(hits, max(0, rb.prompt_tokens - 1) // bs)

    def acquire(self, rb: RequestBlocks, now: cython.double) -> Lease:
        if rb.parents.count(None) > 1:
            raise ValueError(
                f"request #{rb.index}: vllm models exact prefix caching; replay it with prefix "
                "keying (segment keying restarts chains, which vLLM cannot reuse)"
            )
        keys: list = rb.keys
        tokens: list = rb.tokens
        stypes: list = rb.stypes
        n: cython.Py_ssize_t = len(keys)
        n_hit: cython.Py_ssize_t = self._hit_count(rb)
        held: list = []
        hit_tokens: cython.longlong = 0
        i: cython.Py_ssize_t
        blk: cython.Py_ssize_t
        tok: cython.Py_ssize_t
        st: cython.Py_ssize_t
        for i in range(n_hit):  # touch: a hit leaves the free queue
            blk = self.cached[keys[i]]
            if self.ref[blk] == 0:
                self._unlink(blk)
            self.ref[blk] += 1
            held.append(blk)
            tok = tokens[i]
            st = stypes[i]
            hit_tokens += tok
            self.counters.hit(st, tok)
        self._allocate(rb, n_hit, held, now, True)
        self.counters.request(n, rb.prompt_tokens, n_hit, hit_tokens)
        return new_lease(held, n_hit, hit_tokens)

    def extend(self, lease: Lease, rb: RequestBlocks, start: int, now: float) -> None:
        """Grow an in-flight request to ``rb`` (prompt + generated output) from block ``start``
        on: vLLM decodes into the blocks the request already holds (the prompt's partial last
        block fills up in place and is hashed once full), then allocates new ones as tokens
        arrive and hashes the full ones."""
        held: list = lease.blocks
        i: cython.Py_ssize_t = start
        while i < len(held) and i < len(rb.keys):
            blk = held[i]
            if self.hash[blk] is None and rb.tokens[i] == rb.block_size:
                self._hash_block(blk, rb.keys[i], rb.stypes[i], rb.block_size)
            i += 1
        self._allocate(rb, i, held, now, False)

    def _hash_block(
        self, blk: cython.Py_ssize_t, key: object, st: cython.longlong, bs: cython.longlong
    ) -> None:
        """A held block became full: it gets ``key`` (``cache_full_blocks``); a hash already
        cached elsewhere makes it a duplicate."""
        self.hash[blk] = key
        self.stype[blk] = st
        self.tokens[blk] = bs
        if key in self.cached:
            self._copies.setdefault(key, []).append(blk)
        else:
            self.cached[key] = blk
        if self.ghost.capacity:
            self.ghost.pop(key)  # cached again: drop what evicting this block recorded

    def _allocate(
        self,
        rb: RequestBlocks,
        start: cython.Py_ssize_t,
        held: list,
        now: cython.double,
        count: cython.bint,
    ) -> None:
        """New blocks for ``rb``'s blocks ``start:`` from the front of the free queue (lazily
        evicting what they held); full ones get their hash (``cache_full_blocks``)."""
        bs: cython.Py_ssize_t = rb.block_size
        keys: list = rb.keys
        tokens: list = rb.tokens
        stypes: list = rb.stypes
        n: cython.Py_ssize_t = len(keys)
        i: cython.Py_ssize_t
        blk: cython.Py_ssize_t
        for i in range(start, n):
            if self._nfree == 0:
                if count:
                    self.counters.uncached += n - i
                break
            key = keys[i]
            full: cython.bint = tokens[i] == bs
            # look the ghost up before the eviction below can put this very key into it
            ghost = self.ghost.pop(key) if full and self.ghost.capacity else None
            blk = self._next[self.capacity_blocks]
            self._unlink(blk)
            self._evict_hash(blk, now)
            self.ref[blk] = 1
            held.append(blk)
            if full:
                self._hash_block(blk, key, stypes[i], bs)
                if ghost is not None and count:
                    self.counters.ghost_hits += 1

    def release(self, lease: Lease, now: cython.double) -> None:
        """Free tail first; an unhashed (partial) block goes to the front of the queue."""
        held: list = lease.blocks
        i: cython.Py_ssize_t
        blk: cython.Py_ssize_t
        for i in range(len(held) - 1, -1, -1):
            blk = held[i]
            self.ref[blk] -= 1
            if self.ref[blk] == 0:
                if self.hash[blk] is None:
                    self._push_front(blk)
                else:
                    self._push_back(blk)

    def access(self, rb: RequestBlocks, now: cython.double) -> Lease:
        lease: Lease = self.acquire(rb, now)
        self.release(lease, now)
        return lease

    def replay(self, trace: list, start: int = 0, stop: int | None = None) -> None:
        """``access`` every request of ``trace[start:stop]`` at its arrival time."""
        rb: RequestBlocks
        i: cython.Py_ssize_t
        for i in range(start, len(trace) if stop is None else stop):
            rb = trace[i]
            self.access(rb, rb.arrival_s)

    def _evict_hash(self, blk: cython.Py_ssize_t, now: cython.double) -> None:
        key = self.hash[blk]
        if key is None:
            return
        copies = self._copies.get(key)
        if self.cached[key] == blk:
            if copies:
                self.cached[key] = copies.pop(0)
            else:
                del self.cached[key]
                if self.ghost.capacity:
                    self.ghost.add(key, GhostEntry(self.stype[blk], now, 0, self.tokens[blk], 0))
        else:
            copies.remove(blk)
        if copies is not None and not copies:
            del self._copies[key]
        self.hash[blk] = None
        st: cython.Py_ssize_t = self.stype[blk]
        self.counters.eviction(st, "capacity")
        if self.eviction_log is not None:
            self.eviction_log.append((now, key, st, "capacity"))
