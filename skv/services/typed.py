"""Semantic types for the engine: what the proxy and the router add to a forwarded body so that
skv's vLLM eviction plugin (:mod:`skv.vllm.eviction_plugin`) can type the request's blocks.

Off by default (``--forward-types``, ``SKV_FORWARD_TYPES``). When on, a body whose
``vllm_xargs`` carry no ``skv_types`` gets the service's own reading of the prompt: type names
and token counts per segment (never text or hashes), and ``skv_session`` from
``X-Session-ID``. A client's own ``skv_types`` win. The counts come from the service's tokenizer
and segmenter, so they approximate the engine's tokens (the plugin clips them to the prompt and
types any remainder ``unknown``; a chat template's tokens fall where the segmenter puts them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skv.model import Segment
from skv.services._common import env_bool

ENV_FORWARD_TYPES = "SKV_FORWARD_TYPES"


def forward_types_from_env() -> bool:
    return env_bool(ENV_FORWARD_TYPES, False)


def with_semantic_xargs(
    body: Mapping[str, Any], segments: Sequence[Segment], session: str | None
) -> dict[str, Any]:
    """A copy of ``body`` whose ``vllm_xargs`` carry ``segments``' types (see the module doc).
    A body with its own ``skv_types``, or with ``vllm_xargs`` that is not an object (the engine
    answers that with its own 400), is returned as it is."""
    xargs = body.get("vllm_xargs")
    if xargs is not None and (not isinstance(xargs, Mapping) or "skv_types" in xargs):
        return dict(body)
    typed: dict[str, Any] = dict(xargs or {})
    typed["skv_types"] = [s.stype.value for s in segments]
    typed["skv_tokens"] = [int(s.num_tokens) for s in segments]
    if session is not None and "skv_session" not in typed:
        typed["skv_session"] = session
    return {**body, "vllm_xargs": typed}
