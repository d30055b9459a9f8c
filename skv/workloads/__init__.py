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
``zipf_rag``                KV-Repurpose's Zipfian RAG: documents behind 8 x 32 varying
                            prefixes, 20% one fixed prefix (analytic prefix ceiling)
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

from typing import Any

from skv.model import Request
from skv.workloads import workload_shift
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
from skv.workloads.registry import MIXABLE, Workload

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

#: every workload: the mixable ones (``skv.workloads.registry``) and ``workload_shift``
WORKLOADS: dict[str, Workload] = {
    **MIXABLE,
    workload_shift.NAME: Workload(
        workload_shift.NAME, workload_shift.WorkloadShiftParams, workload_shift.chats
    ),
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
