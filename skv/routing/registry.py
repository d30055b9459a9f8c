"""Name -> router class. Adding a router is one file plus one line here.

Names are what experiment configs (``replicas.router``), the simulator and the router service
(``SKV_ROUTING_POLICY``) use.
"""

from __future__ import annotations

from typing import Any

from skv.routing.base import LocalityRouter, Router
from skv.routing.cacheroute import CacheRoute
from skv.routing.consistent_hashing import ConsistentHashing
from skv.routing.dynamo_cost import DynamoCost
from skv.routing.least_loaded import LeastLoaded
from skv.routing.power_of_two import PowerOfTwo
from skv.routing.precise import Precise
from skv.routing.prefix_locality import PrefixLocality
from skv.routing.random_router import RandomRouter
from skv.routing.round_robin import RoundRobin
from skv.routing.semantic_locality import SemanticLocality
from skv.routing.sglang_cache_aware import SGLangCacheAware

ROUTERS: dict[str, type[Router]] = {
    r.name: r
    for r in (
        RoundRobin,
        LeastLoaded,
        PrefixLocality,
        SemanticLocality,
        Precise,
        RandomRouter,
        PowerOfTwo,
        ConsistentHashing,
        SGLangCacheAware,
        DynamoCost,
        CacheRoute,
    )
}
#: routers whose ranking reads the replicas' caches (and take ``max_imbalance``)
LOCALITY: tuple[str, ...] = tuple(n for n, c in ROUTERS.items() if issubclass(c, LocalityRouter))


def router_class(name: str) -> type[Router]:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None


def make_router(name: str, **params: Any) -> Router:
    """A fresh router (its own state) for ``name``; ValueError names a bad name or parameter."""
    cls = router_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"router {name!r}: bad parameters {params}: {exc}") from None
