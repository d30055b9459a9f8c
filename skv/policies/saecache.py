"""``saecache`` / ``saecache_fixed``: SAECache's four-queue semantic-adaptive eviction.

What the paper gives (REFERENCE.md section 3) and what this file had to choose is marked
*choice*; every choice is a constructor parameter, listed in ``params()``.

Queues. Each block sits in one of four queues, decided by the request that last used it
(inserted or hit it) and by the block's own type:

1. ``output`` blocks (decode) -> **Evict-First**, whatever the request;
2. else a *multi-turn* request (it has a session id, or its prompt carries an
   ``assistant_history`` segment) that uses tools (a ``tool_schema`` or ``tool_output``
   segment anywhere in its prompt) -> **Agentic**;
3. else a multi-turn request -> **Chat**;
4. else (single-turn) a templated request (``RequestBlocks.templated``, which the segmenter sets
   when a ``template`` segment is present) -> **Structural**;
5. else (untemplated single-turn prefill) -> **Evict-First** while the block is *low-reuse*:
   *choice*, it moves to Structural once it has been hit ``promote_hits`` times (default 1)
   while cached (``promote_hits=None``: never).

``turn`` is not read (traces number turns from 0 or from 1). A block hit by a request of
another class changes queue at that hit.

Priority, lowest evicted first: ``P(b) = alpha_q * w_type * p_q(b) / dt`` with
``dt = max(now - t_b, dt_epsilon)``, ``t_b`` the time the block's last holder released it (as
``lru``: a block in use is in use until its request finishes) and ``dt_epsilon`` = 1 ms
(*choice*: a block released at ``now`` gets ``dt = dt_epsilon``, not a division by zero).

- Chat, Agentic: ``p_q = 1 - LogNormalCDF(dt; mu_q, sigma_q)``, the chance that the session's
  next turn has not come yet after ``dt``. ``mu_q, sigma_q``: maximum likelihood on the last
  ``gap_window`` log inter-turn gaps of that queue, ``mu = mean(log g)``,
  ``sigma = sqrt(mean((log g - mu)^2))`` (= ``scipy.stats.lognorm.fit(g, floc=0)``); the seed
  ``mu = 2.28, sigma = 1.34`` holds until ``min_gap_samples`` (30) gaps are in the window;
  ``sigma >= sigma_min`` (0.05). A gap is the arrival of a session's request minus the arrival
  of the session's previous request (the simulator adding a request's output blocks is
  ``on_extend``, the same request, not a gap; gaps <= 0 are not samples; in the simulator a
  gap also spans the previous turn's service time, which ``dt`` does not). The last
  ``max_sessions`` sessions are remembered.
- Structural: ``p_q = 1 - (pos / pos_max) ** gamma`` with ``pos`` the block's index in the
  request that inserted it and ``pos_max`` that request's block count, *choice*: the ratio is
  rounded down to ``position_levels`` = R levels, ``r = floor(R * pos / pos_max) / R`` (so
  ``p >= 1 - ((R-1)/R)**gamma > 0``; the error against the unrounded ratio is at most
  ``max(gamma, 1) * R ** -min(gamma, 1)`` in ``p``, 1/16 at gamma = 1). ``gamma``: *choice*,
  the same model read as a distribution: ``1 - r**gamma`` is the chance that a later prompt
  reuses the prefix past relative depth ``r``, i.e. reuse depths ``D`` have CDF ``D**gamma``,
  whose MLE is ``gamma = -1 / mean(log D)`` (= ``scipy.stats.powerlaw.fit(D, floc=0,
  fscale=1)``) over the last ``gamma_window`` single-turn requests, with
  ``D = (hit blocks + 0.5) / (blocks + 1)``; seed ``gamma = 1`` until ``min_gamma_samples``
  (30); clipped to [``gamma_min``, ``gamma_max``] = [0.1, 10].
- Evict-First: ``p_q = 1`` (recency and type only); *choice*: its queue weight starts at
  ``alpha_evict_first = 0.1`` (the other queues at 1), so at equal type a decode or unreused
  block goes first unless it is ten times fresher; learning moves it like any alpha.

Learning (``learn=True``; every ``update_every`` = K evictions, default 256):

- type weights: ``adaptive_semantic``'s rule, run by an ``AdaptiveSemantic`` instance fed this
  policy's evictions and ghost hits (not a copy of it): per type,
  ``w <- (1 - eta) w + eta (1 + ghost_gain * miss_after_evict + reuse_gain * reuse)``,
  gains 5 and 2, ``eta = 0.1``, initial weights ``static_semantic``'s prior;
- queue weights, *choice* (the paper gives no rule): per queue ``q`` with events in the window,
  hit efficiency ``e_q = (hits_q + ghost_hits_q) / (hits_q + evictions_q)`` (block reuses,
  counting those lost to an eviction, per block fate: reused or evicted), and
  ``alpha_q <- (1 - alpha_eta) alpha_q + alpha_eta * clip(e_q / mean(e), alpha_min, alpha_max)``
  with ``mean(e)`` over those queues (only ratios of alphas matter; the clip bounds the
  targets to [0.05, 20]); no update when every ``e_q`` is 0;
- ``mu_q, sigma_q`` and ``gamma`` are refitted at every new sample (above).

``metrics()``: ``alpha_<queue>``, ``w_<type>``, ``mu_chat, sigma_chat, mu_agentic,
sigma_agentic``, ``gamma`` and sample/update counts, for logging over time; ``fitted()`` gives
the learned values as parameters for ``saecache_fixed``.

``saecache_fixed``: nothing learned; ``alpha``, ``weights``, ``mu``, ``sigma``, ``gamma`` as
given (e.g. ``fitted()`` of a run on another workload). Ablation switches (both policies), each
replacing one factor by 1: ``queue_weights=False`` (``alpha_q = 1``), ``type_weights=False``
(``w = 1``), ``lognormal_timing=False`` (Chat/Agentic ``p = 1``: plain ``1/dt``),
``position_decay=False`` (Structural ``p = 1``). A switched-off factor is not learned either.

Exact victim (P depends on ``now``, so no fixed heap key ranks blocks for all time). Blocks
sit in groups: (Evict-First, type), (Chat, type), (Agentic, type), (Structural, type, level).
Inside a group ``alpha_q``, ``w_type``, ``mu_q, sigma_q`` and the Structural ``p`` are the same
for every block, and ``P`` is a non-increasing function of ``dt`` (``1/dt`` times a constant or
times a survival function), so at any ``now`` the group's least-priority block is its least
recently released one, whatever the parameters are or become. Each group is a heap ordered by
``(t_b, release seq)``, kept lazily as in ``MonotonePriorityPolicy`` (a block's key only grows
while it is cached; a block that changes group, or is released at a time earlier than its last
release, voids its entry and gets a new one); the victim is the minimum over group tops of
``(log P, t_b, seq)`` evaluated at ``now`` (the time of the request being served, from
``on_request``): the argmin of ``P`` over all evictable blocks, ties going to the earlier
release. Learning never re-keys anything. Cost per eviction: one heap pop (amortised
O(log n), stale entries included) plus O(non-empty groups), at most ``3 T + T R`` (T = 12 types),
a few in practice; heaps are compacted when stale entries outnumber live ones.

Speed. Compiled (``saecache.pxd``, see ``skv/_build.py``), the hooks are C calls. Each group
is a ``Group`` record (queue, type, level, heap) holding two cached values, each recomputed
from the same expression whenever an input differs, so keys and victims are the same in both
modes, bit for bit (``tests/test_compiled_equivalence.py``): the group's constant ``log alpha_q +
log w_type (+ log p)`` (until the weights or ``gamma`` change) and the key of its top entry (a
function of that constant, ``t_b``, ``now``, ``dt_epsilon``, ``mu_q`` and ``sigma_q`` only: an
eviction recomputes the popped group's key, not every group's). The fit windows are rings of C
doubles whose periodic exact re-sum is, compiled, ``math.fsum``'s algorithm in C (``_fsum``).
``compact_slack`` is read when the policy is made.
"""

