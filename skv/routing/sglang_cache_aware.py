"""``sglang_cache_aware``: the SGLang router's ``cache_aware`` policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import (
    Ranking,
    ReplicaView,
    Router,
    matched_tokens,
    matches,
    order_by,
)

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class SGLangCacheAware(Router):
    """SGLang router (sgl-router) ``cache_aware``, as REFERENCE.md section 2 states it:

    1. Imbalanced when ``max_load - min_load > balance_abs_threshold`` AND
       ``max_load > balance_rel_threshold * min_load`` (``load`` = requests in flight/queued
       as the view gives; SGLang counts its own running requests per worker). Then: shortest
       queue, i.e. replicas by (load, routed, index).
    2. Otherwise: match ratio per replica = matched prompt tokens / prompt tokens (SGLang:
       matched characters of its approximate radix tree / characters). If the best ratio is
       ``> cache_threshold``: replicas by (-ratio, load, routed, index); else the least
       loaded order.

    Defaults: ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5, ``cache_threshold``
    0.3: the SGLang router's defaults (REFERENCE.md section 2).

    Differences from SGLang, both forced by the view: below the cache threshold SGLang picks the
    worker with the smallest approximate tree (fewest cached characters); the view exposes no
    cache size, so this takes the least loaded (as REFERENCE.md states the rule). Ties among
    equally matching replicas go to the least loaded (SGLang returns one tenant of the matched
    node). ``match`` is the view's: the service's approximate per-replica LRU (like SGLang's
    approximate tree, fed by routing decisions), the simulator's exact cache (idealised).

    Scores: the match ratios (None when imbalanced: the ratios were not used)."""

    name = "sglang_cache_aware"
    cache_aware = True

    def __init__(
        self,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        cache_threshold: float = 0.3,
    ) -> None:
        if balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}")
        if balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {balance_rel_threshold}")
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.cache_threshold = cache_threshold
        # the decision log's fixed reasons, formatted once
        self._imbalanced_reason = f"{self.name}: imbalanced, shortest queue"
        self._match_reason = f"{self.name}: cache match"

    def imbalanced(self, views: Sequence[ReplicaView]) -> bool:
        return self._imbalanced([v.load for v in views])

    def _imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        loads = [v.load for v in views]
        routed = [v.routed for v in views]
        if self._imbalanced(loads):  # the least loaded order (least_loaded_order)
            return Ranking(order_by(loads, routed), None, self._imbalanced_reason)
        prompt = max(1, rb.prompt_tokens)
        ratio: dict[int, float] = {}  # by matched tokens: most replicas share a few values
        ratios = []
        for t in matched_tokens(rb, matches(rb, views)):
            r = ratio.get(t)
            if r is None:
                r = ratio[t] = round(t / prompt, 6)
            ratios.append(r)
        if max(ratios) > self.cache_threshold:
            order = order_by([-r for r in ratios], loads, routed)
            return Ranking(order, ratios, self._match_reason)
        reason = f"{self.name}: match <= {self.cache_threshold}, least loaded"
        return Ranking(order_by(loads, routed), ratios, reason)
