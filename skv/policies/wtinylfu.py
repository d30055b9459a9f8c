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

A block's 64-bit key hash is computed once, at its insertion, and kept in ``b.pseq`` (``b.version``
is 1 once it is there): the hits and contests that follow read it instead of hashing again.

Complexity: O(1) per insert, hit and release (a sketch update is ``depth`` hashes); ``victim``
is O(1) amortised: each block it passes over is moved from the window to the main cache (once
per insertion) or detached (once per release/leaf event, which reattaches it); the periodic
halving is O(width) every ``sample_factor x capacity`` increments.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import cython

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.block_queue import link_before, sentinel, unlink

WINDOW = 0
PROBATION = 1
PROTECTED = 2
MASK64 = (1 << 64) - 1

# C constants of the hot path when compiled (plain module globals otherwise)
_WINDOW = cython.declare(cython.int, WINDOW)
_PROBATION = cython.declare(cython.int, PROBATION)
_PROTECTED = cython.declare(cython.int, PROTECTED)
_M64 = cython.declare(cython.ulonglong, MASK64)
_GOLDEN = cython.declare(cython.ulonglong, 0x9E3779B97F4A7C15)
_MIX1 = cython.declare(cython.ulonglong, 0xBF58476D1CE4E5B9)
_MIX2 = cython.declare(cython.ulonglong, 0x94D049BB133111EB)
#: byte -> byte // 2, for halving every counter at once (``bytearray.translate``)
_HALVE = bytes(c >> 1 for c in range(256))


#: BLAKE2b with an 8-byte digest, nothing hashed yet (``key64`` copies it: no argument parsing)
_BLAKE2B_8 = hashlib.blake2b(digest_size=8)


def key64(key: object) -> cython.ulonglong:
    """A block key as a deterministic 64-bit integer. An int key hashes as its 8 little-endian
    bytes, so a key and the bytes an engine's pool carries for it (the vLLM plugin's check sends
    ``k.to_bytes(8, "little")``) land in the same sketch cells and the policy decides alike."""
    if isinstance(key, int):
        if not cython.compiled:
            key = (key & MASK64).to_bytes(8, "little")
        else:  # the same BLAKE2b digest as hashlib's below, in C
            return _blake2b_word(key & MASK64)
    if not isinstance(key, (bytes, bytearray)):
        key = repr(key).encode()
    h = _BLAKE2B_8.copy()
    h.update(key)
    return int.from_bytes(h.digest(), "little")


# BLAKE2b (RFC 7693) of one 64-bit word, in C when compiled: its initialisation vector, the
# parameter word of an unkeyed 8-byte digest, and, four bits a round, where the message word 0
# sits in each of the 12 rounds' schedules (the other 15 message words are 0 here)
_IV0 = cython.declare(cython.ulonglong, 0x6A09E667F3BCC908)
_IV1 = cython.declare(cython.ulonglong, 0xBB67AE8584CAA73B)
_IV2 = cython.declare(cython.ulonglong, 0x3C6EF372FE94F82B)
_IV3 = cython.declare(cython.ulonglong, 0xA54FF53A5F1D36F1)
_IV4 = cython.declare(cython.ulonglong, 0x510E527FADE682D1)
_IV5 = cython.declare(cython.ulonglong, 0x9B05688C2B3E6C1F)
_IV6 = cython.declare(cython.ulonglong, 0x1F83D9ABFB41BD6B)
_IV7 = cython.declare(cython.ulonglong, 0x5BE0CD19137E2179)
_PARAM8 = cython.declare(cython.ulonglong, 0x01010008)  # digest 8 bytes, no key, fanout/depth 1
_WORD0_AT = cython.declare(cython.ulonglong, 0xA0F69841D3A0)


def _g(
    v: cython.p_ulonglong,
    a: cython.int,
    b: cython.int,
    c: cython.int,
    d: cython.int,
    x: cython.ulonglong,
    y: cython.ulonglong,
) -> cython.void:
    """BLAKE2b's mixing function G on the work vector ``v`` (C arithmetic: wraps mod 2**64)."""
    v[a] = v[a] + v[b] + x
    v[d] = ((v[d] ^ v[a]) >> 32) | ((v[d] ^ v[a]) << 32)
    v[c] = v[c] + v[d]
    v[b] = ((v[b] ^ v[c]) >> 24) | ((v[b] ^ v[c]) << 40)
    v[a] = v[a] + v[b] + y
    v[d] = ((v[d] ^ v[a]) >> 16) | ((v[d] ^ v[a]) << 48)
    v[c] = v[c] + v[d]
    v[b] = ((v[b] ^ v[c]) >> 63) | ((v[b] ^ v[c]) << 1)


