"""Replay speed: block accesses per second for every policy, against plain baselines.

Streams:
- ``zipf``: a synthetic stream of single-block requests whose keys are Zipf(alpha) over
  ``--objects`` objects (each request is one root block: a flat trace).
- ``mooncake``: the Mooncake conversation trace (512-token blocks, prefix-chained), if found.

Baselines on the same key stream: a plain ``OrderedDict`` flat LRU loop (the yardstick for the
targets: skv ``lru`` >= 0.5x, other online policies >= 0.2x) and libCacheSim's C LRU when the
``libcachesim`` package is installed. Each stream is compiled to blocks once, outside the timing.

Run: ``python benchmarks/replay_speed.py [--accesses 10000000] [--policies lru fifo ...]
[--json FILE]``; ``--json`` also writes every row with the command, the date and the machine
(the docs' speed tables cite such files, ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from skv.blocks import RequestBlocks
from skv.policies.registry import OFFLINE, POLICIES
from skv.replay import compile_trace, replay_one, trace_totals

log = logging.getLogger("bench")


def zipf_stream(n: int, objects: int, alpha: float, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, objects + 1, dtype=np.float64)
    p = ranks**-alpha
    p /= p.sum()
    return (rng.choice(objects, size=n, p=p) + 1).tolist()


def flat_trace(keys: list[int]) -> list[RequestBlocks]:
    return [
        RequestBlocks(i, float(i), [k], [None], [1], [0], [1], None, 0, False, 1)
        for i, k in enumerate(keys)
    ]


def ordered_dict_lru(keys: list[int], capacity: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    od: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in keys:
        if k in od:
            od.move_to_end(k)
            hits += 1
        else:
            od[k] = None
            if len(od) > capacity:
                od.popitem(last=False)
    return len(keys) / (time.perf_counter() - t0), hits / len(keys)


def libcachesim_lru(keys: list[int], capacity: int) -> tuple[float, float] | None:
    try:
        import libcachesim as lcs
    except ImportError:
        return None
    cache = lcs.LRU(cache_size=capacity)
    req = lcs.Request()
    req.obj_size = 1
    hits = 0
    t0 = time.perf_counter()
    for k in keys:
        req.obj_id = k
        if cache.get(req):
            hits += 1
    return len(keys) / (time.perf_counter() - t0), hits / len(keys)


def bench_stream(
    name: str, trace: list[RequestBlocks], capacity: int, policies: list[str]
) -> list[dict]:
    """Time every implementation on one stream; print the table and return its rows."""
    keys = [k for rb in trace for k in rb.keys]
    n = len(keys)
    base_rate, base_hit = ordered_dict_lru(keys, capacity)
    print(f"\n== {name}: {n:,} block accesses, {len(trace):,} requests, capacity {capacity:,}")
    print(f"{'implementation':<24} {'accesses/s':>12} {'x OrderedDict':>14} {'block hit':>10}")
    print(f"{'OrderedDict flat LRU':<24} {base_rate:>12,.0f} {1.0:>14.2f} {base_hit:>10.4f}")
    rows = [_row(name, n, capacity, "OrderedDict flat LRU", base_rate, base_rate, base_hit)]
    lcs = libcachesim_lru(keys, capacity)
    if lcs is not None:
        print(
            f"{'libCacheSim LRU (C)':<24} {lcs[0]:>12,.0f} {lcs[0] / base_rate:>14.2f} "
            f"{lcs[1]:>10.4f}"
        )
        rows.append(_row(name, n, capacity, "libCacheSim LRU (C)", lcs[0], base_rate, lcs[1]))
    totals = trace_totals(trace)
    for policy in policies:
        if policy in OFFLINE:
            for rb in trace:
                rb.next_use = None
        t0 = time.perf_counter()
        row = replay_one(trace, policy, capacity, totals=totals, progress=False)
        rate = n / (time.perf_counter() - t0)
        print(
            f"{'skv ' + policy:<24} {rate:>12,.0f} {rate / base_rate:>14.2f} "
            f"{row['block_hit_rate']:>10.4f}"
        )
        rows.append(
            _row(name, n, capacity, f"skv {policy}", rate, base_rate, row["block_hit_rate"])
        )
    return rows


def _row(stream, n, capacity, implementation, rate, base_rate, hit) -> dict:
    return {
        "stream": stream,
        "accesses": n,
        "capacity": capacity,
        "implementation": implementation,
        "accesses_per_s": round(rate),
        "x_ordered_dict": round(rate / base_rate, 3),
        "block_hit_rate": hit,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--capacity-frac", type=float, default=0.1, help="of unique blocks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="also write the rows, command and machine")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    rows: list[dict] = []
    if not args.skip_mooncake:
        from skv.traces import find_trace, load_trace

        try:
            path = find_trace("mooncake/conversation_trace.jsonl")
        except FileNotFoundError as exc:
            print(f"SKIPPED mooncake: {exc}")
        else:
            trace = compile_trace(load_trace(path), 512)
            unique = len({k for rb in trace for k in rb.keys})
            rows += bench_stream(
                "mooncake conversation", trace, int(unique * args.capacity_frac), args.policies
            )

    keys = zipf_stream(args.accesses, args.objects, args.alpha, args.seed)
    trace = flat_trace(keys)
    unique = len(set(keys))
    rows += bench_stream(
        f"zipf alpha={args.alpha}", trace, int(unique * args.capacity_frac), args.policies
    )
    if args.json:
        from skv.artifact.timings import write_bench_json

        write_bench_json(Path(args.json), "replay_speed.py", sys.argv[1:], rows)


if __name__ == "__main__":
    main()
