"""``lhd``: Least Hit Density (Beckmann, Chen, Cidon, "LHD: Improving Cache Hit Rate by
Maximizing Hit Density", NSDI 2018), learned online, with leaf-only eviction.

The algorithm, as in the paper and its reference implementation (``lhd.hpp`` / ``lhd.cpp`` of
the RankCache simulator, also shipped in libCacheSim): time counts *accesses*, here the block
accesses the cache reports (every insert and every hit; evictions are not accesses). A block's
*age* is the number of accesses since it was last touched, coarsened to ``age >> shift`` and
capped at ``max_age - 1`` (the overflow bucket). Blocks fall into *classes*; per class the
policy keeps two histograms over coarsened ages, of *hits* (a block was hit at that age: the
lifetime that began at its previous touch ended in a hit) and of *evictions* (it was evicted at
that age). Every ``reconfigure_interval`` accesses it

1. decays both histograms of every class by ``ewma_decay`` (an EWMA over intervals),
2. re-chooses the coarsening ``shift`` (below) and rebins the histograms if it changed,
3. recomputes, per class and age ``a``, the *hit density*: expected further hits over
   expected remaining lifetime of a block of that class that has reached age ``a``, by the
   paper's backwards recursion, O(max_age) per class (:func:`hit_density`)::

       H(a) = sum_{x >= a} hits[x]                         # hits still to come
       E(a) = sum_{x >= a} (hits[x] + evictions[x])        # lifetimes still running
       L(a) = sum_{x >= a} E(x) = sum_{x >= a} (x - a + 1) (hits[x] + evictions[x])
       density(a) = H(a) / L(a)    (0 where E(a) <= 1e-5: nothing was seen that old)

To evict, it samples ``associativity`` evictable blocks uniformly at random (with replacement,
as the reference does) and evicts the one of lowest density; a block in the overflow bucket
(age ``>= max_age - 1``) has density ``-inf``: it goes first, as in the reference. Ties go to
the block touched longest ago, then to the first sampled. With ``associativity`` at least the
number of evictable blocks, every one is examined instead: the victim is then exactly the
argmin (deterministic whatever the seed).

Classes (*choice*, a constructor parameter, ``features``, ``+``-joined): the paper classifies
objects by how many times they have been hit so far, capped, optionally combined with an
application id; the reference code buckets the sum of the last two hit ages instead (16 buckets
x 16 apps). Here a block's class combines any of

- ``hits``: ``min(b.hits, hit_classes - 1)``, the hits of this cached copy (a block evicted and
  inserted again starts from 0, as a re-admitted object does in the paper);
- ``reuse``: the reference code's classifier, ``hit_classes`` buckets of about
  ``log2(max_age / (last hit age + the one before))`` (coarsened ages; never hit: bucket 0,
  both ages 0: the top bucket);
- ``stype``: the block's semantic type (``TYPES`` index), playing the paper's application id
  (system prompts, tool outputs, answers are reused very differently);
- ``session``: whether the request that inserted the block had a session id (multi-turn).

Default ``"reuse+stype"`` (16 x 12 classes at most): the best mean block hit rate of ``hits``,
``reuse``, ``hits+stype``, ``reuse+stype`` and ``hits+session`` on the policy leaderboard's
tuning workloads, none of which it ranks
(``python -m skv.experiments.leaderboard.derive_defaults``; the scores are in
``experiments/leaderboard/derived_defaults.json``). The paper gives no feature set for this
setting. (An earlier default, ``hits+stype``, had been picked on the Mooncake trace the
leaderboard evaluates on.) A hit is recorded in the class the block had during the lifetime it
ends; the block then moves to its new class. In vLLM's pool (``FreeOrder``) a block's
``req`` is its request's ``RequestBlocks`` as in the simulator; inside a real engine the plugin
knows a session only when the client sends ``skv_session`` and a type only when it sends
segments: without them every block falls in the "no session" / ``unknown`` class, i.e. the
classification degrades gracefully to ``hits`` alone.

Age coarsening: at every reconfiguration ``shift`` becomes the smallest ``s >= 0`` with
``2**s >= n / (coarsening_tolerance * max_age)``, ``n`` an EWMA (``ewma_decay``) of the number
of cached blocks at reconfigurations, so the largest age, ``max_age << shift`` accesses, spans
``n / coarsening_tolerance`` = 100 cache fills at the default tolerance (several cache
lifetimes: a lifetime is ``n / miss rate`` accesses). On a change the histograms are rebinned:
coarser, buckets merge by ``x >> d``; finer, each bucket is spread evenly over its ``2**d``
new ones; what lands past the last bucket joins the overflow bucket. The reference does this
only at its 5th and 25th reconfiguration; here at every one (the EWMA keeps it stable).

Before the first reconfiguration (nothing learned yet) densities follow the reference's prior
``(1 + h) / (1 + a)``, ``h`` the class's capped hit count (0 without the ``hits`` feature) and
``a`` the coarsened age: older is lower, ties (equal age bucket) go to the block touched
longest ago, and ``shift`` starts at 0. A class first met after a reconfiguration starts with
density 0 at every age until the next one, as every class without events does in the
reference.

Explorers (reference, "escape local minima"): at every access the accessed block becomes an
*explorer* with probability ``1 / explore_inverse_probability`` (32) if fewer than
``floor(explore_fraction * cached blocks)`` (1%) explorers are cached; an explorer's density
gets +1 (above any learned density, which is at most 1 hit per age bucket) until its next
access or eviction, so classes the model would evict young are still observed at larger ages.
With fewer than 100 cached blocks there are no explorers.

What was adapted for prefix trees and the cache's interface:

- *Block fields*: ``pdata`` is the block's class, ``pseq`` its last touch (the access
  clock), ``version`` its index + 1 in the candidate array (0: not in it), ``pk1`` its last hit
  age (for ``reuse``), ``pk2`` its explorer bonus (0 or 1).
- *Leaf-only*: only unpinned leaves (``ref == 0 and n_children == 0``) are candidates. They sit
  in an array, each block storing its index + 1 in ``b.version`` (0: not in the array): a block
  joins on release as a leaf (``on_unpin``) or when its last child goes (``on_leaf``) and
  leaves on pin or eviction by swap-remove, O(1). The chosen victim is checked evictable; one
  that is not (never expected) is dropped from the array and the choice made again. In
  vLLM's flat pool every free cached block is a leaf.
- *Touches*: besides inserts and hits, a release (``on_unpin``) restarts a block's age without
  recording an event: time spent pinned by its request is in use, not idle (``lru``'s release
  order), so an age is the accesses since the block was last touched or released. Every hit is
  recorded, a hit on a block another request holds included (the reference records every
  access).
- *Reconfiguration interval*: the reference reconfigures every 2**20 accesses, tuned for caches
  of millions of objects and traces of 10**8 requests; skv's block caches hold 10**3-10**5
  blocks and its traces 10**5-10**7 block accesses, so the default is 2**14 (17
  reconfigurations on the 288,500-access Mooncake conversation trace). Pass 1 << 20 for the
  reference's value.
- *Histogram length*: the reference's ``MAX_AGE`` is 20000 buckets; this policy rebuilds every
  class's model at each reconfiguration (a cost that counted when it ran as plain Python), so
  ``max_age`` defaults to 1024 (with the same tolerance, buckets are 20x wider: ~10 buckets per
  cache fill of accesses).
- Left out: the reference's size division (every block is one slot of KV memory, so density
  is per block), its warm-up hack (8 candidates for the first 50 reconfigurations), and
  libCacheSim's extra "recently admitted" candidates.

Ordering invariant: among the sampled evictable leaves, the lowest ``(density, last touch)``
is evicted; ``density`` is the class's model at the block's coarsened age plus its explorer
bonus.

Complexity: O(1) per insert, hit, pin, release, ``on_leaf`` and eviction record (one RNG draw
per access for exploration); ``victim()`` is O(associativity) (O(evictable) when fewer);
a reconfiguration is O(classes x max_age), once every ``reconfigure_interval`` accesses
(amortised O(classes x max_age / interval) per access). ``victim()`` reads each evictable
block's last touch, class and explorer bonus from compact arrays indexed like the candidate
array (copied when the block joins it, see ``_add``), not from the scattered blocks. Compiled
(:mod:`skv._build`), the histograms are C arrays, and the random numbers come from a C copy of
the generator's Mersenne Twister state: the numbers of ``random.Random(seed).random()``, as in
plain Python.

Parameters (defaults, and where they come from):

- ``associativity=64``: sampled candidates (the paper; the reference code has 32);
- ``reconfigure_interval=16384``: adapted, above (reference 2**20);
- ``max_age=1024``: age buckets, adapted, above (reference ``MAX_AGE`` 20000);
- ``coarsening_tolerance=0.01``: reference ``AGE_COARSENING_ERROR_TOLERANCE``;
- ``ewma_decay=0.9``: reference ``EWMA_DECAY``;
- ``hit_classes=16``: buckets of ``hits`` and of ``reuse`` (reference: 16 classes,
  "diminishing returns after a few classes; 16 is safe");
- ``features="reuse+stype"``: derived, above;
- ``explore_fraction=0.01``, ``explore_inverse_probability=32``: reference
  ``EXPLORER_BUDGET_FRACTION``, ``EXPLORE_INVERSE_PROBABILITY``;
- ``seed=0``: the policy's own ``random.Random`` (runs are deterministic).

``metrics()`` logs the reconfiguration count, the shift, the classes in use, the cached
explorers and the evictable blocks.
"""

