"""vLLM's block pool with the reuse order of its free cached blocks chosen by an skv policy.

This is the simulator's side of the vLLM eviction plugin (:mod:`skv.vllm.eviction_plugin`):
everything of :class:`skv.cache.vllm_pool.VllmBlockPool` (null block, block-aligned hits capped
at ``prompt_len - 1`` tokens, duplicates, unhashed blocks reused first, lazy eviction) except
that the cached free blocks are ordered by a policy through :class:`skv.cache.free_order.FreeOrder`,
the same object the plugin drives inside the engine. With ``lru`` it makes the choices of stock
vLLM (tests/test_policy_pool.py checks it against ``VllmBlockPool`` request by request).

Events happen in the engine's order: a request's hits are touched, then all of its new blocks are
taken from the free queue (evicting as needed), then the full ones are hashed (vLLM's
``allocate_slots``: ``touch``, ``get_new_blocks``, ``cache_full_blocks``). Decoding (``extend``)
takes one block at a time and hashes it once full, as decode steps do.

Plain Python (not on the replay hot path): it serves engine-sized traces, where the engine, not
the simulator, is the slow part.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from skv.cache.block import CacheStats, Counters, GhostList, Lease, new_lease
from skv.cache.free_order import FreeOrder
from skv.cache.vllm_pool import flat_admission_need

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks
    from skv.cache.policy import Policy


class PolicyBlockPool:
    """A vLLM block pool whose free cached blocks are reused in ``policy``'s order."""

    name = "vllm"

    def __init__(self, capacity_blocks: int, policy: Policy) -> None:
        if capacity_blocks < 2:
            raise ValueError(
                f"vllm needs >= 2 blocks (one is the null block), got {capacity_blocks}"
            )
        self.capacity_blocks = capacity_blocks
        ghost = capacity_blocks if getattr(policy, "uses_ghost_list", False) else 0
        self.order = FreeOrder(policy, ghost_capacity=ghost)
        self.policy = policy
        self.ref = [0] * capacity_blocks
        self.hash: list[object] = [None] * capacity_blocks
        #: free blocks without a hash, next to be reused first (vLLM's front of the queue)
        self.unhashed: deque[int] = deque(range(1, capacity_blocks))
        self.free_cached = 0
        self.cached: dict[object, int] = {}  # hash -> oldest block holding it
        self._copies: dict[object, list[int]] = {}
        self.counters = Counters()

    # --- the interface shared with BlockCache and VllmBlockPool -------------------------------

    def __len__(self) -> int:
        return len(self.order.blocks)

    @property
    def ghost(self) -> GhostList:
        """The policy's ghost list (capacity 0 unless the policy learns from one)."""
        return self.order.ghost

    @property
    def usable_blocks(self) -> int:
        return self.capacity_blocks - 1

    @property
    def pinned_blocks(self) -> int:
        return self.capacity_blocks - 1 - len(self.unhashed) - self.free_cached

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

    def _hit_count(self, rb: RequestBlocks) -> int:
        hits = 0
        for key, tok in zip(rb.keys, rb.tokens, strict=True):
            if tok != rb.block_size or key not in self.cached:
                break
            hits += 1
        return min(hits, max(0, rb.prompt_tokens - 1) // rb.block_size)

    def acquire(self, rb: RequestBlocks, now: float) -> Lease:
        if rb.parents.count(None) > 1:
            raise ValueError(
                f"request #{rb.index}: vllm models exact prefix caching; replay it with prefix "
                "keying (segment keying restarts chains, which vLLM cannot reuse)"
            )
        order = self.order
        order.begin(rb, now)
        n_hit = self._hit_count(rb)
        held: list[int] = []
        hit_tokens = 0
        for i in range(n_hit):
            blk = self.cached[rb.keys[i]]
            order.touched(blk, now)
            if self.ref[blk] == 0:
                self.free_cached -= 1
            self.ref[blk] += 1
            held.append(blk)
            hit_tokens += rb.tokens[i]
            self.counters.hit(rb.stypes[i], rb.tokens[i])
        n = len(rb.keys)
        new = [self._take(now) for _ in range(min(n - n_hit, self._nfree))]
        self.counters.uncached += n - n_hit - len(new)
        held.extend(new)
        for i in range(n_hit, n_hit + len(new)):
            if rb.tokens[i] == rb.block_size:
                self._hash_block(held[i], rb, i, rb.keys[i], rb.tokens[i], now)
        self.counters.request(n, rb.prompt_tokens, n_hit, hit_tokens)
        return new_lease(held, n_hit, hit_tokens)

    def extend(self, lease: Lease, rb: RequestBlocks, start: int, now: float) -> None:
        """Decode ``rb`` (prompt + output) into the lease from block ``start`` on: a held
        block that is now full gets its hash; new blocks are taken one at a time."""
        held: list[int] = lease.blocks
        bs = rb.block_size
        self.order.extend(rb, now)
        for i in range(start, len(rb.keys)):
            if i >= len(held):
                if self._nfree == 0:
                    return  # the engine would preempt; only prompts count as uncached
                held.append(self._take(now))
            blk = held[i]
            if self.hash[blk] is None and rb.tokens[i] == bs:
                self._hash_block(blk, rb, i, rb.keys[i], bs, now, count=False)

    def release(self, lease: Lease, now: float) -> None:
        """Free tail first, as vLLM does."""
        for blk in reversed(lease.blocks):
            self.ref[blk] -= 1
            if self.ref[blk] == 0:
                if self.hash[blk] is None:
                    self.unhashed.appendleft(blk)
                else:
                    self.free_cached += 1
            self.order.freed(blk, now)

    def access(self, rb: RequestBlocks, now: float) -> Lease:
        lease = self.acquire(rb, now)
        self.release(lease, now)
        return lease

    def replay(self, trace: list, start: int = 0, stop: int | None = None) -> None:
        for rb in trace[start:stop]:
            self.access(rb, rb.arrival_s)

    # --- internals ---------------------------------------------------------------------------

    @property
    def _nfree(self) -> int:
        return len(self.unhashed) + self.free_cached

    def _take(self, now: float) -> int:
        """A free block for new KV: an unhashed one first, else the policy's victim."""
        if self.unhashed:
            blk = self.unhashed.popleft()
        else:
            blk = self.order.evict(now)
            self.free_cached -= 1
            self._drop_hash(blk)
        self.ref[blk] = 1
        return blk

    def _hash_block(
        self,
        blk: int,
        rb: RequestBlocks,
        i: int,
        key: object,
        tokens: int,
        now: float,
        count: bool = True,
    ) -> None:
        """``count``: a prompt block (its ghost hit is reported, as ``VllmBlockPool`` reports
        prompt blocks only; the policy hears of every ghost hit either way)."""
        self.hash[blk] = key
        if key in self.cached:
            self._copies.setdefault(key, []).append(blk)
        else:
            self.cached[key] = blk
        ghosts = self.order.ghost_hits
        self.order.hashed(blk, key, tokens, rb.stypes[i], i, rb, self.ref[blk], now)
        if count:
            self.counters.ghost_hits += self.order.ghost_hits - ghosts

    def _drop_hash(self, blk: int) -> None:
        key = self.hash[blk]
        copies = self._copies.get(key)
        if self.cached[key] == blk:
            if copies:
                self.cached[key] = copies.pop(0)
            else:
                del self.cached[key]
        else:
            assert copies is not None
            copies.remove(blk)
        if copies is not None and not copies:
            del self._copies[key]
        self.hash[blk] = None
        self.counters.eviction(self.order.last_evicted.stype, "capacity")
