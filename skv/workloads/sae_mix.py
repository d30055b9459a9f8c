"""SAECache's workloads: dataset-like chat traffic and four class mixes, from one generator.

The SAECache paper (REFERENCE.md section 3) evaluates on ShareGPT-like (74% multi-turn),
LMSys-like (33%) and Chatbot-Arena-like (12%) traffic and on four mixes named ``tool_use``,
``multi_turn_dominant``, ``balanced`` and ``single_turn_dominant``, with new requests every
0.02-0.08 s. It gives no generator, so this module is one: a stream of *conversations* of four
classes, which are the request classes the ``saecache`` policy (``skv/policies/saecache.py``)
sorts prefill blocks by:

===============  =====================================================  ===================
class            the requests                                           saecache queue
===============  =====================================================  ===================
``chat``         a multi-turn conversation: a session id on every       Chat
                 turn; turn ``k + 1`` re-sends turn ``k``'s prompt and
                 quotes its answer (ASSISTANT_HISTORY)
``agentic``      a multi-turn tool-using session: tool schemas          Agentic
                 (TOOL_SCHEMA) first, then system, task and, per
                 earlier step, the tool call and its TOOL_OUTPUT
``structural``   one request, no session id: the system prompt of its   Structural
                 template, the template (``TEMPLATE:``, a TEMPLATE
                 segment, so ``templated``), then ``Question:`` + a
                 fresh fill
``evict_first``  one request, no session id: a system prompt and a      Evict-First (until
                 fresh user query                                       its blocks are hit)
===============  =====================================================  ===================

A single-turn request carries no session id on purpose: ``saecache`` reads a session id as
"multi-turn" (its rule 2), as a session-aware router would. It carries ``turn = 0``. Every
request records its class in ``extra["sae_class"]`` (the queue's name) and its conversation's
planned length in ``extra["planned_turns"]``.

Why one module: the seven names differ only in class shares (a ShareGPT-like and a
``balanced`` trace are the same kind of traffic in different proportions), so each name is a
params model (:class:`SaeMixParams` with other defaults) over the same :func:`chats`. Any
preset takes every parameter, so e.g. ``lmsys_like`` with ``tool_use_share=0.3`` is allowed.

Shares are of *conversations*, as datasets report them (a conversation is multi-turn or not).
``multi_turn_share`` (m) is the share of multi-turn conversations, ``tool_use_share`` (u) the
share of those that use tools, ``template_share`` (t) the share of single-turn requests that are
templated; so conversations are ``chat`` m(1-u), ``agentic`` m u, ``structural`` (1-m) t,
``evict_first`` (1-m)(1-t). A multi-turn conversation brings ``mean_turns`` (T = 4) requests on
average, so in steady state the share of *requests* of a class is its conversation share times
its requests per conversation, normalised:

========================  =====  =====  =====  =============================================
preset                    m      u      t      steady-state requests chat/agentic/struct/evict
========================  =====  =====  =====  =============================================
``sharegpt_like``         0.74   0      0.5    92 / 0 / 4 / 4 %
``lmsys_like``            0.33   0      0.5    66 / 0 / 17 / 17 %
``arena_like``            0.12   0      0.5    35 / 0 / 32 / 32 %
``tool_use``              0.5    0.8    0.5    16 / 64 / 10 / 10 %
``multi_turn_dominant``   0.5    0.2    0.5    64 / 16 / 10 / 10 %
``balanced``              0.2    0.5    0.5    25 / 25 / 25 / 25 %
``single_turn_dominant``  1/17   0.5    0.5    10 / 10 / 40 / 40 %
========================  =====  =====  =====  =============================================

Where each number comes from (paper: REFERENCE.md section 3; chosen: no source gives it, the
value is a plain choice made before any experiment ran, and no value was changed after):

- m of the dataset-likes: paper (74%, 33%, 12% multi-turn).
- u = 0 for the dataset-likes: chosen: ShareGPT, LMSys and Arena conversations are plain chat
  with no tool calls.
- the mixes' m, u: chosen in request terms, the traffic a server sees, and converted with
  ``m = x / (x + T (1 - x))`` for a multi-turn request share ``x``: ``multi_turn_dominant`` and
  ``tool_use`` x = 80% (m = 0.5), ``balanced`` x = 50% (m = 0.2), ``single_turn_dominant``
  x = 20% (m = 1/17); u = 0.8 for ``tool_use`` (tools dominate), 0.2 for
  ``multi_turn_dominant`` (chat dominates), 0.5 for the other two (agentic = chat). The result:
  ``balanced`` gives each of the four queues a quarter of the requests. A changed ``mean_turns``
  does not re-derive a preset's m.
- t = 0.5 everywhere: chosen: the paper gives no templated share; an even split gives both
  single-turn queues traffic.
- turns of a multi-turn conversation: ``2 + G``, G geometric on {0, 1, ...} with mean
  ``mean_turns - 2``, capped at ``max_turns``: chosen: a constant chance to go on after each
  turn (memoryless, long-tailed); ``mean_turns`` = 4 chosen, the same for every preset so that
  presets differ only in the shares above; ``max_turns`` = 32 only bounds outliers
  (P(turns > 32) = (2/3)^31, about 3.5e-6, at mean 4). Agentic sessions use the same count for
  their steps.
- inter-turn gaps: log-normal, log-seconds ``gap_mu`` = 2.28, ``gap_sigma`` = 1.34: the
  paper's prior of its inter-turn gap model (median e^2.28 = 9.8 s), used here as the *true*
  distribution of the gaps. ``tool_gap_mu`` / ``tool_gap_sigma`` (default: the same values;
  the paper gives one prior for Chat and Agentic) let agent steps be timed differently.
  A gap runs from one turn's arrival to the next's (open loop: the next turn does not wait for
  the simulator to finish the previous one).
- new conversations: one every ``U[arrival_min_s, arrival_max_s]`` = U[0.02, 0.08] s: the paper's
  range; uniform chosen (the paper gives only the range). Follow-up turns come on top, so the
  request rate is this rate times the mean requests per conversation (3.2 for ShareGPT-like,
  2.0 LMSys-like, 1.4 Arena-like, 2.5 for the 80% mixes, 1.6 ``balanced``, 1.2
  ``single_turn_dominant``).
- ``num_requests``: the earliest requests are kept, as in every session workload here (a late
  conversation keeps a prefix of its turns). While the first conversations ramp up, follow-up
  turns are fewer than in steady state, so a short trace holds fewer multi-turn requests than
  the table says; the conversation shares hold exactly in expectation.
- lengths (mean tokens, log-normal spread ``length_sigma``): system prompt 300 from 4 prompts,
  user message 80, answer 250: chosen, ``multi_turn_chat``'s defaults. Templates: 16 of 200
  tokens, picked Zipf(1.0): chosen (a few popular applications and a tail). Tools: 4 tool sets
  of 8 tools (40-token descriptions, Zipf(1.0) set choice), tool outputs of 250 tokens, fixed
  per (tool, arguments) with arguments Zipf(0.9) over 1000: chosen, ``tool_agent``'s defaults.

Answers are generated: every request's answer is known text (``output_tokens`` and
``output_hash`` set by the renderer), so the simulator caches the answer as OUTPUT blocks, and
the next turn of a chat (or agentic step) quotes it verbatim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

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
    ZipfSampler,
    check_order,
    draw_length,
    rng_for,
)
from skv.workloads.tool_agent import tool_set

#: conversation classes, named after the saecache queue their prefill blocks go to
CLASSES: tuple[str, ...] = ("chat", "agentic", "structural", "evict_first")
CHAT, AGENTIC, STRUCTURAL, EVICT_FIRST = range(4)

#: the paper's prior of the inter-turn gap model (log-seconds)
GAP_MU = 2.28
GAP_SIGMA = 1.34


def GapMu(default: float | None, description: str) -> object:
    """A log-normal mu in log-seconds (finite, |mu| <= 20)."""
    return Field(default=default, ge=-20, le=20, allow_inf_nan=False, description=description)


class SaeMixParams(WorkloadParams):
    """Parameters of the SAECache workloads (plus those of :class:`WorkloadParams`, except
    ``rate_rps``: conversations arrive every ``U[arrival_min_s, arrival_max_s]`` seconds).

    The defaults are ``sharegpt_like``'s; each preset subclass changes some of them.
    """

    NAME: ClassVar[str] = "sharegpt_like"

    rate_rps: float | None = Field(
        default=None,
        description="not used (must stay unset): arrivals follow arrival_min_s/arrival_max_s",
    )
    multi_turn_share: float = Fraction(
        0.74, "share of multi-turn conversations (paper: ShareGPT-like 74%)"
    )
    tool_use_share: float = Fraction(
        0.0, "share of multi-turn conversations that use tools (chosen: ShareGPT has none)"
    )
    template_share: float = Fraction(
        0.5, "share of single-turn requests that are templated (chosen: even split)"
    )
    mean_turns: float = Field(
        default=4.0,
        ge=2,
        le=1000,
        description="mean turns of a multi-turn conversation: 2 + geometric (chosen)",
    )
    max_turns: int = Field(
        default=32, ge=2, le=MAX_PER_REQUEST, description="cap on a conversation's turns"
    )
    gap_mu: float = GapMu(GAP_MU, "log-normal inter-turn gap, mu in log-seconds (paper prior)")
    gap_sigma: float = LogSpread(GAP_SIGMA, "log-normal inter-turn gap, sigma (paper prior)")
    tool_gap_mu: float | None = GapMu(None, "mu of the gap between agent steps (None: gap_mu)")
    tool_gap_sigma: float | None = Field(
        default=None,
        ge=0,
        le=5,
        description="sigma of the gap between agent steps (None: gap_sigma)",
    )
    arrival_min_s: float = Seconds(0.02, "shortest interval between new conversations (paper)")
    arrival_max_s: float = Seconds(0.08, "longest interval between new conversations (paper)")
    num_system_prompts: int = Field(
        default=4, ge=1, le=MAX_CATALOGUE, description="distinct system prompts"
    )
    system_tokens: int = Tokens(300, "mean system-prompt length; each prompt's is fixed")
    num_templates: int = Field(
        default=16, ge=1, le=MAX_CATALOGUE, description="distinct single-turn templates"
    )
    template_tokens: int = Tokens(200, "mean template length; each template's is fixed")
    template_alpha: float = Field(
        default=1.0, ge=0, le=5, description="Zipf skew of the templates' popularity"
    )
    user_tokens: int = Tokens(80, "mean user message / query / template fill / task length")
    answer_tokens: int = Tokens(250, "mean answer length (text answers)")
    num_tool_sets: int = Field(
        default=4, ge=1, le=MAX_CATALOGUE, description="distinct tool sets (agent kinds)"
    )
    tools_per_set: int = Field(default=8, ge=1, le=MAX_PER_REQUEST, description="tools in each set")
    tool_description_tokens: int = Tokens(40, "mean length of a tool's description")
    tool_output_tokens: int = Tokens(250, "mean tool-output length; fixed per (tool, args)")
    tool_arg_catalogue: int = Field(
        default=1000,
        ge=1,
        le=MAX_CATALOGUE,
        description="distinct arguments each tool is called with",
    )
    tool_arg_alpha: float = Field(
        default=0.9, ge=0, le=5, description="Zipf skew of the arguments (shared outputs)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> SaeMixParams:
        if self.rate_rps is not None:
            raise ValueError(
                f"{self.NAME} does not take rate_rps: new conversations arrive every "
                "U[arrival_min_s, arrival_max_s] seconds (set those instead)"
            )
        check_order(self, "arrival_min_s", "arrival_max_s")
        if self.mean_turns > self.max_turns:
            raise ValueError(
                f"mean_turns ({self.mean_turns}) must be <= max_turns ({self.max_turns})"
            )
        return self

    def class_shares(self) -> np.ndarray:
        """Probability of each class (``CLASSES`` order) for one conversation."""
        m, u, t = self.multi_turn_share, self.tool_use_share, self.template_share
        return np.array([m * (1 - u), m * u, (1 - m) * t, (1 - m) * (1 - t)])

    def request_shares(self) -> np.ndarray:
        """Steady-state share of *requests* of each class (ignoring the ``max_turns`` cap)."""
        per = self.class_shares() * np.array([self.mean_turns, self.mean_turns, 1.0, 1.0])
        return per / per.sum()


# ------------------------------------------------------------------------------ presets
# One class per registered name; only the shares differ (reasons: the module docstring).


class ShareGptLikeParams(SaeMixParams):
    """``sharegpt_like``: 74% multi-turn conversations (paper), no tools."""

    NAME: ClassVar[str] = "sharegpt_like"


class LmsysLikeParams(SaeMixParams):
    """``lmsys_like``: 33% multi-turn conversations (paper), no tools."""

    NAME: ClassVar[str] = "lmsys_like"
    multi_turn_share: float = Fraction(
        0.33, "share of multi-turn conversations (paper: LMSys-like 33%)"
    )


class ArenaLikeParams(SaeMixParams):
    """``arena_like``: 12% multi-turn conversations (paper), no tools."""

    NAME: ClassVar[str] = "arena_like"
    multi_turn_share: float = Fraction(
        0.12, "share of multi-turn conversations (paper: Chatbot-Arena-like 12%)"
    )


class ToolUseParams(SaeMixParams):
    """``tool_use``: 80% of requests multi-turn, most of them agentic (chosen)."""

    NAME: ClassVar[str] = "tool_use"
    multi_turn_share: float = Fraction(
        0.5, "share of multi-turn conversations (chosen: 80% of requests at 4 turns)"
    )
    tool_use_share: float = Fraction(
        0.8, "share of multi-turn conversations that use tools (chosen: tools dominate)"
    )


class MultiTurnDominantParams(SaeMixParams):
    """``multi_turn_dominant``: 80% of requests multi-turn, most of them chat (chosen)."""

    NAME: ClassVar[str] = "multi_turn_dominant"
    multi_turn_share: float = Fraction(
        0.5, "share of multi-turn conversations (chosen: 80% of requests at 4 turns)"
    )
    tool_use_share: float = Fraction(
        0.2, "share of multi-turn conversations that use tools (chosen: chat dominates)"
    )


class BalancedParams(SaeMixParams):
    """``balanced``: a quarter of the requests in each saecache class (chosen)."""

    NAME: ClassVar[str] = "balanced"
    multi_turn_share: float = Fraction(
        0.2, "share of multi-turn conversations (chosen: 50% of requests at 4 turns)"
    )
    tool_use_share: float = Fraction(
        0.5, "share of multi-turn conversations that use tools (chosen: agentic = chat)"
    )


class SingleTurnDominantParams(SaeMixParams):
    """``single_turn_dominant``: 80% of requests single-turn (chosen)."""

    NAME: ClassVar[str] = "single_turn_dominant"
    multi_turn_share: float = Fraction(
        1 / 17, "share of multi-turn conversations (chosen: 20% of requests at 4 turns)"
    )
    tool_use_share: float = Fraction(
        0.5, "share of multi-turn conversations that use tools (chosen: agentic = chat)"
    )


PRESETS: tuple[type[SaeMixParams], ...] = (
    ShareGptLikeParams,
    LmsysLikeParams,
    ArenaLikeParams,
    ToolUseParams,
    MultiTurnDominantParams,
    BalancedParams,
    SingleTurnDominantParams,
)


# ------------------------------------------------------------------------------ planning


@dataclass(slots=True)
class Conversation:
    """One conversation's class, kept arrivals (turn ``k`` at ``arrivals[k]``) and planned
    number of turns (``len(arrivals)`` is smaller when the trace cut it short)."""

    index: int
    kind: int
    arrivals: list[float]
    planned_turns: int


def plan_conversations(p: SaeMixParams) -> list[Conversation]:
    """The conversations whose requests are the ``num_requests`` earliest, in start order.

    Conversations start every ``U[arrival_min_s, arrival_max_s]``; each draws its class
    (``class_shares``), its turns (1, or ``min(max_turns, 2 + G)``) and its gaps (log-normal,
    the agentic ones with the tool-gap parameters), in batches from one seeded stream. Drawing
    stops once no later conversation could start before the ``num_requests``-th arrival.
    """
    rng = rng_for(p.seed, p.NAME, "plan")
    shares = np.cumsum(p.class_shares())
    shares /= shares[-1]
    mean_requests = float(p.class_shares() @ [p.mean_turns, p.mean_turns, 1.0, 1.0])
    batch = max(64, int(p.num_requests / max(mean_requests, 1.0) * 1.1) + 16)
    geo_p = 1.0 / (p.mean_turns - 1.0)
    mu = np.array([p.gap_mu, _or(p.tool_gap_mu, p.gap_mu), 0.0, 0.0])
    sigma = np.array([p.gap_sigma, _or(p.tool_gap_sigma, p.gap_sigma), 0.0, 0.0])
    kinds_l: list[np.ndarray] = []
    turns_l: list[np.ndarray] = []
    times_l: list[np.ndarray] = []
    t = 0.0
    total = 0
    while True:
        starts = t + np.cumsum(rng.uniform(p.arrival_min_s, p.arrival_max_s, size=batch))
        t = float(starts[-1])
        kinds = np.minimum(np.searchsorted(shares, rng.random(batch), side="right"), 3)
        multi = np.minimum(p.max_turns, 1 + rng.geometric(geo_p, size=batch))
        turns = np.where(kinds <= AGENTIC, multi, 1)
        z = rng.standard_normal(int(turns.sum()))
        kind_of = np.repeat(kinds, turns)
        gaps = np.exp(mu[kind_of] + sigma[kind_of] * z)
        # turn k of a conversation arrives at start + (sum of its first k gaps); turn 0 at start
        first = np.cumsum(turns) - turns
        gaps[first] = 0.0
        csum = np.cumsum(gaps)
        times_l.append(np.repeat(starts, turns) + (csum - np.repeat(csum[first], turns)))
        kinds_l.append(kinds)
        turns_l.append(turns)
        total += int(turns.sum())
        if total >= p.num_requests:
            all_times = np.concatenate(times_l)
            cutoff = np.partition(all_times, p.num_requests - 1)[p.num_requests - 1]
            if t > cutoff:
                break
    kinds_all = np.concatenate(kinds_l)
    turns_all = np.concatenate(turns_l)
    times_all = np.concatenate(times_l)
    conv_of = np.repeat(np.arange(len(turns_all)), turns_all)
    turn_of = np.arange(len(times_all)) - np.repeat(np.cumsum(turns_all) - turns_all, turns_all)
    order = np.lexsort((turn_of, conv_of, times_all))[: p.num_requests]
    kept = np.zeros(len(times_all), dtype=bool)
    kept[order] = True
    out: list[Conversation] = []
    pos = 0
    times_list = times_all.tolist()
    kept_list = kept.tolist()
    for c, (n, kind) in enumerate(zip(turns_all.tolist(), kinds_all.tolist(), strict=True)):
        arrivals = [times_list[pos + k] for k in range(n) if kept_list[pos + k]]
        if arrivals:
            out.append(Conversation(c, kind, arrivals, n))
        pos += n
    return out


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


# ------------------------------------------------------------------------------ chats


def chats(params: SaeMixParams, ctx: Context) -> list[Chat]:
    """SAECache-style traffic: chat, agentic, templated and plain single-turn conversations.

    - A new conversation every ``U[arrival_min_s, arrival_max_s]`` = U[0.02, 0.08] s; its class
      is drawn from ``multi_turn_share``, ``tool_use_share`` and ``template_share`` (see the
      module docstring for each preset's values and their sources).
    - ``chat``: ``[system, user_0, assistant_0, ..., user_k]``; a system prompt from
      ``num_system_prompts`` (4) of ``system_tokens`` (300); user messages of ``user_tokens``
      (80); answers of ``answer_tokens`` (250), quoted verbatim by the next turn.
    - ``agentic``: tool set Zipf(1.0) of ``num_tool_sets`` (4) (TOOL_SCHEMA, first), a system
      prompt, a task of ``user_tokens``; each step but the last answers with a tool call
      (uniform tool, arguments Zipf(``tool_arg_alpha`` = 0.9) over ``tool_arg_catalogue``);
      the next step quotes it and adds the tool's output (TOOL_OUTPUT, ``tool_output_tokens``
      = 250, fixed per (set, tool, arguments)); the last step answers in text.
    - Multi-turn conversations have ``min(max_turns, 2 + G)`` turns, mean ``mean_turns`` (4),
      separated by log-normal gaps (``gap_mu`` = 2.28, ``gap_sigma`` = 1.34 log-seconds, the
      paper's prior; agent steps use ``tool_gap_mu`` / ``tool_gap_sigma``, default the same).
      Every turn carries the session id, its turn number and its parent's request id.
    - ``structural``: template ``k`` ~ Zipf(``template_alpha`` = 1.0) of ``num_templates`` (16):
      system prompt ``k mod num_system_prompts``, then a user message ``TEMPLATE: <template
      k>`` (``template_tokens`` = 200) + ``Question: <fresh fill>`` (``user_tokens``); so
      requests of one template share every block of system prompt + template.
    - ``evict_first``: a uniform system prompt and a fresh user query (``user_tokens``).
    - Single-turn requests have no session id and ``turn = 0``; every answer is generated text
      (``answer_tokens``), so each request's ``output_tokens`` / ``output_hash`` are known.
    - ``extra``: ``sae_class`` (the class), ``planned_turns``; ``template`` / ``tool_set``.
    """
    p = params
    name = p.NAME
    tg = ctx.textgen
    sigma = p.length_sigma
    systems = [
        Message("system", (tg.text(f"{name}/system", k, p.system_tokens, sigma),))
        for k in range(p.num_system_prompts)
    ]
    templates = [
        tg.join("TEMPLATE:", tg.text(f"{name}/template", k, p.template_tokens, sigma))
        for k in range(p.num_templates)
    ]
    template_zipf = ZipfSampler(p.num_templates, p.template_alpha)
    tool_sets: dict[int, list] = {}
    set_zipf = ZipfSampler(p.num_tool_sets, 1.0)
    arg_zipf = ZipfSampler(p.tool_arg_catalogue, p.tool_arg_alpha)

    def answer(rng: np.random.Generator) -> Message:
        return Message("assistant", (tg.fresh(rng, draw_length(rng, p.answer_tokens, sigma)),))

    def user_text(rng: np.random.Generator) -> str:
        return tg.fresh(rng, draw_length(rng, p.user_tokens, sigma))

    out: list[Chat] = []
    for conv in plan_conversations(p):
        rng = rng_for(p.seed, name, "conversation", conv.index)
        conv_id = f"{ctx.id_prefix}{name}-c{conv.index:06d}"
        extra: dict[str, object] = {
            "sae_class": CLASSES[conv.kind],
            "planned_turns": conv.planned_turns,
        }
        t0 = ctx.time_offset_s
        if conv.kind == STRUCTURAL:
            k = template_zipf.sample_one(rng)
            fill = tg.join("Question:", user_text(rng))
            msgs = [systems[k % p.num_system_prompts], Message("user", (templates[k], fill))]
            out.append(_single(conv_id, t0 + conv.arrivals[0], msgs, answer(rng), extra, k))
        elif conv.kind == EVICT_FIRST:
            system = systems[int(rng.integers(0, p.num_system_prompts))]
            msgs = [system, Message("user", (user_text(rng),))]
            out.append(_single(conv_id, t0 + conv.arrivals[0], msgs, answer(rng), extra))
        elif conv.kind == CHAT:
            history = [systems[int(rng.integers(0, p.num_system_prompts))]]
            parent = None
            for turn, t in enumerate(conv.arrivals):
                history.append(Message("user", (user_text(rng),)))
                reply = answer(rng)
                request_id = f"{conv_id}-t{turn:03d}"
                out.append(
                    Chat(
                        request_id=request_id,
                        arrival_s=t0 + t,
                        messages=list(history),
                        answer=reply,
                        session_id=conv_id,
                        turn=turn,
                        parent_id=parent,
                        extra=dict(extra),
                    )
                )
                history.append(reply)
                parent = request_id
        else:
            s = set_zipf.sample_one(rng)
            if s not in tool_sets:
                tool_sets[s] = tool_set(ctx, s, p.tools_per_set, p.tool_description_tokens)
            tools = tool_sets[s]
            system = systems[int(rng.integers(0, p.num_system_prompts))]
            history = [system, Message("user", (user_text(rng),))]
            parent = None
            for step, t in enumerate(conv.arrivals):
                request_id = f"{conv_id}-t{step:03d}"
                last = step == conv.planned_turns - 1
                if last:
                    reply = answer(rng)
                else:
                    tool, arg = int(rng.integers(0, p.tools_per_set)), arg_zipf.sample_one(rng)
                    call_id = f"call_{conv.index}_{step}"
                    query = tg.text(f"{name}/arg", (s, tool, arg), 6)
                    reply = Message(
                        "assistant",
                        tool_calls=[
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {
                                    "name": tools[tool]["function"]["name"],
                                    "arguments": json.dumps({"query": query}),
                                },
                            }
                        ],
                    )
                out.append(
                    Chat(
                        request_id=request_id,
                        arrival_s=t0 + t,
                        messages=list(history),
                        tools=tools,
                        answer=reply,
                        session_id=conv_id,
                        turn=step,
                        parent_id=parent,
                        extra={**extra, "tool_set": s},
                    )
                )
                if not last:
                    output = tg.text(f"{name}/output", (s, tool, arg), p.tool_output_tokens, sigma)
                    history.append(reply)
                    history.append(Message("tool", (output,), tool_call_id=call_id))
                parent = request_id
    return out


def _single(
    conv_id: str,
    arrival_s: float,
    messages: list[Message],
    reply: Message,
    extra: dict[str, object],
    template: int | None = None,
) -> Chat:
    """A single-turn request: no session id (saecache reads one as multi-turn), turn 0."""
    if template is not None:
        extra = {**extra, "template": template}
    return Chat(
        request_id=f"{conv_id}-t000",
        arrival_s=arrival_s,
        messages=messages,
        answer=reply,
        turn=0,
        extra=extra,
    )
