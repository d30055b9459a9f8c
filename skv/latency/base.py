"""What one engine iteration computes, and the interface every latency model implements.

A serving engine (vLLM, SGLang) runs in iterations: each one runs a batch that mixes prefill
chunks (prompt tokens computed this step, possibly a slice of a longer prompt under chunked
prefill) with one decode token for each running request. Its duration depends on how many tokens
pass through the weights and how much KV context attention reads, so an ``Iteration`` records
exactly that and nothing about which request is which. Latency models are pure functions of an
``Iteration``: the simulator owns queues, batching and the cache; the model only prices a batch.

Every model can ``describe()`` itself (name, formula, constants) so that any simulated result can
say "TTFT simulated by <model>" next to the numbers it reports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Prompt tokens one request computes this iteration.

    ``tokens`` are computed now; ``context_before`` are already in that request's KV when the
    chunk runs (prefix-cache hits or chunks computed in earlier iterations), so the chunk's
    queries attend to ``context_before + tokens`` keys. ``tokens == 0`` is allowed and costs
    nothing beyond the iteration's fixed cost (the seed's TTFT formula has a term for it).
    """

    tokens: int
    context_before: int = 0

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.context_before < 0:
            raise ValueError(
                f"PrefillChunk(tokens={self.tokens}, context_before={self.context_before}): "
                "both must be >= 0"
            )


@dataclass(frozen=True, slots=True)
class Iteration:
    """One engine step: prefill chunks plus one decoded token per running request.

    Decodes are kept as two sums, ``decode_seqs`` (requests decoding one token) and
    ``decode_context_tokens`` (KV tokens they attend, summed): every latency model prices
    decodes by these sums alone, and the simulator keeps them as running totals, so pricing a
    step costs O(prefill chunks), not O(batch). :meth:`with_decodes` builds one from per-request
    contexts. Invariant: both sums are >= 0 and a context sum needs decoding requests; an
    iteration may be empty (the models then return their fixed per-iteration cost).
    """

    prefill: tuple[PrefillChunk, ...] = ()
    decode_seqs: int = 0
    decode_context_tokens: int = 0

    def __post_init__(self) -> None:
        if self.decode_seqs < 0 or self.decode_context_tokens < 0:
            raise ValueError(
                f"Iteration(decode_seqs={self.decode_seqs}, decode_context_tokens="
                f"{self.decode_context_tokens}): both must be >= 0"
            )
        if self.decode_context_tokens and not self.decode_seqs:
            raise ValueError(
                f"Iteration: decode_context_tokens={self.decode_context_tokens} without "
                "decoding requests (decode_seqs=0)"
            )

    @classmethod
    def with_decodes(
        cls, prefill: tuple[PrefillChunk, ...] = (), decode_contexts: Sequence[int] = ()
    ) -> Iteration:
        """An iteration from the context length of each decoding request."""
        if any(c < 0 for c in decode_contexts):
            raise ValueError(f"decode_contexts must be >= 0, got {tuple(decode_contexts)}")
        return cls(tuple(prefill), len(decode_contexts), sum(decode_contexts))

    @classmethod
    def lone_prefill(cls, tokens: int, context_before: int = 0) -> Iteration:
        """A batch holding only one request's prefill: the no-queueing TTFT case."""
        return cls(prefill=(PrefillChunk(tokens, context_before),))

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens computed this iteration (all chunks)."""
        return sum(c.tokens for c in self.prefill)

    @property
    def prefill_context_tokens(self) -> int:
        """Tokens already in KV before the chunks ran (cached or computed earlier), summed."""
        return sum(c.context_before for c in self.prefill)

    @property
    def batch_tokens(self) -> int:
        """Tokens that pass through the weights: prefill tokens plus one per decode."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode_seqs


class LatencyModel(ABC):
    """Prices one engine iteration in milliseconds.

    Subclasses set ``name`` (the registry key) and implement ``iteration_ms`` and ``describe``.
    ``ttft_ms`` is derived: the duration of an iteration that holds only this request's prefill,
    i.e. TTFT without queueing or batching interference (the seed's TTFT model is exactly this).
    """

    name: ClassVar[str] = "abstract"

    @abstractmethod
    def iteration_ms(self, it: Iteration) -> float:
        """Wall-clock duration of ``it`` in milliseconds."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """``{"model": name, "formula": str, "constants": {...}}``; JSON-serialisable."""

    def decode_ms(self, seqs: int, context_tokens: int) -> float:
        """``iteration_ms`` of a decode-only iteration (the simulator's fast path for runs of
        them); a model may override it with the same arithmetic, never a different value."""
        return self.iteration_ms(Iteration((), seqs, context_tokens))

    def prefill_ms(
        self, tokens: list, contexts: list, decode_seqs: int, decode_context_tokens: int
    ) -> float:
        """``iteration_ms`` of the iteration with prefill chunks ``PrefillChunk(tokens[i],
        contexts[i])`` and these decodes. A model may override it with the same arithmetic and
        no ``Iteration`` built, never a different value; the simulator then prices an iteration
        with a prefill by it when no hook needs the ``Iteration``."""
        if len(contexts) != len(tokens):
            raise ValueError(f"prefill_ms: {len(tokens)} chunk sizes, {len(contexts)} contexts")
        chunks = tuple(map(PrefillChunk, tokens, contexts))
        return self.iteration_ms(Iteration(chunks, decode_seqs, decode_context_tokens))

    def decode_run_ends(self, seqs: int, context_tokens: int, count: int, start_s: float) -> list:
        """End times (s) of ``count`` decode-only iterations back to back from ``start_s``, the
        decode context growing by ``seqs`` tokens per iteration: ``t = t + decode_ms / 1000``,
        exactly as the simulator advances one iteration at a time."""
        ends = []
        t = start_s
        for _ in range(count):
            t = t + self.decode_ms(seqs, context_tokens) / 1000.0
            ends.append(t)
            context_tokens += seqs
        return ends

    def ttft_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        """No-queueing TTFT: a lone prefill of ``uncached_tokens`` after ``cached_tokens`` hits."""
        return self.iteration_ms(Iteration.lone_prefill(uncached_tokens, cached_tokens))

    def label(self) -> str:
        """Short provenance line for tables and figure captions."""
        return f"TTFT simulated by {self.name} latency model"
