"""``semantic_locality``: prefix locality with the matched prefix weighted by semantic type."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from skv.model import TYPES, SemanticType
from skv.routing.base import LocalityRouter

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks

T = SemanticType
#: weight of one matched token of each type (types not listed: 1.0)
SEMANTIC_WEIGHTS: dict[SemanticType, float] = {
    T.SYSTEM: 3.0,
    T.TOOL_SCHEMA: 3.0,
    T.TEMPLATE: 3.0,
    T.RETRIEVED_CONTEXT: 2.0,
    T.LEGAL_EVIDENCE: 2.0,
    T.CODE: 1.5,
    T.TOOL_OUTPUT: 1.0,
    T.ASSISTANT_HISTORY: 1.0,
    T.REASONING: 0.8,
    T.OUTPUT: 0.8,
    T.USER_QUERY: 0.5,
    T.UNKNOWN: 0.5,
}


class SemanticLocality(LocalityRouter):
    """Score = the tokens of the matched leading blocks, each weighted by its block's semantic
    type (system prompts, tool schemas and templates count most, one-off user text least),
    rounded to 3 decimals. Order, ties and ``max_imbalance`` as :class:`LocalityRouter`."""

    name = "semantic_locality"

    def __init__(
        self,
        max_imbalance: int | None = None,
        weights: Mapping[SemanticType | str, float] | None = None,
    ) -> None:
        super().__init__(max_imbalance)
        src = SEMANTIC_WEIGHTS if weights is None else weights
        self.weights = {SemanticType(k): float(w) for k, w in src.items()}

    def _weight(self, stype: Any) -> float:
        st = TYPES[stype] if isinstance(stype, int) else SemanticType(stype)
        return self.weights.get(st, 1.0)

    def scores(self, rb: RequestBlocks, hits: list[float]) -> list[float]:
        most = min(int(max(hits, default=0)), len(rb.tokens))
        tokens, stypes = rb.tokens, rb.stypes
        cum = [0, *accumulate(tokens[i] * self._weight(stypes[i]) for i in range(most))]
        return [round(cum[min(int(h), most)], 3) for h in hits]
