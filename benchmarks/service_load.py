"""Load held through the services: client -> proxy -> router -> 2 mock engines, a replica killed.

Issue 33's load benchmark (a benchmark, not a timed test). Four processes, each started with the
CLI (``skv services mock|router|proxy``) on a free 127.0.0.1 port: two mock engines, the router
over both (``SKV_REPLICAS``; cache-aware ``prefix_locality`` by default) and the telemetry proxy
in front of it (``--upstream`` = the router). One asyncio client (httpx) sends ``--requests``
OpenAI-style requests (default 20,000) at ``--concurrency`` (default 128) to the proxy: chat and
completion requests, streamed and not, in turn. Prompts share prefixes: one of 8 long system
prompts, then the document of one of 256 sessions, then a question of their own, so the
router's cache-aware ranking has real prefixes to follow. After ``--kill-at`` of the requests
(default 40%) have been answered, mock 0 is killed with SIGKILL; the load keeps going; after
``--down`` seconds it is started again on the same port, and the run waits for its health.

Every request ends in exactly one of these, as its client saw it:

- ``ok``: HTTP 200 and a whole answer (a completion with text, or a stream ending ``[DONE]``);
- failed, surfaced: an HTTP error status with a JSON error (``http_<status>``), or a 200 stream
  that ends with an SSE error event (``stream_error``: what the router sends when the engine it
  was relaying died mid-stream; the client knows the request failed);
- ``truncated``: a response began (status and headers came) but its body was cut off or is not
  an answer, with no error in it;
- **lost**: the client got no HTTP response at all: a transport error (connection refused or
  reset, protocol error) or no response within the client timeout (``--client-timeout``).

``lost`` and ``truncated`` are what the services must never do (the router fails over to the
other replica on a connection error or 5xx before any byte reached the client; a stream cut
after its first byte cannot be retried and ends with an error event). The proxy's trace and the
router's decision log are counted too (one record per request each).

Reported (printed and in the JSON): counts by outcome; client-side latency (send to last byte,
every answered request) p50/p90/p99, overall and per phase by the time the request was SENT:
``before_kill``, ``replica_down`` (from the kill until the restarted mock answers its health
check), ``after_restart``; the router's counters (routed per replica, failovers, replica
failures, requests every replica failed) at the kill, at the restart and at the end; the RSS of
each service process (psutil, else /proc/PID/status) at start (healthy, before the load), peak
and end (after the load), growth = end - start; the restarted mock is its own process
(``mock0_restarted``) and the killed one ends at its last sample before the kill.

Output: ``build/bench/service_load.json`` (``--out``; written whole or not at all) with the
machine (:func:`skv.artifact.timings.machine`), the date, the arguments and the git commit; the
services' logs, the proxy's trace and the router's decision log under ``--work-dir``
(``build/bench/service_load/``, emptied first).

Run: ``python benchmarks/service_load.py [--requests 20000] [--concurrency 128]`` or
``--quick`` (2,000 requests at concurrency 32).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from skv.artifact.timings import machine, write_json

REPO = Path(__file__).resolve().parent.parent

log = logging.getLogger("bench")

DEFAULT_OUT = REPO / "build" / "bench" / "service_load.json"
DEFAULT_WORK = REPO / "build" / "bench" / "service_load"
SYSTEMS = 8
SESSIONS = 256
KINDS = (("chat", False), ("chat", True), ("completion", False), ("completion", True))
PHASES = ("before_kill", "replica_down", "after_restart")
MIB = 2**20

# ----------------------------------------------------------------------------- workload

_TOPICS = (
    "billing",
    "networking",
    "storage",
    "accounts",
    "databases",
    "security",
    "mobile",
    "printing",
)


def system_prompt(k: int) -> str:
    topic = _TOPICS[k % len(_TOPICS)]
    rule = (
        f"You are the {topic} assistant of the support team. Answer briefly, cite the "
        f"{topic} manual by section, never invent a section, and ask for the ticket number "
        f"when the customer has not given one. "
    )
    return rule * 4


def session_document(s: int) -> str:
    return (
        f"Ticket {s:04d}: the customer reports that step {s % 17} of the setup fails with "
        f"code {1000 + s}. Logs attached: " + f"line {s}-{s % 7} ok; " * 12
    )


def request_body(i: int, max_tokens: int) -> tuple[str, dict[str, Any], str]:
    """(endpoint, body, session id) of request ``i``: a shared system prompt, a session's
    document, a question of its own; chat and completion, streamed and not, in turn."""
    session = (i * 7919) % SESSIONS
    system, doc = system_prompt(session % SYSTEMS), session_document(session)
    question = f"Question {i}: what should the customer try next?"
    kind, stream = KINDS[i % len(KINDS)]
    body: dict[str, Any] = {"model": "skv-mock", "max_tokens": max_tokens, "stream": stream}
    if kind == "chat":
        body["messages"] = [
            {"role": "system", "content": system},
            {"role": "user", "content": doc + "\n" + question},
        ]
        return "/v1/chat/completions", body, f"s-{session}"
    body["prompt"] = system + "\n" + doc + "\n" + question
    return "/v1/completions", body, f"s-{session}"


def classify(status: int, body: bytes, stream: bool) -> str:
    """How an HTTP response ended, as its client sees it (see the module docstring)."""
    if status != 200:
        try:
            err = json.loads(body)["error"]
            ok = isinstance(err, dict) and isinstance(err.get("message"), str)
        except (ValueError, KeyError, TypeError):
            ok = False
        return f"http_{status}" if ok else "truncated"
    text = body.decode("utf-8", "replace")
    if not stream:
        try:
            choice = json.loads(text)["choices"][0]
            answer = choice.get("message", {}).get("content") or choice.get("text")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return "truncated"
        return "ok" if answer else "truncated"
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    if events and events[-1] == "[DONE]":
        return "ok"
    if events:
        try:
            if "error" in json.loads(events[-1]):
                return "stream_error"
        except (ValueError, TypeError):
            pass
    return "truncated"


# ----------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skv_cli() -> list[str]:
    """The ``skv`` console script beside this Python, else the same ``main`` through ``-c``."""
    script = Path(sys.executable).with_name("skv")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from skv.cli import main; sys.exit(main())"]


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (None once it is gone)."""
    try:
        import psutil

        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None
    except ImportError:
        pass
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Memory:
    """RSS samples of one process (one instance: a restarted mock is another)."""

    start: int | None = None
    peak: int = 0
    last: int | None = None
    samples: int = 0

    def sample(self, pid: int) -> None:
        rss = rss_bytes(pid)
        if rss is None:
            return
        if self.start is None:
            self.start = rss
        self.peak = max(self.peak, rss)
        self.last = rss
        self.samples += 1

    def report(self, note: str | None = None) -> dict[str, Any]:
        mib = lambda b: None if b is None else round(b / MIB, 1)  # noqa: E731
        growth = None if self.start is None or self.last is None else self.last - self.start
        out = {
            "start_mib": mib(self.start),
            "peak_mib": mib(self.peak or None),
            "end_mib": mib(self.last),
            "growth_mib": mib(growth),
            "samples": self.samples,
        }
        if note:
            out["note"] = note
        return out


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as out:
            out.write(f"--- start {self.starts}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (uvicorn shuts down, the proxy closes its trace), SIGKILL if it hangs."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def failed_start(self) -> str:
        return (
            f"{self.name} exited ({self.proc and self.proc.returncode}): "
            + (self.log_path.read_text(errors="replace")[-2000:])
        )


def wait_healthy(svc: Service, timeout_s: float = 60.0) -> None:
    """:func:`wait_healthy_async` from synchronous code (start-up, before the load runs)."""

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            await wait_healthy_async(client, svc, timeout_s)

    asyncio.run(go())


async def wait_healthy_async(client: httpx.AsyncClient, svc: Service, timeout_s: float) -> None:
    """Poll ``/health`` until 200; raises with the log's tail if the service exits, or at
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if (await client.get(svc.url + "/health", timeout=1)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not svc.alive():
            raise RuntimeError(svc.failed_start())
        if time.monotonic() > deadline:
            raise RuntimeError(f"{svc.name} not healthy within {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


def service_env() -> dict[str, str]:
    """The caller's environment without SKV_* settings (the benchmark sets what it uses)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKV_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def make_services(args: argparse.Namespace, work: Path) -> dict[str, Service]:
    cli, env = skv_cli(), service_env()
    mocks = {}
    for k in range(2):
        port = free_port()
        argv = [
            *cli,
            "services",
            "mock",
            "--port",
            str(port),
            "--name",
            f"m{k}",
            "--time-scale",
            str(args.time_scale),
            "--itl-ms",
            str(args.itl_ms),
            "--max-tokens",
            str(args.max_tokens),
            "--seed",
            str(k),
        ]
        mocks[f"mock{k}"] = Service(f"mock{k}", argv, port, work / f"mock{k}.log", env)
    renv = dict(env, SKV_REPLICAS=",".join(m.url for m in mocks.values()))
    rport = free_port()
    router = Service(
        "router",
        [
            *cli,
            "services",
            "router",
            "--port",
            str(rport),
            "--policy",
            args.policy,
            "--routing-dir",
            str(work / "routing"),
        ],
        rport,
        work / "router.log",
        renv,
    )
    pport = free_port()
    proxy = Service(
        "proxy",
        [
            *cli,
            "services",
            "proxy",
            "--port",
            str(pport),
            "--upstream",
            router.url,
            "--trace-dir",
            str(work / "trace"),
        ],
        pport,
        work / "proxy.log",
        env,
    )
    return {**mocks, "router": router, "proxy": proxy}


# ----------------------------------------------------------------------------- the load

_METRIC = re.compile(r"^(skv_router_\w+)(?:\{([^}]*)\})?\s+(\S+)$")


async def router_counters(client: httpx.AsyncClient, router: Service) -> dict[str, Any]:
    """The router's counters from its /metrics: routed and failures per replica, failovers,
    requests every replica failed (errors), in flight per replica."""
    text = (await client.get(router.url + "/metrics", timeout=10)).text
    out: dict[str, Any] = {"routed": [], "replica_failures": [], "in_flight": []}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, value = m.group(1).removeprefix("skv_router_"), float(m.group(3))
        key = {
            "routed_total": "routed",
            "replica_failures_total": "replica_failures",
            "in_flight": "in_flight",
        }.get(name)
        if key:
            out[key].append(int(value))
        elif name in ("failovers_total", "errors_total"):
            out[name.removesuffix("_total")] = int(value)
    return out


@dataclass
class Run:
    """What the client saw, request by request, and the kill's timeline (monotonic clock)."""

    n: int
    sent: int = 0
    done: int = 0
    outcome: list[str | None] = field(default_factory=list)
    detail: Counter = field(default_factory=Counter)
    incidents: list[dict[str, Any]] = field(default_factory=list)  # lost or truncated requests
    connections_opened: int = 0  # TCP connections the client opened to the proxy
    t_send: list[float] = field(default_factory=list)
    latency_ms: list[float | None] = field(default_factory=list)
    t0: float = 0.0
    killed_at: float | None = None
    restarted_at: float | None = None  # the restarted mock answered its health check
    in_flight_at_kill: int = 0
    router_at: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcome = [None] * self.n
        self.t_send = [0.0] * self.n
        self.latency_ms = [None] * self.n

    def phase(self, i: int) -> str:
        t = self.t_send[i]
        if self.killed_at is None or t < self.killed_at:
            return "before_kill"
        if self.restarted_at is None or t < self.restarted_at:
            return "replica_down"
        return "after_restart"


async def one_request(
    client: httpx.AsyncClient, base: str, i: int, run: Run, max_tokens: int
) -> None:
    endpoint, body, session = request_body(i, max_tokens)
    headers = {"x-request-id": f"sl-{i:06d}", "x-session-id": session}
    got_response = opened = False

    async def trace(event: str, _info: dict) -> None:  # new TCP connections, for the report
        nonlocal opened
        if event == "connection.connect_tcp.complete":
            opened = True
            run.connections_opened += 1

    t = time.monotonic()
    run.t_send[i] = t
    try:
        async with client.stream(
            "POST", base + endpoint, json=body, headers=headers, extensions={"trace": trace}
        ) as r:
            got_response = True
            data = await r.aread()
        kind = classify(r.status_code, data, body["stream"])
        run.latency_ms[i] = (time.monotonic() - t) * 1e3
    except (httpx.HTTPError, OSError) as exc:
        kind = "truncated" if got_response else "lost"
        run.detail[f"{kind}:{type(exc).__name__}"] += 1
        run.incidents.append({"request": i, "outcome": kind, "error": type(exc).__name__,
                              "message": str(exc)[:200], "sent_at_s": round(t - run.t0, 3),
                              "after_s": round(time.monotonic() - t, 3),
                              "new_connection": opened})  # fmt: skip
    run.outcome[i] = kind


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """Nearest-rank p50/p90/p99, max and mean (ms), and the count."""
    xs = sorted(values)
    if not xs:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}

    def rank(p: float) -> float:
        return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]

    return {
        "count": len(xs),
        "p50": round(rank(50), 2),
        "p90": round(rank(90), 2),
        "p99": round(rank(99), 2),
        "max": round(xs[-1], 2),
        "mean": round(sum(xs) / len(xs), 2),
    }


