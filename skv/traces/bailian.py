"""Qwen-Bailian (Alibaba Cloud) JSONL traces, e.g. ``qwen_traceA_blksz_16.jsonl``.

Upstream: github.com/alibaba-edu/qwen-bailian-usagetraces-anon (paper: "KVCache Cache in the
Wild", USENIX ATC'25). No copy is available here; the reader follows the upstream README and is
tested on a synthetic fixture. Assumed field semantics (from that README):

- ``chat_id`` (int): request id; ``parent_chat_id`` (int): the previous turn, ``-1`` (or null)
  for a root request; ``turn`` (int): conversation turn number (1 for a root);
- ``timestamp`` (float): seconds since the trace start -> ``arrival_s`` as is;
- ``input_length``/``output_length``: token counts; ``type``: text, search, image or file;
- ``hash_ids``: salted-hash ids of 16-token blocks (``hash_block_size = 16``), prefix-chained.

Sessions: ``session_id`` is the root chat id, found by following ``parent_chat_id`` inside the
file. A parent that is not in the file (the trace is a time window) ends the walk and becomes the
session root, so siblings of one missing parent still share a session.
``parent_id`` is the parent's chat id as a string.

Prompt typing, the same rule as the other hash-id traces:

1. ``SYSTEM``: leading blocks whose id occurs in more than ``system_share`` (50%) of requests.
2. ``ASSISTANT_HISTORY``: the following blocks shared (equal ids) with the parent request's
   prompt: the conversation so far.
3. The rest by request ``type``: text -> USER_QUERY, search and file -> RETRIEVED_CONTEXT
   (search results and uploaded documents dominate such prompts), image -> UNKNOWN (no image
   type in the model), anything else -> UNKNOWN.

Checks (:mod:`skv.traces.limits`): lengths at most ``MAX_TOKENS`` (2**24), ``timestamp >= 0``,
hash ids in ``[0, 2**64)`` and no more of them than the prompt has blocks, ``chat_id`` unique:
each an error naming ``file:line: field``. Fewer ids than whole blocks is one warning per file.
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
    common_prefix_len,
    iter_lines,
    parse_line,
    request_share_counts,
    shared_prefix_blocks,
    sort_by_arrival,
    spans_to_segments,
)
from skv.traces.errors import TraceFormatError
from skv.traces.limits import HashId, TokenCount

log = logging.getLogger(__name__)

BAILIAN_BLOCK_SIZE = 16

TYPE_MAP: dict[str, SemanticType] = {
    "text": SemanticType.USER_QUERY,
    "search": SemanticType.RETRIEVED_CONTEXT,
    "file": SemanticType.RETRIEVED_CONTEXT,
    "image": SemanticType.UNKNOWN,
}


class BailianRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    chat_id: int
    parent_chat_id: int | None = -1
    timestamp: float = Field(ge=0, allow_inf_nan=False)
    input_length: TokenCount
    output_length: TokenCount
    type: str = "text"
    turn: int | None = None
    hash_ids: list[HashId]


def _is_root(parent: int | None) -> bool:
    return parent is None or parent < 0


def load_bailian(
    path: PathLike, *, system_share: float = 0.5, block_size: int = BAILIAN_BLOCK_SIZE
) -> list[Request]:
    """Read a Bailian JSONL trace into requests sorted by arrival (see module docstring)."""
    records: list[tuple[int, BailianRecord]] = []
    by_id: dict[int, BailianRecord] = {}
    short = ShortIdsWarning(path)
    for lineno, line in iter_lines(path):
        rec = parse_line(BailianRecord, line, path, lineno, strict=True)
        check_hash_ids_fit(
            len(rec.hash_ids), rec.input_length, block_size, path, line=lineno, field="hash_ids"
        )
        short.check(len(rec.hash_ids), rec.input_length, block_size, line=lineno, where="hash_ids")
        if rec.chat_id in by_id:
            raise TraceFormatError(
                path, f"duplicate chat_id {rec.chat_id}", line=lineno, field="chat_id"
            )
        by_id[rec.chat_id] = rec
        records.append((lineno, rec))
    short.report()

    roots: dict[int, int] = {}

    def root_of(chat_id: int) -> int:
        chain = []
        cur = chat_id
        while cur in by_id and not _is_root(by_id[cur].parent_chat_id) and cur not in roots:
            chain.append(cur)
            if len(chain) > len(by_id):
                raise TraceFormatError(path, f"parent_chat_id cycle through chat {chat_id}")
            cur = by_id[cur].parent_chat_id  # type: ignore[assignment]
        root = roots.get(cur, cur)
        for c in chain:
            roots[c] = root
        roots[cur] = root
        return root

    counts = request_share_counts(rec.hash_ids for _, rec in records)
    min_count = system_share * len(records)
    stem = Path(path).stem
    requests: list[Request] = []
    for _lineno, rec in records:
        ids = rec.hash_ids
        n_sys = shared_prefix_blocks(ids, counts, min_count)
        parent = None if _is_root(rec.parent_chat_id) else by_id.get(rec.parent_chat_id)  # type: ignore[arg-type]
        n_hist = 0
        if parent is not None:
            n_hist = max(0, common_prefix_len(ids, parent.hash_ids) - n_sys)
        sys_tok = min(rec.input_length, n_sys * block_size)
        hist_tok = min(rec.input_length - sys_tok, n_hist * block_size)
        rid = str(rec.chat_id)
        segments = spans_to_segments(
            [
                (SemanticType.SYSTEM, sys_tok),
                (SemanticType.ASSISTANT_HISTORY, hist_tok),
                (
                    TYPE_MAP.get(rec.type, SemanticType.UNKNOWN),
                    rec.input_length - sys_tok - hist_tok,
                ),
            ],
            hash_ids=ids,
            block_size=block_size,
            scope=f"bailian|{stem}",
            request_id=rid,
        )
        requests.append(
            Request(
                request_id=rid,
                arrival_s=rec.timestamp,
                segments=segments,
                output_tokens=rec.output_length,
                session_id=str(root_of(rec.chat_id)),
                turn=rec.turn,
                parent_id=None if _is_root(rec.parent_chat_id) else str(rec.parent_chat_id),
                hash_ids=ids,
                hash_block_size=block_size,
                extra={"type": rec.type},
            )
        )
    log.info("bailian: %d requests from %s", len(requests), path)
    return sort_by_arrival(requests)
