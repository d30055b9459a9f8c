"""The simulator's side of routing: each replica seen through a router's ``ReplicaView``.

The routers themselves live in :mod:`skv.routing` (re-exported here). What a cache-aware router
reads as a replica's ``match`` depends on the view (``SimConfig.router_view``):

- ``"exact"`` (the default; every result before views existed used it): :class:`ExactCacheView`,
  ``match`` = the replica's exact cache lookup. The locality routers are then idealised
  routers: they know precisely what every replica holds, evictions included.
- ``"approximate"``: :class:`ApproximateView`, ``match`` = the router's own per-replica skv
  ``lru`` cache of the prompts it routed there (``SimConfig.router_cache_blocks`` blocks, default
  the replica's cache capacity), updated at routing time. This is what the router service
  (:mod:`skv.services.router`) keeps, so the router can believe a prefix is cached that the
  replica has evicted (or, with a smaller cache, forget one the replica still holds), and it
  never sees answers (output blocks) the replica caches. The views share one key index
  (:class:`ApproximateCluster`), so a router reads all replicas' matches in one walk of the
  prompt (``skv.routing.base.matches``).

``precise`` always gets the exact view: it models KV-cache events, which report what the
engine really holds. For both views ``load`` is the replica's queued plus running requests and
``routed`` the requests routed there so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cython

from skv.routing import ROUTERS, Ranking, Router, make_router
from skv.routing.precise import Precise
from skv.sim.replica import Replica

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks

__all__ = [
    "ROUTERS",
    "VIEWS",
    "ApproximateCluster",
    "ApproximateView",
    "ExactCacheView",
    "Ranking",
    "Router",
    "SimRouting",
    "make_router",
]

#: the router views the simulator offers (``SimConfig.router_view``); the first is the default
VIEWS: tuple[str, ...] = ("exact", "approximate")


def check_view(view: str) -> str:
    """``view`` if it names a router view; ValueError naming the allowed ones otherwise."""
    if view not in VIEWS:
        raise ValueError(f"unknown router view {view!r}; allowed: {', '.join(VIEWS)}")
    return view


class ExactCacheView:
    """One simulated replica as an idealised router sees it (live: reads the replica at each
    call); ``match`` is the replica's exact cache lookup."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.routed = 0

    @property
    def load(self) -> int:
        replica: Replica = self.replica
        return replica.load

    def match(self, rb: RequestBlocks) -> float:
        return float(self.replica.cache.lookup(rb))

    def record(self, rb: RequestBlocks) -> None:
        """A request was routed here: the exact view learns nothing (it reads the replica)."""


class ApproximateView(ExactCacheView):
    """One simulated replica as a deployed router sees it: ``load`` and ``routed`` as
    :class:`ExactCacheView`, ``match`` from the router's own ``lru`` cache of ``cache_blocks``
    blocks (default: the replica's cache capacity) holding the prompts routed here.

    Like the router service's approximate cache, each routed prompt is inserted by ``access``
    (acquire then release at once) at a logical clock that counts the insertions; unlike the
    service (which inserts when the answer ends), the simulator inserts at routing time.

    ``index``/``bit``: the cluster's shared key index (:class:`ApproximateCluster`) and this
    replica's bit in it; ``record`` keeps this replica's bit set on exactly the keys its cache
    holds (None: no shared index)."""

    def __init__(
        self,
        replica: Replica,
        cache_blocks: int | None = None,
        index: dict[Any, int] | None = None,
        bit: int = 0,
    ) -> None:
        from skv.policies.registry import make_cache

        super().__init__(replica)
        blocks = replica.cache.capacity_blocks if cache_blocks is None else cache_blocks
        self.cache = make_cache("lru", blocks, record_evictions=index is not None)
        self.clock = 0
        self.index = index
        self.bit = bit

    def match(self, rb: RequestBlocks) -> float:
        return float(self.cache.lookup(rb))

    def record(self, rb: RequestBlocks) -> None:
        """Insert the prompt routed here into the router's cache (its most recent entry)."""
        if not rb.keys:
            return
        self.clock += 1
        lease = self.cache.access(rb, float(self.clock))
        index: dict | None = self.index
        if index is None:
            return
        bit = self.bit
        log: list = self.cache.eviction_log
        for entry in log:  # evictions happen before insertions: clear first, then set
            key = entry[1]
            held = index[key] & ~bit
            if held:
                index[key] = held
            else:
                del index[key]
        log.clear()
        for b in lease.blocks:
            key = b.key
            index[key] = index.get(key, 0) | bit


