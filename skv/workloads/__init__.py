"""Deterministic, seeded synthetic workloads: chat requests -> segmenter -> ``list[Request]``.

Each workload builds OpenAI-style chat requests from seeded random streams, runs them through
one :class:`skv.segmenter.Segmenter`, and returns requests sorted by arrival. The same
parameters give identical requests (segments, content hashes, arrivals) in any process.

==========================  ===============================================================
name                        what it stresses
==========================  ===============================================================
``shared_system_prompt``    a few long system prompts (one dominant), short unique queries
``rag``                     Zipf-popular documents behind varying system prompts; an
                            optional fixed shared prefix (KV-Repurpose)
``tool_agent``              agent sessions: tool schemas, tool calls, re-read tool outputs
``legal_review``            long exhibits reused across a case's questions, shared clauses
``multi_turn_chat``         sessions whose turns re-send the history plus the last answer
``reasoning``               chat with ``<think>`` answers kept in or stripped from history
``workload_shift``          the mix of the above changes mid-run
``sharegpt_like``           SAECache's ShareGPT-like traffic: 74% multi-turn conversations
``lmsys_like``              SAECache's LMSys-like traffic: 33% multi-turn
``arena_like``              SAECache's Chatbot-Arena-like traffic: 12% multi-turn
``tool_use``                SAECache mix: mostly agentic (tool-using) sessions
``multi_turn_dominant``     SAECache mix: mostly multi-turn chat
``balanced``                SAECache mix: a quarter of the requests per saecache class
``single_turn_dominant``    SAECache mix: mostly single-turn (templated and plain) requests
==========================  ===============================================================

The seven SAECache names are presets (params models) of one generator, ``sae_mix``.

Usage::

    from skv.workloads import make_workload, WORKLOADS
    requests = make_workload("rag", num_requests=5000, zipf_alpha=1.2, seed=3)
    print(WORKLOADS["rag"].describe())       # every parameter, default and meaning
    chats = make_chats("rag", num_requests=10)  # the chat bodies, e.g. to send to an engine

Every parameter model forbids unknown fields; :func:`make_workload` reports a bad name or value
as a ``ValueError`` that names the workload and the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from skv.model import Request
from skv.runtime import no_cyclic_gc
from skv.workloads import (
    legal_review,
    multi_turn_chat,
    rag,
    reasoning,
    sae_mix,
    shared_system_prompt,
    tool_agent,
    workload_shift,
)
from skv.workloads.base import (
    VOCABULARY,
    Chat,
    Context,
    Message,
    Renderer,
    TextGen,
    WorkloadParams,
    ZipfSampler,
    plan_sessions,
    poisson_arrivals,
)

__all__ = [
    "VOCABULARY",
    "WORKLOADS",
    "Chat",
    "Context",
    "Message",
    "Renderer",
    "TextGen",
    "Workload",
    "WorkloadParams",
    "ZipfSampler",
    "get_workload",
    "make_chats",
    "make_workload",
    "plan_sessions",
    "poisson_arrivals",
    "workload_params",
]


@dataclass(frozen=True)
class Workload:
    """A registered workload: its parameter model and its chat builder.

    Calling it generates requests: ``WORKLOADS["rag"](num_requests=100)``.
    """

    name: str
    params_model: type[WorkloadParams]
    build: Callable[[Any, Context], list[Chat]]

    def params(self, **params: Any) -> WorkloadParams:
        """Validated parameters; a ``ValueError`` naming the bad field otherwise."""
        try:
            return self.params_model(**params)
        except ValidationError as exc:
            raise ValueError(f"workload {self.name!r}: {_explain(exc, self.params_model)}") from exc

    def _resolve(self, params: WorkloadParams | None, overrides: dict[str, Any]) -> WorkloadParams:
        if params is None:
            return self.params(**overrides)
        if not isinstance(params, self.params_model):
            raise TypeError(
                f"workload {self.name!r} takes {self.params_model.__name__}, "
                f"got {type(params).__name__}"
            )
        if overrides:
            return self.params(**{**params.model_dump(), **overrides})
        return params

    def chats(self, params: WorkloadParams | None = None, /, **overrides: Any) -> list[Chat]:
        """The planned chat requests (OpenAI-style messages), sorted by arrival."""
        p = self._resolve(params, overrides)
        with no_cyclic_gc():
            out = self.build(p, Context.for_params(p))
        out.sort(key=lambda c: (c.arrival_s, c.request_id))
        return out

    def __call__(self, params: WorkloadParams | None = None, /, **overrides: Any) -> list[Request]:
        """Requests sorted by arrival."""
        p = self._resolve(params, overrides)
        ctx = Context.for_params(p)
        with no_cyclic_gc():
            return ctx.renderer.render(self.build(p, ctx))

    def describe(self) -> str:
        """The builder's docstring and a table of parameters with defaults and meanings."""
        lines = [f"{self.name}: {(self.build.__doc__ or '').strip()}", "", "parameters:"]
        for field, info in self.params_model.model_fields.items():
            default = info.default_factory() if info.default_factory else info.default
            desc = info.description or _BASE_DOCS.get(field, "")
            lines.append(f"  {field} = {default!r}: {desc}")
        return "\n".join(lines)


