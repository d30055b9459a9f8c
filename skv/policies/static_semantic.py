"""``static_semantic``: LRU weighted by fixed per-semantic-type weights.

Each block is worth ``w[type] * 2 ** (-(now - t_release) / half_life_s)`` at time ``now``: its
type's weight, halved every ``half_life_s`` seconds since its last holder released it. The block
worth least goes first. That score drifts with time, but its ranking does not: ``half_life_s *
log2(score) = key - now`` with

    key = t_release + half_life_s * log2(w[type])

so the heap stores ``key`` (fixed at release) and never needs refreshing. Read it as: a
block whose type weighs twice as much is treated as if used ``half_life_s`` seconds later. At
equal recency a heavier type is kept; a heavy block still goes once it is staler than a light one
by more than ``half_life_s * log2(weight ratio)``. Ties (same key) evict in release order, a
request's tail first.

Default weights (``DEFAULT_WEIGHTS``) are a prior, not fitted to any trace: shared instructions
(system, tool schema, template) 8; documents (retrieved context, legal evidence, code) 4;
tool output and assistant history 2; user query, output and unknown 1; reasoning 0.5 (chains of
thought are rarely resent). ``weights`` overrides any subset by type name.
"""

from __future__ import annotations

from math import log2
from typing import Any

from skv.cache.block import Block
from skv.model import TYPES, SemanticType
from skv.policies.base import MonotonePriorityPolicy

DEFAULT_WEIGHTS: dict[str, float] = {
    SemanticType.SYSTEM.value: 8.0,
    SemanticType.TOOL_SCHEMA.value: 8.0,
    SemanticType.TEMPLATE.value: 8.0,
    SemanticType.RETRIEVED_CONTEXT.value: 4.0,
    SemanticType.LEGAL_EVIDENCE.value: 4.0,
    SemanticType.CODE.value: 4.0,
    SemanticType.TOOL_OUTPUT.value: 2.0,
    SemanticType.ASSISTANT_HISTORY.value: 2.0,
    SemanticType.USER_QUERY.value: 1.0,
    SemanticType.OUTPUT.value: 1.0,
    SemanticType.UNKNOWN.value: 1.0,
    SemanticType.REASONING.value: 0.5,
}


def resolve_weights(weights: dict[str, float] | None, policy: str) -> list[float]:
    """Per-type weights indexed like ``TYPE_INDEX``: the defaults overridden by ``weights``."""
    merged = dict(DEFAULT_WEIGHTS)
    for name, w in (weights or {}).items():
        if name not in merged:
            raise ValueError(
                f"{policy}: unknown semantic type {name!r} in weights; "
                f"known: {', '.join(t.value for t in TYPES)}"
            )
        if not w > 0:
            raise ValueError(f"{policy}: weight of {name!r} must be > 0, got {w}")
        merged[name] = float(w)
    return [merged[t.value] for t in TYPES]


class StaticSemantic(MonotonePriorityPolicy):
    name = "static_semantic"

    def __init__(self, weights: dict[str, float] | None = None, half_life_s: float = 10.0) -> None:
        super().__init__()
        if not half_life_s > 0:
            raise ValueError(f"static_semantic: half_life_s must be > 0, got {half_life_s}")
        self.weights = resolve_weights(weights, self.name)
        self.half_life_s = float(half_life_s)
        #: per type, the key offset half_life_s * log2(w)
        self._offset = [self.half_life_s * log2(w) for w in self.weights]

    def key(self, b: Block, now: float) -> float:
        return now + self._offset[b.stype]

    def params(self) -> dict[str, Any]:
        return {
            "weights": {t.value: w for t, w in zip(TYPES, self.weights, strict=True)},
            "half_life_s": self.half_life_s,
        }
