"""``power_of_two``: cache-blind, the less loaded of two replicas drawn at random."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router, least_loaded_order

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class PowerOfTwo(Router):
    """Power of two choices (Mitzenmacher; Azar et al.): draw two distinct replicas uniformly
    (``random.Random(seed).sample``, one draw per ranked request), the one with the lower
    (load, routed, index) first, the other second, then the rest by (load, routed, index) for
    failover. One replica: just it. ``seed``: chosen 0, any fixed value makes runs repeatable.

    Versus ``random`` (one draw) the maximum load of n requests on n replicas drops from
    about ln n / ln ln n to ln ln n / ln 2 + O(1); versus ``least_loaded`` it needs only two
    replicas' loads, so stale or partial load information hurts it less."""

    name = "power_of_two"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        n = len(views)
        if n == 1:
            return Ranking([0], None, self.name)
        a, b = self._rng.sample(range(n), 2)
        pair = sorted((a, b), key=lambda i: (views[i].load, views[i].routed, i))
        rest = [i for i in least_loaded_order(views) if i != a and i != b]
        return Ranking(pair + rest, None, f"{self.name}: {pair[0]} over {pair[1]}")