from __future__ import annotations

import random
import sys
from array import array
from typing import Any

import cython

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.model import NUM_TYPES

_FEATURES = ("hits", "reuse", "stype", "session")
_NEG_INF = float("-inf")
_POS_INF = float("inf")

#: the random generator's 32-bit words drawn at a time (two per ``random()``)
_RAND_WORDS = 4096
#: MT19937's constants: state size and shift (words), masks, twist matrix, tempering masks
_MT_N = 624
_MT_M = 397
_MT_UPPER = 0x80000000
_MT_LOWER = 0x7FFFFFFF
_MT_MATRIX_A = 0x9908B0DF
_MT_TEMPER_B = 0x9D2C5680
_MT_TEMPER_C = 0xEFC60000
#: the evictable-leaf arrays' first capacity (doubled when full)
_LEAF_START = 64
#: the ``array`` type code of the words (``unsigned int``: 32 bits wherever CPython runs)
_WORD = "I"
assert array(_WORD).itemsize == 4


@cython.annotation_typing(False)  # any sequences, as before
def hit_density(hits: list[float], evictions: list[float]) -> list[float]:
    """Hit density per age bucket from a class's hit and eviction histograms (the paper's
    backwards recursion; see the module docstring). The last bucket is the overflow bucket:
    it takes part in the sums, its own density is 0 (blocks there are evicted first)."""
    h, e = array("d", hits), array("d", evictions)
    if len(h) != len(e):
        raise ValueError("hit_density: hits and evictions differ in length")
    if not h:
        raise IndexError("hit_density: no age buckets")
    out = array("d", h)
    _densities(h, e, out)
    return out.tolist()


