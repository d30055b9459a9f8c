"""``skv replay``: a trace through eviction policies, cache only (:mod:`skv.replay`) or timed
through the serving simulator (:mod:`skv.experiments.replay.timed`, selected by any timed option);
``skv shadow``: the routing gate (:mod:`skv.experiments.replay.shadow`).

The command line ends here: the library functions get typed parameters, never the Namespace.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skv.traces.cli import add_trace_args, load_compiled_args


def add_timed_args(p: argparse.ArgumentParser) -> None:
    """The timed-replay options of ``skv replay`` (any of them selects the timed mode)."""
    from skv.latency import LATENCY_MODELS

    g = p.add_argument_group(
        "timed replay (serving simulator; selected by --cache-token-budget or --timed)"
    )
    g.add_argument(
        "--cache-token-budget",
        type=int,
        default=None,
        metavar="N",
        help="KV cache size in tokens per replica; runs the timed replay",
    )
    g.add_argument(
        "--timed",
        action="store_true",
        help="run the timed replay at the --capacity sizes (per replica)",
    )
    g.add_argument(
        "--latency-model",
        choices=sorted(LATENCY_MODELS),
        default=None,
        help="model that prices each engine iteration (default linear; calibrated with "
        "--calibrate-from-trace)",
    )
    g.add_argument(
        "--latency-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="latency model constant, e.g. base_ttft_ms=25 or gpu=H100; repeatable",
    )
    g.add_argument(
        "--calibrate-from-trace",
        action="store_true",
        help="fit the calibrated latency model to the trace's observed TTFT and cached tokens, "
        "on the requests that found the engine idle (a TTFT measured behind other requests holds "
        "their queueing; too few idle ones is an error that says so)",
    )
    g.add_argument("--replicas", type=int, default=1, help="serving replicas (default 1)")
    g.add_argument("--router", default="round_robin", help="request router across replicas")
    g.add_argument("--max-batch-tokens", type=int, default=8192, help="tokens per engine iteration")
    g.add_argument(
        "--output-name", default=None, help="name in the output directory (default: trace stem)"
    )


def add_tier_args(p: argparse.ArgumentParser) -> None:
    """Lower KV tiers under the GPU cache (skv.tiers; docs/tiers.md)."""
    g = p.add_argument_group(
        "tiered KV store (cache-only replay; --capacity is then the GPU tier, docs/tiers.md)"
    )
    g.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="NAME=SIZE[@POLICY][,link=LINK]",
        help="a lower tier, top down, e.g. cpu=20%% or disk=1TB@sieve (default policy lru; "
        "link by name: cpu/dram/host pcie5, disk/ssd/nvme nvme, remote/rdma rdma); repeatable",
    )
    g.add_argument(
        "--tier-write",
        choices=["through", "evict"],
        default="through",
        help="through: computed blocks are written to every tier (default); evict: a block "
        "reaches a tier when the one above evicts it",
    )
    g.add_argument(
        "--tier-load",
        choices=["copy", "move"],
        default="copy",
        help="copy: a lower tier keeps what it loads up (default); move: it drops it "
        "(--tier-write evict --tier-load move is an exclusive hierarchy)",
    )


def add_curve_args(p: argparse.ArgumentParser) -> None:
    """The options of ``skv replay --capacity-curve`` (:mod:`skv.mrc`)."""
    from skv.mrc import AUTO_MIN_UNITS, BELADY_MAX_ACCESSES, UNITS, check_rate

    def rate(text: str) -> float:
        try:
            return check_rate(float(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    g = p.add_argument_group("hit rate at every capacity (selected by --capacity-curve)")
    g.add_argument(
        "--capacity-curve",
        action="store_true",
        help="write the hit-rate curve: exact lru at every capacity in one pass, SHARDS "
        "estimates for --policies, Belady's bound at a few capacities",
    )
    g.add_argument(
        "--sample-rate",
        type=rate,
        nargs="+",
        default=[0.1],
        metavar="R",
        help="SHARDS sampling rates in (0, 1] (default 0.1)",
    )
    g.add_argument("--sample-seed", type=int, default=0, help="seed of the sampling hash")
    g.add_argument(
        "--sample-unit",
        choices=UNITS,
        default="auto",
        help="what is kept or dropped whole: auto (default: sessions when the trace has "
        f"them, else the block where requests diverge; each block when fewer than "
        f"{AUTO_MIN_UNITS} such units would be sampled), the first block, the session, or each "
        "block (per-key SHARDS, re-chained)",
    )
    g.add_argument(
        "--curve-points", type=int, default=64, help="exact lru points written (log-spaced)"
    )
    g.add_argument(
        "--belady-points",
        type=int,
        default=3,
        help=f"capacities with Belady's bound (0: none); a trace of more than "
        f"{BELADY_MAX_ACCESSES:,} block accesses gets it from its largest sample within that "
        "(its rows carry the rate)",
    )


def parse_latency_params(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> constants (ints and floats converted); latency model and router
    parameters alike."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--latency-param {item!r}: expected KEY=VALUE")
        value: Any = raw.strip()
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out


def check_replay_args(args: argparse.Namespace) -> None:
    """Reject unknown policy names and malformed capacities before the trace loads (a real
    trace takes seconds to minutes to load; a typo should cost nothing)."""
    from skv.policies.registry import policy_class
    from skv.sizing import Capacity, get_model
    from skv.tiers import TierSpec, check_move_policies, check_tier_policy

    for name in args.policies:
        policy_class(name)  # ValueError naming the known policies
    tiers = [TierSpec.parse(t) for t in getattr(args, "tier", [])]
    if tiers:
        for name in args.policies:
            check_tier_policy(name)
        if args.tier_load == "move":
            check_move_policies([t.policy for t in tiers])
    sizes = [*(args.capacity or []), *(t.capacity for t in tiers)]
    for spec in sizes:
        if Capacity.parse(spec).kind == "bytes":
            if args.model is None:
                raise ValueError(f"capacity {spec!r} is in bytes: give a model (--model)")
            get_model(args.model)


def _default_out(kind: str, name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    return Path("outputs") / kind / f"{stamp}_{name}"


def cmd_replay(args: argparse.Namespace) -> int:
    from skv.experiments.replay import timed as tracereplay

    check_replay_args(args)
    timed = tracereplay.wants_timed(
        timed=args.timed,
        cache_token_budget=args.cache_token_budget,
        calibrate=args.calibrate_from_trace,
        latency_model=args.latency_model,
    )
    if args.mode == "flat" and (timed or args.capacity_curve):
        raise ValueError(
            "--mode flat is for the cache-only replay: not with --capacity-curve or the timed "
            "options (a flat stream has no requests to time)"
        )
    if args.tier and (timed or args.capacity_curve):
        raise ValueError(
            "--tier is for the cache-only replay: not with --capacity-curve or the timed "
            "options (docs/tiers.md says where transfer costs are priced)"
        )
    if args.capacity_curve:
        return cmd_replay_curve(args)
    return cmd_replay_timed(args) if timed else cmd_replay_cache_only(args)


def cmd_replay_cache_only(args: argparse.Namespace) -> int:
    from skv.policies.registry import OFFLINE
    from skv.replay import replay_trace, write_results
    from skv.tiers import TierSpec

    # online policies replay a CompactTrace (memory per unique block); offline ones (belady)
    # annotate every access, so they get the whole list
    online = not any(p in OFFLINE for p in args.policies)
    if args.mode == "flat":
        trace, block_size = load_flat(args)
    else:
        trace, block_size = load_compiled_args(args, compact=online)
    tiers = [TierSpec.parse(t) for t in args.tier]
    rows = replay_trace(
        trace,
        args.policies,
        args.capacity,
        model=args.model,
        metrics_every=args.metrics_every,
        progress=None if not args.quiet else False,
        tiers=tiers,
        tier_write=args.tier_write,
        tier_load=args.tier_load,
    )
    out = Path(args.output) if args.output else _default_out("replay", Path(args.trace).stem)
    meta = {
        "trace": str(args.trace),
        "format": args.fmt,
        "block_size": block_size,
        "mode": args.mode,
        "model": args.model,
        "salt_by_tenant": args.salt_by_tenant,
        "limit": args.limit,
        "simulated": "cache-only replay (no timing model); hit rates are simulated",
    }
    if tiers:
        meta["tiers"] = [
            {"name": t.name, "capacity": t.capacity, "policy": t.policy, "link": t.link}
            for t in tiers
        ]
        meta["tier_write"], meta["tier_load"] = args.tier_write, args.tier_load
    write_results(rows, out, meta)
    print(f"{'capacity':>10} {'blocks':>9} {'policy':>18} {'token_hit':>9} {'block_hit':>9}")
    for r in rows:
        print(
            f"{r['capacity']:>10} {r['capacity_blocks']:>9} {r['policy']:>18} "
            f"{r['token_hit_rate']:>9.4f} {r['block_hit_rate']:>9.4f}"
        )
    if args.mode == "flat":
        print(
            "mode flat: every block access its own request (an object cache); token hit = "
            "block hit, request-level numbers mean nothing"
        )
    if tiers:
        print_tiers(rows)
    print(
        f"infinite-cache ceiling: token {rows[0]['ceiling_token_hit_rate']:.4f}, "
        f"block {rows[0]['ceiling_block_hit_rate']:.4f}"
    )
    print(f"results: {out}/replay_results.csv, replay_results.json")
    return 0


def print_tiers(rows: list[dict[str, Any]]) -> None:
    """Per tier: its share of prompt tokens served, and what its link moved."""
    print(
        f"{'capacity':>10} {'policy':>18} {'tier':>8} {'blocks':>9} {'token_hit':>9} "
        f"{'loaded':>10} {'stored':>10} {'loaded GB':>10}"
    )
    for r in rows:
        for t in r["tiers"]:
            gb = t.get("loaded_bytes")
            print(
                f"{r['capacity']:>10} {r['policy']:>18} {t['tier']:>8} {t['capacity_blocks']:>9} "
                f"{t['token_hit_rate']:>9.4f} {t.get('loaded_blocks', ''):>10} "
                f"{t.get('stored_blocks', ''):>10} {'' if gb is None else f'{gb / 1e9:.2f}':>10}"
            )


def load_flat(args: argparse.Namespace) -> tuple[list, int]:
    """``--mode flat``: the trace cut into prefix-keyed blocks one request at a time and
    flattened as it goes (:func:`skv.replay.flatten`): memory is the flat stream, one entry per
    block access."""
    from skv.blocks import iter_blocks
    from skv.replay import flatten
    from skv.traces.cli import load_requests

    requests = load_requests(args.trace, args.fmt, args.limit, cache=args.trace_cache)
    try:
        flat = flatten(
            iter_blocks(requests, args.block_size, "prefix", salt_by_tenant=args.salt_by_tenant)
        )
    except KeyboardInterrupt as exc:
        exc.add_note(f"interrupted while flattening {args.trace}; nothing written")
        raise
    del requests
    if not flat:
        raise ValueError(f"{args.trace}: no block accesses to replay in flat mode")
    return flat, flat[0].block_size


def cmd_replay_curve(args: argparse.Namespace) -> int:
    """``skv replay --capacity-curve``: the hit rate at every capacity (:mod:`skv.mrc`)."""
    from skv.mrc import BELADY_MAX_ACCESSES, capacity_curve, write_capacity_curve
    from skv.replay import resolve_capacities

    # a CompactTrace: the one-pass curve and the samples need memory per unique block only
    trace, block_size = load_compiled_args(args, compact=True)
    extra: list[int] = []
    if args.capacity:
        from skv.replay import trace_totals

        unique = trace_totals(trace).unique_blocks
        extra = [
            c
            for _, c in resolve_capacities(
                args.capacity, block_size=block_size, unique_blocks=unique, model=args.model
            )
        ]
    rows = capacity_curve(
        trace,
        policies=args.policies,
        rates=args.sample_rate,
        points=args.curve_points,
        belady_points=args.belady_points,
        extra_capacities=extra,
        seed=args.sample_seed,
        unit=args.sample_unit,
        progress=False if args.quiet else None,
    )
    out = (
        Path(args.output) if args.output else _default_out("capacity_curve", Path(args.trace).stem)
    )
    meta = {
        "trace": str(args.trace),
        "format": args.fmt,
        "block_size": block_size,
        "mode": args.mode,
        "limit": args.limit,
        "sample_rates": args.sample_rate,
        "sample_seed": args.sample_seed,
        "sample_unit": args.sample_unit,
        "simulated": "cache-only replay; exact_lru is one pass of stack distances, shards a "
        "spatially sampled replay, belady the offline bound (sampled, with its rate, past "
        f"{BELADY_MAX_ACCESSES} block accesses)",
    }
    write_capacity_curve(rows, out, meta)
    print(
        f"{'method':>9} {'policy':>18} {'rate':>6} {'blocks':>9} {'fraction':>8} {'token_hit':>9}"
    )
    for r in rows:
        if r["method"] == "exact_lru" and len(rows) > 40 and r is not rows[-1]:
            continue  # the full curve is in the CSV
        print(
            f"{r['method']:>9} {r['policy']:>18} {r['sample_rate']:>6g} "
            f"{r['capacity_blocks']:>9} {r['capacity_fraction']:>8.4f} {r['token_hit_rate']:>9.4f}"
        )
    print(f"results: {out}/capacity_curve.csv, capacity_curve.json, capacity_curve.png")
    return 0


def cmd_replay_timed(args: argparse.Namespace) -> int:
    """Unpack the Namespace into :func:`skv.experiments.replay.timed.run_timed`; print its table."""
    from skv.experiments.replay.timed import run_timed

    result, out = run_timed(
        args.trace,
        args.policies,
        fmt=args.fmt,
        limit=args.limit,
        capacities=args.capacity,
        cache_token_budget=args.cache_token_budget,
        latency_model=args.latency_model,
        latency_params=parse_latency_params(args.latency_param),
        calibrate=args.calibrate_from_trace,
        model=args.model,
        block_size=args.block_size,
        mode=args.mode,
        salt_by_tenant=args.salt_by_tenant,
        replicas=args.replicas,
        router=args.router,
        max_batch_tokens=args.max_batch_tokens,
        output=args.output,
        output_name=args.output_name,
        progress=False if args.quiet else None,
    )
    if result.fit is not None:
        print(result.fit.report_text())
    print(f"TTFT simulated by the {result.latency.name} latency model")
    print(
        f"{'capacity':>12} {'policy':>18} {'mean_ttft_ms':>12} {'p99_ttft_ms':>11} "
        f"{'tokens_saved':>12} {'token_hit':>9}"
    )
    for r in result.rows:
        print(
            f"{r['capacity']:>12} {r['policy']:>18} {r['sim_ttft_ms_mean']:>12.2f} "
            f"{r['sim_ttft_ms_p99']:>11.2f} {r['tokens_saved']:>12} {r['token_hit_rate']:>9.4f}"
        )
    print(f"results: {out}/replay_summary.md, replay_results.json, replay_metrics.csv")
    return 0


def cmd_shadow(args: argparse.Namespace) -> int:
    """``skv shadow``: the shadow-replay gate (:mod:`skv.experiments.replay.shadow`); exit 0 to
    enable the candidate, 3 to keep the baseline."""
    from skv.blocks import resolve_block_size
    from skv.experiments.replay.shadow import format_verdict, shadow_replay, time_scaled
    from skv.experiments.replay.timed import build_latency
    from skv.replay import compile_trace, resolve_capacities, trace_totals
    from skv.sizing import Capacity
    from skv.traces.cli import load_requests

    requests = time_scaled(load_requests(args.trace, args.fmt, args.limit), args.time_scale)
    bs = resolve_block_size(args.block_size, requests[0])
    unique = None
    if Capacity.parse(args.capacity).kind == "fraction":
        unique = trace_totals(compile_trace(requests, args.block_size)).unique_blocks
    ((_, blocks),) = resolve_capacities(
        [args.capacity], block_size=bs, unique_blocks=unique, model=args.model
    )
    latency, _ = build_latency(
        requests,
        args.latency_model,
        parse_latency_params(args.latency_param),
        calibrate=args.calibrate_from_trace,
        model_preset=args.model,
    )
    verdict = shadow_replay(
        requests,
        candidate=args.candidate,
        baseline=args.baseline,
        candidate_params=parse_latency_params(args.candidate_param),
        slo_p99_s=args.slo_p99,
        latency=latency,
        replicas=args.replicas,
        capacity_blocks=blocks,
        policy=args.policy,
        block_size=args.block_size,
        max_batch_tokens=args.max_batch_tokens,
        min_gain_ms=args.min_gain_ms,
    )
    print(format_verdict(verdict))
    return verdict.exit_code


def register_shadow(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``shadow`` (the routing gate) to the ``skv`` command line; return its parser."""
    from skv.latency import LATENCY_MODELS

    p = subparsers.add_parser(
        "shadow",
        help="shadow-replay gate: replay a trace through a candidate and a baseline router "
        "(simulated); exit 0 = enable the candidate, 3 = keep the baseline",
    )
    p.add_argument("trace", help="trace file or directory (any format skv reads)")
    p.add_argument("--format", dest="fmt", default=None, help="force the trace format")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--block-size", type=int, default=None, help="KV block size in tokens")
    p.add_argument("--candidate", required=True, help="router to enable if it wins")
    p.add_argument(
        "--candidate-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="candidate router parameter, e.g. period_s=5; repeatable",
    )
    p.add_argument("--baseline", default="least_loaded", help="router in service now")
    p.add_argument("--slo-p99", type=float, required=True, help="p99 TTFT SLO in seconds")
    p.add_argument("--replicas", type=int, default=4, help="serving replicas (default 4)")
    p.add_argument(
        "--capacity",
        default="10%",
        help="KV cache per replica: blocks, tokens (50000tok), share of the trace's unique "
        "blocks (10%%, the default) or bytes (30GB, needs --model)",
    )
    p.add_argument("--model", default=None, help="model preset (byte capacities, roofline)")
    p.add_argument("--policy", default="lru", help="eviction policy on every replica")
    p.add_argument("--latency-model", choices=sorted(LATENCY_MODELS), default=None)
    p.add_argument("--latency-param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--calibrate-from-trace", action="store_true")
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="replay X times faster (load scaling)"
    )
    p.add_argument("--max-batch-tokens", type=int, default=8192)
    p.add_argument(
        "--min-gain-ms", type=float, default=0.0, help="p99 gain the candidate must show"
    )
    p.set_defaults(func=cmd_shadow)
    return p


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``replay`` and ``shadow`` to the ``skv`` command line; return replay's parser."""
    p = subparsers.add_parser(
        "replay",
        help="replay a trace through eviction policies (cache only; timed with "
        "--cache-token-budget or --timed)",
    )
    add_trace_args(p, flat=True)
    p.add_argument("--policies", nargs="+", default=["lru"], help="policy names (see skv check)")
    p.add_argument(
        "--capacity",
        nargs="+",
        action="extend",
        default=None,
        help="cache sizes: blocks (4096), tokens (50000tok), share of unique blocks (10%%) or "
        "bytes (30GB, needs --model); repeatable",
    )
    p.add_argument("--model", default=None, help="model preset for byte capacities")
    p.add_argument("--output", default=None, help="output directory")
    p.add_argument(
        "--metrics-every", type=int, default=0, help="log policy metrics every N requests"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_tier_args(p)
    add_timed_args(p)
    add_curve_args(p)
    p.set_defaults(func=cmd_replay)
    register_shadow(subparsers)
    return p
