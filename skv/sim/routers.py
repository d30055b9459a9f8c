"""Routers: which replica serves a request. The seam the routing experiments plug into.

A router sees the request's blocks and every replica's public state (queue lengths, running
requests, its cache) and returns a replica index. Adding a router is one class plus one line in
``ROUTERS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks
    from skv.sim.replica import Replica


class Router:
    name: ClassVar[str] = "base"

    def choose(self, rb: RequestBlocks, replicas: Sequence[Replica], now: float) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    """Cache-blind: replicas in turn."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, rb: RequestBlocks, replicas: Sequence[Replica], now: float) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class LeastLoaded(Router):
    """Cache-blind: the replica with the fewest queued plus running requests (lowest index)."""

    name = "least_loaded"

    def choose(self, rb: RequestBlocks, replicas: Sequence[Replica], now: float) -> int:
        return min(range(len(replicas)), key=lambda i: (replicas[i].load, i))


class PrefixLocality(Router):
    """Cache-aware: the replica whose cache holds the longest run of the request's blocks now;
    ties (and no match anywhere) go to the least loaded."""

    name = "prefix_locality"

    def choose(self, rb: RequestBlocks, replicas: Sequence[Replica], now: float) -> int:
        return min(
            range(len(replicas)),
            key=lambda i: (-replicas[i].cache.lookup(rb), replicas[i].load, i),
        )


ROUTERS: dict[str, type[Router]] = {r.name: r for r in (RoundRobin, LeastLoaded, PrefixLocality)}


def make_router(name: str, **params: Any) -> Router:
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None
    return cls(**params)