from __future__ import annotations

import array
import math
from typing import Any, ClassVar

import cython
from cython.cimports.libc.math import erfc, fabs, isfinite, log, log1p, pow, sqrt  # C math

from skv.blocks import RequestBlocks
from skv.cache.block import Block, GhostEntry
from skv.cache.policy import Policy
from skv.model import NUM_TYPES, TYPE_INDEX, TYPES, SemanticType
from skv.policies.adaptive_semantic import AdaptiveSemantic
from skv.policies.base import HeapEntry, KeyHeap
from skv.policies.static_semantic import resolve_weights

# queue ids: the non-Structural queues' groups are ``q * NUM_TYPES + type``
EVICT_FIRST, CHAT, AGENTIC, STRUCTURAL = 0, 1, 2, 3
QUEUES: tuple[str, ...] = ("evict_first", "chat", "agentic", "structural")
QUEUE_INDEX: dict[str, int] = {q: i for i, q in enumerate(QUEUES)}

MU_SEED = 2.28  # log-seconds: the paper's seed of the inter-turn gap model
SIGMA_SEED = 1.34
DEFAULT_ALPHA: dict[str, float] = {
    "evict_first": 0.1,
    "chat": 1.0,
    "agentic": 1.0,
    "structural": 1.0,
}

# C constants of the hot path when compiled (plain module globals otherwise)
_EF = cython.declare(cython.int, EVICT_FIRST)
_CHAT = cython.declare(cython.int, CHAT)
_AGENTIC = cython.declare(cython.int, AGENTIC)
_STRUCT = cython.declare(cython.int, STRUCTURAL)
_T = cython.declare(cython.Py_ssize_t, NUM_TYPES)
_OUTPUT = cython.declare(cython.Py_ssize_t, TYPE_INDEX[SemanticType.OUTPUT])
_HISTORY = cython.declare(cython.Py_ssize_t, TYPE_INDEX[SemanticType.ASSISTANT_HISTORY])
_TOOL_SCHEMA = cython.declare(cython.Py_ssize_t, TYPE_INDEX[SemanticType.TOOL_SCHEMA])
_TOOL_OUTPUT = cython.declare(cython.Py_ssize_t, TYPE_INDEX[SemanticType.TOOL_OUTPUT])
_SQRT2 = cython.declare(cython.double, math.sqrt(2.0))
_HALF_LOG_PI = cython.declare(cython.double, 0.5 * math.log(math.pi))
_LOG_HALF = cython.declare(cython.double, math.log(0.5))
_NUM_PARTIALS = cython.declare(cython.Py_ssize_t, 64)  # more than doubles can need (~40)


