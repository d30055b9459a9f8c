"""Hit-rate curves at every capacity: one exact pass for ``lru``, SHARDS sampling for any policy.

**One pass (Mattson).** :func:`lru_curve` gives the block and token hit counts of skv's ``lru``
cache-only replay (``skv replay``, :func:`skv.replay.replay_one`) at *every* capacity from one
pass over the trace: each block access gets a stack distance ``d`` and hits at capacity ``C``
iff ``d <= C``. The stack is the order of the keys by *stamp*; a request's distinct keys get new
stamps at its end, the first-occurring key the highest (skv releases a request's blocks tail
first, so its first block is the most recent). Distances are counts of live stamps above a
key's stamp: a range-add/prefix-sum Fenwick tree over stamps, O(log n) per query.

Why the stack (inclusion) property holds, and exactly for what. Claim: after every request,
the ``lru`` cache at capacity ``C`` holds exactly the ``C`` keys with the highest stamps (call
that order ``U``). By induction over requests; during request ``r`` let ``P`` be its distinct
keys looked up so far (pinned, or beyond ``C`` of them: uncached). Every cached block that is
not in ``P`` is unpinned and the ``lru`` list orders those by ``U``, so the cache is always
``P`` plus the top ``C - |P|`` keys of ``U \\ P`` (a hit moves a key into ``P``; a miss is
inserted by evicting the lowest unpinned key, or, when ``|P| = C``, is not cached). Hence:

- a key not in ``P`` hits iff ``d = 1 + |P| + #{keys of U\\P above it} <= C``, the LRU stack
  distance with ``P`` moved to the top;
- a key already in ``P`` (a repeat within one request: segment keying) hits iff its rank
  among ``P`` by first occurrence is ``<= C`` (only the first ``C`` distinct keys are held);
- at the end the held keys are the first ``min(C, |P|)`` of ``P`` released tail first, so the
  cache is again the top ``C`` of the new ``U``, whatever ``C``: pinning and capacities smaller
  than a request are exact too, down to ``C = 1``.

Prefix semantics ("a hit stops at the first miss") are implied, not an extra rule: a key fixes
its parent's key (prefix-chained hashes), every request holding a block holds its parent at an
earlier position, so the parent's stamp is always higher. A cached block's parent is therefore
cached, and within one chain the keys seen before form a prefix of the chain with strictly
decreasing stamps, whose distance is simply ``1 + #{live stamps above}`` (the ``P`` keys above
it are exactly the chain before it). A request whose seen keys form such a prefix (checked,
not assumed) costs one Fenwick query per run of consecutive old stamps (a turn extending the
previous turn: one run), not one per block; any other request (a repeated key, or later chain
roots that reorder recency) takes the general per-block path. The curve is exact up to 64-bit
key collisions, and for ``lru`` only: other policies (``sglang_lru``, ``vllm``, ...) get their
curves from replays or from sampling.

**Sampling (SHARDS, Waldspurger et al., FAST '15).** :func:`sample_trace` keeps a request iff a
seeded 64-bit hash (blake2b; the same in every process) of its *unit* falls below
``rate * 2**64``. Units (``unit=``): ``"session"``; ``"root"``, the request's first block;
``"auto"`` (the default), sessions when the trace has two or more, else the block at the
shallowest depth that splits the requests into at least half as many units as any depth up to
8 (depth 1 on Mooncake, whose block 0 is one system prompt for every request); and per-key
(``"block"``, below) when fewer than :data:`AUTO_MIN_UNITS` units would be sampled. Whole requests
are kept, so a kept key keeps its whole chain and prefix semantics survive. The keys shared by
several units (the trunk: system prompts shared across sessions, the blocks above the depth)
come with every sampled request; they are hot and always cached, so the sample's cache is
``rate * (C - S) + S`` with ``S`` the trunk blocks in the sample (:func:`scaled_capacity`).
``"block"`` is per-key SHARDS instead: a block is kept iff its key is sampled (a seeded
splitmix64 hash, vectorised over the stored keys of a :class:`~skv.compact_trace.CompactTrace`,
whose turns inherit their predecessor's cut of the shared prefix), re-chained to its nearest
kept ancestor; it has far more independent units, but one hot shared key (Mooncake's
block 0: 4% of its accesses) is all in or all out. Any policy replays a sample
(:func:`shards_curve`). Biases: few units give large errors (40 sessions at ``rate=0.01`` keep
0 or 1); policies that learn from volume or mix (``adaptive_semantic``, frequency counts) see
a thinner stream; per-key sampling shortens requests (``vllm`` caps hits per request).
"""

from __future__ import annotations

import hashlib
import logging
import math
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import Any

import numpy as np
from tqdm import tqdm

from skv.blocks import RequestBlocks
from skv.compact_trace import CompactTrace

log = logging.getLogger(__name__)

#: sampling depths ``unit="auto"`` considers
AUTO_DEPTHS = 8


