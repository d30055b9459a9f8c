"""``tool_agent``: agent sessions that call tools step by step over a growing history.

Every step of a session is one request: the tool schemas (one of a few tool sets), a system
prompt, the user's task, then for each earlier step the assistant's tool call and the tool's
output. The model answers each step with the next tool call, and the last step with a final
answer. Tool outputs are a pure function of (tool, arguments): a popular call returns the same
output in any session, and a session sometimes repeats an earlier call, re-reading an output it
already holds (found by segment keying, not by exact prefix). The seed's
``tool_agent_session_reuse``; SAECache's ``tool_use`` mix.
"""

from __future__ import annotations

import json
from typing import Any

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
    plan_sessions,
    rng_for,
    uniform_turns,
)

NAME = "tool_agent"


class ToolAgentParams(WorkloadParams):
    """Parameters of ``tool_agent`` (plus those of :class:`WorkloadParams`)."""

    num_tool_sets: int = Field(
        default=4, ge=1, le=MAX_CATALOGUE, description="distinct tool sets (agent kinds)"
    )
    tool_set_alpha: float = Field(
        default=1.0, ge=0, le=5, description="Zipf skew of the sessions' tool-set choice"
    )
    tools_per_set: int = Field(default=8, ge=1, le=MAX_PER_REQUEST, description="tools in each set")
    tool_description_tokens: int = Tokens(40, "mean length of a tool's description")
    num_system_prompts: int = Field(default=2, ge=1, le=MAX_CATALOGUE, description="system prompts")
    system_tokens: int = Tokens(600, "mean system-prompt length")
    task_tokens: int = Tokens(80, "mean length of the user's task")
    min_steps: int = Field(
        default=2, ge=1, le=MAX_PER_REQUEST, description="fewest steps (requests) per session"
    )
    max_steps: int = Field(
        default=8, ge=1, le=MAX_PER_REQUEST, description="most steps per session"
    )
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
    reread_prob: float = Fraction(0.2, "chance a step repeats an earlier call of its session")
    answer_tokens: int = Tokens(150, "mean final-answer length")
    think_time_median_s: float = Seconds(2.0, "median gap between steps (s)")
    think_time_sigma: float = LogSpread(0.8, "log-space spread of the gap between steps")

    @model_validator(mode="after")
    def _steps_ordered(self) -> ToolAgentParams:
        check_order(self, "min_steps", "max_steps")
        return self


def tool_set(ctx: Context, index: int, tools: int, description_tokens: int) -> list[dict[str, Any]]:
    """Tool set ``index``: OpenAI function-tool schemas, a pure function of the seed."""
    tg = ctx.textgen
    rng = rng_for(tg.seed, f"{NAME}/toolset", index)
    out = []
    for j in range(tools):
        name = "_".join(tg.words(rng, 2)) + f"_{index}_{j}"
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": tg.fresh(rng, draw_length(rng, description_tokens, 0.3)),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "query": {"type": "string", "description": tg.fresh(rng, 8)},
                            "limit": {"type": "integer", "description": tg.fresh(rng, 6)},
                        },
                        "required": ["query"],
                    },
                },
            }
        )
    return out


def chats(params: ToolAgentParams, ctx: Context) -> list[Chat]:
    """Agent sessions; step ``k`` sends ``tools, system, task, (call_j, output_j) for j < k``.

    - Sessions start Poisson at ``rate_rps / mean steps``; ``min_steps``..``max_steps`` (2..8)
      steps, uniformly; steps are separated by a lognormal gap (median
      ``think_time_median_s`` = 2 s, log-space spread ``think_time_sigma`` = 0.8): tool
      latency plus the model's turn.
    - A session uses tool set ``Zipf(tool_set_alpha = 1.0)`` of ``num_tool_sets`` (4), each of
      ``tools_per_set`` (8) tools with descriptions of ``tool_description_tokens`` (40): one
      TOOL_SCHEMA segment, first in the prompt. Then one of ``num_system_prompts`` (2) system
      prompts of ``system_tokens`` (600) and a task of ``task_tokens`` (80).
    - Step ``k``'s answer (its ``output_hash``) is a tool call that step ``k + 1`` quotes: with
      probability ``reread_prob`` (0.2) a repeat of an earlier call of the session, else a
      uniform tool of the set with arguments ``Zipf(tool_arg_alpha = 0.9)`` over
      ``tool_arg_catalogue`` (1000). The tool's output (TOOL_OUTPUT, ``tool_output_tokens`` =
      250, fixed per (tool, arguments)) follows the call in the next step's prompt.
    - The last step answers in text (``answer_tokens`` = 150).
    """
    p = params
    tg = ctx.textgen
    draw_steps = uniform_turns(p.min_steps, p.max_steps)
    plans = plan_sessions(
        rng_for(p.seed, NAME, "sessions"),
        p.num_requests,
        p.rate_rps,
        draw_steps,
        (p.min_steps + p.max_steps) / 2,
        p.think_time_median_s,
        p.think_time_sigma,
    )
    sets = [
        tool_set(ctx, s, p.tools_per_set, p.tool_description_tokens) for s in range(p.num_tool_sets)
    ]
    set_zipf = ZipfSampler(p.num_tool_sets, p.tool_set_alpha)
    arg_zipf = ZipfSampler(p.tool_arg_catalogue, p.tool_arg_alpha)
    prompts = [
        Message("system", (tg.text(f"{NAME}/system", k, p.system_tokens, p.length_sigma),))
        for k in range(p.num_system_prompts)
    ]
    out = []
    for plan in plans:
        rng = rng_for(p.seed, NAME, "session", plan.index)
        session_id = f"{ctx.id_prefix}{NAME}-s{plan.index:06d}"
        s = set_zipf.sample_one(rng)
        tools = sets[s]
        task = Message("user", (tg.fresh(rng, draw_length(rng, p.task_tokens, p.length_sigma)),))
        history = [prompts[int(rng.integers(0, p.num_system_prompts))], task]
        calls: list[tuple[int, int]] = []
        parent = None
        for step, t in enumerate(plan.arrivals):
            request_id = f"{session_id}-t{step:03d}"
            last = step == plan.planned_turns - 1
            reread = False
            if last:
                answer = Message(
                    "assistant",
                    (tg.fresh(rng, draw_length(rng, p.answer_tokens, p.length_sigma)),),
                )
            else:
                if calls and rng.random() < p.reread_prob:
                    tool, arg = calls[int(rng.integers(0, len(calls)))]
                    reread = True
                else:
                    tool, arg = int(rng.integers(0, p.tools_per_set)), arg_zipf.sample_one(rng)
                calls.append((tool, arg))
                query = tg.text(f"{NAME}/arg", (s, tool, arg), 6)
                call_id = f"call_{plan.index}_{step}"
                answer = Message(
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
                    arrival_s=ctx.time_offset_s + t,
                    messages=list(history),
                    tools=tools,
                    answer=answer,
                    session_id=session_id,
                    turn=step,
                    parent_id=parent,
                    extra={"tool_set": s, "repeats_call": reread},
                )
            )
            if not last:
                output = tg.text(
                    f"{NAME}/output", (s, tool, arg), p.tool_output_tokens, p.length_sigma
                )
                history.append(answer)
                history.append(Message("tool", (output,), tool_call_id=call_id))
            parent = request_id
    return out
