"""Routers: which replica serves a request. One file per router, one registry; used by both the
serving simulator (``skv.sim``) and the router service (``skv.services.router``).

Imports go downward only: nothing here imports ``skv.sim``, ``skv.services`` or ``skv.vllm``.
"""

from skv.routing.base import FixedView, LocalityRouter, Ranking, ReplicaView, Router
from skv.routing.registry import LOCALITY, ROUTERS, make_router, router_class

__all__ = [
    "LOCALITY",
    "ROUTERS",
    "FixedView",
    "LocalityRouter",
    "Ranking",
    "ReplicaView",
    "Router",
    "make_router",
    "router_class",
]