class _Fenwick:
    """Range add, prefix sum over slots ``0..size-1`` (two Fenwick trees; 1-based inside)."""

    def __init__(self, size: int) -> None:
        self.n = size + 2
        self.b1 = [0] * (self.n + 1)
        self.b2 = [0] * (self.n + 1)
        self.total = 0

    def _upd(self, i: int, v1: int, v2: int) -> None:
        n, b1, b2 = self.n, self.b1, self.b2
        while i <= n:
            b1[i] += v1
            b2[i] += v2
            i += i & -i

    def add(self, lo: int, hi: int, v: int) -> None:
        """Add ``v`` to slots ``lo..hi`` (0-based, inclusive)."""
        if lo < 0 or hi < lo:
            raise ValueError(f"bad slot range {lo}..{hi}")
        lo += 1
        hi += 1
        self._upd(lo, v, v * (lo - 1))
        self._upd(hi + 1, -v, -v * hi)
        self.total += v * (hi - lo + 1)

    def above(self, i: int) -> int:
        """Sum of slots ``> i`` (0-based)."""
        i += 1
        x = i
        s1 = s2 = 0
        b1, b2 = self.b1, self.b2
        while i > 0:
            s1 += b1[i]
            s2 += b2[i]
            i -= i & -i
        return self.total - (s1 * x - s2)


@dataclass(frozen=True)
class LruCurve:
    """Hit counts of skv's ``lru`` cache-only replay at every capacity.

    ``hit_blocks[c]`` / ``hit_tokens[c]`` are the hits at capacity ``c`` blocks for
    ``c = 0 .. len - 1``; beyond the last index nothing changes (every reuse already hits).
    """

    hit_blocks: np.ndarray
    hit_tokens: np.ndarray
    requests: int
    block_accesses: int
    prompt_tokens: int
    unique_blocks: int

    def _index(self, capacity: int) -> int:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 block, got {capacity}")
        return min(int(capacity), len(self.hit_blocks) - 1)

    def hits(self, capacity: int) -> tuple[int, int]:
        """(hit blocks, hit tokens) at ``capacity`` blocks."""
        i = self._index(capacity)
        return int(self.hit_blocks[i]), int(self.hit_tokens[i])

    def block_hit_rate(self, capacity: int) -> float:
        return self.hits(capacity)[0] / self.block_accesses if self.block_accesses else 0.0

    def token_hit_rate(self, capacity: int) -> float:
        return self.hits(capacity)[1] / self.prompt_tokens if self.prompt_tokens else 0.0


#: requests up to this many blocks are checked on lists (numpy's per-call cost dominates there)
SMALL = 64


