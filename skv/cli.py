"""The ``skv`` command line: thin wrappers over the library, one subcommand per task."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("skv")


def _add_trace_args(p: argparse.ArgumentParser) -> None:
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
        choices=["prefix", "segment"],
        default="prefix",
        help="block keying: exact prefix (vLLM) or position-independent segments",
    )
    p.add_argument(
        "--salt-by-tenant",
        action="store_true",
        help="salt each chain with the tenant id (vLLM cache_salt isolation)",
    )
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")


def _load(args: argparse.Namespace):
    from skv.replay import compile_trace
    from skv.traces import load_trace

    requests = load_trace(args.trace, args.fmt)
    if args.limit is not None:
        requests = requests[: args.limit]
    if not requests:
        raise SystemExit(f"{args.trace}: no requests")
    trace = compile_trace(requests, args.block_size, args.mode, salt_by_tenant=args.salt_by_tenant)
    return requests, trace, trace[0].block_size


def _service_apps() -> dict[str, Any]:
    """Name -> a builder of each FastAPI app with a harmless config (nothing is contacted)."""
    from skv.services import mock_backend, proxy, router, sim_api

    return {
        "mock backend": lambda: mock_backend.create_app(mock_backend.MockConfig()),
        "telemetry proxy": lambda: proxy.create_app(proxy.ProxyConfig()),
        "router": lambda: router.create_app(
            router.RouterConfig(replicas=["http://127.0.0.1:9"], routing_output_dir=None)
        ),
        "simulation API": lambda: sim_api.create_app(sim_api.SimConfig()),
    }


def check_service_apps() -> list[str]:
    """Build the four service apps and answer ``GET /health`` in process (no server, no port),
    as the seed's project check imported its FastAPI apps; returns the problems found."""
    import asyncio

    import httpx

    from skv.services.cli import quiet_http_logs

    async def health(app: Any) -> int:
        async with app.router.lifespan_context(app):  # startup and shutdown: resources close
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://check") as client:
                return (await client.get("/health")).status_code

    problems = []
    for name, build in _service_apps().items():
        try:
            with quiet_http_logs():
                status = asyncio.run(health(build()))
            if status != 200:
                raise RuntimeError(f"GET /health answered {status}")
            print(f"ok      app {name}")
        except Exception as exc:  # report every broken app, not just the first
            problems.append(f"app {name}: {exc}")
            print(f"FAILED  app {name}: {exc}")
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    """Verify the install: imports, registries, experiment configs, trace directory."""
    import importlib

    from skv.policies.registry import check_all

    problems = []
    for mod in (
        "skv.model",
        "skv.blocks",
        "skv.sizing",
        "skv.segmenter",
        "skv.tokenize",
        "skv.cache.radix",
        "skv.cache.vllm_pool",
        "skv.replay",
        "skv.traces",
        "skv.latency",
        "skv.workloads",
        "skv.sim",
        "skv.experiments",
        "skv.tracereplay",
        "skv.collect",
        "skv.vllm",
        "skv.services",
    ):
        try:
            importlib.import_module(mod)
            print(f"ok      import {mod}")
        except Exception as exc:  # report every broken piece, not just the first
            problems.append(f"import {mod}: {exc}")
            print(f"FAILED  import {mod}: {exc}")
    try:
        problems += check_service_apps()
    except Exception as exc:  # fastapi itself missing
        problems.append(f"service apps: {exc}")
        print(f"FAILED  service apps: {exc}")
    try:
        names = check_all()
        print(f"ok      policies: {', '.join(names)}")
    except Exception as exc:
        problems.append(f"policies: {exc}")
        print(f"FAILED  policies: {exc}")
    try:
        from skv.traces import FORMATS, trace_dir

        print(f"ok      trace formats: {', '.join(FORMATS)}")
        where = trace_dir()
        print(f"info    trace directory: {where or 'not found (set SKV_TRACE_DIR)'}")
    except Exception as exc:
        problems.append(f"traces: {exc}")
        print(f"FAILED  traces: {exc}")
    from skv._build import build_status

    status = build_status()
    states = sorted(set(status.values()))
    if "stale" in states:
        stale = [rel for rel, st in status.items() if st == "stale"]
        problems.append(f"stale compiled modules: {', '.join(stale)}")
        print(
            f"FAILED  compiled hot path is older than its source: {', '.join(stale)} "
            "(rebuild: python setup.py build_ext --inplace)"
        )
    elif states == ["compiled"]:
        print(f"ok      hot path compiled ({len(status)} modules)")
    else:
        print(
            "info    hot path runs as plain Python (no C compiler at install): slower, same results"
        )
    root = Path(__file__).resolve().parent.parent
    try:
        from skv.experiments.config import load_config
        from skv.experiments.runner import NOT_EXPERIMENTS

        configs = [
            p
            for p in sorted((root / "experiments").glob("*.yaml"))
            if p.name not in NOT_EXPERIMENTS
        ]

        for path in configs:
            load_config(path)
        print(f"ok      experiment configs: {len(configs)} valid in {root / 'experiments'}")
    except Exception as exc:
        problems.append(f"experiment configs: {exc}")
        print(f"FAILED  experiment configs: {exc}")
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print("skv is installed correctly")
    return 0


