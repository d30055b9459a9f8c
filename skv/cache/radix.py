"""The block cache: a forest of cached KV blocks with radix (SGLang-style) semantics.

Invariants:
- ``len(self) <= capacity_blocks`` at all times; a block is evicted before one is added when full.
- A block held by an in-flight request (``ref > 0``) is never evicted.
- Policies evict only unpinned blocks without cached children (leaves), so a cached block's
  whole chain is cached too and a lookup can stop at the first miss of each run.
- A lookup run starts at every chain root (``parents[i] is None``): once from the prompt start in
  prefix keying, once per reusable segment in segment keying. Hits are counted in blocks and
  tokens, per semantic type.

When a request needs more blocks than can be freed (everything else is pinned), the rest of
that chain is computed but not cached (counted in ``stats.uncached_blocks``); a later chain root
of the same request may still hit.

This module is compiled with Cython when possible (``skv._build``): it is the replay hot path.
"""

from __future__ import annotations

from collections.abc import Sequence

import cython

from skv.blocks import RequestBlocks
from skv.cache.block import (
    Block,
    CacheStats,
    Counters,
    GhostList,
    Lease,
    new_block,
    new_lease,
)
from skv.cache.policy import Policy


class BlockCache:
    """A capacity-bounded block cache driven by a pluggable eviction policy."""

    def __init__(
        self,
        capacity_blocks: int,
        policy: Policy,
        *,
        ghost_capacity: int | None = None,
        record_evictions: bool = False,
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        if not getattr(policy, "leaf_only", True):
            name = getattr(policy, "name", type(policy).__name__)
            raise ValueError(f"policy {name!r} is not leaf-only; BlockCache needs one")
        self.capacity_blocks = capacity_blocks
        self.policy = policy
        self.blocks = {}
        if ghost_capacity is None:  # kept only for policies that learn from it (it costs time)
            ghost_capacity = capacity_blocks if getattr(policy, "uses_ghost_list", False) else 0
        self.ghost = GhostList(ghost_capacity)
        self.eviction_log = [] if record_evictions else None
        # a list to append every evicted block to, in eviction order (a tiered store demotes
        # them: skv.tiers); None: not kept
        self.evicted_blocks = None
        self.counters = Counters()
        self._pinned = 0
        self._last_hit_blocks = self._last_hit_tokens = 0

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def stats(self) -> CacheStats:
        """A snapshot of the counters (the hot loop keeps them as plain C integers)."""
        return self.counters.snapshot()

    @property
    def usable_blocks(self) -> int:
        """Blocks that can hold KV."""
        return self.capacity_blocks

    @property
    def pinned_blocks(self) -> int:
        """Blocks held by in-flight requests; every other cached block can be evicted."""
        return self._pinned

    def prepare(self, trace: Sequence[RequestBlocks]) -> None:
        self.policy.prepare(trace)

    def lookup(self, rb: RequestBlocks) -> int:
        """Number of blocks of ``rb`` a request would hit now (no side effects)."""
        hits = 0
        in_run = False
        for key, parent in zip(rb.keys, rb.parents, strict=True):
            if parent is None:
                in_run = True
            if in_run and key in self.blocks:
                hits += 1
            else:
                in_run = False
        return hits

    def admission_need(self, rb: RequestBlocks) -> int:
        """Blocks admitting ``rb`` takes from the free pool (no side effects): its misses plus
        the hits no request holds, which pinning removes from the evictable pool (vLLM v1's
        ``get_num_blocks_to_allocate`` counts them the same way)."""
        need = 0
        in_run = False
        for key, parent in zip(rb.keys, rb.parents, strict=True):
            if parent is None:
                in_run = True
            b = self.blocks.get(key) if in_run else None
            if b is None:
                in_run = False
                need += 1
            elif b.ref == 0:
                need += 1
        return need

    def acquire(self, rb: RequestBlocks, now: cython.double) -> Lease:
        """Look the request up, pin its hits and cache its misses; returns what it holds."""
        held: list = []
        self._acquire_into(rb, now, held, 0, True)
        return new_lease(held, self._last_hit_blocks, self._last_hit_tokens)

    def extend(self, lease: Lease, rb: RequestBlocks, start: int, now: float) -> None:
        """Grow an in-flight request by blocks ``start:`` of ``rb`` (its prompt plus generated
        output; block ``start - 1`` is the lease's), pinned with the rest of the lease and not
        counted as lookups or hits."""
        if (
            start == 0
            or start >= len(rb.keys)
            or len(lease.blocks) < start
            or lease.blocks[start - 1].key != rb.parents[start]
        ):
            return  # the chain the output continues is not cached: neither can the output be
        self._acquire_into(rb, now, lease.blocks, start, False)

    def _acquire_into(
        self,
        rb: RequestBlocks,
        now: cython.double,
        held: list,
        start: cython.Py_ssize_t,
        count: cython.bint,
    ) -> None:
        """``acquire``'s work from block ``start`` on, appending what it pins to ``held``; a
        non-zero ``start`` continues the chain of ``held[start - 1]``. ``count``: a new request
        (lookups and hits are counted)."""
        blocks: dict = self.blocks
        policy: Policy = self.policy
        keys: list = rb.keys
        parents: list = rb.parents
        tokens: list = rb.tokens
        stypes: list = rb.stypes
        next_use: object = rb.next_use
        n: cython.Py_ssize_t = len(keys)
        if count:
            policy.on_request(rb, now)
        else:
            policy.on_extend(rb, now)
        i: cython.Py_ssize_t
        hit_blocks: cython.longlong = 0
        hit_tokens: cython.longlong = 0
        tok: cython.longlong
        st: cython.Py_ssize_t
        in_run: cython.bint = start > 0
        uncachable: cython.bint = False
        b: Block
        parent: Block
        prev: object = held[start - 1] if start > 0 else None
        for i in range(start, n):
            key = keys[i]
            if parents[i] is None:
                in_run = True
                uncachable = False
                prev = None
            found = blocks.get(key)
            if found is not None:
                b = found
                if not in_run:
                    raise AssertionError(f"block {key:#x} cached without its parent chain")
                if b.ref == 0:
                    self._pinned += 1
                    policy.on_pin(b)
                b.ref += 1
                b.hits += 1
                b.last_access = now
                if next_use is not None:
                    b.next_use = next_use[i]
                policy.on_hit(b, now)
                tok = tokens[i]
                st = stypes[i]
                hit_blocks += 1
                hit_tokens += tok
                if count:
                    self.counters.hit(st, tok)
            else:
                in_run = False
                if uncachable:  # its parent could not be cached: computed, not cached
                    self.counters.uncached += 1
                    continue
                # look the ghost up before evicting: the eviction may push this key out of it
                ghost = self.ghost.pop(key) if self.ghost.capacity else None
                if len(blocks) >= self.capacity_blocks and not self._evict_one(now, "capacity"):
                    # everything left is pinned: the rest of this chain is computed, not cached
                    # (a later chain root may still hit)
                    self.counters.uncached += 1
                    uncachable = True
                    continue
                b = new_block(key, prev, tokens[i], stypes[i], i, rb, now)
                if next_use is not None:
                    b.next_use = next_use[i]
                blocks[key] = b
                if prev is not None:
                    parent = prev
                    parent.n_children += 1
                b.ref = 1
                self._pinned += 1
                policy.on_insert(b, now)
                if ghost is not None:
                    self.counters.ghost_hits += 1
                    policy.on_ghost_hit(b, ghost, now)
            held.append(b)
            prev = b
        if count:
            self.counters.request(n, rb.prompt_tokens, hit_blocks, hit_tokens)
        self._last_hit_blocks = hit_blocks
        self._last_hit_tokens = hit_tokens

    def release(self, lease: Lease, now: cython.double):
        """Unpin a finished request's blocks, tail first (so ties evict the tail first)."""
        self._release_list(lease.blocks, now)

    def _release_list(self, held: list, now: cython.double) -> None:
        policy: Policy = self.policy
        i: cython.Py_ssize_t
        b: Block
        for i in range(len(held) - 1, -1, -1):
            b = held[i]
            b.ref -= 1
            if b.ref == 0:
                self._pinned -= 1
                policy.on_unpin(b, now)

    def access(self, rb: RequestBlocks, now: cython.double) -> Lease:
        """Acquire and release at once: cache-only replay with no time in flight."""
        lease: Lease = self.acquire(rb, now)
        self.release(lease, now)
        return lease

    def replay(self, trace: list, start: int = 0, stop: int | None = None) -> None:
        """``access`` every request of ``trace[start:stop]`` at its arrival time."""
        rb: RequestBlocks
        i: cython.Py_ssize_t
        end: cython.Py_ssize_t = len(trace) if stop is None else stop
        held: list = []
        for i in range(start, end):
            rb = trace[i]
            self._acquire_into(rb, rb.arrival_s, held, 0, True)
            self._release_list(held, rb.arrival_s)
            del held[:]

    def _evict_one(self, now: cython.double, reason: str) -> cython.bint:
        found = self.policy.victim()
        if found is None:
            return False
        b: Block = found
        del self.blocks[b.key]
        if b.parent is not None:
            parent: Block = b.parent
            parent.n_children -= 1
            if parent.n_children == 0 and parent.ref == 0:
                self.policy.on_leaf(parent, now)
        b.parent = None
        self.counters.eviction(b.stype, reason)
        self.ghost.remember(b, now)
        if self.eviction_log is not None:
            self.eviction_log.append((now, b.key, b.stype, reason))
        if self.evicted_blocks is not None:
            self.evicted_blocks.append(b)
        self.policy.on_evict(b, now)
        return True
