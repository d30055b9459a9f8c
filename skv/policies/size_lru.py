"""``size_lru``: LRU that keeps blocks of large (expensive to recompute) segments longer.

Ordering invariant: priority = ``t_release + beta_s * log2(seg_tokens)``, lowest first, where
``t_release`` is when the block's last holder released it (``lru``'s recency) and
``seg_tokens = b.req.seg_tokens[b.pos]`` is the size of the prompt segment the block belongs to.
Read it as: a block of a segment twice as large is treated as if it had been used ``beta_s``
seconds later. At equal recency, blocks of small segments (one-off short texts) go before blocks
of large documents, tool schemas or system prompts; a large block still goes once it is more than
``beta_s * log2(size ratio)`` seconds staler. ``beta_s = 0`` is ``lru``.

The key is fixed when the block is released, so the heap needs no refreshing: at any later
time ``now``, ranking by the key is ranking by the score ``seg_tokens * 2 ** (-(now - t) /
beta_s)`` (a block is worth its segment size, halved every ``beta_s`` seconds it goes unused),
because ``beta_s * log2(score) = key - now``. Ties (same key) evict in release order, a
request's tail first.
"""

from __future__ import annotations

from math import log2
from typing import Any

from skv.cache.block import Block
from skv.policies.base import MonotonePriorityPolicy


class SizeLRU(MonotonePriorityPolicy):
    name = "size_lru"

    def __init__(self, beta_s: float = 1.0) -> None:
        super().__init__()
        if beta_s < 0:
            raise ValueError(f"size_lru: beta_s must be >= 0 seconds per doubling, got {beta_s}")
        self.beta_s = float(beta_s)

    def key(self, b: Block, now: float) -> float:
        seg = b.req.seg_tokens[b.pos]
        return now + self.beta_s * log2(seg) if seg > 1 else now

    def params(self) -> dict[str, Any]:
        return {"beta_s": self.beta_s}
