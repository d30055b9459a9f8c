"""``round_robin``: cache-blind, replicas in turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class RoundRobin(Router):
    """Request k goes first to replica ``k mod n``, then the next ones in index order. The
    counter advances once per ranked request (also when the caller fails over)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        n = len(views)
        start = self._next % n
        self._next += 1
        return Ranking([(start + k) % n for k in range(n)], None, self.name)
