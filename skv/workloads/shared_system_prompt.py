"""``shared_system_prompt``: a few long system prompts, one dominant, and short unique queries.

The high-prefix-reuse case (an assistant product with a long fixed instruction block): nearly
every prompt token is a system-prompt token that an earlier request already computed, and the
only misses are the short user queries. The seed's ``shared_system_prompt_high_reuse``.
"""

from __future__ import annotations

from pydantic import Field

from skv.workloads.base import (
    MAX_CATALOGUE,
    Chat,
    Context,
    Fraction,
    Message,
    Tokens,
    WorkloadParams,
    draw_length,
    poisson_arrivals,
    rng_for,
)

NAME = "shared_system_prompt"


class SharedSystemPromptParams(WorkloadParams):
    """Parameters of ``shared_system_prompt`` (plus those of :class:`WorkloadParams`)."""

    num_system_prompts: int = Field(
        default=4, ge=1, le=MAX_CATALOGUE, description="distinct system prompts"
    )
    system_tokens: int = Tokens(2048, "mean system-prompt length; each prompt's is fixed")
    dominant_fraction: float = Fraction(
        0.7, "share of requests using prompt 0; the rest pick uniformly among the others"
    )
    query_tokens: int = Tokens(48, "mean user-query length (unique text per request)")
    output_tokens: int = Tokens(128, "mean answer length")


def chats(params: SharedSystemPromptParams, ctx: Context) -> list[Chat]:
    """Single-turn requests ``[system, user]``, Poisson arrivals at ``rate_rps``.

    - ``num_system_prompts`` (4) prompts of ``system_tokens`` (2048, lognormal spread
      ``length_sigma``, fixed per prompt); prompt ``k`` serves tenant ``app-k``.
    - A request uses prompt 0 with probability ``dominant_fraction`` (0.7), else one of the
      other prompts uniformly (all use prompt 0 when there is only one).
    - The user query is fresh prose of ``query_tokens`` (48) tokens; the answer is
      ``output_tokens`` (128) tokens, never re-read (``output_hash`` None).
    """
    p = params
    tg = ctx.textgen
    rng = rng_for(p.seed, NAME, "content")
    arrivals = poisson_arrivals(rng_for(p.seed, NAME, "arrivals"), p.num_requests, p.rate_rps)
    prompts = [
        Message("system", (tg.text(f"{NAME}/system", k, p.system_tokens, p.length_sigma),))
        for k in range(p.num_system_prompts)
    ]
    out = []
    for i, t in enumerate(arrivals):
        k = 0
        if p.num_system_prompts > 1 and rng.random() >= p.dominant_fraction:
            k = 1 + int(rng.integers(0, p.num_system_prompts - 1))
        query = tg.fresh(rng, draw_length(rng, p.query_tokens, p.length_sigma))
        out.append(
            Chat(
                request_id=f"{ctx.id_prefix}{NAME}-{i:06d}",
                arrival_s=ctx.time_offset_s + t,
                messages=[prompts[k], Message("user", (query,))],
                output_tokens=draw_length(rng, p.output_tokens, p.length_sigma),
                tenant_id=f"{ctx.id_prefix}app-{k}",
            )
        )
    return out
