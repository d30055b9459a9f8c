"""``legal_review``: long evidence bundles reused across the questions of a case.

A reviewer works through a case: each question sends a subset of the case's long exhibits plus
a few standard clauses (shared across cases, Zipf-popular), then the question. Exhibits repeat
within a case (in case order, but different subsets, so exact prefixes diverge early) and
clauses repeat across cases: long-context LEGAL_EVIDENCE reuse. The seed's
``legal_review_long_context``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from skv.workloads.base import (
    MAX_CATALOGUE,
    MAX_PER_REQUEST,
    Chat,
    Context,
    LogSpread,
    Message,
    Seconds,
    Tokens,
    WorkloadParams,
    ZipfSampler,
    check_order,
    draw_length,
    plan_sessions,
    rng_for,
    uniform_turns,
)

NAME = "legal_review"


def _exhibit_label(i: int) -> str:
    """A, B, ..., Z, AA, AB, ..."""
    label = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        label = chr(ord("A") + r) + label
    return label


class LegalReviewParams(WorkloadParams):
    """Parameters of ``legal_review`` (plus those of :class:`WorkloadParams`)."""

    num_system_prompts: int = Field(default=2, ge=1, le=MAX_CATALOGUE, description="system prompts")
    system_tokens: int = Tokens(400, "mean system-prompt length")
    exhibits_per_case: int = Field(
        default=6, ge=1, le=MAX_PER_REQUEST, description="exhibits of a case"
    )
    exhibit_tokens: int = Tokens(1500, "mean exhibit length; each exhibit's is fixed")
    exhibits_per_question: int = Field(
        default=3, ge=1, le=MAX_PER_REQUEST, description="exhibits a question cites"
    )
    clause_catalogue: int = Field(
        default=300, ge=1, le=MAX_CATALOGUE, description="standard clauses (all cases)"
    )
    clause_alpha: float = Field(default=1.1, ge=0, le=5, description="Zipf skew of clauses")
    clauses_per_question: int = Field(
        default=2, ge=0, le=MAX_PER_REQUEST, description="clauses a question cites"
    )
    clause_tokens: int = Tokens(200, "mean clause length; each clause's is fixed")
    min_questions: int = Field(
        default=3, ge=1, le=MAX_PER_REQUEST, description="fewest questions per case"
    )
    max_questions: int = Field(
        default=10, ge=1, le=MAX_PER_REQUEST, description="most questions per case"
    )
    question_tokens: int = Tokens(60, "mean question length")
    output_tokens: int = Tokens(300, "mean answer length")
    think_time_median_s: float = Seconds(30.0, "median gap between questions (s)")
    think_time_sigma: float = LogSpread(1.0, "log-space spread of the gap between questions")

    @model_validator(mode="after")
    def _consistent(self) -> LegalReviewParams:
        check_order(self, "exhibits_per_question", "exhibits_per_case")
        check_order(self, "clauses_per_question", "clause_catalogue")
        check_order(self, "min_questions", "max_questions")
        return self


def chats(params: LegalReviewParams, ctx: Context) -> list[Chat]:
    """Cases (sessions) of independent questions ``[system, user]`` over shared evidence.

    - Cases start Poisson at ``rate_rps / mean questions``; ``min_questions``..``max_questions``
      (3..10) questions, uniformly, separated by a lognormal reviewer gap (median
      ``think_time_median_s`` = 30 s, log-space spread ``think_time_sigma`` = 1.0). Questions
      do not carry earlier answers (``parent_id`` None; ``turn`` is the question's index).
    - A case has ``exhibits_per_case`` (6) exhibits ``Exhibit A``, ``Exhibit B``, ... of
      ``exhibit_tokens`` (1500, fixed per exhibit), and one of ``num_system_prompts`` (2)
      system prompts of ``system_tokens`` (400).
    - A question's user message: ``exhibits_per_question`` (3) of the case's exhibits (a
      uniform subset, in case order), ``clauses_per_question`` (2) distinct standard clauses
      ``Clause <n>`` drawn Zipf(``clause_alpha`` = 1.1) from ``clause_catalogue`` (300) of
      ``clause_tokens`` (200), then ``Question: ...`` of ``question_tokens`` (60). Exhibits and
      clauses are LEGAL_EVIDENCE segments. Answer: ``output_tokens`` (300).
    """
    p = params
    tg = ctx.textgen
    plans = plan_sessions(
        rng_for(p.seed, NAME, "sessions"),
        p.num_requests,
        p.rate_rps,
        uniform_turns(p.min_questions, p.max_questions),
        (p.min_questions + p.max_questions) / 2,
        p.think_time_median_s,
        p.think_time_sigma,
    )
    prompts = [
        Message("system", (tg.text(f"{NAME}/system", k, p.system_tokens, p.length_sigma),))
        for k in range(p.num_system_prompts)
    ]
    clause_zipf = ZipfSampler(p.clause_catalogue, p.clause_alpha)
    clauses: dict[int, str] = {}
    # a case's exhibits are its own (the id prefix keeps a composed run's cases apart)
    exhibit_kind = f"{NAME}/exhibit/{ctx.id_prefix}"
    out = []
    for plan in plans:
        rng = rng_for(p.seed, NAME, "case", plan.index)
        session_id = f"{ctx.id_prefix}{NAME}-case{plan.index:06d}"
        system = prompts[int(rng.integers(0, p.num_system_prompts))]
        exhibits: dict[int, str] = {}  # made when first cited
        for q, t in enumerate(plan.arrivals):
            chosen = sorted(
                rng.choice(
                    p.exhibits_per_case, size=p.exhibits_per_question, replace=False
                ).tolist()
            )
            sections = []
            for e in chosen:
                text = exhibits.get(e)
                if text is None:
                    body = tg.text(exhibit_kind, (plan.index, e), p.exhibit_tokens, p.length_sigma)
                    text = exhibits[e] = tg.join(f"Exhibit {_exhibit_label(e)}:", body)
                sections.append(text)
            for c in clause_zipf.sample_distinct(rng, p.clauses_per_question):
                text = clauses.get(c)
                if text is None:
                    body = tg.text(f"{NAME}/clause", c, p.clause_tokens, p.length_sigma)
                    text = clauses[c] = tg.join(f"Clause {c + 1}.", body)
                sections.append(text)
            question = tg.fresh(rng, draw_length(rng, p.question_tokens, p.length_sigma))
            sections.append(tg.join("Question:", question))
            out.append(
                Chat(
                    request_id=f"{session_id}-q{q:03d}",
                    arrival_s=ctx.time_offset_s + t,
                    messages=[system, Message("user", tuple(sections))],
                    output_tokens=draw_length(rng, p.output_tokens, p.length_sigma),
                    session_id=session_id,
                    turn=q,
                )
            )
    return out
