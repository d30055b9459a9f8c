"""Mooncake (Kimi) JSONL traces: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids`` (prefix-chained ids of 512-token blocks, last block partial).

Upstream: github.com/kvcache-ai/Mooncake, ``FAST25-release/traces/``.

The trace has no text, no roles and no session ids, so prompt typing is inferred, by a rule that
is simple, causal and checkable:

1. ``SYSTEM``: the leading blocks whose id occurs in more than ``system_share`` (default 50%) of
   all requests. In the conversation trace that is exactly block 0, the system prompt every
   request shares. (Ids are prefix-chained, so a shared block implies its whole prefix is shared.)
2. ``ASSISTANT_HISTORY`` (when ``history=True``, the default): the following blocks whose ids
   already appeared in an *earlier* request (arrival order): the conversation so far, re-sent
   by a later turn. This only looks backwards, so it leaks no future information.
3. ``USER_QUERY``: the rest of the prompt (new user turn, plus the previous answer that the
   trace cannot separate from it).

With ``history=False`` rule 2 is skipped (SYSTEM + USER_QUERY only).

Other choices: ``arrival_s = timestamp / 1000``; ``hash_block_size = 512``; the request id is
``<file stem>:<line>``. Hash ids are scoped to one file: do not mix two Mooncake files' requests
without remapping ids.

Checks (:mod:`skv.traces.limits`): ``input_length`` and ``output_length`` at most ``MAX_TOKENS``
(2**24), ``timestamp >= 0``, hash ids in ``[0, 2**64)`` and no more of them than the prompt has
blocks: each an error naming ``file:line: field``. Fewer ids than whole blocks (the published
trace has exactly ``ceil(input_length / 512)``) is one warning per file.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from skv.model import Request, SemanticType
from skv.traces._common import (
    PathLike,
    ShortIdsWarning,
    check_hash_ids_fit,
    iter_lines,
    parse_line,
    request_share_counts,
    shared_prefix_blocks,
    sort_by_arrival,
    spans_to_segments,
)
from skv.traces.limits import HashId, TokenCount

log = logging.getLogger(__name__)

MOONCAKE_BLOCK_SIZE = 512


class MooncakeRecord(BaseModel):
    # Unknown extra keys are tolerated: upstream may add columns; we read the ones we know.
    model_config = ConfigDict(extra="ignore")

    timestamp: float = Field(ge=0, allow_inf_nan=False)
    input_length: TokenCount
    output_length: TokenCount
    hash_ids: list[HashId]


def load_mooncake(
    path: PathLike,
    *,
    system_share: float = 0.5,
    history: bool = True,
    block_size: int = MOONCAKE_BLOCK_SIZE,
) -> list[Request]:
    """Read a Mooncake JSONL trace into requests sorted by arrival (see module docstring)."""
    stem = Path(path).stem
    records: list[tuple[int, MooncakeRecord]] = []
    short = ShortIdsWarning(path)
    for lineno, line in iter_lines(path):
        rec = parse_line(MooncakeRecord, line, path, lineno, strict=True)
        check_hash_ids_fit(
            len(rec.hash_ids), rec.input_length, block_size, path, line=lineno, field="hash_ids"
        )
        short.check(len(rec.hash_ids), rec.input_length, block_size, line=lineno, where="hash_ids")
        records.append((lineno, rec))
    short.report()
    # stable by arrival, so "earlier request" below means earlier in time
    records.sort(key=lambda lr: lr[1].timestamp)
    counts = request_share_counts(rec.hash_ids for _, rec in records)
    min_count = system_share * len(records)
    seen: set[int] = set()
    requests: list[Request] = []
    for lineno, rec in records:
        ids = rec.hash_ids
        n_sys = shared_prefix_blocks(ids, counts, min_count)
        n_hist = 0
        if history:
            while n_sys + n_hist < len(ids) and ids[n_sys + n_hist] in seen:
                n_hist += 1
            seen.update(ids)
        sys_tok = min(rec.input_length, n_sys * block_size)
        hist_tok = min(rec.input_length - sys_tok, n_hist * block_size)
        rid = f"{stem}:{lineno}"
        segments = spans_to_segments(
            [
                (SemanticType.SYSTEM, sys_tok),
                (SemanticType.ASSISTANT_HISTORY, hist_tok),
                (SemanticType.USER_QUERY, rec.input_length - sys_tok - hist_tok),
            ],
            hash_ids=ids,
            block_size=block_size,
            scope=f"mooncake|{stem}",
            request_id=rid,
        )
        requests.append(
            Request(
                request_id=rid,
                arrival_s=rec.timestamp / 1000.0,
                segments=segments,
                output_tokens=rec.output_length,
                hash_ids=ids,
                hash_block_size=block_size,
            )
        )
    log.info("mooncake: %d requests from %s", len(requests), path)
    return sort_by_arrival(requests)
