"""The block cache: a forest of cached KV blocks with radix (SGLang-style) semantics.

Invariants:
- ``len(self) <= capacity_blocks`` at all times; a block is evicted before one is added when full.
- A block held by an in-flight request (``ref > 0``) is never evicted.
- Leaf-only policies evict only unpinned blocks without cached children, so a cached block's
  whole chain is cached too and a lookup can stop at the first miss of each run.
- A lookup run starts at every chain root (``parents[i] is None``): once from the prompt start in
  prefix keying, once per reusable segment in segment keying. Hits are counted in blocks and
  tokens, per semantic type.

When a request needs more blocks than can be freed (everything else is pinned), its remaining
blocks are computed but not cached (counted in ``stats.uncached_blocks``).
"""

from __future__ import annotations

from collections.abc import Sequence

from skv.blocks import RequestBlocks
from skv.cache.block import Block, CacheStats, GhostEntry, GhostList, Lease
from skv.policies.base import Policy


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
        if not policy.leaf_only:
            raise ValueError(f"policy {policy.name!r} is not leaf-only; BlockCache needs one")
        self.capacity_blocks = capacity_blocks
        self.policy = policy
        self.blocks: dict[int, Block] = {}
        self.ghost = GhostList(capacity_blocks if ghost_capacity is None else ghost_capacity)
        self.stats = CacheStats()
        self.eviction_log: list[tuple[float, int, int, str]] | None = (
            [] if record_evictions else None
        )
        # hooks a policy leaves as no-ops are not called at all on the hot path
        self._on_pin = _overridden(policy, "on_pin")
        self._on_hit = _overridden(policy, "on_hit")
        self._on_insert = _overridden(policy, "on_insert")

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def pinned_blocks(self) -> int:
        return sum(1 for b in self.blocks.values() if b.ref > 0)

    def prepare(self, trace: Sequence[RequestBlocks]) -> None:
        self.policy.prepare(trace)

    def lookup(self, rb: RequestBlocks) -> int:
        """Number of blocks of ``rb`` a request would hit now (no side effects)."""
        blocks = self.blocks
        hits = 0
        in_run = False
        for key, parent in zip(rb.keys, rb.parents, strict=True):
            if parent is None:
                in_run = True
            if in_run and key in blocks:
                hits += 1
            else:
                in_run = False
        return hits

    def acquire(self, rb: RequestBlocks, now: float) -> Lease:
        """Look the request up, pin its hits and cache its misses; returns what it holds.

        Only hits are counted here; prompt totals per type come from the trace
        (``skv.replay.trace_totals``), which is the same for every policy.
        """
        blocks = self.blocks
        stats = self.stats
        keys = rb.keys
        parents = rb.parents
        tokens = rb.tokens
        stypes = rb.stypes
        next_use = rb.next_use
        on_pin, on_hit, on_insert = self._on_pin, self._on_hit, self._on_insert
        hit_tok_by_type = stats.hit_tokens_by_type
        hit_blk_by_type = stats.hit_blocks_by_type
        held: list[Block] = []
        hit_blocks = hit_tokens = 0
        in_run = False
        prev: Block | None = None
        i = 0
        for key in keys:
            if parents[i] is None:
                in_run = True
                prev = None
            b = blocks.get(key)
            if b is not None:
                if not in_run:
                    raise AssertionError(f"block {key:#x} cached without its parent chain")
                if b.ref == 0 and on_pin is not None:
                    on_pin(b)
                b.ref += 1
                b.hits += 1
                b.last_access = now
                if next_use is not None:
                    b.next_use = next_use[i]
                if on_hit is not None:
                    on_hit(b, now)
                tok = tokens[i]
                hit_blocks += 1
                hit_tokens += tok
                hit_tok_by_type[stypes[i]] += tok
                hit_blk_by_type[stypes[i]] += 1
            else:
                in_run = False
                if len(blocks) >= self.capacity_blocks and not self._evict_one(now):
                    stats.uncached_blocks += len(keys) - i
                    break
                b = Block(key, prev, tokens[i], stypes[i], i, rb, now)
                if next_use is not None:
                    b.next_use = next_use[i]
                blocks[key] = b
                if prev is not None:
                    prev.n_children += 1
                b.ref = 1
                if on_insert is not None:
                    on_insert(b, now)
                if self.ghost.capacity:
                    ghost = self.ghost.pop(key)
                    if ghost is not None:
                        stats.ghost_hits += 1
                        self.policy.on_ghost_hit(b, ghost, now)
            held.append(b)
            prev = b
            i += 1
        stats.requests += 1
        stats.blocks += len(keys)
        stats.prompt_tokens += rb.prompt_tokens
        stats.hit_blocks += hit_blocks
        stats.hit_tokens += hit_tokens
        return Lease(held, hit_blocks, hit_tokens)

    def release(self, lease: Lease, now: float) -> None:
        """Unpin a finished request's blocks, tail first (so ties evict the tail first)."""
        on_unpin = self.policy.on_unpin
        for b in reversed(lease.blocks):
            b.ref -= 1
            if b.ref == 0:
                on_unpin(b, now)

    def access(self, rb: RequestBlocks, now: float) -> Lease:
        """Acquire and release at once: cache-only replay with no time in flight."""
        lease = self.acquire(rb, now)
        self.release(lease, now)
        return lease

    def _evict_one(self, now: float, reason: str = "capacity") -> bool:
        b = self.policy.victim()
        if b is None:
            return False
        del self.blocks[b.key]
        parent = b.parent
        if parent is not None:
            parent.n_children -= 1
            if parent.n_children == 0 and parent.ref == 0:
                self.policy.on_leaf(parent, now)
        b.parent = None
        stats = self.stats
        stats.evictions += 1
        stats.evictions_by_type[b.stype] += 1
        stats.evictions_by_reason[reason] = stats.evictions_by_reason.get(reason, 0) + 1
        self.ghost.add(b.key, GhostEntry(b.stype, now, b.hits, b.tokens, b.pos))
        if self.eviction_log is not None:
            self.eviction_log.append((now, b.key, b.stype, reason))
        self.policy.on_evict(b, now)
        return True


def _overridden(policy: Policy, hook: str):
    """The bound hook, or None when the policy inherits the base class's no-op."""
    return None if getattr(type(policy), hook) is getattr(Policy, hook) else getattr(policy, hook)
