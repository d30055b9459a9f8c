"""The seed's linear TTFT model, extended to whole iterations.

The seed (SemanticKV) estimates ``ttft_ms = base_ttft_ms + uncached_prompt_tokens *
token_latency_ms``. Iteration-level, the same constants price a batch::

    iteration_ms = base_ttft_ms + token_latency_ms * prefill_tokens
                   + decode_ms_per_seq * decode_seqs

so a lone prefill reproduces the seed's TTFT exactly. It ignores attention over cached context
(a hit is free) and the GPU entirely: it is the baseline that makes results comparable with the
seed's, not a performance model.

Defaults are illustrative (the seed's README gives the formula but no numbers): 20 ms fixed cost
per iteration, 0.05 ms per prompt token (20k prompt tokens/s, the order of a 1.5B-8B model's
prefill throughput on one A40/A100) and 0.2 ms per decoding request. Fit real ones with
``skv.latency.calibrated``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from skv.latency.base import Iteration, LatencyModel


@dataclass(frozen=True)
class LinearLatency(LatencyModel):
    """``base_ttft_ms + token_latency_ms * prefill_tokens + decode_ms_per_seq * decode_seqs``."""

    name: ClassVar[str] = "linear"
    formula: ClassVar[str] = (
        "iteration_ms = base_ttft_ms + token_latency_ms * prefill_tokens"
        " + decode_ms_per_seq * decode_seqs; lone-request TTFT = base_ttft_ms"
        " + token_latency_ms * uncached_prompt_tokens"
    )

    base_ttft_ms: float = 20.0
    token_latency_ms: float = 0.05
    decode_ms_per_seq: float = 0.2

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"linear latency: {key} must be finite and >= 0, got {value}")

    def iteration_ms(self, it: Iteration) -> float:
        return (
            self.base_ttft_ms
            + self.token_latency_ms * it.prefill_tokens
            + self.decode_ms_per_seq * it.decode_seqs
        )

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "formula": self.formula,
            "constants": asdict(self),
            "source": "SemanticKV seed README (formula); constants illustrative unless set",
        }
