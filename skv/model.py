"""The request data model every stage shares: typed segments, requests, semantic types.

A request's prompt is an ordered list of segments; each segment has a semantic type, a token
count and an identity for its content (a content hash, or the trace's own block hash ids).
These are plain dataclasses: cheap to build in bulk from traces. Validation happens at the
boundaries (trace files, configs), not here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum


class SemanticType(StrEnum):
    """What a span of prompt tokens is, for policies that value tokens by role."""

    SYSTEM = "system"
    TOOL_SCHEMA = "tool_schema"
    TEMPLATE = "template"
    RETRIEVED_CONTEXT = "retrieved_context"
    TOOL_OUTPUT = "tool_output"
    CODE = "code"
    LEGAL_EVIDENCE = "legal_evidence"
    ASSISTANT_HISTORY = "assistant_history"
    REASONING = "reasoning"
    USER_QUERY = "user_query"
    OUTPUT = "output"
    UNKNOWN = "unknown"


#: Stable integer index of every type; the hot loop works on these ints, never on enums.
TYPES: tuple[SemanticType, ...] = tuple(SemanticType)
TYPE_INDEX: dict[SemanticType, int] = {t: i for i, t in enumerate(TYPES)}
NUM_TYPES = len(TYPES)

#: Types whose segments start a fresh key chain in `segment` keying mode: content that is
#: plausibly identical across requests wherever it appears (documents, tool schemas, code).
#: User queries, history and outputs stay chained to what precedes them.
DEFAULT_REUSABLE: frozenset[SemanticType] = frozenset(
    {
        SemanticType.SYSTEM,
        SemanticType.TOOL_SCHEMA,
        SemanticType.TEMPLATE,
        SemanticType.RETRIEVED_CONTEXT,
        SemanticType.TOOL_OUTPUT,
        SemanticType.CODE,
        SemanticType.LEGAL_EVIDENCE,
    }
)


def content_hash(data: str | bytes | list[int] | tuple[int, ...]) -> str:
    """A deterministic 64-bit content identity (hex), stable across processes and machines."""
    if isinstance(data, str):
        raw = data.encode("utf-8")
    elif isinstance(data, bytes):
        raw = data
    else:
        raw = b"".join(int(t).to_bytes(4, "little", signed=False) for t in data)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


@dataclass(slots=True)
class Segment:
    """A contiguous span of the prompt with one semantic type.

    `content_hash` identifies the tokens (same hash -> same tokens). `reusable` overrides the
    type's default for segment keying. `text` and `token_ids` are kept only when not redacted.
    """

    stype: SemanticType
    num_tokens: int
    content_hash: str | None = None
    reusable: bool | None = None
    text: str | None = None
    token_ids: list[int] | None = None

    def is_reusable(self) -> bool:
        return self.stype in DEFAULT_REUSABLE if self.reusable is None else self.reusable


@dataclass(slots=True)
class Request:
    """One inference request as the cache sees it.

    When `hash_ids` is set (hash-id traces: Mooncake, Claude Code, Bailian), block identity comes
    from the trace: one id per `hash_block_size` tokens, prefix-chained by the trace itself, and
    segments only say which token ranges have which type.
    """

    request_id: str
    arrival_s: float
    segments: list[Segment]
    output_tokens: int = 0
    session_id: str | None = None
    tenant_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    templated: bool = False
    hash_ids: list[int] | None = None
    hash_block_size: int | None = None
    observed_ttft_ms: float | None = None
    observed_cached_tokens: int | None = None
    #: content identity of the generated answer, when known (a later turn that quotes the
    #: answer verbatim can then hit the answer's KV blocks); None = unique content
    output_hash: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)

    def type_tokens(self) -> dict[SemanticType, int]:
        out: dict[SemanticType, int] = {}
        for s in self.segments:
            out[s.stype] = out.get(s.stype, 0) + s.num_tokens
        return out
