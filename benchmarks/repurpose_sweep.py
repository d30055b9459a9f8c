"""KV-Repurpose capacity sweep for one seed: wall time and peak memory (issue 13).

The issue's budget: the whole capacity sweep of one seed (both keyings, every capacity of
``experiments/repurpose/repurpose_capacity.yaml``: 10 GB to 1 TB and an infinite cache, 10,000
requests) in under a minute, without per-capacity copies of the trace (1 TB of llama-3.1-8b KV
is ~7.6M tokens, 476,837 blocks of 16). This runs :func:`skv.experiments.repurpose.study.
sweep_seed` exactly as the notebook does, with its two expensive calls (``compile_trace`` and
``chain_hits``) wrapped to time them and to record the resident set after each, and the id of
the trace each replay gets. One trace object per mode replayed at every capacity, and a
resident set that grows only by the cache a capacity holds, show there are no copies.

Run: ``python benchmarks/repurpose_sweep.py [--seed 0] [--quick] [--config PATH]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

from skv.experiments.repurpose import study as S

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """The resident set now (``/proc/self/statm``), MB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def peak_mb() -> float:
    """The process's peak resident set so far (``ru_maxrss`` is in KiB on Linux), MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/repurpose/repurpose_capacity.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the config's quick: overrides")
    args = ap.parse_args(argv)

    cfg = S.load_config(args.config, quick=args.quick)
    events: list[dict[str, Any]] = []
    compile_trace, chain_hits = S.compile_trace, S.chain_hits

    def timed_compile(requests: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        trace = compile_trace(requests, **kw)
        took = time.perf_counter() - t
        events.append({"what": f"compile {kw['mode']}", "s": took, "rss": rss_mb(),
                       "blocks": sum(len(rb.keys) for rb in trace)})  # fmt: skip
        return trace

    def timed_replay(trace: Any, policy: str, capacity_blocks: int, starts: Any = None) -> Any:
        t = time.perf_counter()
        out = chain_hits(trace, policy, capacity_blocks, starts)
        took = time.perf_counter() - t
        events.append({"what": f"  replay {capacity_blocks:>9,} blocks", "s": took, "rss": rss_mb(),
                       "trace": id(trace)})  # fmt: skip
        return out

    S.compile_trace, S.chain_hits = timed_compile, timed_replay
    base = rss_mb()
    t0 = time.perf_counter()
    try:
        hits, _, meta = S.sweep_seed(cfg, args.seed)
    finally:
        S.compile_trace, S.chain_hits = compile_trace, chain_hits
    total = time.perf_counter() - t0

    print(
        f"{cfg.id}, seed {args.seed}{' (quick)' if args.quick else ''}: {meta['requests']:,} "
        f"requests, capacities {', '.join(cfg.capacities)}, modes prefix and segment"
    )
    replays = [e for e in events if "trace" in e]
    for e in events:
        extra = f"  {e['blocks']:>10,} block accesses" if "blocks" in e else ""
        print(f"{e['what']:<34} {e['s']:6.2f} s   rss {e['rss']:7.0f} MB{extra}")
    per_mode = len(cfg.capacities)
    traces = [len({e["trace"] for e in replays[i : i + per_mode]}) for i in (0, per_mode)]
    print(f"trace objects replayed per mode: {traces} (1 = every capacity replays the same one)")
    compiled = sum(e["s"] for e in events if "blocks" in e)
    replayed = sum(e["s"] for e in replays)
    print(
        f"sweep_seed: {total:.1f} s (compile {compiled:.1f} s, replay {replayed:.1f} s, "
        f"workload, ceiling and TTFT {total - compiled - replayed:.1f} s); budget 60 s"
    )
    print(f"resident set: {base:.0f} MB before, peak {peak_mb():.0f} MB")
    cap = hits[hits["capacity"] == cfg.large_capacity]["capacity_blocks"].iloc[0]
    print(f"{cfg.large_capacity} = {cap:,} blocks = {cap * cfg.block_size:,} tokens of {cfg.model}")


if __name__ == "__main__":
    main()
