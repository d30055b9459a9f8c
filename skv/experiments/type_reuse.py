"""Reuse by semantic type: how much of each type's prompt tokens an unbounded prefix cache serves.

The analogue of SAECache's reuse-by-token-type table, shared by the replay study (the Claude Code
sessions' own table) and the SAECache study (its Claude Code column beside the synthetic
workloads).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


def reuse_by_type(requests: Sequence, block_size: int | None = None) -> pd.DataFrame:
    """Per semantic type: prompt tokens, their share, and the share an infinite prefix cache
    would serve (a block reused along its chain, the ceiling of :func:`skv.replay.trace_totals`),
    the analogue of SAECache's reuse-by-token-type table. Sorted by tokens, descending."""
    from skv.model import TYPES
    from skv.replay import compile_trace

    trace = compile_trace(requests, block_size)
    tokens = [0] * len(TYPES)
    reused = [0] * len(TYPES)
    seen: set[int] = set()
    for rb in trace:
        in_run = False
        for key, parent, tok, st in zip(rb.keys, rb.parents, rb.tokens, rb.stypes, strict=True):
            tokens[st] += tok
            if parent is None:
                in_run = True
            if in_run and key in seen:
                reused[st] += tok
            else:
                in_run = False
                seen.add(key)
    total = sum(tokens) or 1
    rows = [
        {
            "semantic_type": TYPES[i].value,
            "prompt_tokens": tokens[i],
            "token_share": tokens[i] / total,
            "reused_tokens": reused[i],
            "reuse_rate": reused[i] / tokens[i],
        }
        for i in range(len(TYPES))
        if tokens[i]
    ]
    return pd.DataFrame(rows).sort_values("prompt_tokens", ascending=False, ignore_index=True)
