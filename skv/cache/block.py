"""The cached-block record and the eviction/ghost bookkeeping shared by every cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import cython

from skv.model import NUM_TYPES

MAX_TYPES = 16  # size of the per-type counter arrays in block.pxd
assert NUM_TYPES <= MAX_TYPES


class Block:
    """One cached KV block; the replay loop touches these millions of times (a C struct when
    compiled, see ``skv._build``).

    Tree fields (``parent``, ``n_children``, ``ref``) belong to the cache. ``version`` and
    ``pdata`` belong to the policy (heap-entry validity; queue id, learned score, ...).
    ``next_use`` is filled by offline policies (Belady) before the block is offered to them.
    ``req`` is the request that inserted the block (session, turn, templated, segment sizes):
    metadata multi-queue policies classify blocks by. ``link_prev``/``link_next`` let an
    ordered policy thread blocks on an intrusive list (O(1), no dict); ``pk1``, ``pk2`` and
    ``pseq`` hold a heap policy's current key without allocating.
    """

    def __init__(
        self,
        key: object,
        parent: object,
        tokens: cython.int,
        stype: cython.int,
        pos: cython.int,
        req: object,
        now: cython.double,
    ) -> None:
        self.key = key
        self.parent = parent
        self.n_children = 0
        self.ref = 0
        self.tokens = tokens
        self.stype = stype
        self.pos = pos
        self.req = req
        self.inserted_at = now
        self.last_access = now
        self.hits = 0
        self.version = 0
        self.next_use = 0
        self.pdata = None
        self.link_prev = None
        self.link_next = None
        self.pk1 = 0.0
        self.pk2 = 0.0
        self.pseq = 0

    def __repr__(self) -> str:
        key = f"{self.key:#x}" if isinstance(self.key, int) else repr(self.key)  # vLLM: bytes
        return f"Block(key={key}, stype={self.stype}, pos={self.pos}, ref={self.ref})"


def new_block(
    key: object,
    parent: object,
    tokens: cython.int,
    stype: cython.int,
    pos: cython.int,
    req: object,
    now: cython.double,
) -> Block:
    """``Block(...)`` without Python argument parsing (the cache creates one per miss)."""
    if not cython.compiled:
        return Block(key, parent, tokens, stype, pos, req, now)
    b: Block = Block.__new__(Block)
    b.key = key
    b.parent = parent
    b.tokens = tokens
    b.stype = stype
    b.pos = pos
    b.req = req
    b.inserted_at = now
    b.last_access = now
    return b


class GhostEntry:
    """What is remembered about an evicted block, for "missed after eviction" feedback.

    ``pdata`` is the policy's tag of the block when it was evicted (e.g. its queue).
    """

    def __init__(
        self,
        stype: cython.int,
        evicted_at: cython.double,
        hits: cython.longlong,
        tokens: cython.int,
        pos: cython.int,
        pdata: object = None,
    ) -> None:
        self.stype = stype
        self.evicted_at = evicted_at
        self.hits = hits
        self.tokens = tokens
        self.pos = pos
        self.pdata = pdata
        self.key = None

    def _fields(self) -> tuple:
        return (self.stype, self.evicted_at, self.hits, self.tokens, self.pos, self.pdata)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GhostEntry):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"GhostEntry(stype={self.stype}, evicted_at={self.evicted_at}, hits={self.hits}, "
            f"tokens={self.tokens}, pos={self.pos})"
        )


class GhostList:
    """The keys evicted within the last ``capacity`` evictions (an ARC-style ghost list).

    A dict for lookups plus a ring of the last ``capacity`` entries in eviction order: adding an
    entry drops the one evicted ``capacity`` evictions earlier, if it is still there (a ghost hit
    removes an entry early). O(1) per eviction and per lookup.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._entries: dict = {}
        self._ring: list = [None] * self.capacity
        self._head = 0

    def remember(self, b: Block, now: cython.double) -> None:
        """Record an evicted block (nothing is built when the ghost list is off)."""
        if self.capacity == 0:
            return
        entry: GhostEntry = GhostEntry.__new__(GhostEntry)
        entry.stype = b.stype
        entry.evicted_at = now
        entry.hits = b.hits
        entry.tokens = b.tokens
        entry.pos = b.pos
        entry.pdata = b.pdata
        self.add(b.key, entry)

    def add(self, key: object, entry: GhostEntry) -> None:
        if self.capacity == 0:
            return
        entry.key = key
        old = self._ring[self._head]
        if old is not None:
            gone: GhostEntry = old
            if self._entries.get(gone.key) is gone:
                del self._entries[gone.key]
        self._ring[self._head] = entry
        self._head += 1
        if self._head == self.capacity:
            self._head = 0
        self._entries[key] = entry

    def pop(self, key: object) -> GhostEntry | None:
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


