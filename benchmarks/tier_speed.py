"""Tiered replay speed: block accesses per second of ``skv replay --tier`` against the same
replay without lower tiers.

The tiered cache (:mod:`skv.tiers`, compiled like the GPU-tier cache) does more per access (a
lookup per tier, the load-or-recompute decision), so it is slower per access; this measures by
how much, on the Mooncake conversation trace (512-token blocks) when it is found, else on a
synthetic ``tool_use`` workload. Each trace is compiled once, outside the timing.

Run: ``python benchmarks/tier_speed.py [--capacity 5%] [--tier cpu=20%] [--repeat 3]
[--json FILE]``; ``--json`` writes the rows with the command, the date and the machine
(docs/tiers.md cites ``benchmarks/results/tier_speed.json``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from skv.replay import compile_trace, replay_one, replay_tiered, resolve_capacities, trace_totals
from skv.tiers import TierSpec, resolve_tiers

log = logging.getLogger("bench")


def load_trace() -> tuple[str, list]:
    from skv.traces import load_trace as read
    from skv.traces import trace_dir

    root = trace_dir()
    path = root / "mooncake" / "conversation_trace.jsonl" if root else None
    if path is not None and path.exists():
        return "mooncake conversation", compile_trace(read(path), mode="prefix")
    from skv.workloads import make_workload

    return "tool_use (synthetic)", compile_trace(make_workload("tool_use", num_requests=3000), 16)


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", default="5%")
    p.add_argument("--tier", action="append", default=None)
    p.add_argument("--policy", default="lru")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tiers = args.tier or ["cpu=20%"]
    name, trace = load_trace()
    totals = trace_totals(trace)
    block = trace[0].block_size
    (_, cap), = resolve_capacities([args.capacity], block_size=block,
                                   unique_blocks=totals.unique_blocks, model=None)  # fmt: skip
    lower = resolve_tiers([TierSpec.parse(t) for t in tiers], block_size=block,
                          unique_blocks=totals.unique_blocks, model=None)  # fmt: skip
    accesses = totals.block_accesses
    rows = []
    for label, fn in (
        ("gpu only", lambda: replay_one(trace, args.policy, cap, totals=totals, progress=False)),
        ("+ " + ", ".join(tiers), lambda: replay_tiered(trace, args.policy, cap, lower,
                                                        totals=totals, progress=False)),
    ):  # fmt: skip
        s = best_of(fn, args.repeat)
        rows.append({"trace": name, "replay": label, "policy": args.policy,
                     "capacity": args.capacity, "block_accesses": accesses, "seconds": s,
                     "accesses_per_s": accesses / s})  # fmt: skip
        log.info("%-28s %-10s %8.3f s  %12.0f accesses/s", label, args.policy, s, accesses / s)
    if args.json:
        from skv.artifact.timings import write_bench_json

        write_bench_json(Path(args.json), "tier_speed.py", sys.argv[1:], rows)


if __name__ == "__main__":
    main()
