"""The native skv trace: JSONL that stores every field of :class:`skv.model.Request`.

Why a native format: every foreign trace is converted once (typing rules, arrival process,
id remapping applied) and then replayed exactly, by anyone, without re-running the converter.

Layout::

    {"skv_trace": 1, "num_requests": 2, "meta": {...}}      <- header, versioned
    {"request_id": "a", "arrival_s": 0.0, "segments": [...], ...}
    {"request_id": "b", ...}

Each request line holds the fields of ``Request`` (segments hold the fields of ``Segment``);
fields equal to their default are omitted. Validation is strict (pydantic v2, ``extra="forbid"``,
no type coercion), so a typo in a field name or a string where a number belongs is an error that
names file, line and field. ``num_requests`` in the header lets a reader notice a truncated file.
Limits (see :mod:`skv.traces.limits`): a segment, a prompt and an output hold at most
``MAX_TOKENS`` (2**24) tokens, ``arrival_s >= 0``, hash ids in ``[0, 2**64)``; a request id seen
twice gets one warning per file (``file:line`` of the first repeat).
The pydantic models exist only at this file boundary; callers get plain dataclasses.

Writing is atomic (temp file + ``os.replace``): a failure leaves no file, or the old one.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticSerializationError

from skv.fileio import atomic_write
from skv.model import Request, Segment, SemanticType
from skv.traces._common import (
    PathLike,
    check_total_tokens,
    iter_lines,
    parse_line,
    sort_by_arrival,
)
from skv.traces.errors import TraceFormatError, from_validation_error
from skv.traces.limits import HashId, TokenCount

log = logging.getLogger(__name__)

SKV_TRACE_VERSION = 1
#: a segment's ``content_hash``: hex digits only (no sign, prefix, blank or underscore)
_HEX = re.compile(r"[0-9a-fA-F]{1,128}")
#: a hash block of more tokens than a whole prompt may hold is a typo
MAX_BLOCK_SIZE = 1 << 24


class SkvHeader(BaseModel):
    """First line of a native trace."""

    model_config = ConfigDict(extra="forbid")

    skv_trace: Literal[1]
    num_requests: int | None = Field(default=None, ge=0)
    meta: dict[str, Any] = Field(default_factory=dict)


class SegmentRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stype: SemanticType
    num_tokens: TokenCount
    content_hash: str | None = None
    reusable: bool | None = None
    text: str | None = None
    token_ids: list[int] | None = None

    @field_validator("content_hash")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        """A content hash is hex digits (:func:`skv.model.content_hash`): block keys are read
        from it as a base-16 integer, so anything else would fail far from its line."""
        if value is not None and not _HEX.fullmatch(value):
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise ValueError(f"must be hex digits (0-9, a-f), got {shown!r}")
        return value


class RequestRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    arrival_s: float = Field(ge=0, allow_inf_nan=False)
    segments: list[SegmentRecord]
    output_tokens: TokenCount = 0
    session_id: str | None = None
    tenant_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    templated: bool = False
    hash_ids: list[HashId] | None = None
    hash_block_size: int | None = Field(default=None, gt=0, le=MAX_BLOCK_SIZE)
    observed_ttft_ms: float | None = Field(default=None, allow_inf_nan=False)
    observed_cached_tokens: int | None = Field(default=None, ge=0)
    output_hash: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


def _to_request(rec: RequestRecord) -> Request:
    return Request(
        request_id=rec.request_id,
        arrival_s=rec.arrival_s,
        segments=[
            Segment(
                stype=s.stype,
                num_tokens=s.num_tokens,
                content_hash=s.content_hash,
                reusable=s.reusable,
                text=s.text,
                token_ids=s.token_ids,
            )
            for s in rec.segments
        ],
        output_tokens=rec.output_tokens,
        session_id=rec.session_id,
        tenant_id=rec.tenant_id,
        turn=rec.turn,
        parent_id=rec.parent_id,
        templated=rec.templated,
        hash_ids=rec.hash_ids,
        hash_block_size=rec.hash_block_size,
        observed_ttft_ms=rec.observed_ttft_ms,
        observed_cached_tokens=rec.observed_cached_tokens,
        output_hash=rec.output_hash,
        extra=rec.extra,
    )


def _to_record(req: Request) -> RequestRecord:
    return RequestRecord.model_validate(
        {
            "request_id": req.request_id,
            "arrival_s": req.arrival_s,
            "segments": [
                {
                    "stype": s.stype,
                    "num_tokens": s.num_tokens,
                    "content_hash": s.content_hash,
                    "reusable": s.reusable,
                    "text": s.text,
                    "token_ids": s.token_ids,
                }
                for s in req.segments
            ],
            "output_tokens": req.output_tokens,
            "session_id": req.session_id,
            "tenant_id": req.tenant_id,
            "turn": req.turn,
            "parent_id": req.parent_id,
            "templated": req.templated,
            "hash_ids": req.hash_ids,
            "hash_block_size": req.hash_block_size,
            "observed_ttft_ms": req.observed_ttft_ms,
            "observed_cached_tokens": req.observed_cached_tokens,
            "output_hash": req.output_hash,
            "extra": req.extra,
        },
        strict=False,
    )


def read_skv_header(path: PathLike) -> SkvHeader:
    """Only the header line (cheap: for format checks and metadata)."""
    for lineno, line in iter_lines(path):
        return _parse_header(line, path, lineno)
    raise TraceFormatError(path, "empty file (expected an skv_trace header line)")


def _parse_header(line: str, path: PathLike, lineno: int) -> SkvHeader:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceFormatError(path, f"invalid JSON: {err.msg}", line=lineno) from None
    if not isinstance(raw, dict) or "skv_trace" not in raw:
        raise TraceFormatError(
            path, "first line must be a header object with 'skv_trace'", line=lineno
        )
    if raw["skv_trace"] != SKV_TRACE_VERSION:
        raise TraceFormatError(
            path,
            f"unsupported version {raw['skv_trace']!r} (this skv reads {SKV_TRACE_VERSION})",
            line=lineno,
            field="skv_trace",
        )
    try:
        return SkvHeader.model_validate(raw, strict=True)
    except ValidationError as err:
        raise from_validation_error(err, path, line=lineno) from None


def read_skv_trace(path: PathLike) -> list[Request]:
    """All requests of a native trace, sorted by arrival (stable)."""
    header: SkvHeader | None = None
    requests: list[Request] = []
    last_line = 0
    first_line: dict[str, int] = {}
    repeats = 0
    first_repeat: tuple[int, str] | None = None
    for lineno, line in iter_lines(path):
        last_line = lineno
        if header is None:
            header = _parse_header(line, path, lineno)
            continue
        rec = parse_line(RequestRecord, line, path, lineno, strict=True)
        check_total_tokens(
            sum(s.num_tokens for s in rec.segments), path, line=lineno, field="segments"
        )
        if first_line.setdefault(rec.request_id, lineno) != lineno:
            repeats += 1
            first_repeat = first_repeat or (lineno, rec.request_id)
        requests.append(_to_request(rec))
    if first_repeat is not None:
        lineno, rid = first_repeat
        log.warning(
            "%s:%d: request_id: %r already on line %d (%d repeated id(s) in the file; "
            "per-request results cannot tell them apart)",
            path,
            lineno,
            rid,
            first_line[rid],
            repeats,
        )
    if header is None:
        raise TraceFormatError(path, "empty file (expected an skv_trace header line)")
    if header.num_requests is not None and header.num_requests != len(requests):
        raise TraceFormatError(
            path,
            f"header says {header.num_requests} requests, file has {len(requests)} "
            "(truncated or edited file?)",
            line=last_line,
        )
    log.debug("read %d requests from %s", len(requests), path)
    return sort_by_arrival(requests)


def load_skv(path: PathLike) -> list[Request]:
    """Registry entry point (no options)."""
    return read_skv_trace(path)


def write_skv_trace(
    path: PathLike, requests: Iterable[Request], meta: dict[str, Any] | None = None
) -> Path:
    """Write requests (in the given order) with a header; atomic, validated before anything lands.

    Raises :class:`TraceFormatError` naming the request when one cannot be stored (a negative
    token count, a non-JSON value in ``extra``...); no file is created or replaced then.
    """
    reqs = list(requests)
    lines: list[str] = []
    for i, req in enumerate(reqs):
        where = f"request {i} ({getattr(req, 'request_id', '?')!r})"
        try:
            rec = _to_record(req)
            check_total_tokens(
                sum(s.num_tokens for s in rec.segments), path, line=None, field=f"{where}: segments"
            )
            lines.append(rec.model_dump_json(exclude_defaults=True))
        except ValidationError as err:
            raise from_validation_error(err, path, prefix=f"{where}: ") from None
        except PydanticSerializationError as err:
            raise TraceFormatError(path, f"cannot serialise: {err}", field=where) from None
    header = SkvHeader(skv_trace=SKV_TRACE_VERSION, num_requests=len(reqs), meta=meta or {})
    try:
        head = header.model_dump_json()
    except PydanticSerializationError as err:
        raise TraceFormatError(path, f"cannot serialise: {err}", field="meta") from None
    with atomic_write(path) as f:
        f.write(head + "\n")
        for line in lines:
            f.write(line + "\n")
    log.info("wrote %d requests to %s", len(reqs), path)
    return Path(path)
