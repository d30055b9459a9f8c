"""``wtinylfu``: W-TinyLFU (Einziger, Friedman, Manes: "TinyLFU: A Highly Efficient Cache
Admission Policy", ACM Transactions on Storage 13(4), 2017), with Caffeine's defaults.

The algorithm in two lines: new blocks enter a small LRU *window* (1% of the cache); the main
cache (99%) is a segmented LRU (probation 20%, protected 80%: a probation hit is promoted, a
protected overflow is demoted to probation's MRU end). A block leaving the window is admitted to
the main cache only if TinyLFU's frequency estimate of it is higher than that of the main cache's
victim (probation's LRU block); otherwise the window's block is the one evicted.

TinyLFU here: a count-min sketch of ``depth = 4`` rows of 4-bit counters (saturating at 15),
``width`` = the power of two at or above the capacity (so ``4 x width`` counters, about 2 bytes
per cached block), incremented on every access (hit or miss); after ``sample_factor x capacity``
increments (Caffeine's 10, the paper's reset period W) every counter is halved and the sample
count halves. The estimate is the minimum over the rows. An optional doorkeeper (``doorkeeper``,
off as in Caffeine) absorbs each key's first access per period; it is an exact set of keys, a
Bloom filter without false positives, cleared at every reset. Row indices come from a
splitmix64 mix of the block key (the first 8 bytes of a BLAKE2b digest of its bytes; an int
key's bytes are its 8 little-endian ones, as an engine's pool would carry it) and per-row
multiply-shift hashes whose odd multipliers are drawn from ``random.Random(seed)``:
deterministic across runs and processes. Candidates win only with a strictly higher estimate
(the paper's rule; Caffeine's random admission of warm candidates against hash flooding
is left out).

The window's overflow is admitted lazily, as libCacheSim's ``WTinyLFU`` does: until the first
eviction every block stays in the window; at an eviction the window's LRU blocks move to
probation while the main cache has room, and then one candidate meets one victim. The capacity
is ``capacity_blocks`` or, when not given, the number of cached blocks at the first eviction
(the cache is full then); sketch increments seen before that are buffered and replayed into the
sketch once it is sized. Windows are ``capacity - int(capacity x (1 - window_ratio))`` blocks
(Caffeine's rounding, at least 1 below 100 blocks).

Against libCacheSim's ``WTinyLFU`` (``tests/test_libcachesim.py``) the flat-trace miss ratios are
close but not identical, because its TinyLFU is not the paper's: a minimal-increment counting
Bloom filter sized for the main cache at 0.1% error, incremented on misses, main-cache hits
(window hits are not counted) and on every window block considered at an eviction, halved after
32 x main-size main-cache hits; its evictions can drop several blocks at once (each window block
that wins evicts a main block, until one loses); and its SLRU inserts into the protected segment
while that has room and evicts from the main cache when a demotion overflows probation.

Prefix trees (only unpinned leaves are evictable): recency is release time (a block moves to its
segment's MRU end on ``on_unpin``, a request's tail first), as in ``lru`` and ``slru``; a
promotion happens on the hit. Moving a window block into the main cache is not an eviction, so
it happens whether or not the block is pinned or has children. A candidate or victim that would
be *evicted* but is not evictable leaves its list (keeping its segment) and is appended at that
segment's MRU end again when it becomes evictable (``on_unpin`` / ``on_leaf``); the next block
in line takes its place in the contest.

Ordering invariant: each segment's list is in release (or demotion/admission) order, LRU first;
``b.pdata`` is the segment, and a block is on its list exactly when ``b.link_next is not None``.

Complexity: O(1) per insert, hit and release (a sketch update is ``depth`` hashes); ``victim``
is O(1) amortised: each block it passes over is moved from the window to the main cache (once
per insertion) or detached (once per release/leaf event, which reattaches it); the periodic
halving is O(width) every ``sample_factor x capacity`` increments.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.block_queue import link_before, sentinel, unlink

WINDOW = 0
PROBATION = 1
PROTECTED = 2
MASK64 = (1 << 64) - 1


def key64(key: object) -> int:
    """A block key as a deterministic 64-bit integer. An int key hashes as its 8 little-endian
    bytes, so a key and the bytes an engine's pool carries for it (the vLLM plugin's check sends
    ``k.to_bytes(8, "little")``) land in the same sketch cells and the policy decides alike."""
    if isinstance(key, int):
        key = (key & MASK64).to_bytes(8, "little")
    if isinstance(key, (bytes, bytearray)):
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads clustered keys (small ints) over 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class CountMinSketch:
    """TinyLFU's frequency sketch: ``depth`` rows of 4-bit counters, halved every
    ``sample_size`` increments, with an optional doorkeeper."""

    def __init__(
        self, width: int, sample_size: int, depth: int = 4, seed: int = 0, doorkeeper: bool = False
    ) -> None:
        if width < 1 or width & (width - 1):
            raise ValueError(f"sketch width must be a power of two, got {width}")
        self.width = width
        self.depth = depth
        self.sample_size = max(1, sample_size)
        self.table = bytearray(width * depth)
        self._shift = 64 - (width.bit_length() - 1)
        rng = random.Random(seed)
        self._muls = [rng.getrandbits(64) | 1 for _ in range(depth)]
        self.samples = 0
        self.resets = 0
        self.doorkeeper: set[int] | None = set() if doorkeeper else None

    def _indices(self, k: int) -> list[int]:
        x = _mix(k)
        shift, width = self._shift, self.width
        if shift >= 64:  # width 1
            return [i * width for i in range(self.depth)]
        return [i * width + (((x * m) & MASK64) >> shift) for i, m in enumerate(self._muls)]

    def increment(self, k: int) -> None:
        door = self.doorkeeper
        if door is not None and k not in door:
            door.add(k)
        else:
            table = self.table
            for i in self._indices(k):
                if table[i] < 15:
                    table[i] += 1
        self.samples += 1
        if self.samples >= self.sample_size:
            self.reset()

    def estimate(self, k: int) -> int:
        table = self.table
        est = min(table[i] for i in self._indices(k))
        if self.doorkeeper is not None and k in self.doorkeeper:
            est += 1
        return est

    def reset(self) -> None:
        """Age the counts: halve every counter (and the sample count), clear the doorkeeper."""
        self.table = bytearray(c >> 1 for c in self.table)
        self.samples //= 2
        self.resets += 1
        if self.doorkeeper is not None:
            self.doorkeeper.clear()


class WTinyLFU(Policy):
    name = "wtinylfu"

    def __init__(
        self,
        window_ratio: float = 0.01,
        protected_ratio: float = 0.8,
        sample_factor: int = 10,
        depth: int = 4,
        doorkeeper: bool = False,
        seed: int = 0,
        capacity_blocks: int | None = None,
    ) -> None:
        if not 0.0 <= window_ratio < 1.0:
            raise ValueError(f"wtinylfu: window_ratio must be in [0, 1), got {window_ratio}")
        if not 0.0 <= protected_ratio <= 1.0:
            raise ValueError(f"wtinylfu: protected_ratio must be in [0, 1], got {protected_ratio}")
        if sample_factor < 1 or depth < 1:
            raise ValueError("wtinylfu: sample_factor and depth must be >= 1")
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError(f"wtinylfu: capacity_blocks must be >= 1, got {capacity_blocks}")
        self.window_ratio = float(window_ratio)
        self.protected_ratio = float(protected_ratio)
        self.sample_factor = int(sample_factor)
        self.depth = int(depth)
        self.doorkeeper = bool(doorkeeper)
        self.seed = int(seed)
        self.capacity_blocks = capacity_blocks
        self._lists = (sentinel(), sentinel(), sentinel())  # window, probation, protected
        self._n = [0, 0, 0]  # blocks labelled with each segment (on the list or detached)
        self._live = 0
        self._main_cap = 0
        self._prot_cap = 0
        self.sketch: CountMinSketch | None = None
        self._pending: list[int] = []  # sketch increments before the sketch is sized
        self.admitted = 0
        self.rejected = 0

    # -- sketch --------------------------------------------------------------------------------

    def _record(self, b: Block) -> None:
        k = key64(b.key)
        if self.sketch is None:
            self._pending.append(k)
        else:
            self.sketch.increment(k)

    def _start(self) -> None:
        cap = self.capacity_blocks if self.capacity_blocks is not None else self._live
        cap = max(cap, 1)
        self._main_cap = int(cap * (1.0 - self.window_ratio))
        self._prot_cap = int(self._main_cap * self.protected_ratio)
        width = 16
        while width < cap:
            width <<= 1
        self.sketch = CountMinSketch(
            width, self.sample_factor * cap, self.depth, self.seed, self.doorkeeper
        )
        for k in self._pending:
            self.sketch.increment(k)
        self._pending = []

    # -- hooks ---------------------------------------------------------------------------------

    def on_insert(self, b: Block, now: float) -> None:
        self._live += 1
        b.pdata = WINDOW
        self._n[WINDOW] += 1
        link_before(b, self._lists[WINDOW])
        self._record(b)

    def on_hit(self, b: Block, now: float) -> None:
        self._record(b)
        if b.pdata == PROBATION:
            b.pdata = PROTECTED
            self._n[PROBATION] -= 1
            self._n[PROTECTED] += 1

    def on_unpin(self, b: Block, now: float) -> None:
        if b.link_next is not None:
            unlink(b)
        elif b.n_children:
            return  # detached inner node: on_leaf puts it back
        link_before(b, self._lists[b.pdata])
        if b.pdata == PROTECTED and self.sketch is not None:
            self._demote()

    def on_leaf(self, b: Block, now: float) -> None:
        if b.link_next is None:
            link_before(b, self._lists[b.pdata])

    def on_evict(self, b: Block, now: float) -> None:
        self._live -= 1
        self._n[b.pdata] -= 1

    def _demote(self) -> None:
        """Protected over its share: its LRU blocks go to probation's MRU end."""
        n = self._n
        prot, prob = self._lists[PROTECTED], self._lists[PROBATION]
        while n[PROTECTED] > self._prot_cap and prot.link_next is not prot:
            b: Block = prot.link_next
            unlink(b)
            b.pdata = PROBATION
            n[PROTECTED] -= 1
            n[PROBATION] += 1
            link_before(b, prob)

    # -- eviction ------------------------------------------------------------------------------

    def _main_victim(self) -> Block | None:
        """The main cache's next victim (probation's LRU, else protected's), detaching the
        blocks in front of it that cannot be evicted."""
        for seg in (PROBATION, PROTECTED):
            head = self._lists[seg]
            b: Block = head.link_next
            while b is not head:
                if b.ref == 0 and b.n_children == 0:
                    return b
                unlink(b)  # pinned or inner: back on release / on_leaf
                b = head.link_next
        return None

    def victim(self) -> Block | None:
        if self.sketch is None:
            self._start()
            self._demote()
        sketch = self.sketch
        n = self._n
        window, prob = self._lists[WINDOW], self._lists[PROBATION]
        while True:
            cand: Block = window.link_next
            if cand is window:
                mv = self._main_victim()
                if mv is not None:
                    unlink(mv)
                return mv
            if n[PROBATION] + n[PROTECTED] < self._main_cap:  # room in main: no contest
                unlink(cand)
                cand.pdata = PROBATION
                n[WINDOW] -= 1
                n[PROBATION] += 1
                link_before(cand, prob)
                continue
            mv = self._main_victim()
            if mv is not None and sketch.estimate(key64(cand.key)) > sketch.estimate(key64(mv.key)):
                unlink(cand)  # admitted: to probation's MRU end; the main victim goes
                cand.pdata = PROBATION
                n[WINDOW] -= 1
                n[PROBATION] += 1
                link_before(cand, prob)
                unlink(mv)
                self.admitted += 1
                return mv
            unlink(cand)
            if cand.ref == 0 and cand.n_children == 0:
                self.rejected += 1
                return cand
            # the rejected candidate is busy: off the window until release, try the next one

    # -- reporting -----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return {
            "window_blocks": float(self._n[WINDOW]),
            "probation_blocks": float(self._n[PROBATION]),
            "protected_blocks": float(self._n[PROTECTED]),
            "admitted": float(self.admitted),
            "rejected": float(self.rejected),
            "sketch_resets": float(self.sketch.resets if self.sketch is not None else 0),
        }

    def params(self) -> dict[str, Any]:
        return {
            "window_ratio": self.window_ratio,
            "protected_ratio": self.protected_ratio,
            "sample_factor": self.sample_factor,
            "depth": self.depth,
            "doorkeeper": self.doorkeeper,
            "seed": self.seed,
            "capacity_blocks": self.capacity_blocks,
        }