def _blake2b_word(m: cython.ulonglong) -> cython.ulonglong:
    """``int.from_bytes(blake2b(m.to_bytes(8, "little"), digest_size=8).digest(), "little")``:
    one compression of a single, last block whose first word is ``m`` (compiled only)."""
    v = cython.declare(cython.ulonglong[16])  # the work vector
    v[0] = _IV0 ^ _PARAM8
    v[1] = _IV1
    v[2] = _IV2
    v[3] = _IV3
    v[4] = _IV4
    v[5] = _IV5
    v[6] = _IV6
    v[7] = _IV7
    v[8] = _IV0
    v[9] = _IV1
    v[10] = _IV2
    v[11] = _IV3
    v[12] = _IV4 ^ 8  # 8 bytes hashed
    v[13] = _IV5
    v[14] = _IV6 ^ _M64  # the last block
    v[15] = _IV7
    r: cython.int
    p: cython.int
    for r in range(12):
        p = (_WORD0_AT >> (4 * r)) & 15
        _g(v, 0, 4, 8, 12, m if p == 0 else 0, m if p == 1 else 0)
        _g(v, 1, 5, 9, 13, m if p == 2 else 0, m if p == 3 else 0)
        _g(v, 2, 6, 10, 14, m if p == 4 else 0, m if p == 5 else 0)
        _g(v, 3, 7, 11, 15, m if p == 6 else 0, m if p == 7 else 0)
        _g(v, 0, 5, 10, 15, m if p == 8 else 0, m if p == 9 else 0)
        _g(v, 1, 6, 11, 12, m if p == 10 else 0, m if p == 11 else 0)
        _g(v, 2, 7, 8, 13, m if p == 12 else 0, m if p == 13 else 0)
        _g(v, 3, 4, 9, 14, m if p == 14 else 0, m if p == 15 else 0)
    return _IV0 ^ _PARAM8 ^ v[0] ^ v[8]


def _mix(x: cython.ulonglong) -> cython.ulonglong:
    """splitmix64's finaliser: spreads clustered keys (small ints) over 64 bits (the masks are
    Python's; compiled, the arithmetic is on 64-bit C integers and wraps the same way)."""
    x = (x + _GOLDEN) & _M64
    x = ((x ^ (x >> 30)) * _MIX1) & _M64
    x = ((x ^ (x >> 27)) * _MIX2) & _M64
    return x ^ (x >> 31)


class CountMinSketch:
    """TinyLFU's frequency sketch: ``depth`` rows of 4-bit counters, halved every
    ``sample_size`` increments, with an optional doorkeeper."""

    @cython.annotation_typing(False)  # the arguments are checked and converted as plain Python
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

    def increment(self, k: cython.ulonglong) -> None:
        door = self.doorkeeper
        if door is not None and k not in door:
            door.add(k)
        else:
            table: bytearray = self.table
            muls: list = self._muls
            x: cython.ulonglong = _mix(k)
            width: cython.Py_ssize_t = self.width
            shift: cython.int = self._shift
            m: cython.ulonglong
            i: cython.Py_ssize_t
            j: cython.Py_ssize_t
            for i in range(self.depth):
                j = i * width  # row i's counters; a multiply-shift hash picks one (width 1: it)
                if shift < 64:
                    m = muls[i]
                    j += ((x * m) & _M64) >> shift
                if table[j] < 15:
                    table[j] += 1
        self.samples += 1
        if self.samples >= self.sample_size:
            self.reset()

    def estimate(self, k: cython.ulonglong) -> cython.long:
        table: bytearray = self.table
        muls: list = self._muls
        x: cython.ulonglong = _mix(k)
        width: cython.Py_ssize_t = self.width
        shift: cython.int = self._shift
        est: cython.long = 15  # a counter's ceiling: the minimum over the rows is at most this
        m: cython.ulonglong
        i: cython.Py_ssize_t
        j: cython.Py_ssize_t
        for i in range(self.depth):
            j = i * width  # the counter increment() adds to
            if shift < 64:
                m = muls[i]
                j += ((x * m) & _M64) >> shift
            if table[j] < est:
                est = table[j]
        if self.doorkeeper is not None and k in self.doorkeeper:
            est += 1
        return est

    def reset(self) -> None:
        """Age the counts: halve every counter (and the sample count), clear the doorkeeper."""
        self.table = self.table.translate(_HALVE)
        self.samples //= 2
        self.resets += 1
        if self.doorkeeper is not None:
            self.doorkeeper.clear()


