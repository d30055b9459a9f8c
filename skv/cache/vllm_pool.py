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

from collections import OrderedDict

from skv.blocks import RequestBlocks
from skv.cache.block import CacheStats, GhostEntry, GhostList, Lease

NULL_BLOCK = 0


class VllmBlockPool:
    """Exact vLLM prefix caching; same ``acquire``/``release`` interface as ``BlockCache``."""

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
        self.capacity_blocks = capacity_blocks
        n = capacity_blocks
        self.ref = [0] * n
        self.hash: list[int | None] = [None] * n
        self.stype = [0] * n
        self.tokens = [0] * n
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, n))
        #: hash -> physical blocks holding it, oldest first (lookups take the first)
        self.cached: dict[int, list[int]] = {}
        # vLLM has no ghost list; keep one only when asked (for "missed after eviction" counts)
        self.ghost = GhostList(ghost_capacity or 0)
        self.stats = CacheStats()
        self.eviction_log: list[tuple[float, int, int, str]] | None = (
            [] if record_evictions else None
        )

    def __len__(self) -> int:
        """Blocks holding cached (hashed) content."""
        return sum(len(v) for v in self.cached.values())

    def prepare(self, trace: object) -> None:
        pass

    def lookup(self, rb: RequestBlocks) -> int:
        return self._hit_count(rb)

    def _hit_count(self, rb: RequestBlocks) -> int:
        cached = self.cached
        bs = rb.block_size
        hits = 0
        for key, tok in zip(rb.keys, rb.tokens, strict=True):
            if tok != bs or key not in cached:
                break
            hits += 1
        return min(hits, max(0, rb.prompt_tokens - 1) // bs)

    def acquire(self, rb: RequestBlocks, now: float) -> Lease:
        if rb.parents.count(None) > 1:
            raise ValueError(
                f"request #{rb.index}: vllm models exact prefix caching; replay it with prefix "
                "keying (segment keying restarts chains, which vLLM cannot reuse)"
            )
        stats = self.stats
        bs = rb.block_size
        keys, tokens, stypes = rb.keys, rb.tokens, rb.stypes
        n_hit = self._hit_count(rb)
        held: list[int] = []
        hit_tokens = 0
        for i in range(n_hit):  # touch: a hit leaves the free queue
            blk = self.cached[keys[i]][0]
            if self.ref[blk] == 0:
                del self.free[blk]
            self.ref[blk] += 1
            held.append(blk)
            tok = tokens[i]
            hit_tokens += tok
            stats.hit_tokens_by_type[stypes[i]] += tok
            stats.hit_blocks_by_type[stypes[i]] += 1
        for i in range(n_hit, len(keys)):
            if not self.free:
                stats.uncached_blocks += len(keys) - i
                break
            key = keys[i]
            full = tokens[i] == bs  # cache_full_blocks: only full blocks get a hash
            # look the ghost up before the eviction below can put this very key into it
            ghost = self.ghost.pop(key) if full else None
            blk, _ = self.free.popitem(last=False)
            self._evict_hash(blk, now)
            self.ref[blk] = 1
            held.append(blk)
            if full:
                self.hash[blk] = key
                self.stype[blk] = stypes[i]
                self.tokens[blk] = bs
                self.cached.setdefault(key, []).append(blk)
                self.ghost.pop(key)  # cached again: drop what evicting this very block recorded
                if ghost is not None:
                    stats.ghost_hits += 1
        stats.requests += 1
        stats.blocks += len(keys)
        stats.prompt_tokens += rb.prompt_tokens
        stats.hit_blocks += n_hit
        stats.hit_tokens += hit_tokens
        return Lease(held, n_hit, hit_tokens)

    def release(self, lease: Lease, now: float) -> None:
        """Free tail first; an unhashed (partial) block goes to the front of the queue."""
        for blk in reversed(lease.blocks):
            self.ref[blk] -= 1
            if self.ref[blk] == 0:
                self.free[blk] = None
                if self.hash[blk] is None:
                    self.free.move_to_end(blk, last=False)

    def access(self, rb: RequestBlocks, now: float) -> Lease:
        lease = self.acquire(rb, now)
        self.release(lease, now)
        return lease

    def replay(self, trace: list, start: int = 0, stop: int | None = None) -> None:
        """``access`` every request of ``trace[start:stop]`` at its arrival time."""
        for i in range(start, len(trace) if stop is None else stop):
            rb = trace[i]
            self.access(rb, rb.arrival_s)

    def _evict_hash(self, blk: int, now: float) -> None:
        key = self.hash[blk]
        if key is None:
            return
        holders = self.cached[key]
        holders.remove(blk)
        if not holders:
            del self.cached[key]
            self.ghost.add(key, GhostEntry(self.stype[blk], now, 0, self.tokens[blk], 0))
        self.hash[blk] = None
        st = self.stype[blk]
        stats = self.stats
        stats.evictions += 1
        stats.evictions_by_type[st] += 1
        stats.evictions_by_reason["capacity"] = stats.evictions_by_reason.get("capacity", 0) + 1
        if self.eviction_log is not None:
            self.eviction_log.append((now, key, st, "capacity"))
