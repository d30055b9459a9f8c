"""``dynamo_cost``: NVIDIA Dynamo's KV router cost (prefill blocks after overlap + decode
blocks), lowest first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from skv.routing.base import Ranking, ReplicaView, Router, matched_tokens, matches, order_by

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks


class DynamoCost(Router):
    """Dynamo's KV router (``DefaultWorkerSelector``; REFERENCE.md section 2):

        cost(r) = w * prefill_blocks(r) + decode_blocks(r), lowest first

    - ``prefill_blocks(r) = (prompt_tokens - matched_tokens(r)) / block_size``: the blocks the
      replica would compute (Dynamo: new prefill tokens / block size), ``matched_tokens`` from
      the view's ``match`` (Dynamo: overlap blocks from its KV-event index; the service: its
      approximate per-replica cache; the simulator: the exact cache, an idealised router).
    - ``decode_blocks(r) = load(r) * b + ceil(prompt_tokens / block_size)``: the KV blocks the
      replica would hold with this request (Dynamo: ``potential_active_blocks``, the router's own
      count of active sequences' blocks plus the request's). The view gives requests, not
      blocks, so each request in flight counts ``b`` blocks: ``blocks_per_request`` if given,
      else the running mean of the blocks of the requests this router has ranked (this one
      included): what a router that sees prompts but not engine state can know.
    - ``w = overlap_score_weight``, default 1.0: Dynamo's ``--kv-overlap-score-weight`` default
      (REFERENCE.md: w = 1). Dynamo's ``--router-temperature`` defaults to 0 (argmin, no
      sampling); only that default is implemented.

    Ties by (load, routed, index). Scores: the costs (3 decimals)."""

    name = "dynamo_cost"
    cache_aware = True

    def __init__(
        self, overlap_score_weight: float = 1.0, blocks_per_request: float | None = None
    ) -> None:
        if overlap_score_weight < 0:
            raise ValueError(f"overlap_score_weight must be >= 0, got {overlap_score_weight}")
        if blocks_per_request is not None and blocks_per_request < 0:
            raise ValueError(f"blocks_per_request must be >= 0, got {blocks_per_request}")
        self.overlap_score_weight = overlap_score_weight
        self.blocks_per_request = blocks_per_request
        self._seen = 0
        self._seen_blocks = 0

    def rank(self, rb: RequestBlocks, views: Sequence[ReplicaView]) -> Ranking:
        bs = max(1, rb.block_size)
        own = -(-rb.prompt_tokens // bs)  # ceil
        self._seen += 1
        self._seen_blocks += own
        b = (
            self.blocks_per_request
            if self.blocks_per_request is not None
            else self._seen_blocks / self._seen
        )
        w = self.overlap_score_weight
        prompt = rb.prompt_tokens
        loads = [v.load for v in views]
        cost: dict[tuple[int, int], float] = {}  # by (matched tokens, load): few distinct pairs
        costs = []
        for t, load in zip(matched_tokens(rb, matches(rb, views)), loads, strict=True):
            c = cost.get((t, load))
            if c is None:
                c = cost[t, load] = round(w * (prompt - t) / bs + load * b + own, 3)
            costs.append(c)
        return Ranking(order_by(costs, loads, [v.routed for v in views]), costs, self.name)
