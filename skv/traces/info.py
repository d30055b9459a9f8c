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

from collections.abc import Sequence
from typing import Any

from skv.blocks import KeyingMode, request_blocks
from skv.model import TYPES, Request, SemanticType

DEFAULT_BLOCK_SIZE = 16


def trace_info(
    requests: Sequence[Request],
    block_size: int | None = None,
    mode: KeyingMode | str = "prefix",
) -> dict[str, Any]:
    """Summary numbers of a trace (see module docstring); JSON-friendly values."""
    mode = KeyingMode(mode)
    seen: set[int] = set()
    block_accesses = hit_blocks = block_tokens = hit_tokens = 0
    prompt_tokens = output_tokens = 0
    type_tokens: dict[SemanticType, int] = {}
    block_sizes: set[int] = set()
    sessions: set[str] = set()
    for i, req in enumerate(requests):
        bs = req.hash_block_size if req.hash_ids is not None and req.hash_block_size else None
        rb = request_blocks(req, bs or block_size or DEFAULT_BLOCK_SIZE, mode, index=i)
        block_sizes.add(rb.block_size)
        for key, tok in zip(rb.keys, rb.tokens, strict=True):
            block_accesses += 1
            block_tokens += tok
            if key in seen:
                hit_blocks += 1
                hit_tokens += tok
            else:
                seen.add(key)
        prompt_tokens += req.prompt_tokens
        output_tokens += req.output_tokens
        for seg in req.segments:
            type_tokens[seg.stype] = type_tokens.get(seg.stype, 0) + seg.num_tokens
        if req.session_id is not None:
            sessions.add(req.session_id)
    arrivals = [r.arrival_s for r in requests]
    span = (max(arrivals) - min(arrivals)) if arrivals else 0.0
    total_typed = sum(type_tokens.values())
    return {
        "requests": len(requests),
        "sessions": len(sessions),
        "span_s": span,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "mode": str(mode),
        "block_size": sorted(block_sizes),
        "block_accesses": block_accesses,
        "block_tokens": block_tokens,
        "unique_blocks": len(seen),
        "hit_ceiling_blocks": hit_blocks / block_accesses if block_accesses else 0.0,
        "hit_ceiling_tokens": hit_tokens / block_tokens if block_tokens else 0.0,
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
        f"sessions          {info['sessions']:,}",
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