_BASE_DOCS = {
    "seed": "root of every random stream and generated text",
    "num_requests": "requests returned (exactly)",
    "rate_rps": "mean request arrival rate (long-run, for session workloads)",
    "length_sigma": "lognormal spread of every length (0: fixed lengths)",
    "keep_text": "keep segment texts on the requests",
    "tokenizer": "None/'simple' or a local HuggingFace tokenizer.json",
}


def _explain(exc: ValidationError, model: type[WorkloadParams]) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            parts.append(f"unknown parameter {loc!r} (known: {known})")
        elif loc:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"parameter {loc!r}: {msg} (got {err.get('input')!r})")
        else:
            parts.append(err["msg"].removeprefix("Value error, "))
    return "; ".join(parts)


WORKLOADS: dict[str, Workload] = {
    module.NAME: Workload(module.NAME, params_model, module.chats)
    for module, params_model in (
        (shared_system_prompt, shared_system_prompt.SharedSystemPromptParams),
        (rag, rag.RagParams),
        (tool_agent, tool_agent.ToolAgentParams),
        (legal_review, legal_review.LegalReviewParams),
        (multi_turn_chat, multi_turn_chat.ChatParams),
        (reasoning, reasoning.ReasoningParams),
        (workload_shift, workload_shift.WorkloadShiftParams),
    )
}


def _sae(params_model: type[sae_mix.SaeMixParams]) -> Workload:
    return Workload(params_model.NAME, params_model, sae_mix.chats)


# SAECache's workloads: presets of one generator (shares and sources: workloads/sae_mix.py)
WORKLOADS |= {
    "sharegpt_like": _sae(sae_mix.ShareGptLikeParams),
    "lmsys_like": _sae(sae_mix.LmsysLikeParams),
    "arena_like": _sae(sae_mix.ArenaLikeParams),
    "tool_use": _sae(sae_mix.ToolUseParams),
    "multi_turn_dominant": _sae(sae_mix.MultiTurnDominantParams),
    "balanced": _sae(sae_mix.BalancedParams),
    "single_turn_dominant": _sae(sae_mix.SingleTurnDominantParams),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})") from None


def workload_params(name: str, **params: Any) -> WorkloadParams:
    """Validated parameters of workload ``name``."""
    return get_workload(name).params(**params)


def make_workload(name: str, **params: Any) -> list[Request]:
    """Requests of workload ``name`` with ``params``, sorted by arrival."""
    return get_workload(name)(**params)


def make_chats(name: str, **params: Any) -> list[Chat]:
    """The chat requests behind :func:`make_workload` (same parameters, same order)."""
    return get_workload(name).chats(**params)
