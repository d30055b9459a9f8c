"""``cacheroute``: CacheRoute's periodic routing plan (REFERENCE.md section 3): a stable warm
set of hot shared prefixes, each placed on replicas by expected load; everything else balanced
cache-blind."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router, least_loaded_order
from skv.routing.keys import prefix_key

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class CacheRoute(Router):
    """The plan, rebuilt whenever a request's ``arrival_s`` enters a new period
    (``floor(arrival_s / period_s)`` grows; the plan in force during a period is built from the
    periods before it, so routing is a deterministic function of the request stream):

    1. Rates: per key (:func:`skv.routing.keys.prefix_key` of the first ``prefix_blocks``
       blocks) and in total, ``rate <- ewma_alpha * count / period_s + (1 - ewma_alpha) * rate``
       for the period that ended; every further period that passed without a request decays
       rates by ``1 - ewma_alpha``. Rates start at 0. A key outside the warm set whose rate is
       below ``admit_rate / 64`` is forgotten (bookkeeping only: its rate restarts at 0).
    2. Warm set with hysteresis: a key joins when its rate ``>= admit_rate`` and leaves when its
       rate ``< evict_rate`` (``evict_rate <= admit_rate``), so a key between the two keeps its
       status and the set does not flap.
    3. Placement by expected load: per-replica capacity ``C`` = ``replica_rps`` if given, else
       the measured fair share ``total rate / n``. Warm key ``k`` with rate ``r_k`` gets
       ``d_k = min(n, max(1, ceil(r_k / C)))`` destinations (a hot key gets several) and adds
       ``r_k / d_k`` to each destination's planned load. Keys already placed go first, then
       new ones, each group hottest first (ties by key); a key keeps those of its previous
       destinations whose planned load stays within ``(1 + slack) * total rate / n``
       (stability: its cache stays where it is), and takes the rest from the replicas with the
       least planned load (ties by index).
    4. Routing: a warm key's request goes to the least loaded (``load``, then routed, index) of
       its destinations, then the other replicas least loaded first (failover); any other
       request (cold key, no key, no plan yet) is balanced cache-blind: least loaded.

    The router never reads ``match``: locality comes from the plan alone (scores None).

    Defaults (the paper's public text gives no values, so all are chosen):

    - ``period_s`` 10: a key at the admit rate has 2 requests per period on average, so one
      period's count already tells it from a one-off prompt; short against the minutes over
      which skew shifts in the counterexample workloads.
    - ``ewma_alpha`` 0.5: the newest period weighs as much as all older ones (a half-life of
      one period): a key arriving at 2x the admit rate is warm after one period, a key that
      stops is evicted after two (0.2 -> 0.1 -> 0.05 < 0.1).
    - ``admit_rate`` 0.2 req/s (one request per 5 s): a prefix re-requested that often is very
      likely still cached on its destination, so pinning it pays; rarer keys gain little from
      affinity and are better spread.
    - ``evict_rate`` 0.1 req/s: half the admit rate, a 2x hysteresis band. With Poisson
      counts the EWMA's sd is ``sqrt(rate / period_s) * sqrt(alpha / (2 - alpha))``: 0.115
      for a steady key at 0.4 req/s, which sits 2.6 sd above the evict rate (about 0.5% of
      periods, normal approximation), but only 1.7 sd above the admit rate: without the band
      such a key would drop out of the warm set (and come back) in about 4% of periods.
    - ``prefix_blocks`` 4: as ``consistent_hashing`` (64 tokens at block size 16).
    - ``replica_rps`` None: the fair share ``total / n``: a key that alone exceeds one replica's
      share of the traffic is split across ``ceil(rate / share)`` replicas.
    - ``slack`` 0.25: the 1.25x bound ``consistent_hashing`` uses (Mirrokni et al.): a key stays
      on a destination unless that would plan it above 1.25x the mean.
    """

    name = "cacheroute"

    def __init__(
        self,
        period_s: float = 10.0,
        ewma_alpha: float = 0.5,
        admit_rate: float = 0.2,
        evict_rate: float = 0.1,
        prefix_blocks: int = 4,
        replica_rps: float | None = None,
        slack: float = 0.25,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        if not 0 < ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {ewma_alpha}")
        if not 0 <= evict_rate <= admit_rate:
            raise ValueError(
                f"need 0 <= evict_rate <= admit_rate, got evict_rate={evict_rate}, "
                f"admit_rate={admit_rate}"
            )
        if prefix_blocks < 1:
            raise ValueError(f"prefix_blocks must be >= 1, got {prefix_blocks}")
        if replica_rps is not None and not replica_rps > 0:
            raise ValueError(f"replica_rps must be > 0 or None, got {replica_rps}")
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.period_s = period_s
        self.ewma_alpha = ewma_alpha
        self.admit_rate = admit_rate
        self.evict_rate = evict_rate
        self.prefix_blocks = prefix_blocks
        self.replica_rps = replica_rps
        self.slack = slack
        self.period: int | None = None  # index of the period being counted
        self.counts: dict[int, int] = {}  # requests per key in the current period
        self.count = 0  # requests in the current period
        self.rates: dict[int, float] = {}  # EWMA requests/s per key
        self.total_rate = 0.0  # EWMA requests/s, all requests
        self.warm: set[int] = set()
        self.plan: dict[int, tuple[int, ...]] = {}  # warm key -> destinations
        self.planned: list[float] = []  # planned warm load per replica (requests/s)
        self._plan_n = 0

    # ------------------------------------------------------------------ the plan

    def _advance(self, period: int, n: int) -> None:
        """Close the counted period, decay through empty ones, rebuild warm set and plan."""
        a = self.ewma_alpha
        keep = 1.0 - a
        for key in set(self.rates) | set(self.counts):
            obs = self.counts.get(key, 0) / self.period_s
            self.rates[key] = a * obs + keep * self.rates.get(key, 0.0)
        self.total_rate = a * self.count / self.period_s + keep * self.total_rate
        assert self.period is not None
        idle = period - self.period - 1
        if idle > 0:
            decay = keep**idle
            self.rates = {k: r * decay for k, r in self.rates.items()}
            self.total_rate *= decay
        warm = {k for k in self.warm if self.rates.get(k, 0.0) >= self.evict_rate}
        warm |= {k for k, r in self.rates.items() if k not in self.warm and r >= self.admit_rate}
        self.warm = warm
        forget = self.admit_rate / 64
        self.rates = {k: r for k, r in self.rates.items() if k in warm or r >= forget}
        self.counts = {}
        self.count = 0
        self.period = period
        self.place(n)

    def destinations(self, rate: float, n: int) -> int:
        """How many replicas a warm key of ``rate`` requests/s gets."""
        cap = self.replica_rps if self.replica_rps is not None else self.total_rate / n
        if cap <= 0:
            return 1
        return min(n, max(1, math.ceil(rate / cap - 1e-9)))

    def place(self, n: int) -> None:
        """Place every warm key on ``n`` replicas by expected load (see the class docstring)."""
        budget = (1.0 + self.slack) * self.total_rate / n
        planned = [0.0] * n
        old = self.plan
        plan: dict[int, tuple[int, ...]] = {}
        for key in sorted(self.warm, key=lambda k: (k not in old, -self.rates.get(k, 0.0), k)):
            rate = self.rates.get(key, 0.0)
            d = self.destinations(rate, n)
            per = rate / d
            kept = [i for i in old.get(key, ()) if i < n and planned[i] + per <= budget][:d]
            free = sorted((i for i in range(n) if i not in kept), key=lambda i: (planned[i], i))
            dests = sorted(kept + free[: d - len(kept)])
            for i in dests:
                planned[i] += per
            plan[key] = tuple(dests)
        self.plan = plan
        self.planned = planned
        self._plan_n = n

    # ------------------------------------------------------------------ routing

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        n = len(views)
        period = math.floor(rb.arrival_s / self.period_s)
        if self.period is None:
            self.period = period
        elif period > self.period:
            self._advance(period, n)
        if n != self._plan_n:
            self.place(n)
        key = prefix_key(rb, self.prefix_blocks)
        self.count += 1
        if key is not None:
            self.counts[key] = self.counts.get(key, 0) + 1
        order = least_loaded_order(views)
        dests = self.plan.get(key) if key is not None else None
        if not dests:
            return Ranking(order, None, f"{self.name}: cold, least loaded")
        first = [i for i in order if i in dests]
        rest = [i for i in order if i not in dests]
        return Ranking(first + rest, None, f"{self.name}: warm, {len(dests)} destinations")
