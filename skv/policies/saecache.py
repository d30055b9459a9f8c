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
  of the session's previous request (the same request seen again, as when the simulator adds
  its output blocks, is not a gap; gaps <= 0 are not samples; in the simulator a gap also spans
  the previous turn's service time, which ``dt`` does not). The last ``max_sessions`` sessions
  are remembered.
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
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, ClassVar

from skv.blocks import RequestBlocks
from skv.cache.block import Block, GhostEntry
from skv.model import NUM_TYPES, TYPE_INDEX, TYPES, SemanticType
from skv.policies.adaptive_semantic import AdaptiveSemantic
from skv.policies.base import KeyHeap, Policy
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

_OUTPUT = TYPE_INDEX[SemanticType.OUTPUT]
_HISTORY = TYPE_INDEX[SemanticType.ASSISTANT_HISTORY]
_TOOL_TYPES = frozenset(
    {TYPE_INDEX[SemanticType.TOOL_SCHEMA], TYPE_INDEX[SemanticType.TOOL_OUTPUT]}
)
_SQRT2 = math.sqrt(2.0)
_HALF_LOG_PI = 0.5 * math.log(math.pi)
_LOG_HALF = math.log(0.5)


def request_queue(rb: RequestBlocks) -> int:
    """The queue of a request's prefill blocks (rules 2-5 of the module docstring, before
    promotion): ``EVICT_FIRST`` for untemplated single-turn requests."""
    stypes = rb.stypes
    if rb.session is not None or _HISTORY in stypes:
        return CHAT if _TOOL_TYPES.isdisjoint(stypes) else AGENTIC
    return STRUCTURAL if rb.templated else EVICT_FIRST


def log_survival(dt: float, mu: float, sigma: float) -> float:
    """``log(1 - LogNormalCDF(dt; mu, sigma))``, finite far in the tail (asymptotic erfc)."""
    z = (math.log(dt) - mu) / (sigma * _SQRT2)
    if z < 25.0:
        return math.log(0.5 * math.erfc(z))
    z2 = z * z
    return (
        _LOG_HALF
        - z2
        - math.log(z)
        - _HALF_LOG_PI
        + math.log1p(-0.5 / z2 + 0.75 / (z2 * z2) - 1.875 / (z2 * z2 * z2))
    )


