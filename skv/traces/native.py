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
The pydantic models exist only at this file boundary; callers get plain dataclasses.

Writing is atomic (temp file + ``os.replace``): a failure leaves no file, or the old one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError

from skv.fileio import atomic_write
from skv.model import Request, Segment, SemanticType
from skv.traces._common import PathLike, iter_lines, parse_line, sort_by_arrival
from skv.traces.errors import TraceFormatError, from_validation_error

log = logging.getLogger(__name__)

SKV_TRACE_VERSION = 1


class SkvHeader(BaseModel):
    """First line of a native trace."""

    model_config = ConfigDict(extra="forbid")

    skv_trace: Literal[1]
    num_requests: int | None = Field(default=None, ge=0)
    meta: dict[str, Any] = Field(default_factory=dict)


class SegmentRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stype: SemanticType
    num_tokens: int = Field(ge=0)
    content_hash: str | None = None
    reusable: bool | None = None
    text: str | None = None
    token_ids: list[int] | None = None


class RequestRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    arrival_s: float = Field(allow_inf_nan=False)
    segments: list[SegmentRecord]
    output_tokens: int = Field(default=0, ge=0)
    session_id: str | None = None
    tenant_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    templated: bool = False
    hash_ids: list[int] | None = None
    hash_block_size: int | None = Field(default=None, gt=0)
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
    for lineno, line in iter_lines(path):
        last_line = lineno
        if header is None:
            header = _parse_header(line, path, lineno)
            continue
        requests.append(_to_request(parse_line(RequestRecord, line, path, lineno, strict=True)))
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
            lines.append(_to_record(req).model_dump_json(exclude_defaults=True))
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
