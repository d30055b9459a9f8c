"""The ``skv`` command line: registers each domain's own cli module (:data:`DOMAINS`)."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
        "skv.experiments.replay.timed",
        "skv.services.collect",
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
            "FAILED  compiled hot path is older than its source (or not built): "
            f"{', '.join(stale)} (rebuild: python setup.py build_ext --inplace)"
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
        from skv.experiments.outputs import SUITE_DIR

        configs = sorted((root / SUITE_DIR).glob("*.yaml"))
        for path in configs:
            load_config(path)
        print(f"ok      experiment configs: {len(configs)} valid in {root / SUITE_DIR}")
    except Exception as exc:
        problems.append(f"experiment configs: {exc}")
        print(f"FAILED  experiment configs: {exc}")
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print("skv is installed correctly")
    return 0


def register_check(subparsers: argparse._SubParsersAction) -> None:
    """Add ``check`` to the ``skv`` command line."""
    p = subparsers.add_parser("check", help="verify the install (imports, registries, configs)")
    p.set_defaults(func=cmd_check)


Register = Callable[[argparse._SubParsersAction], Any]


def domains() -> list[tuple[str, list[Register]]]:
    """Each domain's title for ``skv --help`` and the ``register`` functions of its cli modules."""
    from skv.artifact import cli as artifact_cli
    from skv.experiments import cli as experiments_cli
    from skv.experiments.leaderboard.cli import register as register_leaderboard
    from skv.experiments.replay.cli import register as register_replay
    from skv.services import cli as services_cli
    from skv.traces import cli as traces_cli
    from skv.vllm import cli as vllm_cli

    return [
        ("install", [register_check]),
        (
            "traces and cache-only replay",
            [traces_cli.register, register_replay, register_leaderboard],
        ),
        ("serving simulation", [experiments_cli.register, services_cli.register_collect]),
        ("paper pipeline", [artifact_cli.register]),
        ("services (servers bind 127.0.0.1)", [services_cli.register]),
        ("real vLLM engine", [vllm_cli.register]),
    ]


def _epilog(groups: dict[str, list[tuple[str, str]]]) -> str:
    """The commands by domain, and the old spellings of the service commands."""
    from skv.services.cli import COMMANDS as SERVICES

    width = max(len(name) for cmds in groups.values() for name, _ in cmds) + 6
    lines = ["commands (skv COMMAND --help for each):"]
    for title, cmds in groups.items():
        lines.append(f"  {title}:")
        for name, help_text in cmds:
            lines += textwrap.wrap(
                help_text, 100, initial_indent=f"    {name}".ljust(width),
                subsequent_indent=" " * width, break_on_hyphens=False,
            )  # fmt: skip
    lines.append("  old spellings, still accepted (hidden):")
    renamed = [c for c in SERVICES if c.old is not None]
    lines.append(f"    skv {'|'.join(str(c.old) for c in renamed)} ...")
    lines.append(f"    = skv services {'|'.join(c.name for c in renamed)} ...")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``skv`` parser: each domain's cli module adds its commands (:func:`domains`)."""
    parser = argparse.ArgumentParser(
        prog="skv",
        description="KV-cache management research artifact: eviction, segment reuse, routing.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of the commands below"
    )
    # argparse lists subcommands in one flat block; list them by domain in the epilog instead.
    # One entry per command added with help= (hidden aliases add none).
    listed = sub._choices_actions
    groups: dict[str, list[tuple[str, str]]] = {}
    for title, registers in domains():
        before = len(listed)
        for register in registers:
            register(sub)
        groups[title] = [(a.dest, a.help or "") for a in listed[before:]]
    del listed[:]
    parser.epilog = _epilog(groups)
    return parser


#: exit status after Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input exits 2 with one ``skv: error:`` line; Ctrl-C exits 130
    with no traceback, saying what was finished and where (the notes commands add to the
    KeyboardInterrupt on its way up)."""
    try:
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
            notes = getattr(exc, "__notes__", [])  # e.g. the sweep task that failed
            print("\n".join([f"skv: error: {exc}", *(f"  {n}" for n in notes)]), file=sys.stderr)
            return 2
    except KeyboardInterrupt as exc:
        notes = getattr(exc, "__notes__", [])
        lines = ["skv: interrupted", *(f"  {n}" for n in notes)]
        print("\n".join(lines), file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
