"""Claude Code agent sessions from kv-cache-tester (``weka_cc/trace_*.json``).

Upstream: github.com/callanjfox/kv-cache-tester, ``traces/``. One JSON file per session:
``block_size`` (64), ``hash_id_scope`` ("local"), ``tool_tokens`` + ``system_tokens`` (the
tool-definition and system prefix of every prompt) and ``requests``, each with ``t`` (s since
session start), ``type`` (``n``, ``s``, or ``subagent``), ``in``/``out``, ``hash_ids``
(prefix-chained 64-token blocks), ``input_types``/``output_types``, ``stop``, ``api_time``,
``think_time`` and sometimes ``ttft`` (s). A ``subagent`` entry nests its own ``requests`` whose
``t`` counts from the subagent's ``t``, with its own tool/system prefix.

Prompt typing (one transparent rule, applied per request):

1. ``TOOL_SCHEMA`` for the first ``tool_tokens`` tokens, then ``SYSTEM`` for ``system_tokens``.
2. ``ASSISTANT_HISTORY`` for the rest of the prefix shared (whole 64-token blocks, equal hash
   ids) with the previous request of the same (sub)session: the conversation so far. ~95% of a
   prompt is usually the previous prompt, so this is where most tokens land.
3. The new suffix gets one type from ``input_types``: ``tool_result`` -> TOOL_OUTPUT, ``text`` ->
   USER_QUERY, ``tool_use`` -> ASSISTANT_HISTORY, ``thinking`` -> REASONING. When several are
   listed, the first present in that order wins: the lists are sorted alphabetically in the
   files (checked on all 2,786 requests), so "first listed" carries no meaning, and the new
   user-side input (tool results, typed text) is what a new turn mainly adds. Unknown or no
   types -> UNKNOWN. The suffix also holds the previous answer, which the trace cannot split off.

Ids and time:

- ``hash_id_scope: "local"`` ids are unique within a file only. Each file gets a 30-bit tag
  from a hash of its session id and ids become ``tag << 32 | id``: deterministic, below 2**62,
  and unique across the files loaded together (a tag clash is resolved by rehashing, in file-name
  order). ``"global"`` ids are kept as they are.
- Sessions have no absolute start, so they are put on one timeline by a seeded Poisson process:
  sessions in file-name order, the first at 0 s, then exponential gaps of mean
  ``session_interval_s`` (default 30 s) drawn from ``numpy.random.default_rng(seed)``.
- Session id: the file's ``id`` (else its stem); a subagent's is ``<session>/<agent_id>``.
  Request id ``<session>:<turn>``, turns count from 1 within each (sub)session, ``parent_id`` is
  the previous request of the same (sub)session.
- The trace hashes whole blocks only (``len(hash_ids) == in // 64``): the trailing partial block
  never becomes a cache block, though ``prompt_tokens`` still counts it.
- ``ttft`` (s) -> ``observed_ttft_ms``; ``out`` -> ``output_tokens``; ``model``, ``type``,
  ``stop``, ``api_time``, ``think_time``, ``input_types``, ``output_types`` and the file name go
  to ``extra`` (plus ``agent_id``/``subagent_type`` for subagent requests).

Checks (:mod:`skv.traces.limits`): token counts (``in``, ``out``, ``tool_tokens``,
``system_tokens``) at most ``MAX_TOKENS`` (2**24), ``t >= 0``, hash ids in ``[0, 2**64)`` (local
ones below 2**32) and no more of them than the prompt has blocks, request ids unique across the
files loaded together (two files with the same ``id``, or two subagents with the same
``agent_id``, would merge sessions): each an error naming the file and the JSON path. Fewer ids
than whole blocks (the published sessions have exactly ``in // 64``) is one warning per file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.model import Request, SemanticType, content_hash
from skv.traces._common import (
    PathLike,
    ShortIdsWarning,
    check_hash_ids_fit,
    common_prefix_len,
    sort_by_arrival,
    spans_to_segments,
)
from skv.traces.errors import TraceFormatError, from_validation_error
from skv.traces.limits import MAX_TOKENS, HashId, TokenCount

log = logging.getLogger(__name__)

INPUT_TYPE_MAP: dict[str, SemanticType] = {
    "tool_result": SemanticType.TOOL_OUTPUT,
    "text": SemanticType.USER_QUERY,
    "tool_use": SemanticType.ASSISTANT_HISTORY,
    "thinking": SemanticType.REASONING,
}
#: Which listed input type types the new suffix when several are listed.
INPUT_TYPE_PRIORITY: tuple[str, ...] = ("tool_result", "text", "tool_use", "thinking")

_TAG_BITS = 30
_LOCAL_ID_LIMIT = 1 << 32


class CCEntry(BaseModel):
    """A request, or a ``subagent`` entry with nested requests."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    t: float = Field(ge=0, allow_inf_nan=False)
    type: str
    model: str | None = None
    in_tokens: TokenCount | None = Field(default=None, alias="in")
    out: TokenCount | None = None
    hash_ids: list[HashId] | None = None
    input_types: list[str] = Field(default_factory=list)
    output_types: list[str] = Field(default_factory=list)
    stop: str | None = None
    api_time: float | None = None
    ttft: float | None = None
    think_time: float | None = None
    # subagent entries
    agent_id: str | None = None
    subagent_type: str | None = None
    tool_tokens: TokenCount | None = None
    system_tokens: TokenCount | None = None
    requests: list[CCEntry] | None = None

    @model_validator(mode="after")
    def _check_kind(self) -> CCEntry:
        if self.type == "subagent":
            if self.requests is None:
                raise ValueError("a subagent entry needs 'requests'")
        else:
            fields = {"in": self.in_tokens, "out": self.out, "hash_ids": self.hash_ids}
            missing = [k for k, v in fields.items() if v is None]
            if missing:
                raise ValueError(f"request lacks {', '.join(missing)}")
        return self


