"""``least_loaded``: cache-blind, the fewest requests first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router, least_loaded_order

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class LeastLoaded(Router):
    """Replicas by (load, routed, index)."""

    name = "least_loaded"

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        return Ranking(least_loaded_order(views), None, self.name)