def _densities(hits: cython.double[:], evictions: cython.double[:], out: cython.double[:]):
    """``hit_density`` into ``out`` (all three of the same length >= 1): from the oldest bucket
    down, the hits to come ``H``, the lifetimes still running ``E`` and their remaining length
    ``L`` (running sums, added in the same order as ``itertools.accumulate`` would)."""
    n: cython.Py_ssize_t = len(hits)
    x: cython.Py_ssize_t
    h: cython.double
    hits_left: cython.double = 0.0
    events_left: cython.double = 0.0
    lifetime_left: cython.double = 0.0
    for x in range(n - 1, -1, -1):
        h = hits[x]
        hits_left += h
        events_left += h + evictions[x]
        lifetime_left += events_left
        out[x] = hits_left / lifetime_left if events_left > 1e-5 else 0.0
    out[n - 1] = 0.0


@cython.annotation_typing(False)  # Python's arithmetic and errors, as before
def prior_density(hit_class: int, max_age: int) -> list[float]:
    """The density before anything is learned: ``(1 + h) / (1 + a)`` (the reference's
    initialisation), older is lower; the overflow bucket 0."""
    density = [(1.0 + hit_class) / (1.0 + a) for a in range(max_age)]
    density[max_age - 1] = 0.0
    return density


class _Class:
    """One class's histograms (decayed at each reconfiguration) and its density model, as
    arrays of doubles (C arrays when compiled); ``hits``, ``evictions`` and ``density`` give
    them as lists."""

    def __init__(self, cid: cython.longlong, density: list) -> None:
        self.cid = cid
        n = len(density)
        self._hits = array("d", bytes(8 * n))
        self._evictions = array("d", bytes(8 * n))
        self._density = array("d", density)

    @property
    def hits(self) -> list[float]:
        return _as_list(self._hits)

    @property
    def evictions(self) -> list[float]:
        return _as_list(self._evictions)

    @property
    def density(self) -> list[float]:
        return _as_list(self._density)

    def __repr__(self) -> str:
        return f"LHDClass({self.cid})"


