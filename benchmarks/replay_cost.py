"""What each replay policy costs, and what replaying lru a radix node at a time saves.

On the Claude Code sessions (``--scale N``: copied N times with new ids, as
``benchmarks/trace_scale.py`` builds them) and the Mooncake conversation trace, each loaded as
the :class:`~skv.compact_trace.CompactTrace` that ``skv replay`` uses for online policies, every
online policy is replayed through ``replay_one`` at each ``--capacity`` fraction of the unique
blocks: seconds and block accesses per second. ``lru`` and ``vllm``, which ``replay_one`` runs
a radix node at a time (:mod:`skv.cache.node_replay`), are also replayed block by block
(``BlockCache`` + ``LRU``, ``VllmBlockPool``, over the rebuilt parts: what ran before), and the
two are checked equal in hits, hit tokens and evictions. Trace loading is
outside every timing; each replay is timed alone, in this process, one after another.

Run: ``python benchmarks/replay_cost.py [--scale 1] [--capacity 0.01 0.1] [--policies ...]``.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from skv.blocks import iter_blocks
from skv.compact_trace import CompactTrace
from skv.policies.registry import OFFLINE, POLICIES, make_cache
from skv.replay import NODE_POLICIES, replay_one, trace_totals
from skv.traces import find_trace, load_trace

ONLINE = [p for p in POLICIES if p not in OFFLINE]


def load(name: str, scale: int) -> CompactTrace:
    if name == "mooncake":
        return CompactTrace(iter_blocks(load_trace(find_trace("mooncake/conversation_trace.jsonl")),
                                        None, "prefix"))  # fmt: skip
    src = find_trace("weka_cc")
    if scale == 1:
        return CompactTrace(iter_blocks(load_trace(src), None, "prefix"))
    from trace_scale import scale_up

    with tempfile.TemporaryDirectory() as tmp:
        scale_up(src, Path(tmp) / "weka_cc", scale)
        return CompactTrace(iter_blocks(load_trace(Path(tmp) / "weka_cc"), None, "prefix"))


def by_block(trace: CompactTrace, policy: str, cap: int) -> tuple[float, tuple[int, int, int]]:
    """``policy`` block by block over the rebuilt parts: seconds and (hit blocks, hit tokens,
    evictions)."""
    cache = make_cache(policy, cap)
    t0 = time.perf_counter()
    for part in trace.parts(0, len(trace)):
        cache.replay(part, 0, len(part))
    s = cache.stats
    return time.perf_counter() - t0, (s.hit_blocks, s.hit_tokens, s.evictions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1, help="Claude Code sessions copied N times")
    ap.add_argument("--capacity", type=float, nargs="+", default=[0.01, 0.1])
    ap.add_argument("--policies", nargs="+", default=ONLINE, choices=ONLINE)
    ap.add_argument("--traces", nargs="+", default=["claude_code", "mooncake"],
                    choices=["claude_code", "mooncake"])  # fmt: skip
    args = ap.parse_args()
    print(f"{'trace':<16} {'cap':>6} {'policy':<18} {'replay':<8} {'s':>7} {'M acc/s':>8} "
          f"{'token hit':>9}")  # fmt: skip
    for name in args.traces:
        try:
            trace = load(name, args.scale)
        except (FileNotFoundError, OSError) as exc:
            print(f"{name}: skipped, trace not found ({exc})")
            continue
        totals = trace_totals(trace)
        label = f"{name} x{args.scale}" if name == "claude_code" else name
        print(f"{label}: {len(trace):,} requests, {totals.block_accesses:,} block accesses, "
              f"{totals.unique_blocks:,} unique blocks")  # fmt: skip
        for frac in args.capacity:
            cap = max(2, round(frac * totals.unique_blocks))
            for policy in args.policies:
                row = replay_one(trace, policy, cap, totals=totals, progress=False)
                how = "node" if policy in NODE_POLICIES else "block"
                _print(label, frac, policy, how, row["replay_seconds"], totals.block_accesses,
                       row["token_hit_rate"])  # fmt: skip
                if policy in NODE_POLICIES:
                    secs, counts = by_block(trace, policy, cap)
                    assert counts == (row["hit_blocks"], row["hit_tokens"], row["evictions"])
                    _print(label, frac, policy, "block", secs, totals.block_accesses,
                           row["token_hit_rate"])  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak:.2f} GB")
    return 0


def _print(label, frac, policy, how, secs, accesses, hit) -> None:
    print(f"{label:<16} {frac:>6.1%} {policy:<18} {how:<8} {secs:>7.2f} "
          f"{accesses / secs / 1e6:>8.2f} {hit:>9.4f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
