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

Run: ``python benchmarks/sim_speed.py [--requests 12000] [--policies lru adaptive_semantic]``;
``--profile`` adds a cProfile of the slowest run (top functions by cumulative and own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=12_000, help="synthetic workload size")
    ap.add_argument("--capacity-frac", type=float, default=0.1, help="of unique prompt blocks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile the slowest run")
    ap.add_argument("--top", type=int, default=25, help="functions listed by --profile")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    slowest: list = []

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

    if args.profile and slowest:
        profile(slowest, args.top)


if __name__ == "__main__":
    main()