def _as_list(values: cython.double[:]) -> list:
    return [values[i] for i in range(len(values))]


@cython.annotation_typing(False)  # Python integers: shifts of any size (rare: a shift change)
def _rebin(hist: list[float], delta: int) -> list[float]:
    """``hist`` for a shift ``delta`` larger (coarser, > 0) or smaller (finer, < 0); the last
    bucket is the overflow bucket and keeps its mass."""
    n = len(hist)
    top = n - 1
    out = [0.0] * n
    out[top] = hist[top]
    if delta > 0:
        for x in range(top):
            out[x >> delta] += hist[x]
    else:
        k = -delta
        width = 1 << k
        for x in range(top):
            v = hist[x]
            if not v:
                continue
            part = v / width
            lo = x << k
            inside = min(lo + width, top) - lo  # new buckets below the overflow bucket
            if inside <= 0:
                out[top] += v
                continue
            for y in range(lo, lo + inside):
                out[y] += part
            if inside < width:
                out[top] += part * (width - inside)
    return out


class LHD(Policy):
    name = "lhd"

    @cython.annotation_typing(False)  # Python's conversions and errors
    def __init__(
        self,
        *,
        associativity: int = 64,
        reconfigure_interval: int = 1 << 14,
        max_age: int = 1024,
        coarsening_tolerance: float = 0.01,
        ewma_decay: float = 0.9,
        hit_classes: int = 16,
        features: str = "reuse+stype",
        explore_fraction: float = 0.01,
        explore_inverse_probability: int = 32,
        seed: int = 0,
    ) -> None:
        if int(associativity) < 1:
            raise ValueError(f"associativity must be >= 1, got {associativity}")
        if int(reconfigure_interval) < 1:
            raise ValueError(f"reconfigure_interval must be >= 1, got {reconfigure_interval}")
        if int(max_age) < 2:
            raise ValueError(f"max_age must be >= 2, got {max_age}")
        if not float(coarsening_tolerance) > 0:
            raise ValueError(f"coarsening_tolerance must be > 0, got {coarsening_tolerance}")
        if not 0.0 <= float(ewma_decay) <= 1.0:
            raise ValueError(f"ewma_decay must be in [0, 1], got {ewma_decay}")
        if int(hit_classes) < 1:
            raise ValueError(f"hit_classes must be >= 1, got {hit_classes}")
        if not 0.0 <= float(explore_fraction) <= 1.0:
            raise ValueError(f"explore_fraction must be in [0, 1], got {explore_fraction}")
        if int(explore_inverse_probability) < 1:
            raise ValueError(
                f"explore_inverse_probability must be >= 1, got {explore_inverse_probability}"
            )
        parts = [p.strip() for p in str(features).split("+")] if str(features).strip() else []
        bad = [p for p in parts if p not in _FEATURES]
        if bad or len(set(parts)) != len(parts):
            raise ValueError(
                f"features must be '+'-joined distinct names from {', '.join(_FEATURES)} "
                f"(or ''), got {features!r}"
            )
        self.associativity = int(associativity)
        self.reconfigure_interval = int(reconfigure_interval)
        self.max_age = int(max_age)
        self.coarsening_tolerance = float(coarsening_tolerance)
        self.ewma_decay = float(ewma_decay)
        self.hit_classes = int(hit_classes)
        self.features = "+".join(p for p in _FEATURES if p in parts)
        self.explore_fraction = float(explore_fraction)
        self.explore_inverse_probability = int(explore_inverse_probability)
        self.seed = int(seed)

        self._by_hits = "hits" in parts
        self._by_reuse = "reuse" in parts
        self._by_type = "stype" in parts
        self._by_session = "session" in parts
        n_classes = (
            (self.hit_classes if self._by_hits else 1)
            * (self.hit_classes if self._by_reuse else 1)
            * (NUM_TYPES if self._by_type else 1)
        )
        n_classes *= 2 if self._by_session else 1
        self._classes: list[_Class | None] = [None] * n_classes
        self._active: list[_Class] = []  # classes met so far, in order of first use

        self._rng = random.Random(self.seed)  # _uniform() gives its random() numbers
        if cython.compiled:
            _seed_words(self, self._rng.getstate()[1])
        else:  # its words, drawn _RAND_WORDS at a time
            self._words = array(_WORD, bytes(4 * _RAND_WORDS))
            self._word = _RAND_WORDS  # the next unused word (all used: draw again)
        self._leaves: list[Block] = []  # the evictable blocks; b.version = index + 1
        # what victim() reads of each, by the same index (compact: sampling touches no block):
        # last touch, class id, explorer bonus; capacity >= len(_leaves)
        self._leaf_t = array("q", bytes(8 * _LEAF_START))
        self._leaf_c = array("q", bytes(8 * _LEAF_START))
        self._leaf_x = array("d", bytes(8 * _LEAF_START))
        # victim()'s candidates: index in _leaves, last touch, density
        self._sample_j = array("q")
        self._sample_t = array("q")
        self._sample_d = array("d")
        self._clock = 0  # accesses so far (inserts + hits)
        self._next_reconfig = self.reconfigure_interval
        self._reconfigs = 0
        self._shift = 0
        self._age_shift = 0  # _shift, at most 63: ages are below 2**63, so the same ages
        self._top = self.max_age - 1  # the overflow bucket
        self._resident = 0  # cached blocks (inserted, not evicted)
        self._explorers = 0
        self._ewma_n = 0.0
        self._ewma_mass = 0.0

    # --- classes ------------------------------------------------------------------------------

    def _class_of(self, b: Block, reuse: cython.double) -> _Class:
        cid: cython.Py_ssize_t = 0
        hc: cython.longlong = 0
        if self._by_hits:
            hc = b.hits
            if hc >= self.hit_classes:
                hc = self.hit_classes - 1
            cid = hc
        if self._by_reuse:
            cid = cid * self.hit_classes + self._reuse_class(reuse)
        if self._by_type:
            cid = cid * NUM_TYPES + b.stype
        if self._by_session:
            req = b.req
            cid = cid * 2 + (0 if req is None or getattr(req, "session", None) is None else 1)
        cl = self._classes[cid]
        if cl is None:
            # before any reconfiguration the prior; after, no events yet: density 0
            # (the reference's model of an empty histogram) until the next one
            density = prior_density(hc, self.max_age) if not self._reconfigs else None
            cl = _Class(cid, density or [0.0] * self.max_age)
            self._classes[cid] = cl
            self._active.append(cl)
        return cl

    def _reuse_class(self, total: cython.double) -> cython.longlong:
        """The reference's class: about log2(max_age / (last two hit ages)), 0 never hit twice."""
        top: cython.longlong = self.hit_classes - 1
        if total == 0.0:
            return top
        c: cython.longlong = 0
        m: cython.longlong = self.max_age
        while total < m and c < top:
            total *= 2
            c += 1
        return c

    def density(self, b: Block) -> float:
        """The block's hit density now (what ``victim()`` compares)."""
        age: cython.longlong = (self._clock - b.pseq) >> self._age_shift
        if age >= self._top:
            return _NEG_INF
        cl: _Class = b.pdata
        return cl._density[age] + b.pk2

    # --- accesses -----------------------------------------------------------------------------

    def _explore(self, b: Block) -> None:
        """Roll for exploration (one draw per access, budget or not: a fixed RNG stream)."""
        if _uniform(self) * self.explore_inverse_probability < 1.0 and (
            self._explorers + 1 <= self.explore_fraction * self._resident
        ):
            b.pk2 = 1.0
            self._explorers += 1

    def _tick(self) -> None:
        self._clock += 1
        if self._clock >= self._next_reconfig:
            self._next_reconfig += self.reconfigure_interval
            self.reconfigure()

    def on_insert(self, b: Block, now: float) -> None:
        self._resident += 1
        b.version = 0
        b.pk2 = 0.0
        b.pk1 = 0.0  # the last hit age (the reference's lastHitAge)
        b.pseq = self._clock
        b.pdata = self._class_of(b, cython.cast(cython.double, self.max_age))
        self._explore(b)
        self._tick()

    def on_hit(self, b: Block, now: float) -> None:
        age: cython.longlong = (self._clock - b.pseq) >> self._age_shift
        if age > self._top:
            age = self._top
        cl: _Class = b.pdata
        cl._hits[age] += 1.0  # the class it had
        if b.pk2:
            b.pk2 = 0.0
            self._explorers -= 1
        b.pseq = self._clock
        b.pdata = self._class_of(b, b.pk1 + age)  # b.hits already counts this hit
        b.pk1 = age
        self._explore(b)
        self._tick()

    # --- the evictable array ------------------------------------------------------------------

    def _add(self, b: Block) -> None:
        """``b`` joins the evictable array, with a copy of its last touch, class and bonus.
        They change on an access and on a release; an accessed block is pinned (the policy
        contract), so not in the array, and a released block joins only now (its release sets
        its last touch first; pins go 0 -> 1 and back, so it was not in the array): the copy
        stays exact while the block is there."""
        if not b.version:
            i: cython.Py_ssize_t = len(self._leaves)
            if i >= len(self._leaf_t):
                self._grow_leaves()
            self._leaves.append(b)
            b.version = i + 1
            cl: _Class = b.pdata
            self._leaf_t[i] = b.pseq
            self._leaf_c[i] = cl.cid
            self._leaf_x[i] = b.pk2

    def _grow_leaves(self) -> None:
        """Double the leaf arrays' capacity (new arrays: a typed view pins an array's size)."""
        n: cython.Py_ssize_t = len(self._leaf_t)
        i: cython.Py_ssize_t
        t = array("q", bytes(16 * n))
        c = array("q", bytes(16 * n))
        x = array("d", bytes(16 * n))
        for i in range(n):
            t[i] = self._leaf_t[i]
            c[i] = self._leaf_c[i]
            x[i] = self._leaf_x[i]
        self._leaf_t = t
        self._leaf_c = c
        self._leaf_x = x

    def _remove(self, b: Block) -> None:
        i: cython.Py_ssize_t = b.version - 1
        leaves: list = self._leaves
        n: cython.Py_ssize_t = len(leaves) - 1  # the last block's index
        last: Block = leaves.pop()
        if last is not b:
            leaves[i] = last
            last.version = i + 1
            self._leaf_t[i] = self._leaf_t[n]
            self._leaf_c[i] = self._leaf_c[n]
            self._leaf_x[i] = self._leaf_x[n]
        b.version = 0

    def on_pin(self, b: Block) -> None:
        if b.version:
            self._remove(b)

    def on_unpin(self, b: Block, now: float) -> None:
        b.pseq = self._clock  # in use until released: the age restarts here
        if not b.n_children:
            self._add(b)

    def on_leaf(self, b: Block, now: float) -> None:
        if not b.ref:
            self._add(b)

    def victim(self) -> Block | None:
        leaves: list = self._leaves
        classes: list = self._classes
        leaf_t: cython.longlong[:] = self._leaf_t
        leaf_c: cython.longlong[:] = self._leaf_c
        leaf_x: cython.double[:] = self._leaf_x
        top: cython.longlong = self._top
        shift: cython.longlong = self._age_shift
        clock: cython.longlong = self._clock
        k: cython.Py_ssize_t = self.associativity
        n: cython.Py_ssize_t
        m: cython.Py_ssize_t
        i: cython.Py_ssize_t
        j: cython.Py_ssize_t
        best: Block
        cl: _Class
        age: cython.longlong
        t: cython.longlong
        best_i: cython.Py_ssize_t
        best_t: cython.longlong
        d: cython.double
        best_d: cython.double
        while leaves:
            n = len(leaves)
            exact = n <= k  # every evictable block: the exact argmin
            m = n if exact else k
            if len(self._sample_j) < m:
                self._sample_j = array("q", bytes(8 * m))
                self._sample_t = array("q", bytes(8 * m))
                self._sample_d = array("d", bytes(8 * m))
            if not exact:  # the draws first
                for i in range(m):
                    j = cython.cast(cython.Py_ssize_t, _uniform(self) * n)
                    if j >= n:
                        raise IndexError("list index out of range")
                    self._sample_j[i] = j
            for i in range(m):
                j = i if exact else self._sample_j[i]
                t = leaf_t[j]
                age = (clock - t) >> shift
                if age >= top:
                    d = _NEG_INF
                else:
                    cl = classes[leaf_c[j]]
                    d = cl._density[age] + leaf_x[j]
                self._sample_j[i] = j
                self._sample_t[i] = t
                self._sample_d[i] = d
            best_i = 0
            best_d = _POS_INF  # densities are finite or -inf: the first block always wins
            best_t = 0
            for i in range(m):
                d = self._sample_d[i]
                t = self._sample_t[i]
                if d < best_d or (d == best_d and t < best_t):
                    best_i = i
                    best_d = d
                    best_t = t
            best = leaves[self._sample_j[best_i]]
            self._remove(best)
            if not best.ref and not best.n_children:
                return best
            # not evictable (never expected): out of the array until released / a leaf again
        return None

    def on_evict(self, b: Block, now: float) -> None:
        age: cython.longlong = (self._clock - b.pseq) >> self._age_shift
        if age > self._top:
            age = self._top
        cl: _Class = b.pdata
        cl._evictions[age] += 1.0
        if b.version:  # not the block victim() gave (a pool's fallback)
            self._remove(b)
        if b.pk2:
            b.pk2 = 0.0
            self._explorers -= 1
        self._resident -= 1

    # --- learning -----------------------------------------------------------------------------

    def reconfigure(self) -> None:
        """Decay the histograms, adapt the age coarsening, rebuild every class's densities."""
        self._reconfigs += 1
        decay: cython.double = self.ewma_decay
        cl: _Class
        i: cython.Py_ssize_t
        for cl in self._active:
            for i in range(len(cl._hits)):
                cl._hits[i] = cl._hits[i] * decay
                cl._evictions[i] = cl._evictions[i] * decay
        self._ewma_n = self._ewma_n * decay + self._resident
        self._ewma_mass = self._ewma_mass * decay + 1.0
        target: cython.double = (
            self._ewma_n / self._ewma_mass / (self.coarsening_tolerance * self.max_age)
        )
        shift: object = 0  # a Python integer: 1 << shift of any size
        while (1 << shift) < target:
            shift += 1
        delta: object = shift - self._shift
        if delta:
            self._shift = shift
            self._age_shift = min(shift, 63)
            for cl in self._active:
                cl._hits = array("d", _rebin(cl.hits, delta))
                cl._evictions = array("d", _rebin(cl.evictions, delta))
        for cl in self._active:
            _densities(cl._hits, cl._evictions, cl._density)

    # --- reporting ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return {
            "reconfigurations": float(self._reconfigs),
            "age_shift": float(self._shift),
            "classes": float(len(self._active)),
            "explorers": float(self._explorers),
            "evictable": float(len(self._leaves)),
        }

    def params(self) -> dict[str, Any]:
        return {
            "associativity": self.associativity,
            "reconfigure_interval": self.reconfigure_interval,
            "max_age": self.max_age,
            "coarsening_tolerance": self.coarsening_tolerance,
            "ewma_decay": self.ewma_decay,
            "hit_classes": self.hit_classes,
            "features": self.features,
            "explore_fraction": self.explore_fraction,
            "explore_inverse_probability": self.explore_inverse_probability,
            "seed": self.seed,
        }


