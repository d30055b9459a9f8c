"""The cached-block record and the eviction/ghost bookkeeping shared by every cache."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import cython

from skv.model import NUM_TYPES


class Block:
    """One cached KV block; the replay loop touches these millions of times (a C struct when
    compiled, see ``skv._build``).

    Tree fields (``parent``, ``n_children``, ``ref``) belong to the cache. ``version`` and
    ``pdata`` belong to the policy (heap-entry validity; queue id, learned score, ...).
    ``next_use`` is filled by offline policies (Belady) before the block is offered to them.
    ``req`` is the request that inserted the block (session, turn, templated, segment sizes):
    metadata multi-queue policies classify blocks by. ``link_prev``/``link_next`` let an
    ordered policy thread blocks on an intrusive list (O(1), no dict).
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

    def __repr__(self) -> str:
        return f"Block(key={self.key:#x}, stype={self.stype}, pos={self.pos}, ref={self.ref})"


class GhostEntry(NamedTuple):
    """What is remembered about an evicted block, for "missed after eviction" feedback."""

    stype: int
    evicted_at: float
    hits: int
    tokens: int
    pos: int


class GhostList:
    """A bounded FIFO of recently evicted keys (ARC-style ghost list)."""

    __slots__ = ("_entries", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._entries: OrderedDict[int, GhostEntry] = OrderedDict()

    def add(self, key: int, entry: GhostEntry) -> None:
        if self.capacity == 0:
            return
        entries = self._entries
        entries[key] = entry
        entries.move_to_end(key)
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def pop(self, key: int) -> GhostEntry | None:
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries


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