class Counters:
    """The counters every cache keeps, as C integers on the hot path (see block.pxd).

    Per-type counters are indexed by ``TYPE_INDEX``; ``snapshot()`` turns them into the
    ``CacheStats`` a replay reports. Capacity evictions are the ones counted under no other
    reason.
    """

    def __init__(self) -> None:
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        self.blocks = self.hit_blocks = self.evictions = 0
        self.ghost_hits = self.uncached = 0
        self.evict_by_reason = {}
        if not cython.compiled:  # compiled, these are zeroed C arrays
            self.hit_tok_by_type = [0] * MAX_TYPES
            self.hit_blk_by_type = [0] * MAX_TYPES
            self.evict_by_type = [0] * MAX_TYPES

    def request(
        self,
        blocks: cython.longlong,
        prompt_tokens: cython.longlong,
        hit_blocks: cython.longlong,
        hit_tokens: cython.longlong,
    ) -> None:
        self.requests += 1
        self.blocks += blocks
        self.prompt_tokens += prompt_tokens
        self.hit_blocks += hit_blocks
        self.hit_tokens += hit_tokens

    def hit(self, stype: cython.Py_ssize_t, tokens: cython.longlong) -> None:
        self.hit_tok_by_type[stype] += tokens
        self.hit_blk_by_type[stype] += 1

    def hits(
        self, stype: cython.Py_ssize_t, blocks: cython.longlong, tokens: cython.longlong
    ) -> None:
        """``blocks`` hits of type ``stype`` at once, ``tokens`` in all (a radix node's run)."""
        self.hit_tok_by_type[stype] += tokens
        self.hit_blk_by_type[stype] += blocks

    def eviction(self, stype: cython.Py_ssize_t, reason: str) -> None:
        self.evictions += 1
        self.evict_by_type[stype] += 1
        if reason != "capacity":
            self.evict_by_reason[reason] = self.evict_by_reason.get(reason, 0) + 1

    def snapshot(self) -> CacheStats:
        reasons = dict(self.evict_by_reason)
        capacity = self.evictions - sum(reasons.values())
        if capacity:
            reasons["capacity"] = capacity
        return CacheStats(
            requests=self.requests,
            prompt_tokens=self.prompt_tokens,
            hit_tokens=self.hit_tokens,
            blocks=self.blocks,
            hit_blocks=self.hit_blocks,
            evictions=self.evictions,
            ghost_hits=self.ghost_hits,
            uncached_blocks=self.uncached,
            hit_tokens_by_type=[self.hit_tok_by_type[t] for t in range(NUM_TYPES)],
            hit_blocks_by_type=[self.hit_blk_by_type[t] for t in range(NUM_TYPES)],
            evictions_by_type=[self.evict_by_type[t] for t in range(NUM_TYPES)],
            evictions_by_reason=dict(sorted(reasons.items())),
        )


@dataclass
class CacheStats:
    """Counters a replay reports; per-type lists are indexed by ``TYPE_INDEX``."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    blocks: int = 0
    hit_blocks: int = 0
    evictions: int = 0
    ghost_hits: int = 0
    uncached_blocks: int = 0
    hit_tokens_by_type: list[int] = field(default_factory=lambda: [0] * NUM_TYPES)
    hit_blocks_by_type: list[int] = field(default_factory=lambda: [0] * NUM_TYPES)
    evictions_by_type: list[int] = field(default_factory=lambda: [0] * NUM_TYPES)
    evictions_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0


class Lease:
    """What a request holds while in flight: its pinned blocks in prompt order, and its hits."""

    def __init__(self, blocks: list, hit_blocks: int, hit_tokens: int) -> None:
        self.blocks = blocks
        self.hit_blocks = hit_blocks
        self.hit_tokens = hit_tokens

    def __repr__(self) -> str:
        return f"Lease(blocks={len(self.blocks)}, hit_blocks={self.hit_blocks})"


def new_lease(blocks: list, hit_blocks: cython.longlong, hit_tokens: cython.longlong) -> Lease:
    """``Lease(...)`` without Python argument parsing (one per request)."""
    lease: Lease = Lease.__new__(Lease)
    lease.blocks = blocks
    lease.hit_blocks = hit_blocks
    lease.hit_tokens = hit_tokens
    return lease