def request_queue(rb: RequestBlocks) -> cython.int:
    """The queue of a request's prefill blocks (rules 2-5 of the module docstring, before
    promotion): ``EVICT_FIRST`` for untemplated single-turn requests."""
    history: cython.bint = False
    tools: cython.bint = False
    t: cython.Py_ssize_t
    for x in rb.stypes:
        t = x
        if t == _HISTORY:
            history = True
        elif t in (_TOOL_SCHEMA, _TOOL_OUTPUT):
            tools = True
    if rb.session is not None or history:
        return _AGENTIC if tools else _CHAT
    return _STRUCT if rb.templated else _EF


def log_survival(dt: cython.double, mu: cython.double, sigma: cython.double) -> cython.double:
    """``log(1 - LogNormalCDF(dt; mu, sigma))``, finite far in the tail (asymptotic erfc)."""
    z: cython.double = (log(dt) - mu) / (sigma * _SQRT2)
    if z < 25.0:
        return log(0.5 * erfc(z))
    z2: cython.double = z * z
    return (
        _LOG_HALF
        - z2
        - log(z)
        - _HALF_LOG_PI
        + log1p(-0.5 / z2 + 0.75 / (z2 * z2) - 1.875 / (z2 * z2 * z2))
    )


def _clip(x: cython.double, lo: cython.double, hi: cython.double) -> cython.double:
    """``min(max(x, lo), hi)`` with Python's rules (the first argument wins ties and NaN)."""
    if lo > x:
        x = lo
    if hi < x:
        x = hi
    return x


