"""Serving-simulator speed: wall seconds to simulate a ~12k-request trace through one replica.

The simulator advances simulated time event to event (arrivals and iteration ends), so a 12k
request trace should take seconds, not minutes. Two traces:

- ``mooncake``: the Mooncake conversation trace (12,031 requests, 512-token hash blocks), if
  ``skv.traces.find_trace`` finds it (skipped with a message otherwise);
- ``multi_turn_chat``: a synthetic 12k-request ``multi_turn_chat`` workload (16-token blocks,
  exact-prefix keying).

Each trace runs with every ``--policies`` policy (default ``lru`` and ``adaptive_semantic``) at
``--capacity-frac`` (default 10%) of its unique prompt blocks, the ``linear`` latency model with
its default constants, one replica and ``SimConfig``'s default batch limits. Workload generation
(or trace loading) and the unique-block count are timed separately from the simulation; the
simulation is timed around ``simulate`` alone. Latencies are SIMULATED; only the wall seconds
are measured.

A third case, ``cluster`` (``--cluster``, or ``--only-cluster``), is one load point of the
CacheRoute study's QPS search: the ``aggregate`` workload at ``--cluster-rate`` (160) req/s,
60 s of warm-up plus 8,000 measured requests (17,600 in all), through 15 replicas of
Llama-3.3-70B fp8 on 4 H100s (roofline, ``vllm`` eviction, 2,591 blocks of 512 tokens each),
once per router in ``--routers``; routers that read caches use their approximate view, as in
``experiments/cacheroute/qps_aggregate.yaml``. Timed around ``simulate_point`` (simulation and
metrics), not the workload generation.

Run: ``python benchmarks/sim_speed.py [--requests 12000] [--policies lru adaptive_semantic]``;
``--profile`` adds a cProfile of the slowest run (top functions by cumulative and own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import statistics
import time
from collections.abc import Sequence

from skv.latency import make_latency_model
from skv.model import Request
from skv.replay import compile_trace, trace_totals
from skv.sim import SimConfig, simulate

DEFAULT_POLICIES = ("lru", "adaptive_semantic")


def unique_blocks(requests: Sequence[Request], block_size: int | None) -> int:
    return trace_totals(compile_trace(requests, block_size, "prefix")).unique_blocks


def bench(
    label: str,
    requests: Sequence[Request],
    block_size: int | None,
    setup_s: float,
    args: argparse.Namespace,
    slowest: list,
) -> None:
    t0 = time.perf_counter()
    unique = unique_blocks(requests, block_size)
    count_s = time.perf_counter() - t0
    capacity = max(1, int(unique * args.capacity_frac))
    latency = make_latency_model("linear")
    defaults = SimConfig()
    print(
        f"\n{label}: {len(requests):,} requests, {unique:,} unique prompt blocks "
        f"(block size {block_size or 'per trace'}), capacity {capacity:,} blocks "
        f"({args.capacity_frac:.0%}); workload {setup_s:.2f} s, unique-block count "
        f"{count_s:.2f} s; linear latency, 1 replica, max_batch_tokens "
        f"{defaults.max_batch_tokens}, max_running {defaults.max_running}"
    )
    print(
        f"  {'policy':<18} {'requests':>9} {'iterations':>11} {'sim. duration':>14} "
        f"{'wall s':>8} {'req/s':>9} {'iter/s':>9} {'token hit':>9} {'mean TTFT':>12}"
    )
    for policy in args.policies:
        config = SimConfig(policy=policy, capacity_blocks=capacity, block_size=block_size)
        t1 = time.perf_counter()
        res = simulate(requests, config, latency, progress=False)
        wall = time.perf_counter() - t1
        s = res.summary
        print(
            f"  {policy:<18} {s['requests']:>9,} {s['iterations']:>11,} "
            f"{s['duration_s']:>12,.0f} s {wall:>8.2f} {s['requests'] / wall:>9,.0f} "
            f"{s['iterations'] / wall:>9,.0f} {s['token_hit_rate']:>9.3f} "
            f"{s['ttft_ms_mean']:>9,.0f} ms"
        )
        if not slowest or wall > slowest[0]:
            slowest[:] = [wall, label, requests, config, latency]


def profile(slowest: list, top: int) -> None:
    wall, label, requests, config, latency = slowest
    print(f"\ncProfile of {label} / {config.policy} ({wall:.2f} s unprofiled):")
    prof = cProfile.Profile()
    prof.enable()
    simulate(requests, config, latency, progress=False)
    prof.disable()
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        text = buf.getvalue()
        print(f"--- by {key} ---")
        print(text[text.index("   ncalls") :].rstrip())


CLUSTER_ROUTERS = ("least_loaded", "consistent_hashing", "sglang_cache_aware", "prefix_locality",
                   "cacheroute")  # fmt: skip


def bench_cluster(rate: float, routers: Sequence[str], repeat: int = 3) -> None:
    from skv.experiments.cacheroute.cluster import ClusterSpec, simulate_point
    from skv.experiments.cacheroute.study import CACHE_BLIND
    from skv.experiments.cacheroute.workloads import generate

    cluster = ClusterSpec()
    n = int(rate * 60) + 8000
    t0 = time.perf_counter()
    requests = generate("aggregate", {"num_requests": n}, rate, 0)
    setup = time.perf_counter() - t0
    print(
        f"\ncluster: aggregate workload, {n:,} requests at {rate:g} req/s (workload "
        f"{setup:.2f} s); {cluster.replicas} replicas x {cluster.model} on {cluster.tp} x "
        f"{cluster.gpu}, roofline, {cluster.kv_capacity_blocks(512):,} blocks of 512 tokens each"
    )
    print(f"  each router {repeat} time(s), interleaved; req/s of the fastest and the median run")
    print(
        f"  {'router':<20} {'best s':>8} {'req/s':>9} {'median s':>9} {'req/s':>9} "
        f"{'p99 TTFT':>10} {'hit rate':>9}"
    )
    walls: dict[str, list[float]] = {router: [] for router in routers}
    metrics: dict[str, dict] = {}
    for _ in range(repeat):  # interleaved: a slow spell of the machine hits every router
        for router in routers:
            params = {"prefix_blocks": 2} if router in ("cacheroute", "consistent_hashing") else {}
            if router == "cacheroute":  # experiments/cacheroute/qps_aggregate.yaml thresholds
                params.update(admit_rate=0.02, evict_rate=0.01)
            view = "exact" if router in CACHE_BLIND or router == "precise" else "approximate"
            t1 = time.perf_counter()
            m = simulate_point(requests, cluster, router, params, warmup_s=60.0, router_view=view)
            walls[router].append(time.perf_counter() - t1)
            if repr(metrics.setdefault(router, m)) != repr(m):  # NaN != NaN
                raise AssertionError(f"{router}: a repeated run gave other metrics")
    for router in routers:
        best, median, m = min(walls[router]), statistics.median(walls[router]), metrics[router]
        print(
            f"  {router:<20} {best:>8.2f} {n / best:>9,.0f} {median:>9.2f} {n / median:>9,.0f} "
            f"{m['ttft_ms_p99']:>7,.0f} ms {m['hit_rate']:>9.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=12_000, help="synthetic workload size")
    ap.add_argument("--capacity-frac", type=float, default=0.1, help="of unique prompt blocks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--cluster", action="store_true", help="also the 15-replica cluster case")
    ap.add_argument("--only-cluster", action="store_true", help="only the cluster case")
    ap.add_argument("--cluster-rate", type=float, default=160.0, help="req/s of the cluster case")
    ap.add_argument("--routers", nargs="+", default=list(CLUSTER_ROUTERS))
    ap.add_argument("--repeat", type=int, default=3, help="runs per router (cluster case)")
    ap.add_argument("--profile", action="store_true", help="cProfile the slowest run")
    ap.add_argument("--top", type=int, default=25, help="functions listed by --profile")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    slowest: list = []
    if args.only_cluster:
        bench_cluster(args.cluster_rate, args.routers, args.repeat)
        return

    if not args.skip_mooncake:
        from skv.traces import find_trace, load_trace

        try:
            path = find_trace("mooncake/conversation_trace.jsonl")
        except FileNotFoundError as exc:
            print(f"SKIPPED mooncake: {exc}")
        else:
            t0 = time.perf_counter()
            requests = load_trace(path)
            setup = time.perf_counter() - t0
            bench("mooncake conversation", requests, None, setup, args, slowest)

    from skv.workloads import make_workload

    t0 = time.perf_counter()
    requests = make_workload("multi_turn_chat", num_requests=args.requests, seed=args.seed)
    setup = time.perf_counter() - t0
    bench("multi_turn_chat (synthetic)", requests, 16, setup, args, slowest)

    if args.cluster:
        bench_cluster(args.cluster_rate, args.routers, args.repeat)
    if args.profile and slowest:
        profile(slowest, args.top)


if __name__ == "__main__":
    main()
