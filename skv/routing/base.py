"""The router interface and the replica view a router reads.

A router never sees a replica itself, only a :class:`ReplicaView`: its ``load``, how many
requests were ``routed`` there, and ``match(rb)``, the leading blocks of ``rb`` the router
believes that replica has cached. Whoever owns the replicas builds the views:

- the router service (``skv.services.router``): ``load`` = requests in flight through it,
  ``match`` = its approximate per-replica LRU cache, or (``precise``) the blocks the engine
  reported through KV-cache events;
- the serving simulator (``skv.sim.routers``): ``load`` = queued + running requests, ``match`` =
  the replica's exact cache (an idealised router).

Invariant: ``rank`` returns every replica index exactly once, best first; a caller takes the
first (simulator) or fails over down the order (service).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, ClassVar, Protocol

import cython

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class ReplicaView(Protocol):
    """What a router may know about one replica at the moment it routes."""

    @property
    def load(self) -> int: ...

    @property
    def routed(self) -> int: ...

    def match(self, rb: RequestBlocks) -> float:
        """Leading blocks of ``rb`` this replica holds, as far as the router can tell."""
        ...


@dataclass(frozen=True)
class FixedView:
    """A view frozen at one moment (the service builds these under its lock; tests too).
    ``lookup``: the match function; None: nothing cached."""

    load: int
    routed: int = 0
    lookup: Callable[[RequestBlocks], float] | None = None

    def match(self, rb: RequestBlocks) -> float:
        return float(self.lookup(rb)) if self.lookup is not None else 0.0


class Ranking:
    """Every replica index, best first; the per-replica scores used (None: cache-blind); and a
    short reason for the first (written to the service's decision log). Read-only once made
    (compiled: C fields that Python cannot set; plain Python: by convention)."""

    def __init__(self, order: list[int], scores: list[float] | None, reason: str) -> None:
        self.order = order
        self.scores = scores
        self.reason = reason

    @property
    def first(self) -> int:
        if not len(self.order):  # compiled, order[0] is read unchecked
            raise IndexError("a ranking of no replicas has no first")
        return self.order[0]

    def __repr__(self) -> str:
        return f"Ranking(order={self.order!r}, scores={self.scores!r}, reason={self.reason!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ranking):
            return NotImplemented
        return (self.order, self.scores, self.reason) == (other.order, other.scores, other.reason)


def matches(rb: RequestBlocks, views: Sequence[ReplicaView]) -> list[float]:
    """Every view's ``match(rb)``, in view order. Views that can answer for all replicas in
    one pass (a ``match_all`` method: the simulator's shared approximate index) are asked
    once; otherwise each view is asked. Same values either way."""
    batch = getattr(views, "match_all", None)
    return batch(rb) if batch is not None else [v.match(rb) for v in views]


def matched_tokens(rb: RequestBlocks, hits: Sequence[float]) -> list[int]:
    """Tokens of the leading blocks of ``rb`` each replica holds, given every replica's
    matched blocks (``matches``); one prefix sum shared by all replicas."""
    tokens: list = rb.tokens
    last: cython.Py_ssize_t = len(tokens)
    cum: list = [0, *accumulate(tokens)]
    out: list = []
    m: cython.Py_ssize_t
    for h in hits:
        m = int(h)
        if m < 0:
            raise ValueError(f"matched blocks must be >= 0, got {h}")
        out.append(cum[m if m < last else last])
    return out


def order_by(*columns: Sequence[float]) -> list[int]:
    """Replica indices sorted by the per-replica ``columns`` (first column first), ties by
    index: one stable sort per column, last column first (the same order as sorting the
    tuples, without building them)."""
    n = len(columns[0])
    for col in columns:
        if len(col) != n:
            raise ValueError(f"order_by: columns of {n} and {len(col)} replicas")
    order = list(range(n))
    for col in reversed(columns):
        order.sort(key=col.__getitem__)
    return order


def least_loaded_order(views: Sequence[ReplicaView]) -> list[int]:
    """Replica indices by (load, routed, index): the one tie-break every router shares."""
    return order_by([v.load for v in views], [v.routed for v in views])


class Router:
    """Ranks replicas for one request. State a router keeps (a round-robin counter) lives in
    the router object, so one object routes one stream of requests."""

    name: ClassVar[str] = "base"
    #: True when the ranking reads ``match`` (the replica's cache as the router sees it)
    cache_aware: ClassVar[bool] = False

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        raise NotImplementedError


class LocalityRouter(Router):
    """Cache-aware: replicas by (-score, load, routed, index), score = :meth:`score`.

    ``max_imbalance``: when the top replica has more than this many more requests (``load``)
    than the least loaded one, locality gives way and the least loaded goes first (None: never;
    the service uses 8, the simulator None). With no match anywhere the order is the least
    loaded's, which the reason says.
    """

    cache_aware = True

    def __init__(self, max_imbalance: int | None = None) -> None:
        if max_imbalance is not None and max_imbalance < 0:
            raise ValueError(f"max_imbalance must be >= 0 or None, got {max_imbalance}")
        self.max_imbalance = max_imbalance

    def scores(self, rb: RequestBlocks, hits: list[float]) -> list[float]:
        """How much of ``rb`` each replica holds, given its matched leading blocks; higher is
        better (default: the matched blocks)."""
        return hits

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        scores = self.scores(rb, matches(rb, views))
        load = [v.load for v in views]
        routed = [v.routed for v in views]
        order = order_by([-s for s in scores], load, routed)
        least = min(zip(load, routed, range(len(load)), strict=True))[2]
        reason = self.name
        if self.max_imbalance is not None and load[order[0]] - load[least] > self.max_imbalance:
            order.remove(least)
            order.insert(0, least)
            reason = f"{self.name}: imbalance > {self.max_imbalance}, least loaded"
        elif scores[order[0]] <= 0:
            reason = f"{self.name}: no match, least loaded"
        return Ranking(order, scores, reason)