def summarize(run: Run, idx: Sequence[int]) -> dict[str, Any]:
    kinds = Counter(run.outcome[i] for i in idx)
    ok = kinds.pop("ok", 0)
    lost, truncated = kinds.pop("lost", 0), kinds.pop("truncated", 0)
    kinds.pop(None, None)
    lat = [run.latency_ms[i] for i in idx if run.latency_ms[i] is not None]
    lat_ok = [run.latency_ms[i] for i in idx if run.outcome[i] == "ok"]
    return {
        "requests": len(idx),
        "succeeded": ok,
        "failed": sum(kinds.values()),
        "failed_by_kind": dict(sorted(kinds.items())),
        "lost": lost,
        "truncated": truncated,
        "latency_ms": percentiles(lat),
        "latency_ok_ms": percentiles(lat_ok),
    }


async def drive(
    args: argparse.Namespace, svcs: dict[str, Service], memory: dict[str, Memory]
) -> Run:
    run = Run(args.requests)
    kill_after = int(args.kill_at * args.requests) if args.kill_at > 0 else None
    victim = svcs["mock0"]
    base = svcs["proxy"].url
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    progress_every = max(1, args.requests // 10)
    stop_sampling = asyncio.Event()
    tasks: list[asyncio.Task] = []

    async with (
        httpx.AsyncClient(timeout=args.client_timeout, limits=limits) as client,
        httpx.AsyncClient(timeout=10) as admin,
    ):

        def pid(name: str) -> int | None:
            """The process to sample as ``name`` now: mock0 until the kill, mock0_restarted
            once it is healthy again; None when there is none."""
            if name == "mock0" and run.killed_at is not None:
                return None
            if name == "mock0_restarted" and run.restarted_at is None:
                return None
            svc = victim if name.startswith("mock0") else svcs[name]
            return svc.proc.pid if svc.alive() and svc.proc is not None else None

        async def sampler() -> None:
            while not stop_sampling.is_set():
                for name, mem in memory.items():
                    if (p := pid(name)) is not None:
                        mem.sample(p)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_sampling.wait(), args.sample_interval)

        async def kill_and_restart() -> None:
            memory["mock0"].sample(victim.proc.pid)  # its last sample, just before the kill
            run.router_at["kill"] = await router_counters(admin, svcs["router"])
            run.killed_at = time.monotonic()
            run.in_flight_at_kill = run.sent - run.done
            await asyncio.to_thread(victim.kill)
            log.info(
                "killed mock0 (SIGKILL) after %d answers; %d in flight",
                run.done,
                run.in_flight_at_kill,
            )
            await asyncio.sleep(args.down)
            await asyncio.to_thread(victim.start)
            await wait_healthy_async(admin, victim, 60)
            run.restarted_at = time.monotonic()
            memory["mock0_restarted"].sample(victim.proc.pid)
            run.router_at["restart"] = await router_counters(admin, svcs["router"])
            log.info(
                "mock0 restarted on port %d and healthy, %.1f s after the kill",
                victim.port,
                run.restarted_at - run.killed_at,
            )

        counter = iter(range(args.requests))

        async def worker() -> None:
            for i in counter:
                run.sent += 1
                await one_request(client, base, i, run, args.max_tokens)
                run.done += 1
                if run.done == kill_after:
                    tasks.append(asyncio.create_task(kill_and_restart()))
                if run.done % progress_every == 0:
                    c = Counter(run.outcome[: run.sent])
                    el = time.monotonic() - run.t0
                    log.info(
                        "%d/%d answered (%.0f req/s): ok %d, lost %d, other %d",
                        run.done,
                        args.requests,
                        run.done / el,
                        c["ok"],
                        c["lost"],
                        run.done - c["ok"] - c["lost"],
                    )

        sampling = asyncio.create_task(sampler())
        run.t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        run.router_at["load_end"] = time.monotonic() - run.t0
        for t in tasks:  # the restart, if the load ended before it did
            await t
        # the relays free their slots just after the last byte: let the router settle
        settle = time.monotonic() + 10
        while True:
            counters = await router_counters(admin, svcs["router"])
            if not any(counters["in_flight"]) or time.monotonic() > settle:
                break
            await asyncio.sleep(0.1)
        run.router_at["end"] = counters
        await asyncio.sleep(args.settle)
        stop_sampling.set()
        await sampling
        for name, mem in memory.items():  # the end sample: after the load, settled
            if (p := pid(name)) is not None:
                mem.sample(p)
    return run


