"""``prefix_locality``: the replica holding the longest prefix of the request's blocks."""

from __future__ import annotations

from skv.routing.base import LocalityRouter


class PrefixLocality(LocalityRouter):
    """Score = matched leading blocks (``view.match``); ties and no match anywhere go to the
    least loaded (see :class:`LocalityRouter` for the order and ``max_imbalance``).

    In the simulator ``match`` reads the replica's exact cache, an idealised router; in the
    service it reads the service's approximate per-replica LRU cache."""

    name = "prefix_locality"
