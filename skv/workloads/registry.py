"""The workload registry without ``workload_shift``: name -> :class:`Workload` (its parameter
model and chat builder). ``workload_shift`` mixes these by name, and ``skv.workloads`` adds it
on top; keeping the mixable workloads here means no workload module imports the package that
lists it (no import cycle). For the same reason this module imports each workload module by its
own name (``import skv.workloads.rag as rag``), never through the package (``from skv.workloads
import rag`` would read ``skv.workloads``, whose ``__init__`` imports this module: a cycle).
Adding a workload is one module plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

import skv.workloads.legal_review as legal_review
import skv.workloads.multi_turn_chat as multi_turn_chat
import skv.workloads.rag as rag
import skv.workloads.reasoning as reasoning
import skv.workloads.sae_mix as sae_mix
import skv.workloads.shared_system_prompt as shared_system_prompt
import skv.workloads.tool_agent as tool_agent
import skv.workloads.zipf_rag as zipf_rag
from skv.model import Request
from skv.runtime import no_cyclic_gc
from skv.workloads.base import Chat, Context, WorkloadParams


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


MIXABLE: dict[str, Workload] = {
    module.NAME: Workload(module.NAME, params_model, module.chats)
    for module, params_model in (
        (shared_system_prompt, shared_system_prompt.SharedSystemPromptParams),
        (rag, rag.RagParams),
        (tool_agent, tool_agent.ToolAgentParams),
        (legal_review, legal_review.LegalReviewParams),
        (multi_turn_chat, multi_turn_chat.ChatParams),
        (reasoning, reasoning.ReasoningParams),
        (zipf_rag, zipf_rag.ZipfRagParams),
    )
}


def _sae(params_model: type[sae_mix.SaeMixParams]) -> Workload:
    return Workload(params_model.NAME, params_model, sae_mix.chats)


# SAECache's workloads: presets of one generator (shares and sources: workloads/sae_mix.py)
MIXABLE |= {
    "sharegpt_like": _sae(sae_mix.ShareGptLikeParams),
    "lmsys_like": _sae(sae_mix.LmsysLikeParams),
    "arena_like": _sae(sae_mix.ArenaLikeParams),
    "tool_use": _sae(sae_mix.ToolUseParams),
    "multi_turn_dominant": _sae(sae_mix.MultiTurnDominantParams),
    "balanced": _sae(sae_mix.BalancedParams),
    "single_turn_dominant": _sae(sae_mix.SingleTurnDominantParams),
}
