"""``pgdsf``: RAGCache's Prefix-aware Greedy-Dual-Size-Frequency over KV blocks.

Paper: Chao Jin, Zili Zhang, Xuanlin Jiang, Fangyue Liu, Xin Liu, Xuanzhe Liu, Xin Jin,
"RAGCache: Efficient Knowledge Caching for Retrieval-Augmented Generation", arXiv 2404.12457
(2024); ACM Transactions on Computer Systems (2025). RAGCache keeps the KV tensors of retrieved
documents in a *knowledge tree* (a prefix tree: a document's KV depends on what precedes it)
and replaces its leaves by PGDSF: ``Priority = Clock + Frequency * Cost / Size``, lowest first.

As implemented (:class:`skv.policies.gdsf.GDSF`'s structure, which this class extends; only the
cost differs), a block's priority, fixed when it is released (the end of its last access):

- ``H = L + freq * cost / size``, the lowest ``H`` among unpinned leaves is evicted;
- ``freq = b.hits + 1``: the insertion plus every reuse while cached (lost on eviction);
- ``cost`` = the *prefix-aware* recompute cost of the block: the prefill FLOPs of its ``t``
  tokens after the ``c = pos * block_size`` tokens before it, in context-free tokens,
  ``t * (1 + (c + t/2) / attn_crossover)`` (:mod:`skv.policies.flop_cost`, shared with
  ``marconi``): a deeper block costs more, because its tokens attend to a longer context;
- ``size = 1``: every block takes one slot of KV memory;
- ``L`` (RAGCache's *Clock*): raised to the ``H`` of each victim as it is evicted
  (``L = max(L, H_victim)``), so blocks not accessed for a long time age out as newer blocks are
  keyed above them.

Difference from skv's plain ``gdsf``: there ``cost = b.tokens`` (the tokens a hit saves), the
same for every full block whatever its depth; here ``cost`` grows linearly with the block's
position, so at equal frequency and recency a deeper block outlives a shallower one (with
``attn_crossover`` = 30632 tokens, a 16-token block at 16k tokens of context costs 1.53x one at
the start of a prompt). For ``attn_crossover -> inf`` it is ``gdsf``.

Ordering invariant (``MonotonePriorityPolicy``): ``H`` never decreases while a block is cached
(``L`` only rises, ``hits`` only grow, ``cost`` is fixed by ``tokens`` and ``pos``), so the heap
is kept lazily; ties (equal ``H``) evict in release order, a request's tail first. A block that
becomes a leaf without being accessed keeps its last ``H`` (GreedyDual updates ``H`` on access
only). Complexity: O(log n) per release and per eviction (amortised over the lazy entries), O(1)
per insert, hit and pin.

Simplified or adapted:

- RAGCache profiles the prefill time offline and looks the cost up in a table indexed by (prefix
  length, tokens to compute); here the cost is the analytic FLOP model above (compute-bound
  prefill), in units of one context-free token; only ratios of costs matter to the order.
- RAGCache's nodes are whole documents of varying size and its tree spans GPU and host
  memory; here every node is one KV block of one tier, so ``size = 1`` and an eviction drops
  the block.
- RAGCache's frequency counts a document's accesses; here, as in ``gdsf``, hits while cached
  (a block evicted and inserted again starts from 1).
- Only unpinned leaves are evicted, as the knowledge tree evicts leaves (checked at the top of
  the heap, never assumed).

In vLLM's free queue (``skv.cache.policy_pool`` / the eviction plugin) every block has a
``req`` (the request view) with ``block_size`` and ``pos`` = its index in that request, so the
cost is the same; nothing else is read from ``req``.

Parameter: ``attn_crossover`` (tokens, default 30632.02: skv's ``llama-3.1-8b`` preset, derived
in :mod:`skv.policies.flop_cost`; RAGCache profiles its model instead). ``metrics()`` logs ``L``.
"""

from __future__ import annotations

from typing import Any

import cython

from skv.cache.block import Block
from skv.policies.flop_cost import DEFAULT_ATTN_CROSSOVER, block_cost, check_crossover
from skv.policies.gdsf import GDSF


class PGDSF(GDSF):
    name = "pgdsf"

    @cython.annotation_typing(False)  # the argument is checked and converted as plain Python
    def __init__(self, attn_crossover: float = DEFAULT_ATTN_CROSSOVER) -> None:
        super().__init__()
        self.attn_crossover = check_crossover(self.name, attn_crossover)

    def key(self, b: Block, now: float) -> float:
        return self.inflation + (b.hits + 1) * block_cost(b, self.attn_crossover)

    def params(self) -> dict[str, Any]:
        return {"cost": "prefix_flops", "size": "1 block", "attn_crossover": self.attn_crossover}
