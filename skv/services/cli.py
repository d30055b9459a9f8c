"""``skv services mock | proxy | router | sim-api | demo-router`` and ``skv collect-mock``: the
services' CLI.

``register(subparsers)`` adds the ``services`` group and, hidden, the old top-level spellings
(``skv serve-mock``, ``skv proxy``, ``skv router``, ``skv sim-api``, ``skv demo-router``: same
arguments, same behaviour). Every server binds 127.0.0.1 unless ``--host`` says otherwise.
Flags override the corresponding ``SKV_*`` environment variables. Every server refuses request
bodies over ``--max-body-bytes`` (``SKV_MAX_BODY_BYTES``, default 4 MiB) with 413; the proxy
and router take ``--connect-timeout`` / ``--first-byte-timeout`` / ``--timeout`` (total) for
their upstream calls (defaults 5 / 60 / 600 s; see ``skv.services.relay.Timeouts``) and
``--tenant-isolation`` (``SKV_TENANT_ISOLATION``, default off: per-tenant router scoring and
each tenant's vLLM ``cache_salt`` on forwarded bodies; see ``skv.services.tenancy``) with
``--tenant-source key|header`` and ``--tenant-keys-file``. Every server takes
``--body-read-timeout`` (``SKV_BODY_READ_TIMEOUT_SECONDS``, default 30 s: request headers, then
the body, must arrive within it; a slow body gets 408 and a closed connection) and
``--max-connections`` (``SKV_MAX_CONNECTIONS``, default 512: beyond it, 503).
``skv services hash-key --tenant NAME`` prints a keys-file line for a key read from stdin
(``--generate``: a new random key). User documentation: ``docs/tenancy.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skv.services._common import (
    DEFAULT_HOST,
    DEFAULT_MAX_CONNECTIONS,
    max_connections_from_env,
    server_options,
)
from skv.services.checks import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    body_read_timeout_from_env,
    max_body_bytes_from_env,
)
from skv.services.relay import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_FIRST_BYTE_TIMEOUT_S,
    DEFAULT_TOTAL_TIMEOUT_S,
)
from skv.services.tenancy import TENANT_SOURCES


def _uvicorn_run(app: Any, host: str, port: int, args: argparse.Namespace | None = None) -> int:
    import uvicorn

    options = server_options(
        _max_connections(args) if args is not None else None,
        _body_read_timeout(args) if args is not None else None,
    )
    uvicorn.run(app, host=host, port=port, log_level="info", **options)
    return 0


def _server_args(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=port, help=f"port (default {port})")
    p.add_argument(
        "--max-body-bytes", type=int, default=None,
        help="413 for larger request bodies (SKV_MAX_BODY_BYTES; default 4 MiB)",
    )  # fmt: skip
    p.add_argument(
        "--body-read-timeout", type=float, default=None,
        help="seconds a request's headers, and then its body, may take to arrive; a slower "
        "body gets 408 and its connection closed (SKV_BODY_READ_TIMEOUT_SECONDS; "
        f"default {DEFAULT_BODY_READ_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--max-connections", type=int, default=None,
        help="concurrent connections before new requests get 503 (SKV_MAX_CONNECTIONS; "
        f"default {DEFAULT_MAX_CONNECTIONS})",
    )  # fmt: skip


def _max_connections(args: argparse.Namespace) -> int:
    value = getattr(args, "max_connections", None)
    return value if value is not None else max_connections_from_env()


def _body_read_timeout(args: argparse.Namespace) -> float:
    value = getattr(args, "body_read_timeout", None)
    return value if value is not None else body_read_timeout_from_env()


def _timeout_args(p: argparse.ArgumentParser, env: str) -> None:
    p.add_argument(
        "--connect-timeout", type=float, default=None,
        help=f"seconds to connect upstream ({env}_CONNECT_TIMEOUT_SECONDS; "
        f"default {DEFAULT_CONNECT_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--first-byte-timeout", type=float, default=None,
        help=f"seconds to the upstream's response headers, and the longest silence in a stream "
        f"({env}_FIRST_BYTE_TIMEOUT_SECONDS; default {DEFAULT_FIRST_BYTE_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float, default=None,
        help=f"total seconds from arrival to last byte ({env}_TIMEOUT_SECONDS; "
        f"default {DEFAULT_TOTAL_TIMEOUT_S:g})",
    )  # fmt: skip


def _isolation_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tenant-isolation", action=argparse.BooleanOptionalAction, default=None,
        help="isolate tenants: forward each tenant's cache_salt, score routing per tenant "
        "(SKV_TENANT_ISOLATION, default off; salts keyed by SKV_TENANT_SALT_SECRET)",
    )  # fmt: skip
    p.add_argument(
        "--tenant-source", choices=TENANT_SOURCES, default=None,
        help="where the tenant comes from: 'key' (the client's API key, default) or 'header' "
        "(X-Tenant-ID, ONLY behind a gateway that strips and sets it) (SKV_TENANT_SOURCE)",
    )  # fmt: skip
    p.add_argument(
        "--tenant-keys-file", default=None,
        help="API keys: '<sha256 hex of the key> <tenant>' per line (skv services hash-key); "
        "also SKV_TENANT_KEYS (SKV_TENANT_KEYS_FILE)",
    )  # fmt: skip

    p.add_argument(
        "--forward-types", action=argparse.BooleanOptionalAction, default=None,
        help="add each prompt's semantic types (names and token counts) to the forwarded body's "
        "vllm_xargs, for skv's vLLM eviction plugin (SKV_FORWARD_TYPES, default off)",
    )  # fmt: skip


def _set_isolation(cfg: Any, args: argparse.Namespace) -> None:
    """``--tenant-isolation`` / ``--no-tenant-isolation`` and ``--forward-types`` override the
    env's settings."""
    if args.tenant_isolation is not None:
        cfg.tenant_isolation = args.tenant_isolation
    if getattr(args, "tenant_source", None) is not None:
        cfg.tenant_source = args.tenant_source
    if getattr(args, "tenant_keys_file", None) is not None:
        cfg.tenant_keys_file = Path(args.tenant_keys_file)
    cfg.body_read_timeout_s = _body_read_timeout(args)
    if args.forward_types is not None:
        cfg.forward_types = args.forward_types


