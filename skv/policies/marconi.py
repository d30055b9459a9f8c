"""``marconi``: Marconi's FLOP-aware eviction, for the KV blocks of a Transformer.

Paper: Rui Pan, Zhuang Wang, Zhen Jia, Can Karakus, Luca Zancato, Tri Dao, Yida Wang, Ravi
Netravali, "Marconi: Prefix Caching for the Era of Hybrid LLMs", MLSys 2025 (arXiv 2411.19379);
artifact: github.com/ruipeterpan/marconi (``radix_cache_hybrid.py``, ``config_tuner.py``,
``utils.py``), read for the details the paper leaves open.

The algorithm. Each eviction candidate ``n`` gets the utility
``S(n) = recency(n) + alpha * flop_efficiency(n)``, both terms min-max normalised to [0, 1] over
the candidates, and the candidate of lowest ``S`` is evicted. ``flop_efficiency`` = FLOPs a hit on
``n`` saves / bytes ``n`` occupies. ``alpha`` starts at 0 (plain recency) and is tuned once,
retrospectively: when ``bootstrap_multiplier`` (5) times as many requests as had arrived at the
first eviction have arrived, those requests are replayed from an empty cache of the same
capacity with every ``alpha`` of a grid and the one that saves the most FLOPs is kept. The
values are the artifact's: ``eff_weight=0`` to start, ``bootstrap_multiplier=5``, the grid 0,
0.1, ..., 2.0 (``ConfigTuner.tune_config``), FLOPs saved as the score.

As implemented here, over unpinned leaf blocks (the candidates):

- ``e_b`` (FLOP efficiency): every KV block of a Transformer takes the same bytes, so FLOPs
  saved per byte is the saved FLOPs up to a constant: the block's prefix-aware recompute cost
  ``t * (1 + (c + t/2) / attn_crossover)`` with ``c = pos * block_size`` tokens before it
  (:mod:`skv.policies.flop_cost`, shared with ``pgdsf``): it grows with the block's depth. (The
  artifact counts a node's FLOPs given its parent, as here, but divides by the state memory of
  the node's whole path; here by the block's own bytes, what evicting it frees.)
- ``t_b`` (recency): the time the block's last holder released it (the ``now`` the cache
  passes, as ``lru``); equal ``S`` evicts in release order, a request's tail first.
- ``S_b = (t_b - t_min) / (t_max - t_min) + alpha * (e_b - e_min) / (e_max - e_min)``, minima and
  maxima over the candidates; a range of zero (every candidate alike) keeps the previous scale,
  which changes nothing among the current candidates (the term is the same for all of them; the
  artifact's normalisation makes such a term a constant too).
- Tuning: the grid (0, 0.5, 1.0, 1.5, 2.0) by default, every fifth point of the artifact's
  (``ARTIFACT_ALPHA_GRID`` is the whole one, at 4.2 times the cost); ties go to the smallest.

Ordering invariant: a min-heap of ``(k_b, release seq, version, block)`` with lazy deletion
(pinning, re-pushing and evicting bump ``b.version``), ``k_b = t_b + w * e_b`` with one weight
``w = alpha * (t_max - t_min) / (e_max - e_min)`` (seconds per unit of cost) for every live
entry, so ``k_b = (t_max - t_min) * S_b + const``: the heap order is the order of ``S`` under
the normalisation of the last *refresh*. A refresh measures the ranges over the candidates in
the heap (``utility(b)`` gives ``S_b`` under them) and re-keys every entry if ``w`` changed (the
offsets ``t_min``, ``e_min`` never change the order; with ``alpha = 0`` it measures nothing).
``k_b`` does not depend on ``now``, so nothing drifts between refreshes. The entries sit in a
binary heap plus a sorted run: an entry not below the run's last is appended to the run (O(1):
every release while ``w = 0`` and time advances), any other goes into the heap, and the smaller
of the run's first and the heap's top pops: the order of one heap. (Compiled, see
:mod:`skv._build`, the comparisons are on C numbers.) With ``alpha = 0``, or
every candidate equally deep, ``w = 0`` and the order is release order: ``lru``'s victims.

Complexity: O(1) per insert, hit, pin and request; O(log n) per release and ``on_leaf`` (a heap
push); per eviction, O(log n) amortised (lazy pops) plus the refreshes: one is O(n) and comes at
the first eviction after ``refresh_fraction * n`` evictions since the last (n = cached blocks),
O(1 / refresh_fraction) amortised per eviction. The tuning runs once: ``len(alpha_grid)``
replays of at most ``tune_max_blocks`` block accesses, a fixed cost (skipped when every block
of the window costs the same, e.g. a flat trace, where ``alpha`` cannot change a victim).

Simplified or adapted, and why:

- Normalisation. Marconi normalises over the candidates at each eviction (the artifact rescans
  every node with at most one child each time: O(n) per eviction). Here the ranges are measured
  at each refresh and held until the next: a block released after the last refresh gets a
  recency term above 1, and a change in the candidates' spread reaches the keys at the next
  refresh (``refresh_fraction=0`` refreshes at every eviction: exact, O(n) per eviction).
- Recency. The artifact's recency term is ``1 / (now - t_b)``, min-max normalised; here it is
  linear in ``t_b`` (minus the age ``now - t_b``, normalised). Both rank blocks of equal
  efficiency by release time, but under ``1 / age`` the trade-off between a fresh shallow block
  and an old deep one changes as ``now`` advances, so no key stays valid and every eviction is a
  full rescan; the linear term keeps ``S`` fixed between refreshes, so a heap works.
- Tuning. The window's requests are replayed in skv's radix cache (``BlockCache``) with a fresh
  ``marconi`` per ``alpha`` (not tuned itself), from an empty cache, as the artifact's one tuning
  replays from the empty tree it snapshots at the first request; the capacity is the number of
  cached blocks at the first eviction (``BlockCache``'s capacity; in vLLM's pool, its cached
  blocks then, without the unhashed ones). FLOPs saved are summed over the whole window (the
  artifact scores the last 500 requests; its note says this changes little). The window keeps
  each request with its block count on arrival and replays those blocks (of a single-chain
  request, its leading full blocks: what vLLM's pool caches), so the engine's request views,
  which grow in place (by appending) as they decode, replay as the simulator's requests do;
  answers are not replayed (the artifact replays input and output). If the window grows past
  ``tune_max_blocks`` block accesses before it is complete, it is dropped and ``alpha`` stays as
  given (memory and time stay bounded). No re-tuning later, as in the artifact.
  ``tune=False``: ``alpha`` as given, nothing recorded.
- Candidates. Marconi also evicts the SSM state of nodes with one child; a Transformer block with
  a cached child cannot be dropped without cutting the chain, so only unpinned leaves are
  candidates (checked at the top of the heap, never assumed).
- Admission. Marconi's admission policy decides which SSM states of a hybrid model to checkpoint
  (those likely to be reused); attention-only KV blocks are always cacheable and skv models only
  Transformers, so it does not apply and every block is admitted.

In vLLM's free queue (``skv.cache.policy_pool`` / the eviction plugin) every block has ``req``
with ``block_size`` and ``pos`` (its index in the request), so ``e_b`` is the same; the tuning
replays the recorded request views in skv's radix model of the cache, not in vLLM's flat pool
(the plugin and its simulation still agree: tests/test_vllm_eviction.py).

Parameters (constructor keywords; ``params()`` returns them): ``alpha`` = 0.0 (the starting
weight: the artifact's), ``tune`` = True, ``alpha_grid`` = (0.0, 0.5, 1.0, 1.5, 2.0),
``bootstrap_multiplier`` = 5 (the artifact's), ``refresh_fraction`` = 0.125 and
``tune_max_blocks`` = 1,000,000 (skv's), ``attn_crossover`` = 30632.02 tokens (the
``llama-3.1-8b`` preset; :mod:`skv.policies.flop_cost`). ``metrics()``: the current ``alpha``,
whether it was tuned, and the refreshes so far.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import cython

from skv.blocks import RequestBlocks
from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.flop_cost import DEFAULT_ATTN_CROSSOVER, block_cost, check_crossover

#: the artifact's grid of ``alpha`` (``ConfigTuner.tune_config``): 0, 0.1, ..., 2.0
ARTIFACT_ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))
#: the default grid: every fifth point of the artifact's (a fifth of the tuning cost)
ALPHA_GRID: tuple[float, ...] = ARTIFACT_ALPHA_GRID[::5]


# --- the heap: a list of entries ordered by (key, seq, version), as tuples would be, sifted
# here so that compiled comparisons are on C numbers (no tuples, no heapq) ---------------------


@cython.freelist(1024)
@cython.no_gc  # holds a block, never part of a cycle: no collector bookkeeping
@cython.cclass
class _Entry:
    """One heap entry: ``b`` under the key ``k_b`` it had when the entry was made."""

    def __init__(
        self, key: cython.double, seq: cython.longlong, version: cython.longlong, b: Block
    ) -> None:
        self.key = key
        self.seq = seq
        self.version = version
        self.b = b

    def __repr__(self) -> str:
        return f"_Entry({self.key!r}, {self.seq}, {self.version}, {self.b!r})"


def _entry(key: cython.double, seq: cython.longlong, version: cython.longlong, b: Block) -> _Entry:
    """``_Entry(...)`` without Python argument parsing (one per release)."""
    e: _Entry = _Entry.__new__(_Entry)
    e.key = key
    e.seq = seq
    e.version = version
    e.b = b
    return e


def _before(x: _Entry, y: _Entry) -> cython.bint:
    """``(x.key, x.seq, x.version) < (y.key, y.seq, y.version)``."""
    if x.key != y.key:
        return x.key < y.key
    if x.seq != y.seq:
        return x.seq < y.seq
    return x.version < y.version


def _heap_push(heap: list, e: _Entry) -> None:
    heap.append(e)
    _sift_up(heap, len(heap) - 1, e)


def _sift_up(heap: list, i: cython.Py_ssize_t, e: _Entry) -> None:
    """Put ``e`` at ``i`` and move it up to its place (the entries above are a heap)."""
    j: cython.Py_ssize_t
    parent: _Entry
    while i > 0:
        j = (i - 1) >> 1
        parent = heap[j]
        if not _before(e, parent):
            break
        heap[i] = parent
        i = j
    heap[i] = e


def _sift_down(heap: list, i: cython.Py_ssize_t, e: _Entry) -> None:
    """Put ``e`` at ``i`` and move it down to its place (the subtrees below are heaps)."""
    n: cython.Py_ssize_t = len(heap)
    c: cython.Py_ssize_t
    child: _Entry
    other: _Entry
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        child = heap[c]
        if c + 1 < n:
            other = heap[c + 1]
            if _before(other, child):
                c += 1
                child = other
        if not _before(child, e):
            break
        heap[i] = child
        i = c
    heap[i] = e


def _heap_pop(heap: list) -> _Entry:
    """Remove and return the smallest entry (``heap`` not empty). The last entry fills the
    hole by heapq's method: the hole goes down to a leaf along the smaller children (one
    comparison a level), then the entry moves up to its place (most stay near the bottom)."""
    top: _Entry = heap[0]
    last: _Entry = heap.pop()
    n: cython.Py_ssize_t = len(heap)
    if n == 0:
        return top
    i: cython.Py_ssize_t = 0
    c: cython.Py_ssize_t = 1
    child: _Entry
    other: _Entry
    while c < n:
        child = heap[c]
        if c + 1 < n:
            other = heap[c + 1]
            if _before(other, child):
                c += 1
                child = other
        heap[i] = child
        i = c
        c = 2 * i + 1
    _sift_up(heap, i, last)
    return top


def _heapify(heap: list) -> None:
    i: cython.Py_ssize_t = len(heap) // 2 - 1
    while i >= 0:
        _sift_down(heap, i, heap[i])
        i -= 1


class Marconi(Policy):
    name = "marconi"

    @cython.annotation_typing(False)  # Python's conversions and errors
    def __init__(
        self,
        alpha: float = 0.0,
        tune: bool = True,
        alpha_grid: Iterable[float] = ALPHA_GRID,
        bootstrap_multiplier: int = 5,
        refresh_fraction: float = 0.125,
        tune_max_blocks: int = 1_000_000,
        attn_crossover: float = DEFAULT_ATTN_CROSSOVER,
    ) -> None:
        self.alpha = _non_negative("alpha", alpha)
        self.tune = bool(tune)
        self.alpha_grid = [_non_negative("alpha_grid values", a) for a in alpha_grid]
        if not self.alpha_grid:
            raise ValueError("marconi: alpha_grid must not be empty")
        self.bootstrap_multiplier = _positive_int("bootstrap_multiplier", bootstrap_multiplier)
        self.tune_max_blocks = _positive_int("tune_max_blocks", tune_max_blocks)
        self.refresh_fraction = _non_negative("refresh_fraction", refresh_fraction)
        self.attn_crossover = check_crossover(self.name, attn_crossover)
        self._alpha0 = self.alpha
        # the entries: a binary heap plus a sorted run (see the module docstring)
        self._heap: list[_Entry] = []
        self._run: list[_Entry] = []
        self._run_head = 0  # the run's entries before this index are gone
        self._rseq = 0  # releases so far: the tie-breaker
        self._live = 0  # cached blocks
        self._since = math.inf  # evictions since the last refresh (the first eviction refreshes)
        # the normalisation of every key in the heap: S = (t - t0) / rt + alpha (e - e0) / re
        self._t0, self._rt, self._e0, self._re = 0.0, 1.0, 0.0, 1.0
        self._w = self.alpha  # the weight of every key in the heap: k = t + w e
        self.refreshes = 0
        self.saved = 0.0  # recompute cost (tokens) of every hit: FLOPs saved, what tuning scores
        # tuning: the requests since the start, until the bootstrap window is full
        self._window: list[tuple[RequestBlocks, int, float]] | None = [] if self.tune else None
        self._window_blocks = 0
        self._requests = 0
        self._window_size = 0  # known at the first eviction
        self._capacity = 0
        self.tuned = False

    # --- hooks ------------------------------------------------------------------------------

    def on_request(self, rb: RequestBlocks, now: float) -> None:
        self._requests += 1
        if self._window is not None:
            window: list = self._window
            n: cython.Py_ssize_t = len(rb.keys)
            window.append((rb, n, now))  # a request view only grows (appends) from here
            self._window_blocks += n
            if self._window_size and len(window) >= self._window_size:
                self._tune()
            elif self._window_blocks > self.tune_max_blocks:
                self._window = None  # too long to replay: alpha stays as given

    def on_insert(self, b: Block, now: float) -> None:
        self._live += 1
        b.pk2 = block_cost(b, self.attn_crossover)

    def on_hit(self, b: Block, now: float) -> None:
        self.saved += b.pk2

    def on_pin(self, b: Block) -> None:
        b.version += 1  # voids its entry

    def on_unpin(self, b: Block, now: float) -> None:
        b.pk1 = now
        self._rseq += 1
        b.pseq = self._rseq
        if not b.n_children:  # _push, inlined (once per access)
            b.version += 1
            self._add(_entry(now + self._w * b.pk2, b.pseq, b.version, b))

    def on_leaf(self, b: Block, now: float) -> None:
        self._push(b)  # keeps its release time and place

    def victim(self) -> Block | None:
        if not self._window_size and self._window is not None:  # the first eviction
            self._window_size = self.bootstrap_multiplier * self._requests
            self._capacity = self._live
        if self._since >= self.refresh_fraction * self._live:
            self._refresh()
        self._since += 1
        e: _Entry = self._pop()
        b: Block
        while e is not None:
            b = e.b
            if e.version == b.version and b.ref == 0 and b.n_children == 0:
                b.version += 1
                return b
            e = self._pop()
        return None

    def on_evict(self, b: Block, now: float) -> None:
        self._live -= 1

    # --- ordering ---------------------------------------------------------------------------

    def utility(self, b: Block) -> float:
        """``S_b`` under the normalisation of the last refresh."""
        return (b.pk1 - self._t0) / self._rt + self.alpha * (b.pk2 - self._e0) / self._re

    def _push(self, b: Block) -> None:
        b.version += 1
        self._add(_entry(b.pk1 + self._w * b.pk2, b.pseq, b.version, b))

    def _add(self, e: _Entry) -> None:
        """Add an entry: to the run if it is not below the run's last (O(1); every release
        while ``w = 0`` and time advances), otherwise to the heap."""
        run: list = self._run
        n: cython.Py_ssize_t = len(run)
        if n == self._run_head or not _before(e, run[n - 1]):
            run.append(e)
        else:
            _heap_push(self._heap, e)
        if len(self._heap) + len(run) - self._run_head > 2 * self._live + 4096:
            self._compact()

    def _pop(self) -> _Entry | None:
        """Remove and return the smallest entry, valid or not (``None``: none left): the
        smaller of the run's first and the heap's top."""
        heap: list = self._heap
        run: list = self._run
        i: cython.Py_ssize_t = self._run_head
        e: _Entry
        if i < len(run):
            e = run[i]
            if not heap or _before(e, heap[0]):
                run[i] = None
                i += 1
                if i == len(run):
                    del run[:]
                    i = 0
                elif i >= 1024 and 2 * i >= len(run):
                    del run[:i]
                    i = 0
                self._run_head = i
                return e
        if heap:
            return _heap_pop(heap)
        return None

    def _compact(self) -> None:
        """Drop the entries no longer valid (a block's pin, re-push or eviction voided them)."""
        e: _Entry
        live: list = []
        for e in self._heap:
            if e.version == e.b.version:
                live.append(e)
        _heapify(live)
        self._heap = live
        run: list = self._run
        live = []
        i: cython.Py_ssize_t
        for i in range(self._run_head, len(run)):
            e = run[i]
            if e.version == e.b.version:
                live.append(e)
        self._run = live
        self._run_head = 0

    def _refresh(self) -> None:
        """Measure the candidates' ranges; re-key every live entry if the weight changed."""
        self._since = 0
        self.refreshes += 1
        if self.alpha == 0.0 and self._w == 0.0:
            return  # w = 0 whatever the ranges: nothing to measure or re-key
        live: list = []
        e: _Entry
        b: Block
        t_lo: cython.double = 0.0
        t_hi: cython.double = 0.0
        e_lo: cython.double = 0.0
        e_hi: cython.double = 0.0
        for e in self._heap + self._run[self._run_head :]:
            b = e.b
            if e.version == b.version:
                if not live:
                    t_lo = t_hi = b.pk1
                    e_lo = e_hi = b.pk2
                else:  # min() and max(): the first of equal values stays
                    if b.pk1 < t_lo:
                        t_lo = b.pk1
                    if b.pk1 > t_hi:
                        t_hi = b.pk1
                    if b.pk2 < e_lo:
                        e_lo = b.pk2
                    if b.pk2 > e_hi:
                        e_hi = b.pk2
                live.append(e)
        if live:
            self._t0, self._e0 = t_lo, e_lo
            if t_hi > t_lo:
                self._rt = t_hi - t_lo
            if e_hi > e_lo:
                self._re = e_hi - e_lo
        w: cython.double = self.alpha * self._rt / self._re
        if w != self._w:
            self._w = w
            for e in live:  # the live entries, re-keyed: the same as new ones
                b = e.b
                e.key = b.pk1 + w * b.pk2
                e.seq = b.pseq
            _heapify(live)
            self._heap = live
            self._run = []
            self._run_head = 0

    # --- tuning -----------------------------------------------------------------------------

    def _tune(self) -> None:
        """Replay the bootstrap window with every ``alpha`` of the grid; keep the one that
        saves the most recompute cost (ties: the first in the grid)."""
        from skv.cache.radix import BlockCache

        recorded, self._window = self._window, None
        if not recorded or self._capacity < 1:
            return
        if _one_cost(recorded):
            self.tuned = True  # every block costs the same: alpha cannot change a victim
            return
        window = [_prompt_copy(rb, n, now) for rb, n, now in recorded]
        best, best_saved = self.alpha, -1.0
        for a in self.alpha_grid:
            trial = Marconi(
                alpha=a,
                tune=False,
                refresh_fraction=self.refresh_fraction,
                attn_crossover=self.attn_crossover,
            )
            BlockCache(self._capacity, trial).replay(window)
            if trial.saved > best_saved:
                best, best_saved = a, trial.saved
        self.alpha = best
        self.tuned = True
        self._since = math.inf  # re-key everything at the next eviction

    # --- reporting --------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return {
            "alpha": float(self.alpha),
            "tuned": float(self.tuned),
            "refreshes": float(self.refreshes),
        }

    def params(self) -> dict[str, Any]:
        return {
            "alpha": self._alpha0,
            "tune": self.tune,
            "alpha_grid": list(self.alpha_grid),
            "bootstrap_multiplier": self.bootstrap_multiplier,
            "refresh_fraction": self.refresh_fraction,
            "tune_max_blocks": self.tune_max_blocks,
            "attn_crossover": self.attn_crossover,
        }


