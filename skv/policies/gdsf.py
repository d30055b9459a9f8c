"""``gdsf``: GreedyDual-Size-Frequency over blocks.

Ordering invariant: priority ``H = L + freq * cost / size``, lowest first, fixed when the block
is released (the moment its last access ends), with

- ``freq = b.hits + 1``: accesses while cached (the insertion plus every reuse),
- ``cost = b.tokens``: prefill tokens a hit on this block saves,
- ``size = 1``: every block takes one slot of KV memory,
- ``L``: the inflation value, raised to ``H`` of each victim as it is evicted
  (``L = max(L, H_victim)``), so blocks not accessed for a long time age out as newer blocks
  are keyed above them.

A block that becomes a leaf without being accessed keeps its last ``H`` (GreedyDual updates
``H`` on access only); such a block may sit below ``L`` and then goes first, which is why ``L``
takes a max rather than the victim's ``H`` (in plain GDSF every cached object is a candidate and
the two agree). Ties (equal ``H``) evict in release order, a request's tail first.
``metrics()`` logs ``L``.
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.policies.base import MonotonePriorityPolicy


class GDSF(MonotonePriorityPolicy):
    name = "gdsf"

    def __init__(self) -> None:
        super().__init__()
        self.inflation = 0.0

    def key(self, b: Block, now: float) -> float:
        return self.inflation + (b.hits + 1) * b.tokens

    def on_evict(self, b: Block, now: float) -> None:
        h = b.pk1
        if h > self.inflation:
            self.inflation = h

    def metrics(self) -> dict[str, float]:
        return {"L": self.inflation}

    def params(self) -> dict[str, Any]:
        return {"cost": "block_tokens", "size": "1 block"}