def _max_body(args: argparse.Namespace) -> int:
    return args.max_body_bytes if args.max_body_bytes is not None else max_body_bytes_from_env()


def _mock_args(p: argparse.ArgumentParser) -> None:
    _server_args(p, 8001)
    p.add_argument("--model", default="skv-mock")
    p.add_argument("--policy", default="lru", help="eviction policy of the mock's cache")
    p.add_argument("--cache-tokens", type=int, default=20_000)
    p.add_argument("--latency", default="linear", help="latency model (skv.latency)")
    p.add_argument(
        "--time-scale", type=float, default=1.0,
        help="really wait time_scale * simulated TTFT (0: answer at once)",
    )  # fmt: skip
    p.add_argument("--itl-ms", type=float, default=5.0, help="simulated inter-token latency")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--name", default="mock", help="engine name (metrics label)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-status", type=int, default=None, help="fault: answer this status")
    p.add_argument("--delay", type=float, default=0.0, help="fault: seconds before answering")
    p.add_argument("--drop-after-chunks", type=int, default=None, help="fault: break streams")


def _proxy_args(p: argparse.ArgumentParser) -> None:
    _server_args(p, 8010)
    p.add_argument("--upstream", default=None, help="upstream base URL (SKV_UPSTREAM_BASE_URL)")
    p.add_argument("--trace-dir", default=None, help="trace directory (SKV_TRACE_OUTPUT_DIR)")
    p.add_argument(
        "--redact", action=argparse.BooleanOptionalAction, default=None,
        help="store no prompt/response text (SKV_REDACT_TEXT, default true)",
    )  # fmt: skip
    _timeout_args(p, "SKV_PROXY")
    _isolation_arg(p)