def count_records(paths: Sequence[Path], prefix: str = "") -> int:
    """JSON lines of ``paths`` whose ``request_id`` starts with ``prefix`` (a header line, or
    one cut short, does not count)."""
    n = 0
    for p in paths:
        for line in p.read_text(errors="replace").splitlines():
            try:
                rid = json.loads(line).get("request_id")
            except (ValueError, AttributeError):
                continue
            n += isinstance(rid, str) and rid.startswith(prefix)
    return n


def git_commit() -> dict[str, Any]:
    def git(*a: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *a], cwd=REPO, capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", "skv", "benchmarks")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def report(
    args: argparse.Namespace,
    run: Run,
    memory: dict[str, Memory],
    wall_s: float,
    svcs: dict[str, Service],
    work: Path,
) -> dict[str, Any]:
    everything = summarize(run, range(run.n))
    phases = {p: summarize(run, [i for i in range(run.n) if run.phase(i) == p]) for p in PHASES}
    end, kill = run.router_at.get("end", {}), run.router_at.get("kill")
    restart = run.router_at.get("restart")
    routed_after = None
    if restart and end.get("routed"):
        routed_after = [a - b for a, b in zip(end["routed"], restart["routed"], strict=True)]
    traces = sorted((work / "trace").glob("*.jsonl"))
    decisions = sorted((work / "routing").glob("routing-*.jsonl"))
    notes = {
        "mock0": "killed: end is its last sample before the SIGKILL",
        "mock0_restarted": "the restarted process: start is when it answered its health",
    }
    args_out = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {
        "benchmark": "service_load",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "git": git_commit(),
        "command": " ".join(["python", "benchmarks/service_load.py", *sys.argv[1:]]),
        "args": args_out,
        "chain": f"client -> proxy -> router ({args.policy}) -> 2 mocks",
        "services": {
            name: {"argv": s.argv, "port": s.port, "starts": s.starts} for name, s in svcs.items()
        },
        "requests": run.n,
        "concurrency": args.concurrency,
        "sent": run.sent,
        "answered": run.n - everything["lost"],
        "succeeded": everything["succeeded"],
        "failed": everything["failed"],
        "failed_by_kind": everything["failed_by_kind"],
        "lost": everything["lost"],
        "truncated": everything["truncated"],
        "exceptions": dict(sorted(run.detail.items())),
        "incidents": run.incidents,
        "client_connections_opened": run.connections_opened,
        "wall_s": round(wall_s, 2),
        "throughput_rps": round(run.n / wall_s, 1) if wall_s > 0 else None,
        "latency_ms": everything["latency_ms"],
        "latency_ok_ms": everything["latency_ok_ms"],
        "phases": phases,
        "kill": {
            "replica": "mock0",
            "after_answers": int(args.kill_at * run.n) if args.kill_at > 0 else None,
            "at_s": None if run.killed_at is None else round(run.killed_at - run.t0, 3),
            "restart_healthy_at_s": (
                None if run.restarted_at is None else round(run.restarted_at - run.t0, 3)
            ),
            "in_flight_at_kill": run.in_flight_at_kill,
        },
        "router": {
            "at_kill": kill,
            "at_restart": restart,
            "end": end,
            "routed_after_restart": routed_after,
        },
        "proxy_trace_records": count_records(traces, "sl-"),
        "router_decisions": count_records(decisions, "sl-"),
        "rss": {
            name: mem.report(notes.get(name) if run.killed_at is not None else None)
            for name, mem in memory.items()
            if mem.samples
        },
        "work_dir": str(work),
    }