@cython.annotation_typing(False)  # Python's conversions and errors
def _prompt_copy(rb: RequestBlocks, n: int, now: float) -> RequestBlocks:
    """What the tuning replays of ``rb``: a copy of its first ``n`` blocks, the ones it had on
    arrival (a vLLM request view grows in place as it decodes; a simulator's request does not),
    arriving at ``now``. A single-chain request keeps only its leading full blocks, the ones
    vLLM's pool caches (a prompt's partial last block is keyed per request in the engine, by
    content in the simulator), so the replay is the same in both; a segment-keyed request keeps
    every block."""
    tokens = rb.tokens[:n]
    parents = rb.parents[:n]
    if parents.count(None) <= 1:
        bs = rb.block_size
        k = 0
        while k < n and tokens[k] == bs:
            k += 1
        if k < n:
            n = k
            del tokens[n:], parents[n:]
    return RequestBlocks(
        rb.index,
        now,
        rb.keys[:n],
        parents,
        tokens,
        rb.stypes[:n],
        rb.seg_tokens[:n],
        rb.session,
        rb.turn,
        rb.templated,
        rb.block_size,
        prompt_tokens=sum(tokens),
    )


def _one_cost(recorded: list) -> cython.bint:
    """Whether every block of the window has the same ``(pos * block_size, tokens)``: the
    same recompute cost (the scan stops at the first that differs)."""
    rb: RequestBlocks
    i: cython.Py_ssize_t
    n: cython.Py_ssize_t
    first: cython.bint = True
    c0: cython.longlong = 0
    t0: cython.longlong = 0
    c: cython.longlong
    t: cython.longlong
    for rb, n, _ in recorded:
        for i in range(n):
            c = i * rb.block_size
            t = rb.tokens[i]
            if first:
                c0, t0, first = c, t, False
            elif c != c0 or t != t0:
                return False
    return True


@cython.annotation_typing(False)  # Python's conversions and errors
def _positive_int(what: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"marconi: {what} must be an integer >= 1, got {value!r}")
    return int(value)


@cython.annotation_typing(False)  # Python's conversions and errors
def _non_negative(what: str, value: float) -> float:
    x = float(value)
    if not 0.0 <= x < math.inf:
        raise ValueError(f"marconi: {what} must be >= 0 and finite, got {value!r}")
    return x