def _router_args(p: argparse.ArgumentParser) -> None:
    from skv.services.router import POLICIES

    _server_args(p, 8020)
    p.add_argument("--replicas", default=None, help="comma-separated base URLs (SKV_REPLICAS)")
    p.add_argument("--policy", choices=POLICIES, default=None, help="SKV_ROUTING_POLICY")
    p.add_argument("--routing-dir", default=None, help="decision log dir (outputs/routing)")
    _timeout_args(p, "SKV_ROUTER")
    p.add_argument(
        "--kv-events",
        default=None,
        help="precise: comma-separated KV-event ZMQ endpoints, one per replica (SKV_KV_EVENTS)",
    )
    p.add_argument("--kv-events-topic", default=None, help="SKV_KV_EVENTS_TOPIC (kv-events)")
    _isolation_arg(p)


def _sim_api_args(p: argparse.ArgumentParser) -> None:
    _server_args(p, 8000)
    p.add_argument("--policy", default=None, help="SKV_SIM_POLICY (default lru)")
    p.add_argument("--cache-tokens", type=int, default=None, help="SKV_SIM_CACHE_TOKENS")


def _demo_router_args(p: argparse.ArgumentParser) -> None:
    from skv.services.router import POLICIES

    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--requests", type=int, default=120)
    simulated = [name for name in POLICIES if name != "precise"]  # needs engines' KV events
    p.add_argument("--policies", nargs="+", choices=simulated, default=simulated)
    p.add_argument("--replica-cache-tokens", type=int, default=12_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routing-dir", default=None, help="also log decisions there")
    p.add_argument(
        "--verbose", dest="http_log", action="store_true",
        help="show the HTTP access log lines (two per request and policy; off by default)",
    )  # fmt: skip


def cmd_serve_mock(args: argparse.Namespace) -> int:
    from skv.services.mock_backend import Faults, MockConfig, create_app

    cfg = MockConfig(
        model=args.model, policy=args.policy, cache_tokens=args.cache_tokens,
        latency=args.latency, time_scale=args.time_scale, itl_ms=args.itl_ms,
        max_tokens=args.max_tokens, seed=args.seed, name=args.name,
        max_body_bytes=_max_body(args), body_read_timeout_s=_body_read_timeout(args),
    )  # fmt: skip
    faults = Faults(
        delay_s=args.delay, fail_status=args.fail_status, drop_after_chunks=args.drop_after_chunks
    )
    return _uvicorn_run(create_app(cfg, faults), args.host, args.port, args)


def cmd_proxy(args: argparse.Namespace) -> int:
    from skv.services.proxy import ProxyConfig, create_app

    cfg = ProxyConfig.from_env()
    if args.upstream:
        cfg.upstream_base_url = args.upstream
    if args.trace_dir:
        cfg.trace_output_dir = Path(args.trace_dir)
    if args.redact is not None:
        cfg.redact_text = args.redact
    _set_timeouts(cfg, args)
    _set_isolation(cfg, args)
    cfg.max_body_bytes = _max_body(args)
    app = create_app(cfg)
    iso = "; tenant isolation on" if cfg.tenant_isolation else ""
    print(f"proxy -> {cfg.upstream_base_url}; trace: {app.state.writer.path}{iso}")
    return _uvicorn_run(app, args.host, args.port, args)


def _set_timeouts(cfg: Any, args: argparse.Namespace) -> None:
    """The timeout flags given override the config's (its env values)."""
    for flag in ("connect_timeout", "first_byte_timeout", "timeout"):
        if getattr(args, flag) is not None:
            setattr(cfg, f"{flag}_s", getattr(args, flag))
    cfg.timeouts  # noqa: B018  (checks them: a clear error before the server starts)


def cmd_router(args: argparse.Namespace) -> int:
    from skv.services.router import RouterConfig, create_app

    if args.replicas:
        os.environ["SKV_REPLICAS"] = args.replicas
    if args.policy:
        os.environ["SKV_ROUTING_POLICY"] = args.policy
    if args.routing_dir:
        os.environ["SKV_ROUTING_OUTPUT_DIR"] = args.routing_dir
    if args.kv_events:
        os.environ["SKV_KV_EVENTS"] = args.kv_events
    if args.kv_events_topic:
        os.environ["SKV_KV_EVENTS_TOPIC"] = args.kv_events_topic
    cfg = RouterConfig.from_env()
    _set_timeouts(cfg, args)
    _set_isolation(cfg, args)
    cfg.max_body_bytes = _max_body(args)
    iso = "; tenant isolation on" if cfg.tenant_isolation else ""
    print(f"router ({cfg.policy}) over {', '.join(cfg.replicas)}{iso}")
    return _uvicorn_run(create_app(cfg), args.host, args.port, args)


def cmd_sim_api(args: argparse.Namespace) -> int:
    from skv.services.sim_api import SimConfig, create_app

    cfg = SimConfig.from_env()
    if args.policy:
        cfg.policy = args.policy
    if args.cache_tokens is not None:
        cfg.cache_tokens = args.cache_tokens
    cfg.max_body_bytes = _max_body(args)
    cfg.body_read_timeout_s = _body_read_timeout(args)
    return _uvicorn_run(create_app(cfg), args.host, args.port, args)


async def demo_policy(
    policy: str,
    n_replicas: int,
    calls: list[Any],
    replica_cache_tokens: int,
    routing_dir: Path | None,
) -> dict[str, Any]:
    """Route ``calls`` (``skv.services.collect.mock_calls``) through an in-process router to
    in-process mock replicas; returns per-replica counts and the token hit rate the replicas
    reported."""
    import httpx

    from skv.services.mock_backend import MockConfig
    from skv.services.mock_backend import create_app as mock_app
    from skv.services.router import RouterConfig
    from skv.services.router import create_app as router_app

    apps = [
        mock_app(MockConfig(name=f"r{i}", cache_tokens=replica_cache_tokens, max_tokens=16))
        for i in range(n_replicas)
    ]
    urls = [f"http://replica-{i}" for i in range(n_replicas)]
    mounts = {u: httpx.ASGITransport(a) for u, a in zip(urls, apps, strict=True)}
    cfg = RouterConfig(replicas=urls, policy=policy, routing_output_dir=routing_dir)
    app = router_app(cfg, mounts=mounts)
    history: dict[str, list[dict[str, Any]]] = {}
    prompt = cached = 0
    ttft: list[float] = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://router", timeout=30
    ) as client:
        for c in calls:
            msgs = history.setdefault(c.session_id, [{"role": "system", "content": c.system}])
            msgs.extend(c.new_messages)
            body: dict[str, Any] = {"model": "skv-mock", "messages": list(msgs)}
            if c.tools:
                body["tools"] = c.tools
            r = await client.post(
                "/v1/chat/completions", json=body,
                headers={"X-Session-ID": c.session_id, "X-Tenant-ID": c.tenant_id},
            )  # fmt: skip
            r.raise_for_status()
            data = r.json()
            usage = data["usage"]
            prompt += usage["prompt_tokens"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            ttft.append(data["skv_mock"]["simulated_ttft_ms"])
            msgs.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
    return {
        "policy": policy,
        "distribution": [a.state.engine.calls for a in apps],
        "hit_rate": cached / prompt if prompt else 0.0,
        "mean_simulated_ttft_ms": sum(ttft) / len(ttft) if ttft else 0.0,
    }


#: loggers that write one line per HTTP request
HTTP_LOGGERS = ("httpx", "httpx2", "httpcore", "uvicorn.access")


@contextlib.contextmanager
def quiet_http_logs(quiet: bool = True) -> Iterator[None]:
    """Silence per-request HTTP log lines while the block runs: the demo sends hundreds of
    requests in-process and its table would drown in them."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in HTTP_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def cmd_demo_router(args: argparse.Namespace) -> int:
    from skv.services.collect import mock_calls

    if args.replicas < 1 or args.requests < 1:
        raise ValueError("--replicas and --requests must be >= 1")
    calls = mock_calls(args.requests, seed=args.seed)
    routing_dir = Path(args.routing_dir) if args.routing_dir else None
    print(
        f"{args.requests} mock requests (seed {args.seed}) over {args.replicas} in-process mock "
        f"replicas of {args.replica_cache_tokens} cache tokens each; TTFT simulated (linear)"
    )
    print(
        f"{'policy':<18} {'requests per replica':<24} {'token hit rate':>14} {'mean TTFT ms':>13}"
    )
    for policy in args.policies:
        with quiet_http_logs(not getattr(args, "http_log", False)):
            res = asyncio.run(
                demo_policy(policy, args.replicas, calls, args.replica_cache_tokens, routing_dir)
            )
        dist = "/".join(str(x) for x in res["distribution"])
        print(
            f"{policy:<18} {dist:<24} {res['hit_rate']:>14.1%} "
            f"{res['mean_simulated_ttft_ms']:>13.1f}"
        )
    return 0


def _hash_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True, help="the tenant the key belongs to")
    p.add_argument(
        "--generate", action="store_true",
        help="make a new random key (printed once, on stderr: give it to the tenant)",
    )  # fmt: skip


def cmd_hash_key(args: argparse.Namespace) -> int:
    """Print a keys-file line for a key read from stdin (never from the command line, where
    other users' ``ps`` would see it), or for a new random key with ``--generate``."""
    import secrets
    import sys

    from skv.services.tenancy import hash_key

    tenant = args.tenant.strip()
    if not tenant or not tenant.isprintable():
        raise ValueError("--tenant must be a non-empty printable name")
    if args.generate:
        key = "skv-" + secrets.token_urlsafe(32)
        print(f"key for {tenant} (shown once): {key}", file=sys.stderr)
    else:
        if sys.stdin.isatty():
            import getpass

            key = getpass.getpass("API key: ")
        else:
            key = sys.stdin.readline().rstrip("\r\n")
        if not key.strip():
            raise ValueError("no key on stdin (or use --generate)")
    print(f"{hash_key(key)} {tenant}")
    return 0


@dataclass(frozen=True)
class ServiceCommand:
    """``skv services NAME``, also spelled ``skv OLD`` (hidden, as before the grouping)."""

    name: str
    old: str | None  # None: only ``skv services NAME``
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    func: Callable[[argparse.Namespace], int]


COMMANDS = (
    ServiceCommand(
        "mock",
        "serve-mock",
        "mock OpenAI-compatible engine (skv prefix cache + latency model; simulated TTFT)",
        _mock_args,
        cmd_serve_mock,
    ),
    ServiceCommand(
        "proxy",
        "proxy",
        "telemetry proxy: forward upstream, record an skv trace",
        _proxy_args,
        cmd_proxy,
    ),
    ServiceCommand(
        "router",
        "router",
        "cache-locality router over OpenAI-compatible replicas",
        _router_args,
        cmd_router,
    ),
    ServiceCommand(
        "sim-api",
        "sim-api",
        "simulation API: POST /v1/simulate/request",
        _sim_api_args,
        cmd_sim_api,
    ),
    ServiceCommand(
        "hash-key",
        None,
        "print a tenant keys-file line ('<sha256 hex> <tenant>') for a key read from stdin",
        _hash_key_args,
        cmd_hash_key,
    ),
    ServiceCommand(
        "demo-router",
        "demo-router",
        "in-process routing demo over mock replicas: distribution and hit rate per policy",
        _demo_router_args,
        cmd_demo_router,
    ),
)


def register_collect(sub: Any) -> None:
    """Add ``skv collect-mock`` (a trace recorded from the mock engine) to the CLI."""
    from skv.services.collect import DEFAULT_LIVE_DIR

    p = sub.add_parser(
        "collect-mock",
        help="record a replayable trace from a deterministic mock serving engine",
        description="Serve seeded chat/RAG/agent sessions with a mock engine (prefix cache + "
        "linear TTFT model), segment every prompt and write an skv JSONL trace with the "
        "observed (mock-simulated) TTFT and cached tokens.",
    )
    p.add_argument("--requests", type=int, default=50, help="requests to record")
    p.add_argument("--output-name", default="mock_trace", help="trace name (file stem)")
    p.add_argument(
        "--output",
        default=None,
        help=f"output file (default {DEFAULT_LIVE_DIR}/<output-name>.jsonl)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the traffic and the mock")
    p.add_argument(
        "--redact",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep only content hashes, token counts, labels and timing (default; "
        "--no-redact keeps prompt and response text)",
    )
    p.add_argument("--tokenizer", default=None, help="'simple' (default) or a tokenizer.json path")
    p.add_argument(
        "--session-rate", type=float, default=0.5, help="new sessions per second (Poisson)"
    )
    p.add_argument(
        "--mock-cache-tokens", type=int, default=20_000, help="the mock engine's prefix cache"
    )
    p.set_defaults(func=cmd_collect_mock)


def cmd_collect_mock(args: argparse.Namespace) -> int:
    from skv.services.collect import DEFAULT_LIVE_DIR, MockHandler, collect_mock

    if args.requests < 1:
        raise ValueError(f"--requests must be >= 1, got {args.requests}")
    out = Path(args.output) if args.output else DEFAULT_LIVE_DIR / f"{args.output_name}.jsonl"
    handler = MockHandler(
        seed=args.seed, tokenizer=args.tokenizer, cache_tokens=args.mock_cache_tokens
    )
    reqs = collect_mock(
        args.requests,
        out,
        seed=args.seed,
        redact=args.redact,
        tokenizer=args.tokenizer,
        handler=handler,
        session_rate_rps=args.session_rate,
    )
    prompt = sum(r.prompt_tokens for r in reqs)
    cached = sum(r.observed_cached_tokens or 0 for r in reqs)
    ttft = [r.observed_ttft_ms for r in reqs if r.observed_ttft_ms is not None]
    mean = sum(ttft) / len(ttft) if ttft else math.nan
    print(
        f"wrote {len(reqs)} requests to {out} ({'redacted' if args.redact else 'with text'}); "
        f"sessions {len({r.session_id for r in reqs})}, prompt tokens {prompt}, "
        f"mock-cached {cached} ({cached / prompt if prompt else 0:.1%}), "
        f"mean mock TTFT {mean:.1f} ms (simulated by the mock handler)"
    )
    print(
        f"replay it: skv replay {out} --cache-token-budget 10000 --policies lru adaptive_semantic"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``skv services ...`` and the hidden old spellings; return the group's parser."""
    group = subparsers.add_parser(
        "services",
        help="mock | proxy | router | sim-api | demo-router: mock engine, telemetry proxy, "
        "cache-aware router, simulation API, in-process routing demo",
    )
    gsub = group.add_subparsers(dest="services_command", required=True)
    for c in COMMANDS:
        p = gsub.add_parser(c.name, help=c.help, description=c.help)
        c.add_args(p)
        p.set_defaults(func=c.func)
    for c in COMMANDS:
        if c.old is None:
            continue
        # no help=: `skv --help` does not list it; it parses exactly as `skv services NAME`
        p = subparsers.add_parser(c.old, description=f"{c.help} (= skv services {c.name})")
        c.add_args(p)
        p.set_defaults(func=c.func)
    return group