class ApproximateCluster(list):
    """The approximate views of all replicas, plus one index over their caches: key ->
    bitmask of the replicas whose router cache holds it (SGLang's router keeps one approximate
    tree with the set of workers per node, for the same reason). ``match_all`` then walks a
    request's keys once for every replica instead of once per replica; it returns what each
    view's ``match`` would (tests/test_sim_router_view.py checks it at every routing decision).

    Memory: one entry per key cached on at least one replica."""

    def __init__(self, replicas: Sequence[Replica], cache_blocks: int | None = None) -> None:
        self.index: dict[Any, int] = {}
        bit: object = 1  # Python ints: a cluster may have more replicas than a C integer bits
        views = []
        for r in replicas:
            views.append(ApproximateView(r, cache_blocks, self.index, bit))
            bit <<= 1
        super().__init__(views)

    def match_all(self, rb: RequestBlocks) -> list[float]:
        """Every replica's matched blocks of ``rb`` with ``BlockCache.lookup``'s rule: a lookup
        run starts at every chain root and counts blocks until the replica's first miss."""
        if len(self) <= _SMALL:
            return _match_small(self.index, rb, len(self))
        index = self.index
        hits = [0] * len(self)
        parents = rb.parents
        one: object = 1  # a Python int: compiled, ``1 << n`` would be C arithmetic (n > 63)
        full = (one << len(self)) - 1
        alive = start = 0
        for i, key in enumerate(rb.keys):
            if parents[i] is None:
                _credit(hits, alive, i - start)  # the previous run's survivors
                alive, start = full, i
            elif not alive:
                continue
            held = alive & index.get(key, 0)
            if held != alive:
                _credit(hits, alive & ~held, i - start)
                alive = held
        _credit(hits, alive, len(rb.keys) - start)
        return [float(h) for h in hits]


#: clusters up to this many replicas keep their bitmasks in one C integer (``_match_small``)
_SMALL = 63


def _match_small(index: dict, rb: RequestBlocks, n: cython.Py_ssize_t) -> list:
    """``ApproximateCluster.match_all`` for ``n <= _SMALL`` replicas: the same walk with the
    masks in a C integer (compiled; the same Python ints otherwise)."""
    keys: list = rb.keys
    parents: list = rb.parents
    if len(parents) != len(keys):  # compiled, ``parents`` is indexed unchecked
        raise ValueError(f"{len(keys)} keys but {len(parents)} parents")
    hits: list = [0] * n
    full: cython.ulonglong = (cython.cast(cython.ulonglong, 1) << n) - 1
    alive: cython.ulonglong = 0
    held: cython.ulonglong
    start: cython.Py_ssize_t = 0
    i: cython.Py_ssize_t
    m: cython.Py_ssize_t = len(keys)
    for i in range(m):
        if parents[i] is None:
            _credit_small(hits, alive, i - start)  # the previous run's survivors
            alive = full
            start = i
        elif not alive:
            continue
        held = alive & index.get(keys[i], 0)
        if held != alive:
            _credit_small(hits, alive & ~held, i - start)
            alive = held
    _credit_small(hits, alive, m - start)
    return [float(h) for h in hits]


def _credit_small(hits: list, mask: cython.ulonglong, amount: cython.Py_ssize_t) -> None:
    """:func:`_credit` for a mask in a C integer."""
    r: cython.Py_ssize_t = 0
    if not amount:
        return
    while mask:
        if mask & 1:
            hits[r] += amount
        mask >>= 1
        r += 1


def _credit(hits: list[int], mask: int, amount: int) -> None:
    """Add ``amount`` to ``hits[r]`` for every replica ``r`` whose bit is set in ``mask``."""
    while mask:
        low = mask & -mask
        hits[low.bit_length() - 1] += amount
        mask ^= low


class SimRouting:
    """One router over the simulated replicas: ``choose`` takes the ranking's first replica
    and counts the request as routed there.

    ``view``: ``"exact"`` (default) or ``"approximate"`` (module docstring); ``cache_blocks``:
    the approximate cache's size per replica (None: the replica's cache capacity). ``precise``
    gets the exact view whatever ``view`` says (KV events report the engine's real cache).
    Cache-blind routers (``cache_aware`` False) never read ``match``, so their approximate
    views are not updated (no cost, same routing)."""

    def __init__(
        self,
        name: str,
        params: dict[str, Any],
        replicas: Sequence[Replica],
        view: str = "exact",
        cache_blocks: int | None = None,
    ) -> None:
        check_view(view)
        if cache_blocks is not None and cache_blocks < 1:
            raise ValueError(f"router cache_blocks must be >= 1 or None, got {cache_blocks}")
        self.router = make_router(name, **params)
        self.view = "exact" if isinstance(self.router, Precise) else view
        self.views: list[ExactCacheView]
        if self.view == "approximate":
            self.views = ApproximateCluster(replicas, cache_blocks)
        else:
            self.views = [ExactCacheView(r) for r in replicas]
        self._record = self.view == "approximate" and self.router.cache_aware

    def choose(self, rb: RequestBlocks) -> int:
        k = self.router.rank(rb, self.views).first
        view: ExactCacheView = self.views[k]
        view.routed += 1
        if self._record:
            view.record(rb)
        return k
