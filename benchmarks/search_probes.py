"""Probes per max-QPS search: the bisection the studies use against Brent's root finder.

Every CacheRoute QPS number is a search (:func:`skv.experiments.slo_search.max_qps`): the
highest offered rate whose simulated p99 TTFT meets the SLO, bisected until the bracket is
within ``rel_tol`` (2%) of its upper end. Each probe is a whole cluster simulation, so probes
are what the CacheRoute steps cost. Would a root finder need fewer? This runs the same
searches both ways on corners of the regime map (``cacheroute_regimes.yaml`` in
``experiments/cacheroute``: both replica counts, both KV sizes, both skews, both SLOs) and
counts the points each asks for.

Brent's method (``scipy.optimize.brentq``) starts from the bracket bisection has after its
``lo`` and doubling probes (both methods make those), runs on ``h(p99) - h(SLO)`` for three
shapes of ``h`` (the p99 itself, its log, and ``-1/p99``, near-linear in the rate close to a
queue's knee), and then bisects whatever bracket it leaves until it is as narrow as
bisection's. Both report the highest rate that met the SLO. A point is simulated once per
(setting, router, seed, rate) and shared by every method and both SLOs; a method's count is
the distinct rates it asked for.

Run: ``python benchmarks/search_probes.py [--seeds 0] [--settings 4]``; prints one row per
search (router, setting, each method's QPS and probes) and the totals. Latencies are SIMULATED.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from scipy.optimize import brentq

from skv.experiments.cacheroute import regimes as RG
from skv.experiments.cacheroute import study as S
from skv.experiments.slo_search import max_qps

CONFIG = "experiments/cacheroute/cacheroute_regimes.yaml"
#: (replicas, gpu_memory_utilization, key_zipf, shared_share, prefix_blocks): corners of the map
SETTINGS = (
    (15, 0.5, 1.2, 1.0, (4, 16)),
    (4, 0.9, 0.8, 0.5, (2, 8)),
    (15, 0.9, 0.8, 1.0, (2, 8)),
    (4, 0.5, 1.2, 0.5, (4, 16)),
)
SHAPES: dict[str, Callable[[float], float]] = {
    "p99": lambda x: x,
    "log": math.log,
    "inverse": lambda x: -1.0 / x,
}


def brent_search(
    p99: Callable[[float], float], slo: float, lo: float, hi: float, rel_tol: float,
    doublings: int, h: Callable[[float], float],
) -> tuple[float, int]:  # fmt: skip
    """(QPS, distinct rates probed): bisection's opening (``lo``, then ``hi`` doubling while it
    meets the SLO), Brent's method inside the bracket, then bisection of what it leaves."""
    seen: dict[float, float] = {}

    def at(rate: float) -> float:
        if rate not in seen:
            seen[rate] = p99(rate)
        return seen[rate]

    if at(lo) > slo:
        return 0.0, len(seen)
    for _ in range(doublings + 1):
        if at(hi) > slo:
            break
        lo, hi = hi, hi * 2
    else:
        return lo, len(seen)
    brentq(lambda r: h(at(r)) - h(slo), lo, hi, xtol=1e-9, rtol=rel_tol)
    good = max(r for r, v in seen.items() if v <= slo)
    bad = min(r for r, v in seen.items() if v > slo and r > good)
    while bad - good > rel_tol * bad:
        mid = (good + bad) / 2
        good, bad = (mid, bad) if at(mid) <= slo else (good, mid)
    return good, len(seen)


def searches(cfg: RG.RouteRegimeConfig, n_settings: int, seeds: list[int]):
    """(row label, the search's config, the p99 at a rate) per search: a point is simulated
    once per (setting, router, seed, rate) and shared by every method and both SLOs."""
    points: dict[tuple[Any, ...], float] = {}
    for replicas, util, zipf, shared, blocks in SETTINGS[:n_settings]:
        for slo in (2000, 3500):
            setting = {
                "replicas": replicas,
                "gpu_memory_utilization": util,
                "key_zipf": zipf,
                "shared_share": shared,
                "slo_ms": slo,
                "prefix_blocks": list(blocks),
            }
            run = RG.setting_config(cfg, setting)
            for ri, router in enumerate(run.routers):
                for seed in seeds:
                    key = (replicas, util, zipf, shared, blocks, ri, seed)

                    def p99(rate: float, key=key, run=run, ri=ri, seed=seed) -> float:
                        if (*key, rate) not in points:
                            m = S.point_at(run, 0, ri, seed, rate)
                            points[(*key, rate)] = m["ttft_ms_slo"]
                        return points[(*key, rate)]

                    cells = (router.key, replicas, util, zipf, shared, slo, seed)
                    label = " | ".join(map(str, cells))
                    yield label, run, p99


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--settings", type=int, default=len(SETTINGS), help="how many of SETTINGS")
    args = ap.parse_args(argv)
    cfg = RG.load(CONFIG, quick=False)
    totals = {"bisection": 0, **{name: 0 for name in SHAPES}}
    head = ["router", "replicas", "KV util", "zipf", "shared", "SLO ms", "seed"]
    head += ["bisection QPS (probes)"] + [f"brent {n} QPS (probes)" for n in SHAPES]
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for label, run, p99 in searches(cfg, args.settings, args.seeds):
        s, slo = run.search, run.slo_ms
        res = max_qps(
            lambda r, p99=p99: {"p": p99(r)},
            slo,
            lo=s.lo,
            hi=s.hi,
            rel_tol=s.rel_tol,
            max_doublings=s.max_doublings,
            key="p",
        )
        row = [f"{res['qps']:.1f} ({len(res['points'])})"]
        totals["bisection"] += len(res["points"])
        for name, h in SHAPES.items():
            q, n = brent_search(p99, slo, s.lo, s.hi, s.rel_tol, s.max_doublings, h)
            row.append(f"{q:.1f} ({n})")
            totals[name] += n
        print(f"| {label} | " + " | ".join(row) + " |", flush=True)
    print("\nprobes in all: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