def distance_counts(
    trace: CompactTrace, progress: bool | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Block accesses and their tokens by ``lru`` stack distance (index ``d``: distance ``d``;
    0 = never seen, a miss at every capacity; ``unique + 1`` entries), and the number of unique
    keys, in one pass over the trace.

    The module docstring says why ``hit at capacity C <=> 0 < d <= C``. Every stamp below
    ``base`` was handed out exactly once, so the live stamps above ``s`` are ``base - 1 - s``
    minus the dead ones above ``s``: the Fenwick tree counts deaths only (runs of consecutive
    stamps die together: one range update). The fast path checks what it relies on (no key
    twice; the keys seen before are a prefix of the request with strictly decreasing stamps);
    a request that fails a check takes the per-block path, which assumes nothing about chains.

    Memory is O(unique keys + requests + one key-id array per live session), not O(block
    accesses): keys become dense ids once per stored key (a turn's shared prefix reuses its
    predecessor's ids), distances go straight into counts (a run of consecutive distances is
    one range update of a difference array), and when the stamps run out (after ~3 x unique of
    them) the live ones are renumbered ``0..`` in order and the tree starts empty."""
    pred, shared, n_keys, _, new_at = trace.key_deltas()
    pred, shared, n_keys, new_at = pred.tolist(), shared.tolist(), n_keys.tolist(), new_at.tolist()
    codes, uniques = trace.key_codes
    unique = len(uniques)
    tok_vals, tok_lens, tok_at = (a.tolist() for a in trace.runs("tokens"))
    block_size = trace.per_request("block_size").tolist()
    size = 4 * unique + 2 * max(n_keys, default=0) + 16  # stamps the tree holds
    last = np.full(unique, -1, dtype=np.int64)  # each key's stamp; -1 = never seen
    mark = np.full(unique, -1, dtype=np.int64)  # scratch: repeated keys within a request
    dead = _Fenwick(size)
    blocks = [0] * (unique + 2)  # difference arrays over the distance
    tokens = [0] * (unique + 2)
    base = 0  # next free stamp
    live: dict[int, np.ndarray] = {}  # each session's latest key ids
    fast = slow = 0
    bar = tqdm(pred, desc="lru curve, one pass", unit="req", leave=False, mininterval=1.0,
               disable=(not progress) if progress is not None else None)  # fmt: skip
    for i, p in enumerate(bar):
        new = codes[new_at[i] : new_at[i + 1]]
        rid = new if p < 0 else np.concatenate((live.pop(p)[: shared[i]], new))
        live[i] = rid
        m = len(rid)
        if m == 0:
            continue
        if base + 2 * m > size:
            base = _renumber(last)
            dead = _Fenwick(size)
        a, b = tok_at[i], tok_at[i + 1]
        toks = list(zip(tok_vals[a:b], tok_lens[a:b], strict=True))
        runs = _runs_small(rid, last) if m <= SMALL else _runs_large(rid, last, mark)
        if runs is None:
            slow += 1
            dists: list[int] = []
            base = _request_slow(rid.tolist(), last, dead, base, dists)
            per_block = [v for v, k in toks for _ in range(k)]
            for d, t in zip(dists, per_block, strict=True):
                _add(blocks, d, d + 1, 1)
                _add(tokens, d, d + 1, t)
            continue
        fast += 1
        bs = block_size[i]
        starts = []
        for a, b, top in runs:
            # the stamps of this run and the runs before it still count: they are the keys
            # of P above this one (module docstring)
            d0 = base - top - dead.above(top)
            starts.append((a, d0))
            _add(blocks, d0, d0 + b - a, 1)
            _add(tokens, d0, d0 + b - a, bs)
        seen = runs[-1][1] if runs else 0
        unseen_tokens = sum(v * k for v, k in toks) - bs * seen
        q = 0
        for v, k in toks:  # blocks of another size than bs (a short last block), if seen
            if v != bs:
                for j in range(q, min(q + k, seen)):
                    a, d0 = starts[bisect_right(starts, (j, math.inf)) - 1]
                    _add(tokens, d0 + j - a, d0 + j - a + 1, v - bs)
                    unseen_tokens -= v - bs
            q += k
        _add(blocks, 0, 1, m - seen)  # never seen: distance 0
        _add(tokens, 0, 1, unseen_tokens)
        for a, b, top in runs:
            dead.add(top - (b - a) + 1, top, 1)
        last[rid] = np.arange(base + m - 1, base - 1, -1)
        base += m
    log.debug("stack distances: %d fast requests, %d per-block requests", fast, slow)
    return np.cumsum(blocks[:-1]), np.cumsum(tokens[:-1]), unique


def _add(diff: list[int], lo: int, hi: int, v: int) -> None:
    """Add ``v`` to entries ``lo..hi-1`` of the array whose difference array is ``diff``."""
    diff[lo] += v
    diff[hi] -= v


def _renumber(last: np.ndarray) -> int:
    """Give the live stamps (every seen key's) the numbers ``0..`` in the same order; returns
    how many there are (the next free stamp)."""
    seen = np.flatnonzero(last >= 0)
    last[seen[np.argsort(last[seen])]] = np.arange(len(seen))
    return len(seen)


def _runs_small(rid: np.ndarray, last: np.ndarray) -> list[tuple[int, int, int]] | None:
    """The fast path's checks on lists: ``(start, stop, top stamp)`` of each run of
    consecutive old stamps in the seen prefix, or ``None`` when a check fails."""
    s = last[rid].tolist()
    m = len(s)
    if len(set(rid.tolist())) != m:
        return None
    runs = []
    a = 0
    while a < m and s[a] >= 0:
        top = s[a]
        b = a + 1
        while b < m and s[b] == top - (b - a) and s[b] >= 0:
            b += 1
        if b < m and s[b] >= s[b - 1]:
            return None  # not strictly decreasing
        runs.append((a, b, top))
        a = b
    if a < m and max(s[a:]) >= 0:
        return None  # a seen key after an unseen one
    return runs


def _runs_large(
    rid: np.ndarray, last: np.ndarray, mark: np.ndarray
) -> list[tuple[int, int, int]] | None:
    """:func:`_runs_small` vectorised (long requests)."""
    m = len(rid)
    span = np.arange(m, dtype=np.int64)
    mark[rid] = span
    if not (mark[rid] == span).all():
        return None
    s = last[rid]
    seen = s >= 0
    k = m if seen.all() else int(seen.argmin())
    if seen[k:].any():
        return None
    sk = s[:k]
    steps = sk[1:] - sk[:-1]
    if (steps >= 0).any():
        return None
    bounds = [0, *(np.flatnonzero(steps != -1) + 1).tolist(), k] if k else [0]
    return [(a, b, int(sk[a])) for a, b in pairwise(bounds)]


def _request_slow(
    rid: list[int], last: np.ndarray, dead: _Fenwick, base: int, dists: list[int]
) -> int:
    """One request block by block (several chain roots or a repeated key): keys of ``P`` move
    to temporary stamps above every old one as they are looked up, then get their final stamps
    in first-occurrence order. Appends each block's distance to ``dists``; returns the new
    ``base`` (``base + 2 * distinct keys``)."""
    rank: dict[int, int] = {}
    temp = base
    for x in rid:
        r = rank.get(x)
        if r is not None:
            dists.append(r)
            continue
        s = int(last[x])
        if s >= 0:
            dists.append(temp - s - dead.above(s))
            dead.add(s, s, 1)
        else:
            dists.append(0)
        rank[x] = len(rank) + 1
        temp += 1
    p = len(rank)
    dead.add(base, base + p - 1, 1)
    base += p
    for x, r in rank.items():
        last[x] = base + p - r
    return base + p


def lru_curve(trace: Sequence[RequestBlocks], progress: bool | None = None) -> LruCurve:
    """The ``lru`` hit counts at every capacity, in one pass (exact; module docstring). A list
    is stored as a :class:`~skv.compact_trace.CompactTrace` first (what the pass reads), so
    keys must be ints in ``[0, 2**64)``, as every keying of :mod:`skv.blocks` gives."""
    if not trace:
        raise ValueError("lru_curve: empty trace (no requests)")
    if not isinstance(trace, CompactTrace):
        trace = CompactTrace(trace, drop_next_use=True)
    blocks, tokens, unique = distance_counts(trace, progress)
    blocks[0] = tokens[0] = 0  # cold misses
    return LruCurve(
        hit_blocks=np.cumsum(blocks),
        hit_tokens=np.cumsum(tokens),
        requests=len(trace),
        block_accesses=trace.block_accesses,
        prompt_tokens=int(trace.per_request("prompt_tokens").sum()),
        unique_blocks=unique,
    )


# -- SHARDS -----------------------------------------------------------------------------------


def check_rate(rate: float) -> float:
    if not (isinstance(rate, int | float) and 0.0 < rate <= 1.0):
        raise ValueError(f"sample rate must be in (0, 1], got {rate!r}")
    return float(rate)


def _unit_hash(data: bytes, seed: int) -> int:
    """A fixed 64-bit hash (blake2b, keyed by the seed): the same in every process."""
    h = hashlib.blake2b(data, digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little")


def _key_bytes(key: Any) -> bytes:
    return int(key).to_bytes(16, "little", signed=True)


def auto_depth(trace: Sequence[RequestBlocks]) -> tuple[int, int]:
    """The shallowest block depth whose keys split the requests into at least half as many
    units as any depth below :data:`AUTO_DEPTHS` (0 when every request has its own root), and
    how many units it gives."""
    counts = [
        len({rb.keys[min(d, len(rb.keys) - 1)] for rb in trace if rb.keys})
        for d in range(AUTO_DEPTHS)
    ]
    best = max(counts, default=0)
    depth = next((d for d, c in enumerate(counts) if 2 * c >= best), 0)
    return depth, counts[depth] if counts else 0


#: what :func:`sample_trace` keeps or drops whole
UNITS = ("auto", "root", "session", "block")

#: ``unit="auto"`` keeps whole units only when the sample would hold at least this many;
#: with fewer, which units come in decides the estimate (one run of benchmarks/mrc_speed.py:
#: 4 of the 40 Claude Code sessions at R = 0.1 were off by 36-80 points, per-key sampling by
#: under 1; 74 Mooncake prefix trees at R = 0.01 by 9), so it samples per key instead
AUTO_MIN_UNITS = 100


#: below this many blocks of a sample's cache, a sampled estimate says little (a handful of
#: blocks decide it, and ``vllm`` needs two): estimates start where the scaled cache has this many
MIN_SAMPLE_CACHE = 16


@dataclass
class Sample:
    """A spatially sampled trace; ``shared_blocks`` = distinct trunk keys (above ``depth``, or
    shared by sessions) in the sample; ``key_share``: the share of the trace's distinct non-trunk
    keys the sample holds (per-key and whole-unit samples set it; None means the nominal rate)."""

    trace: Sequence[RequestBlocks]  # a CompactTrace if per key or cut from one; else a list
    rate: float
    unit: str
    depth: int
    shared_blocks: int
    key_share: float | None = None

    @property
    def scale(self) -> float:
        """What a cache's non-trunk part is scaled by: the key share if known, else the rate."""
        return self.key_share if self.key_share is not None else self.rate

    @property
    def label(self) -> str:
        """The unit as tables name it: ``block``, ``session``, ``root`` or ``depth N``."""
        return self.unit if self.unit != "auto" else f"depth {self.depth}"


def sample_trace(
    trace: Sequence[RequestBlocks],
    rate: float,
    *,
    seed: int = 0,
    unit: str = "auto",
    min_units: int = AUTO_MIN_UNITS,
) -> Sample:
    """SHARDS-style spatial sample: whole requests, kept by a seeded hash of their unit.

    Deterministic for a given ``seed``. Kept requests are re-indexed ``0..`` (offline policies
    index by position); whole requests share their block lists with ``trace``; a per-key
    sample is a :class:`~skv.compact_trace.CompactTrace` (memory per stored key, not per
    access; an offline policy replays ``list(sample.trace)``). ``unit="auto"`` below
    ``min_units`` expected sampled units is per-key sampling (``Sample.unit`` says which was
    used).
    """
    return Sampler(trace, unit, min_units).sample(rate, seed)


class _Units:
    """How a trace splits into whole sampling units for ``unit`` (not per rate or seed, so a
    :class:`Sampler` keeps one): by session (``auto`` with two or more sessions, or
    ``session``), else by the key at ``depth`` (:func:`auto_depth` for ``auto``, 0 for
    ``root``); ``count`` units. The trunk (keys two sessions share, or the keys above
    ``depth``) is kept whole by every sample."""

    def __init__(self, trace: Sequence[RequestBlocks], unit: str) -> None:
        self.trace = trace
        names = trace.sessions if isinstance(trace, CompactTrace) else (rb.session for rb in trace)
        sessions = set(names) - {None}
        self.by_session = unit == "session" or (unit == "auto" and len(sessions) >= 2)
        if self.by_session or unit != "auto":
            self.depth, self.count = 0, len(sessions)
        else:
            self.depth, self.count = auto_depth(trace)

    @cached_property
    def shared(self) -> set:
        """Keys more than one session uses (the trunk of session sampling; empty otherwise)."""
        return _cross_session_keys(self.trace) if self.by_session else set()

    @cached_property
    def non_trunk_keys(self) -> int:
        """Distinct keys of the trace outside the trunk (what a sample's key share is of)."""
        if isinstance(self.trace, CompactTrace):  # every key is stored at least once
            every = len(self.trace.key_codes[1])
        else:
            every = len({k for rb in self.trace for k in rb.keys})
        if self.by_session:
            return every - len(self.shared)
        return every - len({k for rb in self.trace for k in rb.keys[: self.depth]})


def _sample_units(
    trace: Sequence[RequestBlocks], rate: float, seed: int, unit: str, units: _Units
) -> Sample:
    """Whole units of ``trace`` kept by a seeded hash (:func:`sample_trace`)."""
    by_session, depth, shared = units.by_session, units.depth, units.shared
    threshold = math.floor(rate * 2**64)
    trunk: set = set()
    mine: set = set()  # the distinct keys the sample holds

    def kept() -> Iterator[RequestBlocks]:
        n = 0
        for rb in trace:
            if by_session and rb.session is not None:
                data = b"s" + rb.session.encode()
            elif len(rb.keys) > depth:
                data = _key_bytes(rb.keys[depth])
            else:  # only trunk blocks (hot, shared by every unit): sampled request by request
                data = b"r" + rb.index.to_bytes(8, "little")
            if rate < 1.0 and _unit_hash(data, seed) >= threshold:
                continue
            if by_session:
                trunk.update(k for k in rb.keys if k in shared)
            else:
                trunk.update(rb.keys[:depth])
            mine.update(rb.keys)
            yield RequestBlocks(
                index=n,
                arrival_s=rb.arrival_s,
                keys=rb.keys,
                parents=rb.parents,
                tokens=rb.tokens,
                stypes=rb.stypes,
                seg_tokens=rb.seg_tokens,
                session=rb.session,
                turn=rb.turn,
                templated=rb.templated,
                block_size=rb.block_size,
                prompt_tokens=rb.prompt_tokens,
            )  # without next-use annotations: a sample's own differ
            n += 1

    # a compact trace's sample is stored compactly too (whole units of a big trace are big)
    sample = CompactTrace(kept()) if isinstance(trace, CompactTrace) else list(kept())
    # the sample's share of the trace's distinct non-trunk keys: whole units differ in size (a
    # session of 3 turns, one of 80), so it can be far from the rate; the cache is scaled by
    # it, as a per-key sample's is (one run on Mooncake at R = 0.1, whole prefix trees: realised
    # shares 9.4-10.8% of the keys across seeds)
    non_trunk = units.non_trunk_keys
    share = (len(mine) - len(trunk)) / non_trunk if non_trunk > 0 else 0.0
    unit = "session" if by_session else unit
    log.info(
        "sample at rate %g (unit %s, depth %d, %d trunk blocks): %d of %d requests",
        rate,
        unit,
        depth,
        len(trunk),
        len(sample),
        len(trace),
    )
    return Sample(sample, rate, unit, depth, len(trunk), key_share=share)


def samples_per_key(
    trace: Sequence[RequestBlocks], rate: float, unit: str = "auto", min_units: int = AUTO_MIN_UNITS
) -> bool:
    """Whether :func:`sample_trace` samples ``trace`` per key at ``rate`` with this ``unit``:
    always for ``"block"``; for ``"auto"`` when fewer than ``min_units`` whole units (sessions
    when the trace has two or more, else prefix trees at :func:`auto_depth`) would come in."""
    return Sampler(trace, unit, min_units).per_key(rate)


class Sampler:
    """Samples of one trace at any rates and seeds (what :func:`sample_trace` takes, with
    ``unit`` and ``min_units``). What does not depend on the rate or seed is worked out once:
    how the trace splits into whole units (:class:`_Units`, its trunk and key count), and the
    :class:`~skv.compact_trace.CompactTrace` every per-key sample is cut from (``trace`` itself
    when it is one)."""

    def __init__(
        self, trace: Sequence[RequestBlocks], unit: str = "auto", min_units: int = AUTO_MIN_UNITS
    ) -> None:
        self.trace, self.unit, self.min_units = trace, unit, min_units
        self._units: _Units | None = None
        self._compact: Any = None
        self._unique_keys: np.ndarray | None = None

    def _whole(self) -> _Units:
        if self._units is None:
            self._units = _Units(self.trace, self.unit)
        return self._units

    def per_key(self, rate: float) -> bool:
        """:func:`samples_per_key` for this trace."""
        if self.unit == "block":
            return True
        if self.unit != "auto" or rate >= 1.0:
            return False
        units = self._whole().count
        if rate * units >= self.min_units:
            return False
        log.info("%d units at rate %g: fewer than %d sampled, so per-key", units, rate,
                 self.min_units)  # fmt: skip
        return True

    def sample(self, rate: float, seed: int = 0) -> Sample:
        rate = check_rate(rate)
        if not self.trace:
            raise ValueError("sample_trace: empty trace (no requests)")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        if not self.per_key(rate):
            return _sample_units(self.trace, rate, seed, self.unit, self._whole())
        if self._compact is None:
            is_compact = isinstance(self.trace, CompactTrace)
            # next-use annotations (a Belady replay's) play no part in a sample
            self._compact = (
                self.trace if is_compact else CompactTrace(self.trace, drop_next_use=True)
            )
            self._unique_keys = self._compact.key_codes[1]  # the distinct keys
        return _sample_blocks(self._compact, self._unique_keys, rate, seed)


def _cross_session_keys(trace: Sequence[RequestBlocks]) -> set:
    """Keys used by more than one session (shared system prompts: the trunk of session
    sampling), in O(log n) lookups per single-chain request.

    Every key of a processed request is owned, so the seen keys of a chain are a prefix of it.
    In a single chain, once a key is owned by this request's own session and not shared, no
    other session has used it, hence none used a key below it: the rest of the seen prefix is
    this session's too, and only the new keys after it (found by bisection) need owning."""
    owner: dict = {}
    shared: set = set()
    for rb in trace:
        keys = rb.keys
        single = rb.parents.count(None) <= 1
        for i, key in enumerate(keys):
            o = owner.get(key, owner)
            if o is not owner and o != rb.session:
                shared.add(key)
                continue
            if not single:
                owner.setdefault(key, rb.session)
                continue
            lo, hi = i, len(keys)  # the first new key is in keys[lo:hi + 1]
            while lo < hi:
                mid = (lo + hi) // 2
                if keys[mid] in owner:
                    lo = mid + 1
                else:
                    hi = mid
            owner.update(dict.fromkeys(keys[lo:], rb.session))
            break
    return shared


def key_sampled(keys: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Per-key SHARDS verdicts for 64-bit keys, vectorised: splitmix64's finaliser of the key
    mixed with a salt drawn from the seed, below ``rate * 2**64``. A key's verdict depends on
    the key and the seed alone (so a key shared by requests or sessions is in or out for all)."""
    rate = check_rate(rate)
    keys = np.asarray(keys, dtype=np.uint64)
    if rate >= 1.0:
        return np.ones(keys.shape, dtype=bool)
    z = keys ^ np.uint64(_unit_hash(b"key-salt", seed))
    z = z + np.uint64(0x9E3779B97F4A7C15)  # uint64 arithmetic wraps (mod 2**64), silently
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return z < np.uint64(math.floor(rate * 2**64))


def _sample_blocks(compact: Any, unique: np.ndarray, rate: float, seed: int) -> Sample:
    """Per-key SHARDS: keep a block iff its key is sampled (:func:`key_sampled`), re-chained to
    its nearest kept ancestor (a key still fixes its sampled parent, so prefix semantics hold
    within the sample). Many more independent units than whole trees; requests shrink to
    ~``rate`` of their blocks, which biases policies that look at request sizes or positions.

    Runs on a :class:`~skv.compact_trace.CompactTrace` (``unique``: its distinct stored keys):
    verdicts for the stored keys at once, and a turn's shared prefix inherits its predecessor's
    cut, so the cost is O(unique keys per session + kept blocks + requests), not O(block
    accesses)."""
    # stored compactly too: a per-key sample of a big trace is big (11.3M accesses at R = 0.1
    # of the 20x Claude Code scale-up), and lru and vllm replay it a node at a time
    kept = compact.cut(key_sampled(compact.new_keys, rate, seed))
    share = float(key_sampled(unique, rate, seed).mean()) if len(unique) else 0.0
    log.info("sample at rate %g (unit block): %d of %d requests, %.4g of the keys",
             rate, len(kept), len(compact), share)  # fmt: skip
    return Sample(kept, rate, "block", 0, 0, key_share=share)


def scaled_capacity(capacity: int, sample: Sample) -> int:
    """The sample's cache size for a full-trace ``capacity``: the trunk whole, the rest scaled
    by ``sample.scale``. A per-key sample scales by the share of the trace's distinct keys it
    holds rather than the nominal rate: a sample that came out larger or smaller than expected
    gets a cache to match (in the spirit of SHARDS-adj, which corrects the reference count
    instead). Measured once, Claude Code, ``lru``, R = 0.01: max error 2.6 -> 2.0 points,
    mean of 5 seeds; not measured at other rates."""
    shared = min(sample.shared_blocks, capacity)
    return max(1, round(sample.scale * (capacity - shared)) + shared)


def shards_curve(
    trace: Sequence[RequestBlocks],
    policy: str,
    capacities: Sequence[int],
    rate: float,
    *,
    seed: int = 0,
    unit: str = "auto",
    params: dict[str, Any] | None = None,
    sample: Sample | None = None,
) -> list[dict[str, Any]]:
    """Hit rates of ``policy`` at each full-trace capacity, estimated on a spatial sample.

    One row per capacity: ``capacity_blocks`` (full trace), ``sample_capacity_blocks``,
    ``block_hit_rate``, ``token_hit_rate`` (of the sample). Pass ``sample`` to reuse one.
    """
    from skv.policies.registry import OFFLINE
    from skv.replay import replay_one, trace_totals

    sample = sample or sample_trace(trace, rate, seed=seed, unit=unit)
    if not sample.trace:
        raise ValueError(
            f"sample at rate {sample.rate:g} kept no request of {len(trace)}; raise the rate"
        )
    totals = trace_totals(sample.trace)
    strace = sample.trace
    if policy in OFFLINE and not isinstance(strace, list):  # next uses need the whole list
        strace = list(strace)
    rows = []
    for cap in capacities:
        if cap < 1:
            raise ValueError(f"capacity must be >= 1 block, got {cap}")
        scap = scaled_capacity(cap, sample)
        row = replay_one(strace, policy, scap, params=params, totals=totals, progress=False)
        rows.append(
            {
                "policy": policy,
                "capacity_blocks": cap,
                "sample_rate": sample.rate,
                "sample_capacity_blocks": scap,
                "sample_requests": len(sample.trace),
                "block_hit_rate": row["block_hit_rate"],
                "token_hit_rate": row["token_hit_rate"],
            }
        )
    return rows


def curve_grid(unique_blocks: int, points: int, low: int = 1) -> list[int]:
    """``points`` capacities, log-spaced from ``low`` blocks to the unique blocks (distinct,
    sorted)."""
    low = max(1, min(low, unique_blocks))
    if unique_blocks <= low:
        return [low]
    grid = np.unique(np.rint(np.geomspace(low, unique_blocks, max(points, 2))).astype(np.int64))
    return [int(c) for c in grid]


# -- the capacity curve of ``skv replay --capacity-curve`` ------------------------------------

CURVE_COLUMNS = [
    "method",
    "policy",
    "sample_rate",
    "sample_unit",
    "capacity_blocks",
    "capacity_fraction",
    "sample_capacity_blocks",
    "block_hit_rate",
    "token_hit_rate",
]


def capacity_curve(
    trace: Sequence[RequestBlocks],
    *,
    policies: Sequence[str] = ("lru",),
    rates: Sequence[float] = (0.1,),
    points: int = 64,
    sample_points: int = 12,
    belady_points: int = 3,
    extra_capacities: Sequence[int] = (),
    seed: int = 0,
    unit: str = "auto",
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """Rows of the hit-rate curve: ``exact_lru`` (one pass) at ``points`` log-spaced
    capacities, ``shards`` estimates for every policy and rate at ``sample_points`` of them, and
    ``belady`` (offline replays, the upper bound) at ``belady_points`` capacities, sampled past
    :data:`BELADY_MAX_ACCESSES`. ``trace`` may be a
    :class:`~skv.compact_trace.CompactTrace` (what ``skv replay --capacity-curve`` loads):
    memory then stays per unique block, Belady's list aside. ``progress``: bars for the long
    parts (the one pass, Belady's full replays); None shows them on a terminal."""
    rates = [check_rate(r) for r in rates]
    for name in policies:
        from skv.policies.registry import policy_class

        policy_class(name)  # a bad name fails before the pass, not after
    if not isinstance(trace, CompactTrace):  # stored once for the pass and the samples
        trace = CompactTrace(trace, drop_next_use=True)
    curve = lru_curve(trace, progress)
    u = curve.unique_blocks
    grid = sorted({*curve_grid(u, points), *(int(c) for c in extra_capacities if c >= 1)})
    coarse = {r: curve_grid(u, sample_points, low=math.ceil(MIN_SAMPLE_CACHE / r)) for r in rates}

    def row(
        method: str,
        policy: str,
        rate: float,
        cap: int,
        scap: int,
        bhr: float,
        thr: float,
        unit: str = "",
    ):
        return {
            "method": method,
            "policy": policy,
            "sample_rate": rate,
            "sample_unit": unit,
            "capacity_blocks": cap,
            "capacity_fraction": cap / u if u else 0.0,
            "sample_capacity_blocks": scap,
            "block_hit_rate": bhr,
            "token_hit_rate": thr,
        }

    rows = [
        row("exact_lru", "lru", 1.0, c, c, curve.block_hit_rate(c), curve.token_hit_rate(c))
        for c in grid
    ]
    sampler = Sampler(trace, unit)
    # Belady past the limit replays the largest sample within it: only that one is kept
    sampled_belady = belady_points > 0 and u > 0 and trace.block_accesses > BELADY_MAX_ACCESSES
    belady_sample: Sample | None = None
    for rate in rates:
        sample = sampler.sample(rate, seed)
        if not sample.trace:
            log.warning("sample rate %g kept no request: no SHARDS rows at this rate", rate)
            continue
        larger = belady_sample is None or rate > belady_sample.rate
        # a sample of a CompactTrace is one (whole units and per key alike)
        if sampled_belady and larger and sample.trace.block_accesses <= BELADY_MAX_ACCESSES:
            belady_sample = sample
        for name in policies:
            for r in shards_curve(trace, name, coarse[rate], rate, sample=sample):
                rows.append(
                    row(
                        "shards",
                        name,
                        rate,
                        r["capacity_blocks"],
                        r["sample_capacity_blocks"],
                        r["block_hit_rate"],
                        r["token_hit_rate"],
                        sample.label,
                    )
                )
    if belady_points > 0 and u:
        fracs = np.geomspace(0.01, 0.5, belady_points) if belady_points > 1 else [0.1]
        caps = sorted({max(1, round(f * u)) for f in fracs})  # distinct on a tiny trace
        rows += _belady_rows(trace, caps, belady_sample, row, progress)
    return rows


#: Belady's bound replays a trace of at most this many block accesses: it needs every access
#: annotated with its next use, a list of ~100 bytes per access (1.2 GB here; the 40 Claude
#: Code sessions have 5.6M). A larger trace gets it from its largest sample within the limit.
BELADY_MAX_ACCESSES = 12_000_000


def _belady_rows(
    trace: CompactTrace,
    caps: list[int],
    sample: Sample | None,
    row,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """Belady's bound at ``caps``: a full offline replay, or, past
    :data:`BELADY_MAX_ACCESSES`, the replay of ``sample`` (the largest within it) at the scaled
    capacity (its rows carry that rate and unit: a sampled estimate, not the bound)."""
    from skv.replay import replay_one, trace_totals

    accesses = trace.block_accesses
    if accesses <= BELADY_MAX_ACCESSES:
        full = list(trace)  # next-use annotations need the list
        totals = trace_totals(full)
        out = []
        for cap in caps:
            r = replay_one(full, "belady", cap, totals=totals, progress=progress)
            out.append(row("belady", "belady", 1.0, cap, cap, r["block_hit_rate"],
                           r["token_hit_rate"]))  # fmt: skip
        return out
    if sample is None:
        log.warning("%d block accesses and no sample of at most %d: no Belady rows", accesses,
                    BELADY_MAX_ACCESSES)  # fmt: skip
        return []
    rate = sample.rate
    log.info("%d block accesses (over %d): Belady's bound from the sample at rate %g", accesses,
             BELADY_MAX_ACCESSES, rate)  # fmt: skip
    out = []
    for r in shards_curve(trace, "belady", caps, rate, sample=sample):
        out.append(row("belady", "belady", rate, r["capacity_blocks"],
                       r["sample_capacity_blocks"], r["block_hit_rate"], r["token_hit_rate"],
                       sample.label))  # fmt: skip
    return out


def write_capacity_curve(rows: list[dict[str, Any]], out_dir: Any, meta: dict[str, Any]) -> None:
    """``capacity_curve.csv``, ``capacity_curve.json`` (meta + rows) and ``capacity_curve.png``
    into ``out_dir``, all or nothing (:func:`skv.fileio.atomic_dir`)."""
    import csv
    import json
    from pathlib import Path

    from skv.fileio import atomic_dir, atomic_write

    with atomic_dir(Path(out_dir), last=("capacity_curve.json",)) as tmp:
        with atomic_write(tmp / "capacity_curve.csv") as f:
            w = csv.DictWriter(f, fieldnames=CURVE_COLUMNS, lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})
        _plot_curve(rows, tmp / "capacity_curve.png", str(meta.get("trace", "")))
        with atomic_write(tmp / "capacity_curve.json") as f:
            f.write(json.dumps({"meta": meta, "rows": rows}, indent=2, sort_keys=True) + "\n")


def _plot_curve(rows: list[dict[str, Any]], path: Any, title: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    exact = [r for r in rows if r["method"] == "exact_lru" and r["capacity_fraction"] > 0]
    ax.plot(
        [r["capacity_fraction"] for r in exact],
        [r["token_hit_rate"] for r in exact],
        "-",
        color="black",
        label="lru, exact (one pass)",
    )
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        if r["method"] == "shards":
            groups.setdefault((r["policy"], r["sample_rate"]), []).append(r)
    markers = "osD^v<>p"
    for i, ((policy, rate), rs) in enumerate(sorted(groups.items())):
        ax.plot(
            [r["capacity_fraction"] for r in rs],
            [r["token_hit_rate"] for r in rs],
            markers[i % len(markers)] + "--",
            ms=4,
            lw=0.8,
            label=f"{policy}, SHARDS R={rate:g}",
        )
    bel = [r for r in rows if r["method"] == "belady"]
    if bel:
        ax.plot(
            [r["capacity_fraction"] for r in bel],
            [r["token_hit_rate"] for r in bel],
            "*",
            ms=11,
            color="tab:red",
            label="belady (offline bound)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (fraction of the trace's unique blocks)")
    ax.set_ylabel("token hit rate (simulated)")
    ax.set_title(f"hit rate at every capacity: {title}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
