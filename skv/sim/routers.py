"""The simulator's side of routing: each replica seen through a router's ``ReplicaView``.

The routers themselves live in :mod:`skv.routing` (re-exported here). In the simulator a
replica's ``match`` reads its exact cache, so the locality routers are idealised routers: they
know precisely what every replica holds (a deployed router keeps an approximate view, as the
router service does). ``load`` is the replica's queued plus running requests; ``routed`` the
requests routed there so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from skv.routing import ROUTERS, Ranking, Router, make_router

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks
    from skv.sim.replica import Replica

__all__ = ["ROUTERS", "ExactCacheView", "Ranking", "Router", "SimRouting", "make_router"]


class ExactCacheView:
    """One simulated replica as a router sees it (live: reads the replica at each call)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.routed = 0

    @property
    def load(self) -> int:
        return self.replica.load

    def match(self, rb: RequestBlocks) -> float:
        return float(self.replica.cache.lookup(rb))


class SimRouting:
    """One router over the simulated replicas: ``choose`` takes the ranking's first replica
    and counts the request as routed there."""

    def __init__(self, name: str, params: dict[str, Any], replicas: Sequence[Replica]) -> None:
        self.router = make_router(name, **params)
        self.views = [ExactCacheView(r) for r in replicas]

    def choose(self, rb: RequestBlocks) -> int:
        k = self.router.rank(rb, self.views).first
        self.views[k].routed += 1
        return k
