"""One-look summary of a trace: size, span, reuse ceiling and semantic-type mix.

The *infinite-cache hit ceiling* is the fraction of block accesses (and of the tokens in them)
whose key was seen in an earlier access: what a cache that never evicts would hit. No policy can
beat it, so it frames every eviction result. Keys come from :func:`skv.blocks.request_blocks`
exactly as the simulator computes them (``mode`` "prefix" or "segment").

Block size: requests carrying trace hash ids always use the trace's block size; ``block_size``
(default 16) applies to content-keyed requests. The type mix is over prompt tokens (segments),
so it includes trailing tokens that never form a full block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from skv.blocks import KeyingMode, RequestBlocks, iter_blocks
from skv.model import TYPES, Request, SemanticType


def trace_info(
    requests: Sequence[Request],
    block_size: int | None = None,
    mode: KeyingMode | str = "prefix",
    *,
    salt_by_tenant: bool = False,
) -> dict[str, Any]:
    """Summary numbers of a trace (see module docstring); JSON-friendly values.

    Requests are cut into blocks one at a time and dropped once counted, so the memory beyond
    the requests themselves is the set of unique keys, not the block accesses."""
    from skv.replay import trace_totals

    mode = KeyingMode(mode)
    sizes: set[int] = set()

    def blocks() -> Iterator[RequestBlocks]:
        for rb in iter_blocks(requests, block_size, mode, salt_by_tenant=salt_by_tenant):
            sizes.add(rb.block_size)
            yield rb

    totals = trace_totals(blocks())
    type_tokens: dict[SemanticType, int] = {}
    for req in requests:
        for seg in req.segments:
            type_tokens[seg.stype] = type_tokens.get(seg.stype, 0) + seg.num_tokens
    sessions = {r.session_id for r in requests if r.session_id is not None}
    arrivals = [r.arrival_s for r in requests]
    span = (max(arrivals) - min(arrivals)) if arrivals else 0.0
    total_typed = sum(type_tokens.values())
    return {
        "requests": len(requests),
        # None: the format carries no session ids (Mooncake, Azure), which is not zero sessions
        "sessions": len(sessions) if sessions else None,
        "span_s": span,
        "prompt_tokens": totals.prompt_tokens,
        "output_tokens": sum(r.output_tokens for r in requests),
        "mode": str(mode),
        "block_size": sorted(sizes),
        "block_accesses": totals.block_accesses,
        "block_tokens": sum(totals.tokens_by_type),
        "unique_blocks": totals.unique_blocks,
        "hit_ceiling_blocks": totals.ceiling_block_hit_rate,
        "hit_ceiling_tokens": totals.ceiling_token_hit_rate,
        "type_mix": {
            str(t): type_tokens[t] / total_typed
            for t in TYPES
            if type_tokens.get(t) and total_typed
        },
    }


def format_info(info: dict[str, Any]) -> str:
    """Human-readable lines for :func:`trace_info`'s dict."""
    bs = info.get("block_size") or []
    lines = [
        f"requests          {info['requests']:,}",
        f"sessions          {'-' if info['sessions'] is None else format(info['sessions'], ',')}",
        f"span              {info['span_s']:,.1f} s",
        f"prompt tokens     {info['prompt_tokens']:,}",
        f"output tokens     {info['output_tokens']:,}",
        f"block size        {', '.join(str(b) for b in bs) or '-'} ({info['mode']} keys)",
        f"block accesses    {info['block_accesses']:,}",
        f"unique blocks     {info['unique_blocks']:,}",
        f"hit ceiling       {info['hit_ceiling_blocks']:.1%} of blocks, "
        f"{info['hit_ceiling_tokens']:.1%} of tokens (infinite cache)",
        "type mix (prompt tokens):",
    ]
    mix = sorted(info["type_mix"].items(), key=lambda kv: -kv[1])
    lines.extend(f"  {name:<18}{frac:6.1%}" for name, frac in mix)
    return "\n".join(lines)
