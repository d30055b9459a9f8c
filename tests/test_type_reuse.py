"""Reuse by semantic type under an infinite prefix cache (skv.experiments.type_reuse), on a
hand-computed trace."""

from __future__ import annotations

import pytest

from skv.experiments.type_reuse import reuse_by_type
from skv.model import Request, Segment, SemanticType

T = SemanticType


def req(i, segs, ids):
    return Request(f"r{i}", float(i), [Segment(t, n) for t, n in segs], hash_ids=ids,
                   hash_block_size=4)  # fmt: skip


def test_reuse_counts_a_block_only_along_an_unbroken_cached_prefix():
    """r0: system [1, 2], user [3]. r1: same system, new user [4] -> system reused (8 tokens).
    r2: block 1 again then a new block 5 and hash id 3 again: behind a different prefix hash id
    3 is a different (prefix-chained) key, so it is not reused. (The in-run guard in
    reuse_by_type is not what this case checks: with prefix keys it cannot fire.)"""
    trace = [
        req(0, [(T.SYSTEM, 8), (T.USER_QUERY, 4)], [1, 2, 3]),
        req(1, [(T.SYSTEM, 8), (T.USER_QUERY, 4)], [1, 2, 4]),
        req(2, [(T.SYSTEM, 4), (T.TOOL_OUTPUT, 4), (T.USER_QUERY, 4)], [1, 5, 3]),
    ]
    t = reuse_by_type(trace).set_index("semantic_type")
    assert t.loc["system", "prompt_tokens"] == 20 and t.loc["system", "reused_tokens"] == 12
    assert t.loc["system", "reuse_rate"] == pytest.approx(12 / 20)
    assert t.loc["user_query", "reused_tokens"] == 0 and t.loc["user_query", "prompt_tokens"] == 12
    assert t.loc["tool_output", "reuse_rate"] == 0
    assert t["token_share"].sum() == pytest.approx(1.0)
    assert list(t.index) == ["system", "user_query", "tool_output"]  # by tokens, descending