class LogWindow:
    """The last ``size`` samples with running sums of ``x`` and ``x**2`` (re-summed exactly
    every ``size`` samples, so rounding never accumulates)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: deque[float] = deque()
        self.s1 = 0.0
        self.s2 = 0.0
        self._since_exact = 0

    def __len__(self) -> int:
        return len(self.values)

    def push(self, x: float) -> None:
        values = self.values
        values.append(x)
        self.s1 += x
        self.s2 += x * x
        if len(values) > self.size:
            y = values.popleft()
            self.s1 -= y
            self.s2 -= y * y
        self._since_exact += 1
        if self._since_exact >= self.size:
            self.s1 = math.fsum(values)
            self.s2 = math.fsum(v * v for v in values)
            self._since_exact = 0

    def mean(self) -> float:
        return self.s1 / len(self.values)

    def std(self) -> float:
        """Population (maximum-likelihood) standard deviation."""
        m = self.mean()
        return math.sqrt(max(0.0, self.s2 / len(self.values) - m * m))


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


class SAECache(Policy):
    name = "saecache"
    uses_ghost_list = True
    #: heaps are compacted when their entries exceed ``2 * live + compact_slack``
    compact_slack: ClassVar[int] = 4096

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
        self.promote_hits = None if promote_hits is None else int(promote_hits)
        self.dt_epsilon = float(dt_epsilon)
        self.queue_weights = bool(queue_weights)
        self.type_weights = bool(type_weights)
        self.lognormal_timing = bool(lognormal_timing)
        self.position_decay = bool(position_decay)
        self.learn = bool(learn)

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
        self._types: AdaptiveSemantic | None = None
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
        self.uses_ghost_list = self._types is not None or self._learn_alpha

        # --- groups --------------------------------------------------------------------------
        T = NUM_TYPES
        self.num_groups = G = 3 * T + T * R
        self._gq = [g // T for g in range(3 * T)] + [STRUCTURAL] * (T * R)
        self._gt = [g % T for g in range(3 * T)] + [t for t in range(T) for _ in range(R)]
        self._glev = [R] * (3 * T) + [lev for _ in range(T) for lev in range(R)]
        self._gtimed = [self.lognormal_timing and q in (CHAT, AGENTIC) for q in self._gq]
        self._heaps = [KeyHeap() for _ in range(G)]
        self._active: list[int] = []
        self._is_active = bytearray(G)
        self._n_entries = 0
        self._n_live = 0
        self._seq = 0
        self._cbase = [0.0] * G  # log alpha_q + log w_type per group
        # pos / pos_max of a Structural group's level when position decay is on, else 0.0
        self._gratio = [lev / R if self.position_decay and lev < R else 0.0 for lev in self._glev]
        self._refresh_cbase()

        # --- the current request and the learning windows -------------------------------------
        self._now = 0.0
        self._cls = EVICT_FIRST
        self._req_id: tuple | None = None
        self._req_single = False  # the current request is single-turn (gives a depth sample)
        self._req_blocks = 0
        self._req_hits = 0
        self._sessions: dict[Any, float] = {}  # session -> arrival of its last request
        self._gaps = [LogWindow(self.gap_window), LogWindow(self.gap_window)]
        self._depths = LogWindow(self.gamma_window)
        self._hits_q = [0] * len(QUEUES)
        self._evicted_q = [0] * len(QUEUES)
        self._ghost_q = [0] * len(QUEUES)
        self._evictions = 0
        self.alpha_updates = 0
        self._w_seen = 0

    # --- classification ------------------------------------------------------------------------

    def group_of(self, b: Block, cls: int) -> int:
        """The group of block ``b`` last used by a request of queue class ``cls``."""
        t = b.stype
        if t == _OUTPUT:
            return t
        if cls == EVICT_FIRST:
            promote = self.promote_hits
            if promote is None or b.hits < promote:
                return t
        elif cls != STRUCTURAL:
            return cls * NUM_TYPES + t
        R = self.position_levels
        req = b.req
        n = len(req.keys) if req is not None else 0
        lev = (b.pos * R) // n if n else 0
        if lev >= R:
            lev = R - 1
        return 3 * NUM_TYPES + t * R + lev

    def queue_of(self, b: Block) -> str:
        """The queue block ``b`` is in now (by name)."""
        return QUEUES[self._gq[b.pdata]]

    def structural_level(self, b: Block) -> int:
        """The rounded position level of a Structural block (-1 for other queues)."""
        lev = self._glev[b.pdata]
        return -1 if lev == self.position_levels else lev

    # --- priority ------------------------------------------------------------------------------

    def log_priority(self, b: Block, now: float) -> float:
        """``log P(b)`` at ``now``, computed from the current parameters (not from the per-group
        constants the victim search keeps): the reference the victim search must agree with."""
        g = b.pdata
        q = self._gq[g]
        key = math.log(self.alpha[q]) + math.log(self.weights[self._gt[g]])
        lev = self._glev[g]
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
        la = [math.log(a) for a in self.alpha]
        lw = [math.log(w) for w in self.weights]
        gq, gt = self._gq, self._gt
        self._cbase = [la[gq[g]] + lw[gt[g]] for g in range(self.num_groups)]

    # --- cache hooks ---------------------------------------------------------------------------

    def on_request(self, rb: RequestBlocks, now: float) -> None:
        self._now = now
        self._cls = cls = request_queue(rb)
        ident = (rb.index, rb.arrival_s)
        if ident == self._req_id:  # the same request again (the simulator adding its output)
            return
        if self._learn_gamma and self._req_single and self._req_blocks:
            self._depths.push(math.log((self._req_hits + 0.5) / (self._req_blocks + 1.0)))
            win = self._depths
            if len(win) >= self.min_gamma_samples:
                # MLE of D ~ CDF D**gamma: -1 / mean(log D) (mean < 0: every D is in (0, 1))
                self.gamma = min(max(-1.0 / win.mean(), self.gamma_min), self.gamma_max)
        self._req_id = ident
        self._req_single = cls in (EVICT_FIRST, STRUCTURAL)
        self._req_blocks = len(rb.keys)
        self._req_hits = 0
        session = rb.session
        if session is not None and self._learn_timing and cls in (CHAT, AGENTIC):
            sessions = self._sessions
            prev = sessions.pop(session, None)
            if prev is not None:
                gap = rb.arrival_s - prev
                if gap > 0:
                    win = self._gaps[cls - CHAT]
                    win.push(math.log(gap))
                    if len(win) >= self.min_gap_samples:
                        self.mu[cls - CHAT] = win.mean()
                        self.sigma[cls - CHAT] = max(win.std(), self.sigma_min)
            sessions[session] = rb.arrival_s
            if len(sessions) > self.max_sessions:
                del sessions[next(iter(sessions))]

    def on_insert(self, b: Block, now: float) -> None:
        b.pdata = self.group_of(b, self._cls)
        b.pk2 = 0.0  # no heap entry yet

    def on_hit(self, b: Block, now: float) -> None:
        old = b.pdata
        self._hits_q[self._gq[old]] += 1
        self._req_hits += 1
        g = self.group_of(b, self._cls)
        if g != old:
            b.pdata = g
            if b.pk2:  # its entry is in the old group's heap: void it
                b.version += 1
                b.pk2 = 0.0
                self._n_live -= 1

    def on_unpin(self, b: Block, now: float) -> None:
        if b.pk2 and now < b.pk1:  # time went back: the entry's key would be too large
            b.version += 1
            b.pk2 = 0.0
            self._n_live -= 1
        b.pk1 = now
        self._seq += 1
        b.pseq = self._seq
        if not b.pk2 and not b.n_children:
            self._push(b)

    def on_leaf(self, b: Block, now: float) -> None:
        if not b.pk2:
            self._push(b)

    def _push(self, b: Block) -> None:
        """Give ``b`` an entry in its group's heap under its current key."""
        g = b.pdata
        b.version += 1
        b.pk2 = 1.0
        heap: KeyHeap = self._heaps[g]
        heap.push(b.pk1, float(b.pseq), b.version, b)
        self._n_live += 1
        self._n_entries += 1
        if not self._is_active[g]:
            self._is_active[g] = 1
            self._active.append(g)
        if self._n_entries > 2 * self._n_live + self.compact_slack:
            self._compact()

    def victim(self) -> Block | None:
        now = self._now
        eps = self.dt_epsilon
        heaps = self._heaps
        cbase, gratio, gtimed, gq = self._cbase, self._gratio, self._gtimed, self._gq
        mu, sigma, gamma = self.mu, self.sigma, self.gamma
        log = math.log
        best_heap: KeyHeap | None = None
        best_key = best_t = best_seq = 0.0
        emptied = False
        for g in self._active:
            heap: KeyHeap = heaps[g]
            while len(heap):
                e = heap.top()
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
                    t = e.k1
                    dt = now - t
                    if dt < eps:
                        dt = eps
                    key = cbase[g]
                    r = gratio[g]
                    if r:  # a Structural level above 0 (level 0: p = 1, log p = 0)
                        key += log(1.0 - r**gamma)
                    key -= log(dt)
                    if gtimed[g]:
                        q = gq[g] - CHAT
                        key += log_survival(dt, mu[q], sigma[q])
                    if (
                        best_heap is None
                        or key < best_key
                        or (key == best_key and (t < best_t or (t == best_t and e.k2 < best_seq)))
                    ):
                        best_heap, best_key, best_t, best_seq = heap, key, t, e.k2
                    break
            else:
                emptied = True
        if emptied:
            keep = []
            for g in self._active:
                if len(heaps[g]):
                    keep.append(g)
                else:
                    self._is_active[g] = 0
            self._active = keep
        if best_heap is None:
            return None
        b = best_heap.pop().b
        self._n_entries -= 1
        self._n_live -= 1
        b.version += 1
        b.pk2 = 0.0
        return b

    def _compact(self) -> None:
        """Drop void entries from every heap (pop all, push back the live ones)."""
        n = 0
        for heap in self._heaps:
            live = []
            while len(heap):
                e = heap.pop()
                if e.seq == e.b.version:
                    live.append(e)
            for e in live:
                heap.push(e.k1, e.k2, e.seq, e.b)
            n += len(live)
        self._n_entries = n

    # --- learning ------------------------------------------------------------------------------

    def on_evict(self, b: Block, now: float) -> None:
        self._evicted_q[self._gq[b.pdata]] += 1
        types = self._types
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
            self._hits_q = [0] * len(QUEUES)
            self._evicted_q = [0] * len(QUEUES)
            self._ghost_q = [0] * len(QUEUES)

    def on_ghost_hit(self, b: Block, ghost: GhostEntry, now: float) -> None:
        if self._types is not None:
            self._types.on_ghost_hit(b, ghost, now)
        if ghost.pdata is not None:
            self._ghost_q[self._gq[ghost.pdata]] += 1

    def _update_alpha(self) -> None:
        eff = {}
        for q in range(len(QUEUES)):
            fates = self._hits_q[q] + self._evicted_q[q]
            if fates:
                eff[q] = (self._hits_q[q] + self._ghost_q[q]) / fates
        if not eff:
            return
        mean = sum(eff.values()) / len(eff)
        if mean <= 0:
            return
        a_eta = self.alpha_eta
        for q, e in eff.items():
            target = min(max(e / mean, self.alpha_min), self.alpha_max)
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
