"""Helpers the format modules share: JSONL iteration, atomic writes, typing hash-id prompts.

Hash-id traces (Mooncake, Claude Code, Bailian) carry no text, only one id per block of
``block_size`` tokens, prefix-chained by the trace itself (the same id never appears at two
positions). Typing such a prompt means cutting it into a few token spans (system prefix, history,
new input); :func:`spans_to_segments` turns those spans into segments with a content identity
derived from the ids, so equal ids give equal content hashes without hashing every id.

The limits every reader applies (lengths, hash ids, arrival times) are in
:mod:`skv.traces.limits`; the checks that need more than a field bound are here
(:func:`check_total_tokens`, :func:`check_hash_ids_fit`, :class:`ShortIdsWarning`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from skv.blocks import common_prefix_len as common_prefix_len  # re-exported for the readers
from skv.model import Request, Segment, SemanticType, content_hash
from skv.traces.errors import TraceFormatError, from_validation_error
from skv.traces.limits import MAX_TOKENS, MAX_TOKENS_REASON

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

PathLike = str | os.PathLike[str]


#: the UTF-8 byte order mark, skipped at the start of a text trace
UTF8_BOM = b"\xef\xbb\xbf"


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Non-blank lines of a text file with their 1-based line numbers; a UTF-8 byte order mark
    at the start of the file (written by some Windows editors and exporters) is skipped."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                raw = raw.removeprefix(UTF8_BOM)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise TraceFormatError(path, f"not UTF-8 text: {err}", line=lineno) from None
            if line.strip():
                yield lineno, line


def parse_line(model: type[M], line: str, path: PathLike, lineno: int, *, strict: bool) -> M:
    """One JSON line through a pydantic model; errors name the file, line and field."""
    try:
        return model.model_validate_json(line, strict=strict)
    except ValidationError as err:
        raise from_validation_error(err, path, line=lineno) from None


def sort_by_arrival(requests: list[Request]) -> list[Request]:
    """Requests by arrival time; ties keep their input order (``sorted`` is stable)."""
    return sorted(requests, key=lambda r: r.arrival_s)


def request_share_counts(hash_id_lists: Iterable[Sequence[int]]) -> Counter[int]:
    """How many requests contain each hash id (each request counted once per id)."""
    counts: Counter[int] = Counter()
    for ids in hash_id_lists:
        counts.update(set(ids))
    return counts


def shared_prefix_blocks(ids: Sequence[int], counts: Counter[int], min_count: float) -> int:
    """Leading blocks whose id occurs in more than ``min_count`` requests."""
    k = 0
    while k < len(ids) and counts[ids[k]] > min_count:
        k += 1
    return k


def spans_to_segments(
    spans: Iterable[tuple[SemanticType, int]],
    *,
    hash_ids: Sequence[int],
    block_size: int,
    scope: str,
    request_id: str,
) -> list[Segment]:
    """Typed token spans (in prompt order) to segments; empty spans dropped, equal types merged.

    A segment's ``content_hash`` comes from the id of the last block it touches plus its token
    range: ids are prefix-chained, so the same last id at the same offsets means the same tokens.
    Tokens past the last id (a trace that does not hash its trailing partial block) have unknown
    content, so such a segment's hash includes the request id and never matches another.
    """
    merged: list[list[Any]] = []
    for stype, n in spans:
        if n <= 0:
            continue
        if merged and merged[-1][0] == stype:
            merged[-1][1] += n
        else:
            merged.append([stype, n])
    segments: list[Segment] = []
    start = 0
    for stype, n in merged:
        end = start + n
        last_block = (end - 1) // block_size
        if last_block < len(hash_ids):
            ident = f"{scope}|{hash_ids[last_block]}|{start}|{n}"
        else:
            ident = f"{scope}|req:{request_id}|{start}|{n}"
        segments.append(Segment(stype=stype, num_tokens=n, content_hash=content_hash(ident)))
        start = end
    return segments


def check_total_tokens(total: int, path: PathLike, *, line: int | None, field: str) -> None:
    """Reject a prompt whose parts add up to more than :data:`MAX_TOKENS`."""
    if total > MAX_TOKENS:
        raise TraceFormatError(
            path,
            f"{total} tokens in one prompt, over {MAX_TOKENS}; {MAX_TOKENS_REASON}",
            line=line,
            field=field,
        )


class ShortIdsWarning:
    """Counts records whose hash ids cover fewer whole blocks than their prompt has, and logs
    one warning per file (the first record's ``file:line``) at :meth:`report`."""

    def __init__(self, path: PathLike) -> None:
        self.path = path
        self.count = 0
        self.first: tuple[int | None, str, int, int] | None = None

    def check(
        self, num_ids: int, prompt_tokens: int, block_size: int, *, line: int | None, where: str
    ) -> None:
        if num_ids < prompt_tokens // block_size:
            self.count += 1
            if self.first is None:
                self.first = (line, where, num_ids, prompt_tokens)

    def report(self) -> None:
        if self.first is None:
            return
        line, where, num_ids, tokens = self.first
        loc = f"{self.path}:{line}" if line is not None else str(self.path)
        log.warning(
            "%s: %s: %d hash ids for %d tokens: the prompt declares more whole blocks than it "
            "has ids, and tokens past the last id can never hit (hit rates diluted); "
            "%d record(s) like this in the file",
            loc,
            where,
            num_ids,
            tokens,
            self.count,
        )


def check_hash_ids_fit(
    num_ids: int,
    prompt_tokens: int,
    block_size: int,
    path: PathLike,
    *,
    line: int | None,
    field: str,
) -> None:
    """Reject more block ids than the prompt has blocks (a corrupt or mis-typed record)."""
    max_ids = -(-prompt_tokens // block_size)
    if num_ids > max_ids:
        raise TraceFormatError(
            path,
            f"{num_ids} hash ids for {prompt_tokens} tokens "
            f"(at most {max_ids} blocks of {block_size})",
            line=line,
            field=field,
        )