# --- randomness: the policy's random.Random, drawn faster -------------------------------------


def _uniform(p: LHD) -> cython.double:
    """``p._rng.random()``: the same numbers, made of two 32-bit words of its Mersenne Twister
    as CPython's ``random()`` makes them. Compiled, the words come from a copy of the
    generator's state, stepped in C (``_next_word``); in Python, from words drawn in bulk with
    ``getrandbits``."""
    a: cython.ulong
    b: cython.ulong
    if cython.compiled:
        a = _next_word(p) >> 5
        b = _next_word(p) >> 6
    else:
        i = p._word
        if i >= _RAND_WORDS:
            data = p._rng.getrandbits(32 * _RAND_WORDS).to_bytes(4 * _RAND_WORDS, "little")
            words = array(_WORD, data)  # the first word drawn is the least significant
            if sys.byteorder != "little":
                words.byteswap()
            p._words = words
            i = 0
        a = p._words[i] >> 5
        b = p._words[i + 1] >> 6
        p._word = i + 2
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


def _seed_words(p: LHD, state: tuple) -> None:
    """Copy a ``random.Random`` state (``getstate()[1]``: 624 words, then the position)."""
    i: cython.Py_ssize_t
    for i in range(_MT_N):
        p._mt[i] = state[i]
    p._mti = state[_MT_N]