def print_summary(res: dict[str, Any], out: Path) -> None:
    lat = res["latency_ms"]
    print(
        f"service_load: {res['requests']:,} requests at concurrency {res['concurrency']} "
        f"through {res['chain']} ({res['throughput_rps']} req/s)"
    )
    print(
        f"  succeeded {res['succeeded']:,}, failed {res['failed']:,} "
        f"{res['failed_by_kind'] or ''}, truncated {res['truncated']}, LOST {res['lost']}"
    )
    print(
        f"  latency ms (client, answered): p50 {lat['p50']}, p90 {lat['p90']}, "
        f"p99 {lat['p99']}, max {lat['max']}"
    )
    k = res["kill"]
    print(
        f"  mock0 killed at {k['at_s']} s ({k['in_flight_at_kill']} in flight), healthy again "
        f"at {k['restart_healthy_at_s']} s; routed after restart: "
        f"{res['router']['routed_after_restart']}"
    )
    for p, s in res["phases"].items():
        lp = s["latency_ms"]
        print(
            f"  {p:<14} {s['requests']:>6,} req: ok {s['succeeded']:,}, failed {s['failed']}, "
            f"lost {s['lost']}; p50 {lp['p50']}, p99 {lp['p99']} ms"
        )
    for name, m in res["rss"].items():
        print(
            f"  RSS {name:<16} start {m['start_mib']} MiB, peak {m['peak_mib']}, "
            f"end {m['end_mib']}, growth {m['growth_mib']}"
        )
    print(
        f"  proxy trace records {res['proxy_trace_records']:,}, router decisions "
        f"{res['router_decisions']:,}; router end {res['router']['end']}"
    )
    print(f"  -> {out}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="2,000 requests at concurrency 32")
    ap.add_argument(
        "--kill-at",
        type=float,
        default=0.4,
        help="kill mock0 after this share of the requests is answered (0: never)",
    )
    ap.add_argument(
        "--down", type=float, default=5.0, help="seconds from the kill to restarting mock0"
    )
    ap.add_argument("--policy", default="prefix_locality", help="the router's policy")
    ap.add_argument(
        "--time-scale", type=float, default=0.05, help="mock: share of simulated TTFT really waited"
    )
    ap.add_argument("--itl-ms", type=float, default=1.0, help="mock: inter-token latency")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--client-timeout",
        type=float,
        default=60.0,
        help="seconds without a response before the client gives up (lost)",
    )
    ap.add_argument("--sample-interval", type=float, default=0.5, help="RSS sampling, seconds")
    ap.add_argument(
        "--settle", type=float, default=1.0, help="seconds after the load before the end RSS sample"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--work-dir",
        type=Path,
        default=DEFAULT_WORK,
        help="services' logs, trace and decision log (emptied first)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.concurrency = 2000, 32
    if args.requests < 1 or args.concurrency < 1 or not 0 <= args.kill_at < 1:
        ap.error("--requests and --concurrency must be >= 1, --kill-at in [0, 1)")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)

    work = args.work_dir.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    svcs = make_services(args, work)
    memory = {name: Memory() for name in ("proxy", "router", "mock0", "mock1")}
    memory["mock0_restarted"] = Memory()
    try:
        for name in ("mock0", "mock1", "router", "proxy"):
            svcs[name].start()
        for name in ("mock0", "mock1", "router", "proxy"):
            wait_healthy(svcs[name])
            log.info("%s healthy on %s (pid %d)", name, svcs[name].url, svcs[name].proc.pid)
        for name in ("proxy", "router", "mock0", "mock1"):  # start: healthy, before the load
            memory[name].sample(svcs[name].proc.pid)
        log.info(
            "sending %d requests at concurrency %d to %s",
            args.requests,
            args.concurrency,
            svcs["proxy"].url,
        )
        t0 = time.monotonic()
        run = asyncio.run(drive(args, svcs, memory))
        wall_s = (
            run.router_at.pop("load_end") if "load_end" in run.router_at else time.monotonic() - t0
        )
    finally:
        for name in ("proxy", "router", "mock0", "mock1"):
            svcs[name].stop()
    res = report(args, run, memory, wall_s, svcs, work)
    write_json(args.out, res)
    print_summary(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
