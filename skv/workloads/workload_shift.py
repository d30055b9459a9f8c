"""``workload_shift``: the request mix changes mid-run, composed from the other workloads.

Before the shift the mix is, by default, RAG-heavy (documents and a shared system prompt are
worth keeping); after it, tool-agent and chat sessions dominate (schemas, tool outputs and
session history are). A policy tuned to the first phase is then wrong for the second: the
seed's ``workload_shift_static_vs_adaptive``, and SAECache's fixed-parameter degradation under
workload mismatch.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from skv.workloads.base import Chat, Context, WorkloadParams, stable_int
from skv.workloads.registry import MIXABLE

NAME = "workload_shift"

#: parameters the composition sets for every component (overriding them is an error)
COMPOSED = ("seed", "num_requests", "rate_rps", "keep_text", "tokenizer")


class WorkloadShiftParams(WorkloadParams):
    """Parameters of ``workload_shift`` (plus those of :class:`WorkloadParams`)."""

    shift_at: float = Field(
        default=0.5, gt=0, lt=1, description="share of num_requests before the shift"
    )
    before: dict[str, float] = Field(
        default_factory=lambda: {"rag": 0.6, "shared_system_prompt": 0.3, "multi_turn_chat": 0.1},
        description="workload -> share of requests before the shift",
    )
    after: dict[str, float] = Field(
        default_factory=lambda: {
            "tool_agent": 0.5,
            "multi_turn_chat": 0.3,
            "reasoning": 0.1,
            "rag": 0.1,
        },
        description="workload -> share of requests after the shift",
    )
    component_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="workload -> parameter overrides for that component (both phases)",
    )

    @field_validator("before", "after")
    @classmethod
    def _mix(cls, mix: dict[str, float]) -> dict[str, float]:

        for name, weight in mix.items():
            if name == NAME or name not in MIXABLE:
                known = ", ".join(n for n in MIXABLE if n != NAME)
                raise ValueError(f"unknown workload {name!r} in the mix (known: {known})")
            if not weight >= 0:
                raise ValueError(f"share of {name!r} must be >= 0, got {weight}")
        if not sum(mix.values()) > 0:
            raise ValueError("the mix needs at least one positive share")
        return mix

    @model_validator(mode="after")
    def _components(self) -> WorkloadShiftParams:

        used = set(self.before) | set(self.after)
        for name, overrides in self.component_params.items():
            if name not in used:
                raise ValueError(
                    f"component_params names {name!r}, which is in neither mix "
                    f"(before/after: {', '.join(sorted(used))})"
                )
            fixed = sorted(set(overrides) & set(COMPOSED))
            if fixed:
                raise ValueError(
                    f"component_params[{name!r}] may not set {', '.join(fixed)}: the "
                    "composition sets them"
                )
            try:
                MIXABLE[name].params(**self._component(name, overrides, 0, 1, 1.0))
            except ValueError as exc:
                raise ValueError(f"in component_params: {exc}") from None
        return self

    def _component(
        self, name: str, overrides: dict[str, Any], phase: int, n: int, rate: float
    ) -> dict[str, Any]:
        return {
            "length_sigma": self.length_sigma,
            **overrides,
            "seed": stable_int(f"{self.seed}/{phase}/{name}") % (1 << 32),
            "num_requests": n,
            "rate_rps": rate,
            "keep_text": self.keep_text,
            "tokenizer": self.tokenizer,
        }


def _split(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Largest-remainder split of ``total`` requests by ``weights`` (counts sum to total)."""
    s = sum(weights.values())
    exact = {k: total * w / s for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    short = total - sum(counts.values())
    for k in sorted(exact, key=lambda k: (counts[k] - exact[k], k))[:short]:
        counts[k] += 1
    return counts


def chats(params: WorkloadShiftParams, ctx: Context) -> list[Chat]:
    """Two phases of concurrently running component workloads.

    - Phase 0 has ``round(shift_at * num_requests)`` requests (``shift_at`` = 0.5), phase 1
      the rest. Phase 1 starts at ``phase-0 requests / rate_rps`` seconds, when phase 0's
      traffic (at ``rate_rps``) has, on average, just ended.
    - In a phase, component ``w`` of the mix (``before``: rag 0.6, shared_system_prompt 0.3,
      multi_turn_chat 0.1; ``after``: tool_agent 0.5, multi_turn_chat 0.3, reasoning 0.1,
      rag 0.1) generates its share of the phase's requests at ``rate_rps * share``, so the
      phases' total rate is ``rate_rps``. Shares are normalised.
    - ``component_params`` overrides a component's own parameters in both phases (e.g.
      ``{"rag": {"zipf_alpha": 1.2}}``); ``length_sigma`` defaults to this workload's.
    - Components draw texts from one generator, so a component in both phases reuses the same
      catalogue (documents, system prompts, tool sets) across the shift. Ids are prefixed with
      ``p<phase>.``; ``extra["phase"]`` and ``extra["component"]`` tag each request.
    """

    p = params
    n0 = min(p.num_requests, max(0, round(p.shift_at * p.num_requests)))
    phases = [(p.before, n0, 0.0), (p.after, p.num_requests - n0, n0 / p.rate_rps)]
    out: list[Chat] = []
    for phase, (mix, n, start_s) in enumerate(phases):
        total_w = sum(mix.values())
        for name, count in _split(n, mix).items():
            if count == 0:
                continue
            spec = MIXABLE[name]
            overrides = p.component_params.get(name, {})
            sub = spec.params(
                **p._component(name, overrides, phase, count, p.rate_rps * mix[name] / total_w)
            )
            sub_ctx = Context(
                ctx.textgen,
                ctx.renderer,
                id_prefix=f"{ctx.id_prefix}p{phase}.",
                time_offset_s=ctx.time_offset_s + start_s,
            )
            for chat in spec.build(sub, sub_ctx):
                chat.extra["phase"] = phase
                chat.extra["component"] = name
                out.append(chat)
    return out