def _next_word(p: LHD) -> cython.uint:
    """The generator's next 32-bit word: MT19937 (``genrand_uint32`` of CPython's
    ``_randommodule.c``, the reference implementation)."""
    y: cython.uint
    kk: cython.Py_ssize_t
    if p._mti >= _MT_N:  # the next 624 words at once
        for kk in range(_MT_N - _MT_M):
            y = (p._mt[kk] & _MT_UPPER) | (p._mt[kk + 1] & _MT_LOWER)
            p._mt[kk] = p._mt[kk + _MT_M] ^ (y >> 1) ^ (_MT_MATRIX_A if y & 1 else 0)
        for kk in range(_MT_N - _MT_M, _MT_N - 1):
            y = (p._mt[kk] & _MT_UPPER) | (p._mt[kk + 1] & _MT_LOWER)
            p._mt[kk] = p._mt[kk + _MT_M - _MT_N] ^ (y >> 1) ^ (_MT_MATRIX_A if y & 1 else 0)
        y = (p._mt[_MT_N - 1] & _MT_UPPER) | (p._mt[0] & _MT_LOWER)
        p._mt[_MT_N - 1] = p._mt[_MT_M - 1] ^ (y >> 1) ^ (_MT_MATRIX_A if y & 1 else 0)
        p._mti = 0
    y = p._mt[p._mti]
    p._mti += 1
    y ^= y >> 11
    y ^= (y << 7) & _MT_TEMPER_B
    y ^= (y << 15) & _MT_TEMPER_C
    y ^= y >> 18
    return y