class LogWindow:
    """The last ``size`` samples (a ring of C doubles) with running sums of ``x`` and ``x**2``,
    re-summed exactly (``math.fsum``, see ``_fsum``) every ``size`` samples, so rounding never
    accumulates."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._arr = array.array("d", [0.0]) * size
        self._buf = self._arr
        self._n = 0
        self._head = 0
        self.s1 = 0.0
        self.s2 = 0.0
        self._since_exact = 0

    def __len__(self) -> int:
        return self._n

    def push(self, x: cython.double) -> None:
        full: cython.bint = self._n == self.size
        y: cython.double = self._buf[self._head] if full else 0.0
        self._buf[self._head] = x
        self._head += 1
        if self._head == self.size:
            self._head = 0
        if not full:
            self._n += 1
        self.s1 += x
        self.s2 += x * x
        if full:  # the oldest sample leaves the window
            self.s1 -= y
            self.s2 -= y * y
        self._since_exact += 1
        if self._since_exact >= self.size:
            # the ring is full here (size pushes since the last re-sum); the exact sum does not
            # depend on the order of the samples
            self.s1 = _fsum(self._arr, self._buf, self._n, False)
            self.s2 = _fsum(self._arr, self._buf, self._n, True)
            self._since_exact = 0

    def mean(self) -> cython.double:
        return self.s1 / self._n

    def std(self) -> cython.double:
        """Population (maximum-likelihood) standard deviation."""
        m: cython.double = self.mean()
        v: cython.double = self.s2 / self._n - m * m
        return sqrt(v if v > 0.0 else 0.0)


def _fsum(
    arr: object, buf: cython.double[::1], n: cython.Py_ssize_t, square: cython.bint
) -> cython.double:
    """``math.fsum`` of the first ``n`` values of ``buf`` (of their squares if ``square``).

    Compiled, CPython's own algorithm (Modules/mathmodule.c, ``math_fsum``: Shewchuk's exact
    partials, then a half-even correction across partials) on the C doubles, with no float
    objects; its result is the correctly rounded sum, so it equals ``math.fsum`` bit for bit
    (``tests/test_saecache.py`` checks). Non-finite values, an intermediate overflow or more
    partials than the C array holds fall back to ``math.fsum`` itself.
    """
    if not cython.compiled:
        values = list(arr)[:n]
        return math.fsum([v * v for v in values] if square else values)
    p = cython.declare(cython.double[64])  # _NUM_PARTIALS
    m: cython.Py_ssize_t = 0  # partials in use
    k: cython.Py_ssize_t
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    x: cython.double
    y: cython.double
    t: cython.double
    hi: cython.double
    yr: cython.double
    lo: cython.double = 0.0
    for k in range(n):
        x = buf[k]
        if square:
            x = x * x
        if not isfinite(x):
            return _fsum_python(arr, n, square)
        i = 0
        for j in range(m):
            y = p[j]
            if fabs(x) < fabs(y):
                t = x
                x = y
                y = t
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                p[i] = lo
                i += 1
            x = hi
        m = i
        if x != 0.0:
            if not isfinite(x) or m >= _NUM_PARTIALS:  # overflow / out of room: let fsum say
                return _fsum_python(arr, n, square)
            p[m] = x
            m += 1
    hi = 0.0
    if m > 0:
        m -= 1
        hi = p[m]
        while m > 0:  # sum from the top, stop when the sum becomes inexact
            x = hi
            m -= 1
            y = p[m]
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                break
        if m > 0 and ((lo < 0.0 and p[m - 1] < 0.0) or (lo > 0.0 and p[m - 1] > 0.0)):
            y = lo * 2.0
            x = hi + y
            yr = x - hi
            if y == yr:
                hi = x
    return hi


def _fsum_python(arr: object, n: cython.Py_ssize_t, square: cython.bint) -> cython.double:
    values = list(arr)[:n]
    return math.fsum([v * v for v in values] if square else values)


def _per_queue(value: float | dict[str, float] | None, seed: float, what: str) -> list[float]:
    """``mu``/``sigma`` for (Chat, Agentic): one number for both or a dict by queue name."""
    if value is None:
        value = seed
    if isinstance(value, dict):
        unknown = set(value) - {"chat", "agentic"}
        if unknown:
            raise ValueError(f"saecache: {what} is given for chat and agentic, not {unknown}")
        out = [float(value.get("chat", seed)), float(value.get("agentic", seed))]
    else:
        out = [float(value)] * 2
    return out


class Group:
    """One group of blocks (module docstring): its queue, type and Structural level, its heap,
    and the constant part of ``log P`` its blocks share (``base``, valid for ``gamma`` and the
    policy's weight ``stamp`` it was computed at)."""

    def __init__(
        self,
        q: cython.int,
        t: cython.int,
        lev: cython.int,
        timed: cython.bint,
        ratio: cython.double,
    ) -> None:
        self.q = q
        self.t = t
        self.lev = lev
        self.timed = timed
        self.ratio = ratio  # pos / pos_max of a Structural level with position decay, else 0
        self.heap = KeyHeap()
        self.cbase = 0.0  # log alpha_q + log w_type
        self.base = 0.0  # cbase + log(1 - ratio ** gamma) when ratio > 0
        self.gamma = 0.0
        self.stamp = -1
        self.active = False
        # the last key computed for the group's top (see SAECache.victim) and its inputs
        self.memo = False
        self.memo_key = 0.0
        self.memo_t = 0.0
        self.memo_now = 0.0
        self.memo_eps = 0.0
        self.memo_mu = 0.0
        self.memo_sigma = 0.0


class SAECache(Policy):
    name = "saecache"
    #: heaps are compacted when their entries exceed ``2 * live + compact_slack`` (read when the
    #: policy is made)
    compact_slack: ClassVar[int] = 4096

    @cython.annotation_typing(False)  # the arguments are checked and converted as plain Python
    def __init__(
        self,
        *,
        update_every: int = 256,
        weights: dict[str, float] | None = None,
        eta: float = 0.1,
        ghost_gain: float = 5.0,
        reuse_gain: float = 2.0,
        alpha: dict[str, float] | None = None,
        alpha_eta: float = 0.1,
        alpha_min: float = 0.05,
        alpha_max: float = 20.0,
        mu: float | dict[str, float] | None = None,
        sigma: float | dict[str, float] | None = None,
        gap_window: int = 1000,
        min_gap_samples: int = 30,
        sigma_min: float = 0.05,
        max_sessions: int = 100_000,
        gamma: float = 1.0,
        gamma_window: int = 1000,
        min_gamma_samples: int = 30,
        gamma_min: float = 0.1,
        gamma_max: float = 10.0,
        position_levels: int = 16,
        promote_hits: int | None = 1,
        dt_epsilon: float = 1e-3,
        queue_weights: bool = True,
        type_weights: bool = True,
        lognormal_timing: bool = True,
        position_decay: bool = True,
        learn: bool = True,
    ) -> None:
        name = self.name
        if update_every < 1 or gap_window < 1 or gamma_window < 1 or max_sessions < 1:
            raise ValueError(f"{name}: update_every, windows and max_sessions must be >= 1")
        if min_gap_samples < 1 or min_gamma_samples < 1:
            raise ValueError(f"{name}: min_gap_samples and min_gamma_samples must be >= 1")
        if position_levels < 1:
            raise ValueError(f"{name}: position_levels must be >= 1, got {position_levels}")
        if promote_hits is not None and promote_hits < 1:
            raise ValueError(f"{name}: promote_hits must be >= 1 or None, got {promote_hits}")
        if not dt_epsilon > 0 or not sigma_min > 0:
            raise ValueError(f"{name}: dt_epsilon and sigma_min must be > 0")
        if not 0.0 <= eta <= 1.0 or not 0.0 <= alpha_eta <= 1.0:
            raise ValueError(f"{name}: eta and alpha_eta must be in [0, 1]")
        if not 0 < alpha_min <= alpha_max:
            raise ValueError(f"{name}: need 0 < alpha_min <= alpha_max")
        if not 0 < gamma_min <= gamma_max or not gamma > 0:
            raise ValueError(f"{name}: need gamma > 0 and 0 < gamma_min <= gamma_max")
        self.update_every = int(update_every)
        self.eta = float(eta)
        self.ghost_gain = float(ghost_gain)
        self.reuse_gain = float(reuse_gain)
        self.alpha_eta = float(alpha_eta)
        self.alpha_min = float(alpha_min)
        self.alpha_max = float(alpha_max)
        self.gap_window = int(gap_window)
        self.min_gap_samples = int(min_gap_samples)
        self.sigma_min = float(sigma_min)
        self.max_sessions = int(max_sessions)
        self.gamma_window = int(gamma_window)
        self.min_gamma_samples = int(min_gamma_samples)
        self.gamma_min = float(gamma_min)
        self.gamma_max = float(gamma_max)
        self.position_levels = R = int(position_levels)
        self.promote_hits = promote_hits
        self.dt_epsilon = float(dt_epsilon)
        self.queue_weights = bool(queue_weights)
        self.type_weights = bool(type_weights)
        self.lognormal_timing = bool(lognormal_timing)
        self.position_decay = bool(position_decay)
        self.learn = bool(learn)
        self._slack = int(type(self).compact_slack)

        # --- parameters (initial values; learned ones move) ----------------------------------
        alpha_given = dict(DEFAULT_ALPHA)
        for q, a in (alpha or {}).items():
            if q not in QUEUE_INDEX:
                raise ValueError(f"{name}: unknown queue {q!r} in alpha; known: {QUEUES}")
            if not a > 0:
                raise ValueError(f"{name}: alpha of {q!r} must be > 0, got {a}")
            alpha_given[q] = float(a)
        self.initial_alpha = [alpha_given[q] for q in QUEUES]
        self.initial_weights = resolve_weights(weights, name)
        self.initial_mu = _per_queue(mu, MU_SEED, "mu")
        self.initial_sigma = _per_queue(sigma, SIGMA_SEED, "sigma")
        if min(self.initial_sigma) <= 0:
            raise ValueError(f"{name}: sigma must be > 0")
        self.initial_gamma = float(gamma)
        self.alpha = list(self.initial_alpha) if self.queue_weights else [1.0] * len(QUEUES)
        self.weights = list(self.initial_weights) if self.type_weights else [1.0] * NUM_TYPES
        self.mu = list(self.initial_mu)  # [chat, agentic]
        self.sigma = list(self.initial_sigma)
        self.gamma = self.initial_gamma

        learn = self.learn
        self._learn_alpha = learn and self.queue_weights
        self._learn_timing = learn and self.lognormal_timing
        self._learn_gamma = learn and self.position_decay
        self._types = None
        if learn and self.type_weights:
            self._types = AdaptiveSemantic(
                eta=self.eta,
                update_every=self.update_every,
                initial_weights={t.value: w for t, w in zip(TYPES, self.weights, strict=True)},
                ghost_gain=self.ghost_gain,
                reuse_gain=self.reuse_gain,
            )
            self.weights = self._types.weights  # the learner's own list: always current
        # the cache keeps a ghost list only for a policy that learns from it
        self._uses_ghost = self._types is not None or self._learn_alpha

        # --- groups --------------------------------------------------------------------------
        T = NUM_TYPES
        self.num_groups = G = 3 * T + T * R
        groups = []
        for g in range(G):
            if g < 3 * T:
                q, t, lev = g // T, g % T, R
            else:
                q, t, lev = STRUCTURAL, (g - 3 * T) // R, (g - 3 * T) % R
            timed = self.lognormal_timing and q in (CHAT, AGENTIC)
            ratio = lev / R if self.position_decay and lev < R else 0.0
            groups.append(Group(q, t, lev, timed, ratio))
        self._groups = groups
        self._heaps = [grp.heap for grp in groups]
        self._active: list[Group] = []  # the groups whose heaps may hold entries
        self._n_entries = 0
        self._n_live = 0
        self._seq = 0
        self._stamp = 0
        self._refresh_cbase()

        # --- the current request and the learning windows -------------------------------------
        self._now = 0.0
        self._cls = EVICT_FIRST
        self._req_single = False  # the current request is single-turn (gives a depth sample)
        self._req_blocks = 0
        self._req_hits = 0
        self._sessions: dict[Any, float] = {}  # session -> arrival of its last request
        self._gaps = [LogWindow(self.gap_window), LogWindow(self.gap_window)]
        self._depths = LogWindow(self.gamma_window)
        if not cython.compiled:  # compiled, these are C arrays (saecache.pxd)
            self._n_hits = [0] * len(QUEUES)
            self._n_evicted = [0] * len(QUEUES)
            self._n_ghost = [0] * len(QUEUES)
        self._reset_window()
        self._evictions = 0
        self.alpha_updates = 0
        self._w_seen = 0

    @property
    def promote_hits(self) -> int | None:
        """Hits after which an Evict-First prefill block moves to Structural (None: never)."""
        return None if self._promote < 0 else self._promote

    @promote_hits.setter
    def promote_hits(self, value: object) -> None:  # int or None
        self._promote = -1 if value is None else int(value)

    @property
    def uses_ghost_list(self) -> bool:
        """The cache keeps a ghost list only for a policy that learns from it."""
        return bool(self._uses_ghost)

    # --- classification ------------------------------------------------------------------------

    def group_of(self, b: Block, cls: cython.int) -> cython.Py_ssize_t:
        """The group of block ``b`` last used by a request of queue class ``cls``."""
        t: cython.Py_ssize_t = b.stype
        if t == _OUTPUT:
            return t
        if cls == _EF:
            if self._promote < 0 or b.hits < self._promote:
                return t
        elif cls != _STRUCT:
            return cls * _T + t
        # Structural: a block's type and level never change, so a Structural block keeps its
        # group (and its inserting request, likely cold in memory by now, is not read again)
        g: cython.Py_ssize_t
        if b.pdata is not None:
            g = b.pdata
            if g >= 3 * _T:
                return g
        R: cython.Py_ssize_t = self.position_levels
        lev: cython.Py_ssize_t = 0
        n: cython.Py_ssize_t
        req: RequestBlocks
        if b.pos:  # a request's first block is at level 0 whatever its length
            req = b.req
            n = len(req.keys) if req is not None else 0
            lev = (b.pos * R) // n if n else 0
            if lev >= R:
                lev = R - 1
        return 3 * _T + t * R + lev

    def queue_of(self, b: Block) -> str:
        """The queue block ``b`` is in now (by name)."""
        g: cython.Py_ssize_t = b.pdata
        grp: Group = self._groups[g]
        return QUEUES[grp.q]

    def structural_level(self, b: Block) -> int:
        """The rounded position level of a Structural block (-1 for other queues)."""
        g: cython.Py_ssize_t = b.pdata
        grp: Group = self._groups[g]
        return -1 if grp.lev == self.position_levels else grp.lev

    # --- priority ------------------------------------------------------------------------------

    def log_priority(self, b: Block, now: float) -> float:
        """``log P(b)`` at ``now``, computed from the current parameters (not from the per-group
        constants the victim search keeps): the reference the victim search must agree with."""
        g: cython.Py_ssize_t = b.pdata
        grp: Group = self._groups[g]
        q = grp.q
        key = math.log(self.alpha[q]) + math.log(self.weights[grp.t])
        lev = grp.lev
        if self.position_decay and lev < self.position_levels:
            key += math.log(1.0 - (lev / self.position_levels) ** self.gamma)
        dt = now - b.pk1
        if dt < self.dt_epsilon:
            dt = self.dt_epsilon
        key -= math.log(dt)
        if self.lognormal_timing and q in (CHAT, AGENTIC):
            key += log_survival(dt, self.mu[q - CHAT], self.sigma[q - CHAT])
        return key

    def priority(self, b: Block, now: float) -> float:
        """``P(b) = alpha_q * w_type * p_q / dt`` at ``now``."""
        return math.exp(self.log_priority(b, now))

    def _refresh_cbase(self) -> None:
        """Take new ``log alpha_q`` and ``log w_type`` (after a weight change); each group's
        ``log alpha_q + log w_type`` is recomputed from them when the victim search next reads
        the group (its ``stamp`` is then behind)."""
        self._la = [math.log(a) for a in self.alpha]
        self._lw = [math.log(w) for w in self.weights]
        self._stamp += 1

    # --- cache hooks ---------------------------------------------------------------------------

    def on_request(self, rb: RequestBlocks, now: cython.double) -> None:
        self._now = now
        cls: cython.int = request_queue(rb)
        self._cls = cls
        win: LogWindow
        if self._learn_gamma and self._req_single and self._req_blocks:
            win = self._depths
            win.push(log((self._req_hits + 0.5) / (self._req_blocks + 1.0)))
            if win._n >= self.min_gamma_samples:
                # MLE of D ~ CDF D**gamma: -1 / mean(log D) (mean < 0: every D is in (0, 1))
                self.gamma = _clip(-1.0 / win.mean(), self.gamma_min, self.gamma_max)
        self._req_single = cls in (_EF, _STRUCT)
        self._req_blocks = len(rb.keys)
        self._req_hits = 0
        session = rb.session
        if session is not None and self._learn_timing and cls in (_CHAT, _AGENTIC):
            sessions: dict = self._sessions
            prev = sessions.pop(session, None)
            if prev is not None:
                gap: cython.double = rb.arrival_s - prev
                if gap > 0:
                    win = self._gaps[cls - _CHAT]
                    win.push(log(gap))
                    if win._n >= self.min_gap_samples:
                        self.mu[cls - _CHAT] = win.mean()
                        s: cython.double = win.std()
                        self.sigma[cls - _CHAT] = self.sigma_min if self.sigma_min > s else s
            sessions[session] = rb.arrival_s
            if len(sessions) > self.max_sessions:
                del sessions[next(iter(sessions))]

    def on_extend(self, rb: RequestBlocks, now: cython.double) -> None:
        """The answer of an in-flight request: its blocks join the request's queue; no new
        sample (a second depth or session gap from one request would bias gamma and mu)."""
        self._now = now
        self._cls = request_queue(rb)

    def on_insert(self, b: Block, now: cython.double) -> None:
        b.pdata = self.group_of(b, self._cls)
        b.pk2 = 0.0  # no heap entry yet

    def on_hit(self, b: Block, now: cython.double) -> None:
        old: cython.Py_ssize_t = b.pdata
        grp: Group = self._groups[old]
        self._n_hits[grp.q] += 1
        self._req_hits += 1
        g: cython.Py_ssize_t = self.group_of(b, self._cls)
        if g != old:
            b.pdata = g
            if b.pk2:  # its entry is in the old group's heap: void it
                b.version += 1
                b.pk2 = 0.0
                self._n_live -= 1

    def on_unpin(self, b: Block, now: cython.double) -> None:
        if b.pk2 and now < b.pk1:  # time went back: the entry's key would be too large
            b.version += 1
            b.pk2 = 0.0
            self._n_live -= 1
        b.pk1 = now
        self._seq += 1
        b.pseq = self._seq
        if not b.pk2 and not b.n_children:
            self._push(b)

    def on_leaf(self, b: Block, now: cython.double) -> None:
        if not b.pk2:
            self._push(b)

    def _push(self, b: Block) -> None:
        """Give ``b`` an entry in its group's heap under its current key."""
        g: cython.Py_ssize_t = b.pdata
        grp: Group = self._groups[g]
        b.version += 1
        b.pk2 = 1.0
        grp.heap.push(b.pk1, float(b.pseq), b.version, b)
        self._n_live += 1
        self._n_entries += 1
        if not grp.active:
            grp.active = True
            self._active.append(grp)
        if self._n_entries > 2 * self._n_live + self._slack:
            self._compact()

    def victim(self) -> Block | None:
        now: cython.double = self._now
        eps: cython.double = self.dt_epsilon
        gamma: cython.double = self.gamma
        stamp: cython.longlong = self._stamp
        active: list = self._active
        best: Group | None = None
        best_key: cython.double = 0.0
        best_t: cython.double = 0.0
        best_seq: cython.double = 0.0
        emptied: cython.bint = False
        grp: Group
        heap: KeyHeap
        e: HeapEntry
        b: Block
        i: cython.Py_ssize_t
        for i in range(len(active)):
            grp = active[i]
            heap = grp.heap
            while True:
                if not heap._items:
                    emptied = True
                    break
                e = heap._items[0]
                b = e.b
                if e.seq != b.version:  # void: the block moved group or was re-pushed
                    heap.pop()
                    self._n_entries -= 1
                elif b.ref or b.n_children:  # not evictable now: back on release / on_leaf
                    heap.pop()
                    self._n_entries -= 1
                    b.version += 1
                    b.pk2 = 0.0
                    self._n_live -= 1
                elif e.k2 != b.pseq:  # released again since: its key grew, let it sink
                    heap.replace_top(b.pk1, float(b.pseq), b.version)
                else:
                    t: cython.double = e.k1
                    if grp.stamp != stamp or grp.gamma != gamma:
                        if grp.stamp != stamp:
                            la: cython.double = self._la[grp.q]
                            lw: cython.double = self._lw[grp.t]
                            grp.cbase = la + lw
                        c: cython.double = grp.cbase
                        if grp.ratio:  # a Structural level above 0 (level 0: log p = 0)
                            c += log(1.0 - pow(grp.ratio, gamma))
                        grp.base = c
                        grp.gamma = gamma
                        grp.stamp = stamp
                        grp.memo = False
                    mu_q: cython.double = 0.0
                    sigma_q: cython.double = 0.0
                    if grp.timed:
                        q: cython.Py_ssize_t = grp.q - _CHAT
                        mu_q = self.mu[q]
                        sigma_q = self.sigma[q]
                    # the key is a function of (base, t, now, eps, mu_q, sigma_q) only: a group
                    # whose top was not popped since the last eviction keeps it
                    if not (
                        grp.memo
                        and t == grp.memo_t
                        and now == grp.memo_now
                        and eps == grp.memo_eps
                        and mu_q == grp.memo_mu
                        and sigma_q == grp.memo_sigma
                    ):
                        dt: cython.double = now - t
                        if dt < eps:
                            dt = eps
                        k: cython.double = grp.base
                        k -= log(dt)
                        if grp.timed:
                            k += log_survival(dt, mu_q, sigma_q)
                        grp.memo_key = k
                        grp.memo = True
                        grp.memo_t = t
                        grp.memo_now = now
                        grp.memo_eps = eps
                        grp.memo_mu = mu_q
                        grp.memo_sigma = sigma_q
                    key: cython.double = grp.memo_key
                    if (
                        best is None
                        or key < best_key
                        or (key == best_key and (t < best_t or (t == best_t and e.k2 < best_seq)))
                    ):
                        best, best_key, best_t, best_seq = grp, key, t, e.k2
                    break
        if emptied:
            keep = []
            for grp in active:
                if grp.heap._items:
                    keep.append(grp)
                else:
                    grp.active = False
            self._active = keep
        if best is None:
            return None
        heap = best.heap
        b = heap.pop().b
        self._n_entries -= 1
        self._n_live -= 1
        b.version += 1
        b.pk2 = 0.0
        return b

    def _compact(self) -> None:
        """Drop void entries from every heap (pop all, push back the live ones)."""
        n: cython.Py_ssize_t = 0
        heap: KeyHeap
        e: HeapEntry
        for heap in self._heaps:
            live = []
            while heap._items:
                e = heap.pop()
                if e.seq == e.b.version:
                    live.append(e)
            for e in live:
                heap.push(e.k1, e.k2, e.seq, e.b)
            n += len(live)
        self._n_entries = n

    # --- learning ------------------------------------------------------------------------------

    def on_evict(self, b: Block, now: cython.double) -> None:
        g: cython.Py_ssize_t = b.pdata
        grp: Group = self._groups[g]
        self._n_evicted[grp.q] += 1
        types: AdaptiveSemantic | None = self._types
        if types is not None:
            types.on_evict(b, now)
            if types.updates != self._w_seen:
                self._w_seen = types.updates
                self._refresh_cbase()
        self._evictions += 1
        if self._evictions >= self.update_every:
            self._evictions = 0
            if self._learn_alpha:
                self._update_alpha()
            self._reset_window()

    def on_ghost_hit(self, b: Block, ghost: object, now: cython.double) -> None:
        if self._types is not None:
            self._types.on_ghost_hit(b, ghost, now)
        entry: GhostEntry = ghost
        if entry.pdata is not None:
            g: cython.Py_ssize_t = entry.pdata
            grp: Group = self._groups[g]
            self._n_ghost[grp.q] += 1

    def _reset_window(self) -> None:
        """Zero the per-queue feedback counters of the current window."""
        q: cython.Py_ssize_t
        for q in range(4):
            self._n_hits[q] = 0
            self._n_evicted[q] = 0
            self._n_ghost[q] = 0

    # the window's counters per queue (EVICT_FIRST, CHAT, AGENTIC, STRUCTURAL), as lists
    @property
    def _hits_q(self) -> list[int]:
        return [self._n_hits[q] for q in range(4)]

    @_hits_q.setter
    def _hits_q(self, values: list[int]) -> None:
        for q in range(4):
            self._n_hits[q] = values[q]

    @property
    def _evicted_q(self) -> list[int]:
        return [self._n_evicted[q] for q in range(4)]

    @_evicted_q.setter
    def _evicted_q(self, values: list[int]) -> None:
        for q in range(4):
            self._n_evicted[q] = values[q]

    @property
    def _ghost_q(self) -> list[int]:
        return [self._n_ghost[q] for q in range(4)]

    @_ghost_q.setter
    def _ghost_q(self, values: list[int]) -> None:
        for q in range(4):
            self._n_ghost[q] = values[q]

    def _update_alpha(self) -> None:
        eff = {}
        for q in range(len(QUEUES)):
            hits: int = self._n_hits[q]
            fates: int = hits + self._n_evicted[q]
            if fates:
                eff[q] = (hits + self._n_ghost[q]) / fates
        if not eff:
            return
        mean = sum(eff.values()) / len(eff)
        if mean <= 0:
            return
        a_eta = self.alpha_eta
        for q, e in eff.items():
            target = _clip(e / mean, self.alpha_min, self.alpha_max)
            self.alpha[q] = (1.0 - a_eta) * self.alpha[q] + a_eta * target
        self.alpha_updates += 1
        self._refresh_cbase()

    # --- reporting -----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        out = {f"alpha_{q}": float(a) for q, a in zip(QUEUES, self.alpha, strict=True)}
        out.update({f"w_{t.value}": float(w) for t, w in zip(TYPES, self.weights, strict=True)})
        out["mu_chat"], out["mu_agentic"] = float(self.mu[0]), float(self.mu[1])
        out["sigma_chat"], out["sigma_agentic"] = float(self.sigma[0]), float(self.sigma[1])
        out["gamma"] = float(self.gamma)
        out["gap_samples_chat"] = float(len(self._gaps[0]))
        out["gap_samples_agentic"] = float(len(self._gaps[1]))
        out["gamma_samples"] = float(len(self._depths))
        out["weight_updates"] = float(self._types.updates if self._types is not None else 0)
        out["alpha_updates"] = float(self.alpha_updates)
        return out

    def fitted(self) -> dict[str, Any]:
        """The current values as ``saecache_fixed`` parameters (a fit to carry elsewhere)."""
        return {
            "alpha": dict(zip(QUEUES, map(float, self.alpha), strict=True)),
            "weights": {t.value: float(w) for t, w in zip(TYPES, self.weights, strict=True)},
            "mu": {"chat": float(self.mu[0]), "agentic": float(self.mu[1])},
            "sigma": {"chat": float(self.sigma[0]), "agentic": float(self.sigma[1])},
            "gamma": float(self.gamma),
        }

    def params(self) -> dict[str, Any]:
        return {
            "learn": self.learn,
            "queue_weights": self.queue_weights,
            "type_weights": self.type_weights,
            "lognormal_timing": self.lognormal_timing,
            "position_decay": self.position_decay,
            "alpha": dict(zip(QUEUES, self.initial_alpha, strict=True)),
            "weights": {t.value: w for t, w in zip(TYPES, self.initial_weights, strict=True)},
            "mu": {"chat": self.initial_mu[0], "agentic": self.initial_mu[1]},
            "sigma": {"chat": self.initial_sigma[0], "agentic": self.initial_sigma[1]},
            "gamma": self.initial_gamma,
            "update_every": self.update_every,
            "eta": self.eta,
            "ghost_gain": self.ghost_gain,
            "reuse_gain": self.reuse_gain,
            "alpha_eta": self.alpha_eta,
            "alpha_min": self.alpha_min,
            "alpha_max": self.alpha_max,
            "gap_window": self.gap_window,
            "min_gap_samples": self.min_gap_samples,
            "sigma_min": self.sigma_min,
            "max_sessions": self.max_sessions,
            "gamma_window": self.gamma_window,
            "min_gamma_samples": self.min_gamma_samples,
            "gamma_min": self.gamma_min,
            "gamma_max": self.gamma_max,
            "position_levels": self.position_levels,
            "promote_hits": self.promote_hits,
            "dt_epsilon": self.dt_epsilon,
        }


class SAECacheFixed(SAECache):
    """``saecache`` with every parameter frozen at the values given (nothing is learned)."""

    name = "saecache_fixed"

    def __init__(self, **params: Any) -> None:
        if "learn" in params:
            raise TypeError("saecache_fixed never learns; use saecache for learn=True")
        super().__init__(learn=False, **params)
