"""The order in which vLLM's block pool reuses free cached blocks, decided by an skv policy.

vLLM keeps free blocks in one queue: blocks without a hash at the front (reused first), cached
blocks behind them in the order they were freed (LRU). :class:`FreeOrder` keeps the same two
parts but lets a :class:`~skv.cache.policy.Policy` order the cached part. It is shared, line for
line, by the simulator (:class:`skv.cache.policy_pool.PolicyBlockPool`) and by the vLLM plugin
(:mod:`skv.vllm.eviction_plugin`): both call the same five methods at the same pool events, so
an engine running a policy and skv's simulation of it make the same choices for requests sent
one at a time, each prompt scheduled in one step (under concurrency, or with chunked prefill,
the engine interleaves the events differently and the two drift apart).

Pool events and the policy hooks they fire (as :class:`skv.cache.radix.BlockCache` fires them):

- ``begin(rb, now)``: a request is first scheduled -> ``on_request``;
- ``extend(rb, now)``: an in-flight request grows by its answer (the simulator's
  ``PolicyBlockPool.extend``; the plugin never calls it) -> ``on_extend``;
- ``touched(bid, now)``: a prefix hit takes block ``bid`` (free or held) -> ``on_pin`` when it
  was free, then ``on_hit``;
- ``hashed(bid, key, tokens, stype, i, rb, ref, now)``: held block ``bid`` became full and
  cached as block ``i`` of ``rb`` -> ``on_insert``, then ``on_ghost_hit`` if its key was
  evicted recently;
- ``freed(bid, now)``: a holder released ``bid`` -> ``on_unpin`` when no holder is left;
- ``evict(now)``: the pool needs a block and none is unhashed -> ``victim`` then ``on_evict``.

Invariants: an entry exists exactly for the blocks holding a hash; ``Block.ref`` equals the
pool's reference count of that block; every block has no children (vLLM's pool is flat: a lookup
stops at the first miss, so evicting a parent only makes its children unreachable). The policy
sees time only through ``now``; the plugin passes a logical clock when the client sends one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from skv.cache.block import Block, GhostList
from skv.model import TYPES

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks
    from skv.cache.policy import Policy


class FreeOrder:
    """Policy bookkeeping for the cached blocks of a flat (vLLM-style) pool, by block id."""

    def __init__(self, policy: Policy, *, ghost_capacity: int = 0) -> None:
        self.policy = policy
        #: block id -> its skv Block, for the blocks that hold a hash
        self.blocks: dict[int, Block] = {}
        #: the reverse map (a Block knows its key, not the physical block holding it)
        self._ids: dict[Block, int] = {}
        #: key -> how many blocks hold it (vLLM keeps duplicates); a key becomes a ghost only
        #: when its last holder is evicted
        self._holders: dict[object, int] = {}
        self.ghost = GhostList(ghost_capacity)
        self.evictions = 0
        #: victims the policy failed to give (None, pinned or unknown): served by a fallback
        self.fallbacks = 0
        self.evictions_by_type = [0] * len(TYPES)
        self.ghost_hits = 0
        #: the block the last ``evict`` dropped (its type, hits, ... for the pool's counters)
        self.last_evicted: Block | None = None

    def begin(self, rb: RequestBlocks, now: float) -> None:
        self.policy.on_request(rb, now)

    def extend(self, rb: RequestBlocks, now: float) -> None:
        self.policy.on_extend(rb, now)

    def touched(self, bid: int, now: float) -> None:
        b = self.blocks[bid]
        if b.ref == 0:
            self.policy.on_pin(b)
        b.ref += 1
        b.hits += 1
        b.last_access = now
        self.policy.on_hit(b, now)

    def hashed(
        self,
        bid: int,
        key: object,
        tokens: int,
        stype: int,
        i: int,
        rb: RequestBlocks,
        ref: int,
        now: float,
    ) -> None:
        """Block ``i`` of request ``rb`` (``tokens`` tokens of type ``stype``) is now cached in
        held block ``bid`` under ``key``; ``ref`` holders hold it."""
        if bid in self.blocks:
            raise AssertionError(f"block {bid} hashed twice without an eviction")
        ghost = self.ghost.pop(key) if self.ghost.capacity else None
        b = Block(key, None, tokens, stype, i, rb, now)
        b.ref = ref
        self.blocks[bid] = b
        self._ids[b] = bid
        self._holders[key] = self._holders.get(key, 0) + 1
        self.policy.on_insert(b, now)
        if ghost is not None:
            self.ghost_hits += 1
            self.policy.on_ghost_hit(b, ghost, now)

    def freed(self, bid: int, now: float) -> None:
        b = self.blocks.get(bid)
        if b is None:
            return  # an unhashed block: the pool reuses it first, the policy never sees it
        b.ref -= 1
        if b.ref == 0:
            self.policy.on_unpin(b, now)

    def evict(self, now: float) -> int:
        """The id of the cached free block to reuse next (its entry is dropped).

        A policy that names no victim, or a pinned or unknown one, is a bug in that policy; a
        serving engine must not die of it, so the oldest free cached block is taken instead
        and the event counted (``fallbacks``, logged once). Only when no free cached block
        exists at all is it an error (the pool asked for more than it has free)."""
        found = self.policy.victim()
        bid = self._ids.get(found) if found is not None else None
        if bid is None or found.ref:
            bid = self._fallback(found)
        b = self.blocks.pop(bid)
        del self._ids[b]
        left = self._holders[b.key] - 1
        if left:
            self._holders[b.key] = left
        else:
            del self._holders[b.key]
            self.ghost.remember(b, now)
        self.last_evicted = b
        self.evictions += 1
        self.evictions_by_type[b.stype] += 1
        self.policy.on_evict(b, now)
        return bid

    def _fallback(self, found: Block | None) -> int:
        for bid, b in self.blocks.items():
            if b.ref == 0:
                if not self.fallbacks:
                    log.error(
                        "%s: victim() gave %s, not a free cached block; taking the oldest free "
                        "cached block instead (counted as fallbacks)",
                        self.policy.name,
                        "None" if found is None else f"a block with ref {found.ref}",
                    )
                self.fallbacks += 1
                return bid
        raise RuntimeError(f"{self.policy.name}: the pool needs a block but none is free")

    def state(self) -> dict[str, Any]:
        """What a run log records: evictions by type and the policy's learned values."""
        return {
            "evictions": self.evictions,
            "evictions_by_type": {
                t.value: n for t, n in zip(TYPES, self.evictions_by_type, strict=True) if n
            },
            "ghost_hits": self.ghost_hits,
            "fallbacks": self.fallbacks,
            "cached_blocks": len(self.blocks),
            "metrics": self.policy.metrics(),
        }
