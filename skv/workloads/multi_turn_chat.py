"""``multi_turn_chat``: ShareGPT-like conversations whose every turn re-sends the whole history.

Turn ``k + 1``'s prompt is turn ``k``'s prompt, then turn ``k``'s answer (as an assistant
message), then a new user message. So in prefix keying turn ``k + 1`` starts with every full
block of turn ``k``'s prompt, and, since each request's ``output_hash`` / ``output_tokens``
describe the answer exactly as the next turn quotes it, a simulator that caches the answer's KV
can hit it too. Turns are separated by a lognormal user think time (SAECache's seed inter-turn
gap model: log-seconds mu 2.28, sigma 1.34).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import Field, model_validator

from skv.workloads.base import (
    MAX_CATALOGUE,
    MAX_PER_REQUEST,
    Chat,
    Context,
    Fraction,
    LogSpread,
    Message,
    Seconds,
    Tokens,
    WorkloadParams,
    check_order,
    draw_length,
    mixed_turns,
    plan_sessions,
    rng_for,
)

NAME = "multi_turn_chat"


class ChatParams(WorkloadParams):
    """Parameters of ``multi_turn_chat`` (plus those of :class:`WorkloadParams`)."""

    num_system_prompts: int = Field(
        default=4, ge=1, le=MAX_CATALOGUE, description="system prompts (per session)"
    )
    system_tokens: int = Tokens(300, "mean system-prompt length; each prompt's is fixed")
    single_turn_fraction: float = Fraction(0.26, "share of one-turn sessions (ShareGPT: 26%)")
    min_turns: int = Field(
        default=2, ge=1, le=MAX_PER_REQUEST, description="fewest turns of a multi-turn session"
    )
    max_turns: int = Field(
        default=8, ge=1, le=MAX_PER_REQUEST, description="most turns of a session"
    )
    user_tokens: int = Tokens(80, "mean user-message length")
    answer_tokens: int = Tokens(250, "mean answer length")
    think_time_median_s: float = Seconds(9.8, "median gap between turns (s)")
    think_time_sigma: float = LogSpread(1.34, "log-space spread of the gap between turns")

    @model_validator(mode="after")
    def _turns_ordered(self) -> ChatParams:
        check_order(self, "min_turns", "max_turns")
        return self


#: (rng, turn) -> (the assistant message the model generates, the message the next turn quotes)
AnswerMaker = Callable[[np.random.Generator, int], tuple[Message, Message]]


def conversation_chats(
    params: ChatParams,
    ctx: Context,
    name: str,
    make_answer: Callable[[np.random.Generator, Context], tuple[AnswerMaker, dict]],
) -> list[Chat]:
    """The session machinery shared by ``multi_turn_chat`` and ``reasoning``.

    ``make_answer(session_rng, ctx)`` returns the session's answer maker, which may decide
    per session how answers appear in later turns (e.g. with or without their reasoning), and
    extra fields for every request of the session.
    """
    p = params
    tg = ctx.textgen
    draw_turns, mean_turns = mixed_turns(p.single_turn_fraction, p.min_turns, p.max_turns)
    plans = plan_sessions(
        rng_for(p.seed, name, "sessions"),
        p.num_requests,
        p.rate_rps,
        draw_turns,
        mean_turns,
        p.think_time_median_s,
        p.think_time_sigma,
    )
    prompts = [
        Message("system", (tg.text(f"{name}/system", k, p.system_tokens, p.length_sigma),))
        for k in range(p.num_system_prompts)
    ]
    out = []
    for plan in plans:
        rng = rng_for(p.seed, name, "session", plan.index)
        session_id = f"{ctx.id_prefix}{name}-s{plan.index:06d}"
        answer_for, session_extra = make_answer(rng, ctx)
        history = [prompts[int(rng.integers(0, p.num_system_prompts))]]
        parent = None
        for turn, t in enumerate(plan.arrivals):
            user = Message(
                "user", (tg.fresh(rng, draw_length(rng, p.user_tokens, p.length_sigma)),)
            )
            history.append(user)
            generated, quoted = answer_for(rng, turn)
            request_id = f"{session_id}-t{turn:03d}"
            out.append(
                Chat(
                    request_id=request_id,
                    arrival_s=ctx.time_offset_s + t,
                    messages=list(history),
                    answer=generated,
                    session_id=session_id,
                    turn=turn,
                    parent_id=parent,
                    extra={"planned_turns": plan.planned_turns, **session_extra},
                )
            )
            history.append(quoted)
            parent = request_id
    return out


def chats(params: ChatParams, ctx: Context) -> list[Chat]:
    """Sessions of ``[system, user_0, assistant_0, ..., user_k]`` requests.

    - Sessions start Poisson at ``rate_rps / mean turns``; a session has one turn with
      probability ``single_turn_fraction`` (0.26), else uniform on [``min_turns``,
      ``max_turns``] = [2, 8]; turns are separated by a lognormal think time (median
      ``think_time_median_s`` = 9.8 s, log-space spread ``think_time_sigma`` = 1.34).
    - A session uses one of ``num_system_prompts`` (4) prompts of ``system_tokens`` (300).
    - Each turn adds a user message of ``user_tokens`` (80) and gets an answer of
      ``answer_tokens`` (250); the answer is one ASSISTANT_HISTORY segment whose hash is the
      request's ``output_hash`` and whose length is its ``output_tokens``, and the next turn
      quotes it verbatim. ``parent_id`` is the previous turn's request id.
    """
    p = params

    def make_answer(_session_rng: np.random.Generator, ctx: Context) -> tuple[AnswerMaker, dict]:
        def answer(rng: np.random.Generator, _turn: int) -> tuple[Message, Message]:
            msg = Message(
                "assistant",
                (ctx.textgen.fresh(rng, draw_length(rng, p.answer_tokens, p.length_sigma)),),
            )
            return msg, msg

        return answer, {}

    return conversation_chats(p, ctx, NAME, make_answer)
