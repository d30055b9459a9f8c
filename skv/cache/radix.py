"""The block cache: a forest of cached KV blocks with radix (SGLang-style) semantics.

Invariants:
- ``len(self) <= capacity_blocks`` at all times; a block is evicted before one is added when full.
- A block held by an in-flight request (``ref > 0``) is never evicted.
- Policies evict only unpinned blocks without cached children (leaves), so a cached block's
  whole chain is cached too and a lookup can stop at the first miss of each run.
- A lookup run starts at every chain root (``parents[i] is None``): once from the prompt start in
  prefix keying, once per reusable segment in segment keying. Hits are counted in blocks and
  tokens, per semantic type.

When a request needs more blocks than can be freed (everything else is pinned), its remaining
blocks are computed but not cached (counted in ``stats.uncached_blocks``).

This module is compiled with Cython when possible (``skv._build``): it is the replay hot path.
"""

from __future__ import annotations

from collections.abc import Sequence

import cython

from skv.blocks import RequestBlocks
from skv.cache.block import Block, CacheStats, GhostEntry, GhostList, Lease
from skv.model import NUM_TYPES


class BlockCache:
    """A capacity-bounded block cache driven by a pluggable eviction policy."""

    def __init__(
        self,
        capacity_blocks: int,
        policy: object,
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
        self.ghost = GhostList(capacity_blocks if ghost_capacity is None else ghost_capacity)
        self.eviction_log = [] if record_evictions else None
        self._requests = self._prompt_tokens = self._hit_tokens = 0
        self._blocks = self._hit_blocks = self._evictions = 0
        self._ghost_hits = self._uncached = 0
        self._hit_tok_by_type = [0] * NUM_TYPES
        self._hit_blk_by_type = [0] * NUM_TYPES
        self._evict_by_type = [0] * NUM_TYPES
        self._evict_by_reason = {}

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def stats(self) -> CacheStats:
        """A snapshot of the counters (the hot loop keeps them as plain C integers)."""
        return CacheStats(
            requests=self._requests,
            prompt_tokens=self._prompt_tokens,
            hit_tokens=self._hit_tokens,
            blocks=self._blocks,
            hit_blocks=self._hit_blocks,
            evictions=self._evictions,
            ghost_hits=self._ghost_hits,
            uncached_blocks=self._uncached,
            hit_tokens_by_type=list(self._hit_tok_by_type),
            hit_blocks_by_type=list(self._hit_blk_by_type),
            evictions_by_type=list(self._evict_by_type),
            evictions_by_reason=dict(self._evict_by_reason),
        )

    @property
    def pinned_blocks(self) -> int:
        return sum(1 for b in self.blocks.values() if b.ref > 0)

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

    def acquire(self, rb: RequestBlocks, now: cython.double) -> Lease:
        """Look the request up, pin its hits and cache its misses; returns what it holds."""
        blocks: dict = self.blocks
        policy: object = self.policy
        keys: list = rb.keys
        parents: list = rb.parents
        tokens: list = rb.tokens
        stypes: list = rb.stypes
        next_use: object = rb.next_use
        held: list = []
        n: cython.Py_ssize_t = len(keys)
        i: cython.Py_ssize_t
        hit_blocks: cython.longlong = 0
        hit_tokens: cython.longlong = 0
        tok: cython.longlong
        st: cython.Py_ssize_t
        in_run: cython.bint = False
        b: Block
        parent: Block
        prev: object = None
        for i in range(n):
            key = keys[i]
            if parents[i] is None:
                in_run = True
                prev = None
            found = blocks.get(key)
            if found is not None:
                b = found
                if not in_run:
                    raise AssertionError(f"block {key:#x} cached without its parent chain")
                if b.ref == 0:
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
                self._hit_tok_by_type[st] += tok
                self._hit_blk_by_type[st] += 1
            else:
                in_run = False
                # look the ghost up before evicting: the eviction may push this key out of it
                ghost = self.ghost.pop(key) if self.ghost.capacity else None
                if len(blocks) >= self.capacity_blocks and not self._evict_one(now, "capacity"):
                    self._uncached += n - i
                    break
                b = Block(key, prev, tokens[i], stypes[i], i, rb, now)
                if next_use is not None:
                    b.next_use = next_use[i]
                blocks[key] = b
                if prev is not None:
                    parent = prev
                    parent.n_children += 1
                b.ref = 1
                policy.on_insert(b, now)
                if ghost is not None:
                    self._ghost_hits += 1
                    policy.on_ghost_hit(b, ghost, now)
            held.append(b)
            prev = b
        self._requests += 1
        self._blocks += n
        self._prompt_tokens += rb.prompt_tokens
        self._hit_blocks += hit_blocks
        self._hit_tokens += hit_tokens
        return Lease(held, hit_blocks, hit_tokens)

    def release(self, lease: Lease, now: cython.double):
        """Unpin a finished request's blocks, tail first (so ties evict the tail first)."""
        policy: object = self.policy
        held: list = lease.blocks
        i: cython.Py_ssize_t
        b: Block
        for i in range(len(held) - 1, -1, -1):
            b = held[i]
            b.ref -= 1
            if b.ref == 0:
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
        for i in range(start, end):
            rb = trace[i]
            self.access(rb, rb.arrival_s)

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
        self._evictions += 1
        self._evict_by_type[b.stype] += 1
        self._evict_by_reason[reason] = self._evict_by_reason.get(reason, 0) + 1
        self.ghost.add(b.key, GhostEntry(b.stype, now, b.hits, b.tokens, b.pos))
        if self.eviction_log is not None:
            self.eviction_log.append((now, b.key, b.stype, reason))
        self.policy.on_evict(b, now)
        return True