class WTinyLFU(Policy):
    name = "wtinylfu"

    @cython.annotation_typing(False)  # the arguments are checked and converted as plain Python
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
        self._window = sentinel()  # one list per segment
        self._prob = sentinel()
        self._prot = sentinel()
        self._n_window = 0  # blocks labelled with each segment (on the list or detached)
        self._n_prob = 0
        self._n_prot = 0
        self._live = 0
        self._main_cap = 0
        self._prot_cap = 0
        self.sketch: CountMinSketch | None = None
        self._pending: list[int] = []  # sketch increments before the sketch is sized
        self.admitted = 0
        self.rejected = 0

    def _list(self, seg: cython.int) -> Block:
        if seg == _WINDOW:
            return self._window
        return self._prob if seg == _PROBATION else self._prot

    # -- sketch --------------------------------------------------------------------------------

    def _key(self, b: Block) -> cython.ulonglong:
        """``key64(b.key)``, hashed once per block (at its insertion) and kept in ``b.pseq``
        (compiled, a C long long: the same 64 bits, read back unsigned)."""
        if b.version != 1:
            b.pseq = key64(b.key)
            b.version = 1
        return b.pseq

    def _record(self, b: Block) -> None:
        k: cython.ulonglong = self._key(b)
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
        self._n_window += 1
        link_before(b, self._window)
        self._record(b)

    def on_hit(self, b: Block, now: float) -> None:
        self._record(b)
        if b.pdata == _PROBATION:
            b.pdata = PROTECTED
            self._n_prob -= 1
            self._n_prot += 1

    def on_unpin(self, b: Block, now: float) -> None:
        if b.link_next is not None:
            unlink(b)
        elif b.n_children:
            return  # detached inner node: on_leaf puts it back
        seg: cython.int = b.pdata
        link_before(b, self._list(seg))
        if seg == _PROTECTED and self.sketch is not None:
            self._demote()

    def on_leaf(self, b: Block, now: float) -> None:
        if b.link_next is None:
            link_before(b, self._list(b.pdata))

    def on_evict(self, b: Block, now: float) -> None:
        self._live -= 1
        seg: cython.int = b.pdata
        if seg == _WINDOW:
            self._n_window -= 1
        elif seg == _PROBATION:
            self._n_prob -= 1
        else:
            self._n_prot -= 1

    def _demote(self) -> None:
        """Protected over its share: its LRU blocks go to probation's MRU end."""
        prot: Block = self._prot
        prob: Block = self._prob
        b: Block
        while self._n_prot > self._prot_cap and prot.link_next is not prot:
            b = prot.link_next
            unlink(b)
            b.pdata = PROBATION
            self._n_prot -= 1
            self._n_prob += 1
            link_before(b, prob)

    # -- eviction ------------------------------------------------------------------------------

    def _main_victim(self) -> Block | None:
        """The main cache's next victim (probation's LRU, else protected's), detaching the
        blocks in front of it that cannot be evicted."""
        head: Block
        b: Block
        for head in (self._prob, self._prot):
            b = head.link_next
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
        sketch: CountMinSketch = self.sketch
        window: Block = self._window
        prob: Block = self._prob
        cand: Block
        mv: Block
        while True:
            cand = window.link_next
            if cand is window:
                mv = self._main_victim()
                if mv is not None:
                    unlink(mv)
                return mv
            if self._n_prob + self._n_prot < self._main_cap:  # room in main: no contest
                unlink(cand)
                cand.pdata = PROBATION
                self._n_window -= 1
                self._n_prob += 1
                link_before(cand, prob)
                continue
            mv = self._main_victim()
            if mv is not None and sketch.estimate(self._key(cand)) > sketch.estimate(self._key(mv)):
                unlink(cand)  # admitted: to probation's MRU end; the main victim goes
                cand.pdata = PROBATION
                self._n_window -= 1
                self._n_prob += 1
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
            "window_blocks": float(self._n_window),
            "probation_blocks": float(self._n_prob),
            "protected_blocks": float(self._n_prot),
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
