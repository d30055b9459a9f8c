"""``rag``: retrieval-augmented requests over a Zipf-popular document catalogue.

The KV-Repurpose setting: popular documents recur in many requests, but behind different
system prompts, per-request metadata and retrieval orders, so exact-prefix caching finds little
beyond the system prompt while position-independent (segment) reuse finds the documents. A
``shared_prefix_fraction`` of requests (KV-Repurpose: 20%) share one fixed prefix.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from skv.workloads.base import (
    MAX_CATALOGUE,
    MAX_MEAN_TOKENS,
    MAX_PER_REQUEST,
    Chat,
    Context,
    Fraction,
    Message,
    Tokens,
    WorkloadParams,
    ZipfSampler,
    check_order,
    draw_length,
    poisson_arrivals,
    rng_for,
)

NAME = "rag"


class RagParams(WorkloadParams):
    """Parameters of ``rag`` (plus those of :class:`WorkloadParams`)."""

    catalogue_size: int = Field(
        default=2000, ge=1, le=MAX_CATALOGUE, description="documents in the corpus"
    )
    zipf_alpha: float = Field(
        default=1.0, ge=0, le=5, description="popularity skew: P(doc i) ~ 1/(i+1)**alpha"
    )
    docs_per_request: int = Field(
        default=4, ge=1, le=MAX_PER_REQUEST, description="distinct documents per request"
    )
    doc_tokens: int = Tokens(400, "mean document length; each document's is fixed")
    num_system_prompts: int = Field(
        default=8, ge=1, le=MAX_CATALOGUE, description="rotating system prompts"
    )
    system_tokens: int = Tokens(512, "mean rotating system-prompt length")
    shared_prefix_fraction: float = Fraction(
        0.2, "share of requests that start with the one fixed shared prefix"
    )
    shared_prefix_tokens: int = Tokens(1024, "length of the shared prefix")
    metadata_tokens: int = Field(
        default=0,
        ge=0,
        le=MAX_MEAN_TOKENS,
        description="unique per-request metadata before the context (0: none)",
    )
    question_tokens: int = Tokens(40, "mean question length (unique per request)")
    output_tokens: int = Tokens(128, "mean answer length")

    @model_validator(mode="after")
    def _docs_fit(self) -> RagParams:
        check_order(self, "docs_per_request", "catalogue_size")
        return self


def document(ctx: Context, doc_id: int, mean_tokens: int, sigma: float) -> str:
    """Document ``doc_id`` as it appears in a context section: ``Document <id>: <text>``.

    The label is the catalogue id, not the position in the request, so a document is the same
    text (same content hash) wherever it is retrieved.
    """
    tg = ctx.textgen
    return tg.join(f"Document {doc_id}:", tg.text(f"{NAME}/doc", doc_id, mean_tokens, sigma))


def chats(params: RagParams, ctx: Context) -> list[Chat]:
    """Single-turn requests ``[system, user]``, Poisson arrivals at ``rate_rps``.

    - System message: with probability ``shared_prefix_fraction`` (0.2) the fixed shared prefix
      (``shared_prefix_tokens``, 1024), else one of ``num_system_prompts`` (8) prompts of
      ``system_tokens`` (512), uniformly.
    - User message, in order: ``metadata_tokens`` (0 = none) of unique metadata (a different
      "history" before the documents), then ``CONTEXT:``, then ``docs_per_request`` (4) distinct
      documents drawn Zipf(``zipf_alpha`` = 1.0) from ``catalogue_size`` (2000) documents, in
      draw order, each ``Document <id>: ...`` of ``doc_tokens`` (400, lognormal spread
      ``length_sigma``, fixed per document), then ``Question: ...`` of ``question_tokens`` (40).
    - Answer: ``output_tokens`` (128), unique (``output_hash`` None).
    """
    p = params
    tg = ctx.textgen
    rng = rng_for(p.seed, NAME, "content")
    arrivals = poisson_arrivals(rng_for(p.seed, NAME, "arrivals"), p.num_requests, p.rate_rps)
    zipf = ZipfSampler(p.catalogue_size, p.zipf_alpha)
    shared = Message("system", (tg.text(f"{NAME}/shared_prefix", 0, p.shared_prefix_tokens),))
    prompts = [
        Message("system", (tg.text(f"{NAME}/system", k, p.system_tokens, p.length_sigma),))
        for k in range(p.num_system_prompts)
    ]
    docs: dict[int, str] = {}
    out = []
    for i, t in enumerate(arrivals):
        if rng.random() < p.shared_prefix_fraction:
            system, variant = shared, "shared"
        else:
            k = int(rng.integers(0, p.num_system_prompts))
            system, variant = prompts[k], str(k)
        sections: list[str] = []
        if p.metadata_tokens:
            sections.append(tg.fresh(rng, p.metadata_tokens))
        sections.append("CONTEXT:")
        doc_ids = zipf.sample_distinct(rng, p.docs_per_request)
        for d in doc_ids:
            text = docs.get(d)
            if text is None:
                text = docs[d] = document(ctx, d, p.doc_tokens, p.length_sigma)
            sections.append(text)
        question = tg.fresh(rng, draw_length(rng, p.question_tokens, p.length_sigma))
        sections.append(tg.join("Question:", question))
        out.append(
            Chat(
                request_id=f"{ctx.id_prefix}{NAME}-{i:06d}",
                arrival_s=ctx.time_offset_s + t,
                messages=[system, Message("user", tuple(sections))],
                output_tokens=draw_length(rng, p.output_tokens, p.length_sigma),
                extra={"doc_ids": doc_ids, "system_prompt": variant},
            )
        )
    return out
