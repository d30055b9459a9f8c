"""``skv traces info | convert``: inspect a trace, or write it as skv JSONL or oracleGeneral.

:func:`add_trace_args` and :func:`load_compiled_args` are shared with ``skv replay``
(:mod:`skv.experiments.replay.cli`): every command that reads a trace takes the same options.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from skv.blocks import RequestBlocks
from skv.model import Request

log = logging.getLogger(__name__)


def add_trace_args(p: argparse.ArgumentParser, *, flat: bool = False) -> None:
    """The trace, its format, block keying and a request limit; ``flat``: ``--mode`` also
    offers ``flat`` (``skv replay``: :func:`skv.replay.flatten`)."""
    p.add_argument("trace", help="trace file or directory (format detected from content)")
    p.add_argument(
        "--format",
        dest="fmt",
        default=None,
        help="force the trace format (skv, mooncake, claude_code, azure2023, bailian)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="KV block size in tokens (default: the trace's own, else 16 as vLLM on GPU)",
    )
    p.add_argument(
        "--mode",
        choices=["prefix", "segment", "flat"] if flat else ["prefix", "segment"],
        default="prefix",
        help="block keying: exact prefix (vLLM) or position-independent segments"
        + (
            "; flat: prefix keys, then every block access replayed as its own one-block "
            "request (an object cache, as libCacheSim sees a block stream: no pinning, no "
            "leaf-only eviction; token hit rate = block hit rate)"
            if flat
            else ""
        ),
    )
    p.add_argument(
        "--salt-by-tenant",
        action="store_true",
        help="salt each chain with the tenant id (vLLM cache_salt isolation)",
    )
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument(
        "--no-trace-cache",
        dest="trace_cache",
        action="store_false",
        help="parse the trace even if the binary cache has it, and do not cache it "
        "(cache: $SKV_TRACE_CACHE, 'off' disables; default ~/.cache/skv/traces)",
    )


def load_requests(
    trace: str | Path, fmt: str | None, limit: int | None, *, cache: bool = True
) -> list[Request]:
    """The trace's requests (the first ``limit``); exits when there are none.

    With ``cache``, through the binary cache of parsed traces (:mod:`skv.traces.parsed_cache`)
    unless ``$SKV_TRACE_CACHE`` is ``off``."""
    from skv.runtime import long_lived
    from skv.traces import load_trace
    from skv.traces.parsed_cache import default_cache_dir

    try:
        with long_lived():  # the command's trace: not re-walked by every later collection
            requests = load_trace(trace, fmt, cache_dir=default_cache_dir() if cache else None)
    except KeyboardInterrupt as exc:
        exc.add_note(f"interrupted while reading {trace}; nothing finished, nothing written")
        raise
    if limit is not None:
        requests = requests[:limit]
    if not requests:
        raise SystemExit(f"{trace}: no requests")
    return requests


def load_compiled(
    trace: str | Path,
    fmt: str | None,
    limit: int | None,
    block_size: int | None,
    mode: str,
    salt_by_tenant: bool,
    *,
    cache: bool = True,
    compact: bool = False,
) -> tuple[Sequence[RequestBlocks], int]:
    """The trace's compiled block chains and the block size they use; the parsed requests are
    dropped once compiled. ``compact``: a :class:`~skv.compact_trace.CompactTrace` (memory per
    unique block, rebuilt a part at a time; online policies only) instead of a list."""
    from skv.blocks import iter_blocks
    from skv.compact_trace import CompactTrace

    requests = load_requests(trace, fmt, limit, cache=cache)
    try:
        blocks = iter_blocks(requests, block_size, mode, salt_by_tenant=salt_by_tenant)
        compiled = CompactTrace(blocks) if compact else list(blocks)
    except KeyboardInterrupt as exc:
        exc.add_note(
            f"interrupted while cutting {trace} into blocks; nothing finished, nothing written"
        )
        raise
    del requests
    return compiled, compiled[0].block_size


def load_compiled_args(
    args: argparse.Namespace, *, compact: bool = False
) -> tuple[Sequence[RequestBlocks], int]:
    """:func:`load_compiled` with the options of :func:`add_trace_args`."""
    return load_compiled(
        args.trace,
        args.fmt,
        args.limit,
        args.block_size,
        args.mode,
        args.salt_by_tenant,
        cache=args.trace_cache,
        compact=compact,
    )


def cmd_traces_info(args: argparse.Namespace) -> int:
    from skv.traces.info import format_info, trace_info

    requests = load_requests(args.trace, args.fmt, args.limit, cache=args.trace_cache)
    try:  # blocks are cut one request at a time: no compiled copy of the whole trace
        info = trace_info(requests, args.block_size, args.mode, salt_by_tenant=args.salt_by_tenant)
    except KeyboardInterrupt as exc:
        exc.add_note(f"interrupted while summarising {args.trace}; traces info writes nothing")
        raise
    print(format_info(info))
    return 0


def cmd_traces_convert(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if args.to == "skv":
        from skv.traces.native import write_skv_trace

        requests = load_requests(args.trace, args.fmt, args.limit, cache=args.trace_cache)
        write_skv_trace(out, requests, {"source": str(args.trace)})
    else:
        from skv.traces.oracle_general import write_oracle_general

        compiled, _ = load_compiled_args(args)
        write_oracle_general(out, compiled)
    log.info("wrote %s", out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``traces`` command group; return its parser."""
    traces = subparsers.add_parser("traces", help="inspect and convert traces (info, convert)")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
    p = tsub.add_parser("info", help="requests, span, blocks, hit ceiling, type mix")
    add_trace_args(p)
    p.set_defaults(func=cmd_traces_info)
    p = tsub.add_parser("convert", help="write a trace as skv JSONL or libCacheSim oracleGeneral")
    add_trace_args(p)
    p.add_argument("--to", choices=["skv", "oracle_general"], required=True)
    p.add_argument("output", help="output file")
    p.set_defaults(func=cmd_traces_convert)
    return traces
