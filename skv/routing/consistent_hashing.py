"""``consistent_hashing``: consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, SODA 2018), keyed by the request's shared prefix."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router, least_loaded_order
from skv.routing.keys import mix64, prefix_key

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class ConsistentHashing(Router):
    """Cache-affine without reading any cache: requests with the same shared prefix go to the
    same replica while it has room.

    - Key: the hash of the request's first ``prefix_blocks`` block keys
      (:func:`skv.routing.keys.prefix_key`).
    - Ring: each replica ``r`` owns ``vnodes`` points ``mix64(r << 32 | v)``; the key sits at
      ``mix64(key)``; its *walk* is the distinct replicas met clockwise from there.
    - Bounded loads: with ``L`` = the sum of the replicas' ``load`` (requests queued or running,
      as the view gives) and ``n`` replicas, the capacity is
      ``cap = ceil(load_factor * (L + 1) / n)`` (the new request counted), and a replica has
      room when ``load + 1 <= cap``. The request goes to the first replica of its walk with
      room; the order is the walk's replicas with room, then those without (failover).
      At least one replica always has room (the least loaded has ``load <= L / n``).
    - A request without blocks has no key: least loaded.

    Defaults: ``load_factor`` 1.25: the cap of 1.25x the mean load the routing baselines use
    (REFERENCE.md section 2; Mirrokni et al.'s ``c = 1 + eps``, bounding every replica at 1.25x
    the mean while a key moves only when its replica is full). ``prefix_blocks`` 4: chosen: 64
    tokens at the default block size of 16, within a shared system prompt or template (so its
    requests share the key) yet long enough that unrelated prompts rarely do; set it to the
    workload's shared-prefix length (e.g. 1 block for a 512-token hash-id trace).
    ``vnodes`` 100: chosen: a replica's share of the ring is then within about
    ``1/sqrt(100) = 10%`` of ``1/n`` (the cap bounds the rest).

    Scores: None (the ranking never reads ``match``)."""

    name = "consistent_hashing"

    def __init__(
        self, prefix_blocks: int = 4, load_factor: float = 1.25, vnodes: int = 100
    ) -> None:
        if prefix_blocks < 1:
            raise ValueError(f"prefix_blocks must be >= 1, got {prefix_blocks}")
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1, got {load_factor}")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.prefix_blocks = prefix_blocks
        self.load_factor = load_factor
        self.vnodes = vnodes
        self._n = 0
        self._points: list[int] = []
        self._owners: list[int] = []
        self._walks: dict[int, tuple[int, ...]] = {}

    def _ring(self, n: int) -> None:
        ring = sorted((mix64((r << 32) | v), r) for r in range(n) for v in range(self.vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [r for _, r in ring]
        self._walks = {}
        self._n = n

    def walk(self, key: int, n: int) -> tuple[int, ...]:
        """The distinct replicas met clockwise from ``key``'s point on a ring of ``n``."""
        if n != self._n:
            self._ring(n)
        start = bisect.bisect_left(self._points, mix64(key)) % len(self._points)
        cached = self._walks.get(start)
        if cached is None:
            seen: dict[int, None] = {}
            m = len(self._owners)
            for j in range(m):
                seen.setdefault(self._owners[(start + j) % m], None)
                if len(seen) == n:
                    break
            cached = self._walks[start] = tuple(seen)
        return cached

    def capacity(self, views: Sequence[ReplicaView]) -> int:
        """``ceil(load_factor * (total load + 1) / n)``: the most requests a replica may hold
        once this one is placed."""
        total = sum(v.load for v in views)
        return math.ceil(self.load_factor * (total + 1) / len(views))

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        key = prefix_key(rb, self.prefix_blocks)
        if key is None:
            return Ranking(least_loaded_order(views), None, f"{self.name}: no key, least loaded")
        walk = self.walk(key, len(views))
        cap = self.capacity(views)
        room = [i for i in walk if views[i].load + 1 <= cap]
        full = [i for i in walk if views[i].load + 1 > cap]
        skipped = walk.index(room[0])
        reason = self.name if skipped == 0 else f"{self.name}: {skipped} full (cap {cap}), spilled"
        return Ranking(room + full, None, reason)