class CCSession(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    block_size: int = Field(gt=0, le=MAX_TOKENS)
    hash_id_scope: str = "local"
    tool_tokens: TokenCount
    system_tokens: TokenCount
    models: list[str] = Field(default_factory=list)
    requests: list[CCEntry]


def session_files(path: PathLike) -> list[Path]:
    """The session files a path names: the file itself, or a directory's ``trace_*.json``."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("trace_*.json"))
        if not files:
            raise TraceFormatError(p, "directory holds no trace_*.json session files")
        return files
    if not p.exists():
        raise FileNotFoundError(f"no such trace file or directory: {p}")
    return [p]


def session_starts(n: int, interval_s: float, seed: int) -> list[float]:
    """Poisson session starts: 0, then exponential gaps of mean ``interval_s`` (seeded)."""
    if n <= 0:
        return []
    if interval_s < 0:
        raise ValueError(f"session_interval_s must be >= 0, got {interval_s}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(interval_s, size=n - 1) if interval_s > 0 else np.zeros(n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def suffix_type(input_types: Sequence[str]) -> SemanticType:
    for name in INPUT_TYPE_PRIORITY:
        if name in input_types:
            return INPUT_TYPE_MAP[name]
    return SemanticType.UNKNOWN


def _read_session(path: Path) -> CCSession:
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading BOM is skipped
        return CCSession.model_validate_json(text, strict=True)
    except ValidationError as err:
        raise from_validation_error(err, path) from None
    except UnicodeDecodeError as err:
        raise TraceFormatError(path, f"not UTF-8 text: {err}") from None


def _file_tag(name: str, used: set[int]) -> int:
    k = 0
    while True:
        tag = int(content_hash(name if k == 0 else f"{name}#{k}"), 16) & ((1 << _TAG_BITS) - 1)
        if tag not in used:
            used.add(tag)
            return tag
        k += 1


class _SessionBuilder:
    """Turns one session's (possibly nested) entries into requests, in file order."""

    def __init__(
        self,
        path: Path,
        block_size: int,
        start: float,
        remap: Callable[[int], int],
        seen: dict[str, tuple[Path, str]] | None = None,
    ):
        self.path = path
        self.start = start
        self.remap = remap
        self.bs = block_size
        self.out: list[Request] = []
        #: request id -> (file, JSON path) of every request built so far (shared across files)
        self.seen: dict[str, tuple[Path, str]] = {} if seen is None else seen
        self.short = ShortIdsWarning(path)

    def walk(
        self,
        entries: list[CCEntry],
        origin: float,
        sid: str,
        tool: int,
        system: int,
        loc: str,
        sub: CCEntry | None = None,
    ) -> None:
        bs = self.bs
        prev_ids: list[int] | None = None
        prev_raw: list[int] | None = None
        prev_rid: str | None = None
        turn = 0
        for i, e in enumerate(entries):
            where = f"{loc}.{i}"
            if e.type == "subagent":
                agent = e.agent_id or f"subagent{i}"
                self.walk(
                    e.requests or [],
                    origin + e.t,
                    f"{sid}/{agent}",
                    e.tool_tokens or 0,
                    e.system_tokens or 0,
                    f"{where}.requests",
                    sub=e,
                )
                continue
            assert e.in_tokens is not None and e.out is not None and e.hash_ids is not None
            n_in = e.in_tokens
            check_hash_ids_fit(
                len(e.hash_ids), n_in, bs, self.path, line=None, field=f"{where}.hash_ids"
            )
            self.short.check(len(e.hash_ids), n_in, bs, line=None, where=f"{where}.hash_ids")
            raw = e.hash_ids
            # the prefix shared with the previous request (the remap is one-to-one, so raw ids
            # share exactly as many) reuses that request's id objects: a turn repeats ~95% of
            # the last prompt, so memory per block access is one list slot, not a new int
            same = common_prefix_len(raw, prev_raw) if prev_raw is not None else 0
            try:
                ids = prev_ids[:same] if prev_ids is not None else []
                ids += [self.remap(h) for h in raw[same:]]
            except ValueError as err:
                raise TraceFormatError(self.path, str(err), field=f"{where}.hash_ids") from None
            turn += 1
            rid = f"{sid}:{turn}"
            first = self.seen.setdefault(rid, (self.path, where))
            if first != (self.path, where):
                raise TraceFormatError(
                    self.path,
                    f"request id {rid!r} again (first at {first[0].name}: {first[1]}): session "
                    "ids (a file's 'id') and a session's agent ids must be unique",
                    field=where,
                )
            tool_tok = min(n_in, tool)
            sys_tok = min(n_in - tool_tok, system)
            fixed = tool_tok + sys_tok
            shared = same * bs
            hist = max(0, min(n_in, shared) - fixed)
            segments = spans_to_segments(
                [
                    (SemanticType.TOOL_SCHEMA, tool_tok),
                    (SemanticType.SYSTEM, sys_tok),
                    (SemanticType.ASSISTANT_HISTORY, hist),
                    (suffix_type(e.input_types), n_in - fixed - hist),
                ],
                hash_ids=ids,
                block_size=bs,
                scope="claude_code",
                request_id=rid,
            )
            extra: dict[str, Any] = {
                "trace_file": self.path.name,
                "model": e.model,
                "type": e.type,
                "stop": e.stop,
                "api_time": e.api_time,
                "think_time": e.think_time,
                "input_types": list(e.input_types),
                "output_types": list(e.output_types),
            }
            if sub is not None:
                extra["agent_id"] = sub.agent_id
                extra["subagent_type"] = sub.subagent_type
            self.out.append(
                Request(
                    request_id=rid,
                    arrival_s=self.start + origin + e.t,
                    segments=segments,
                    output_tokens=e.out,
                    session_id=sid,
                    turn=turn,
                    parent_id=prev_rid,
                    hash_ids=ids,
                    hash_block_size=bs,
                    observed_ttft_ms=None if e.ttft is None else e.ttft * 1000.0,
                    extra={k: v for k, v in extra.items() if v is not None},
                )
            )
            prev_ids, prev_raw = ids, raw
            prev_rid = rid


def _remapper(scope: str, tag: int, path: Path) -> Callable[[int], int]:
    if scope == "global":
        return lambda h: h
    if scope != "local":
        raise TraceFormatError(
            path, f"unknown scope {scope!r} (expected 'local' or 'global')", field="hash_id_scope"
        )
    base = tag << 32

    def remap(h: int) -> int:
        if not 0 <= h < _LOCAL_ID_LIMIT:
            raise ValueError(f"local hash id {h} outside [0, 2**32)")
        return base | h

    return remap


def read_sessions(path: PathLike, max_sessions: int | None = None) -> list[tuple[Path, CCSession]]:
    """Parse the session files (one, or a directory's in name order; ``max_sessions`` keeps the
    first N). Parsing is the costly part of loading: a sweep over session timelines parses once
    and calls :func:`session_requests` per timeline."""
    files = session_files(path)
    if max_sessions is not None:
        files = files[:max_sessions]
    return [(f, _read_session(f)) for f in files]


def session_requests(
    sessions: Sequence[tuple[Path, CCSession]], *, session_interval_s: float = 30.0, seed: int = 0
) -> list[Request]:
    """The requests of parsed sessions placed on a seeded Poisson timeline, sorted by arrival."""
    return _place(iter(sessions), len(sessions), session_interval_s, seed)


def _place(
    sessions: Iterator[tuple[Path, CCSession]], n: int, session_interval_s: float, seed: int
) -> list[Request]:
    """:func:`session_requests` over ``n`` sessions taken one at a time (a parsed session can
    be dropped once its requests are built)."""
    starts = session_starts(n, session_interval_s, seed)
    used_tags: set[int] = set()
    seen: dict[str, tuple[Path, str]] = {}
    requests: list[Request] = []
    for (f, sess), start in zip(sessions, starts, strict=True):
        sid = sess.id or f.stem
        remap = _remapper(sess.hash_id_scope, _file_tag(sid, used_tags), f)
        builder = _SessionBuilder(f, sess.block_size, start, remap, seen)
        builder.walk(sess.requests, 0.0, sid, sess.tool_tokens, sess.system_tokens, "requests")
        builder.short.report()
        requests.extend(builder.out)
    return sort_by_arrival(requests)


def load_claude_code(
    path: PathLike,
    *,
    session_interval_s: float = 30.0,
    seed: int = 0,
    max_sessions: int | None = None,
) -> list[Request]:
    """Read one session file or a directory of them; requests sorted by arrival.

    ``max_sessions`` keeps the first N files in name order (quick looks at a big directory).
    """
    files = session_files(path)
    if max_sessions is not None:
        files = files[:max_sessions]
    # parsed one file at a time: only the built requests stay (users' directories are large)
    parsed = ((f, _read_session(f)) for f in files)
    requests = _place(parsed, len(files), session_interval_s, seed)
    log.info("claude_code: %d requests in %d sessions from %s", len(requests), len(files), path)
    return requests