def cmd_traces_info(args: argparse.Namespace) -> int:
    from skv.traces.info import format_info, trace_info

    requests, _, block_size = _load(args)
    print(format_info(trace_info(requests, block_size=block_size, mode=args.mode)))
    return 0


def cmd_traces_convert(args: argparse.Namespace) -> int:
    requests, trace, _ = _load(args)
    out = Path(args.output)
    if args.to == "skv":
        from skv.traces.native import write_skv_trace

        write_skv_trace(out, requests, {"source": str(args.trace)})
    else:
        from skv.traces.oracle_general import write_oracle_general

        write_oracle_general(out, trace)
    log.info("wrote %s", out)
    return 0


def check_replay_args(args: argparse.Namespace) -> None:
    """Reject unknown policy names and malformed capacities before the trace loads (a real
    trace takes seconds to minutes to load; a typo should cost nothing)."""
    from skv.policies.registry import policy_class
    from skv.sizing import Capacity, get_model

    for name in args.policies:
        policy_class(name)  # ValueError naming the known policies
    for spec in args.capacity or []:
        if Capacity.parse(spec).kind == "bytes":
            if args.model is None:
                raise ValueError(f"capacity {spec!r} is in bytes: give a model (--model)")
            get_model(args.model)


def cmd_replay(args: argparse.Namespace) -> int:
    from skv import tracereplay
    from skv.replay import replay_trace, write_results

    check_replay_args(args)
    if tracereplay.wants_timed(args):
        return tracereplay.run_timed(args)
    _, trace, block_size = _load(args)
    rows = replay_trace(
        trace,
        args.policies,
        args.capacity,
        model=args.model,
        metrics_every=args.metrics_every,
        progress=None if not args.quiet else False,
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
    write_results(rows, out, meta)
    print(f"{'capacity':>10} {'blocks':>9} {'policy':>18} {'token_hit':>9} {'block_hit':>9}")
    for r in rows:
        print(
            f"{r['capacity']:>10} {r['capacity_blocks']:>9} {r['policy']:>18} "
            f"{r['token_hit_rate']:>9.4f} {r['block_hit_rate']:>9.4f}"
        )
    print(
        f"infinite-cache ceiling: token {rows[0]['ceiling_token_hit_rate']:.4f}, "
        f"block {rows[0]['ceiling_block_hit_rate']:.4f}"
    )
    print(f"results: {out}/replay_results.csv, replay_results.json")
    return 0


def _default_out(kind: str, name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    return Path("outputs") / kind / f"{stamp}_{name}"


def build_parser() -> argparse.ArgumentParser:
    from skv import collect, tracereplay
    from skv.experiments.cli import register as register_experiments
    from skv.services.cli import register as register_services
    from skv.vllm.cli import register as register_vllm

    parser = argparse.ArgumentParser(
        prog="skv",
        description="KV-cache management research artifact: eviction, segment reuse, routing.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="verify the install (imports, registries, configs)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "replay",
        help="replay a trace through eviction policies (cache only; timed with "
        "--cache-token-budget or --timed)",
    )
    _add_trace_args(p)
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
    tracereplay.add_timed_args(p)
    p.set_defaults(func=cmd_replay)
    collect.register(sub)

    traces = sub.add_parser("traces", help="inspect and convert traces")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
    p = tsub.add_parser("info", help="requests, span, blocks, hit ceiling, type mix")
    _add_trace_args(p)
    p.set_defaults(func=cmd_traces_info)
    p = tsub.add_parser("convert", help="write a trace as skv JSONL or libCacheSim oracleGeneral")
    _add_trace_args(p)
    p.add_argument("--to", choices=["skv", "oracle_general"], required=True)
    p.add_argument("output", help="output file")
    p.set_defaults(func=cmd_traces_convert)
    register_experiments(sub)
    register_services(sub)
    register_vllm(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "capacity", "absent") is None:
        args.capacity = ["10%"]
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"skv: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
