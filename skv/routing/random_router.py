"""``random``: cache-blind, a uniformly random order (seeded)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class RandomRouter(Router):
    """Each request: the replicas shuffled by ``random.Random(seed)`` (one generator per router
    object, one shuffle per ranked request), so a seed fixes the whole stream of choices.
    ``seed``: chosen 0, any fixed value makes runs repeatable."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        order = list(range(len(views)))
        self._rng.shuffle(order)
        return Ranking(order, None, self.name)
