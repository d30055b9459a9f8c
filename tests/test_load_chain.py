"""Load through the whole chain (issue 16): client -> proxy -> router -> 2 mock engines.

2,000 requests at concurrency 64 over real sockets on 127.0.0.1: the mocks are separate
processes (``skv services mock``), the proxy and router run under uvicorn in threads of this
process (so their state can be read), both with tenant isolation on (4 tenants). Mid-way,
after 1,000 answers, one mock is killed with SIGKILL. Nothing is lost: every client request
gets an answer, either served (200, a whole completion or stream) or a clean error (a JSON
error status, or an SSE error event in a stream the dead engine cut); no client sees a
connection error. The proxy's trace holds exactly one record per request (by request id), the
router's decision log one line per request, and no in-flight slot is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from skv.services import proxy, router
from skv.services._common import serve_in_thread

pytestmark = pytest.mark.slow  # ~1 min on a loaded 2-core machine

N_REQUESTS = 2000
CONCURRENCY = 64
KILL_AFTER = 1000
TENANTS = 4
SYSTEM = [f"You are assistant {k} of the support team; be brief, cite the manual. " * 6
          for k in range(TENANTS)]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mock_engine(name: str, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``skv services mock`` in its own process (so it can be SIGKILLed); yields (url, proc)."""
    port = _free_port()
    code = "import sys; from skv.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "services", "mock", "--port", str(port), "--name", name,
            "--time-scale", "0.05", "--itl-ms", "1", "--max-tokens", "6"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, f"mock {name} exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"mock {name} did not start"
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def _body(i: int) -> dict:
    msgs = [{"role": "system", "content": SYSTEM[i % TENANTS]},
            {"role": "user", "content": f"Question {i}: how do I reset my password?"}]  # fmt: skip
    return {"model": "skv-mock", "messages": msgs, "max_tokens": 6, "stream": i % 2 == 0}


async def _one(client: httpx.AsyncClient, url: str, i: int) -> tuple[int, str]:
    """One request; (status, how it ended): ``ok``, ``error`` (clean error), or raises."""
    headers = {"x-request-id": f"load-{i:05d}", "x-tenant-id": f"tenant-{i % TENANTS}",
               "x-session-id": f"s-{i % 50}"}  # fmt: skip
    body = _body(i)
    if not body["stream"]:
        r = await client.post(url, json=body, headers=headers)
        data = r.json()
        if r.status_code == 200:
            assert data["choices"][0]["message"]["content"]
            return 200, "ok"
        assert isinstance(data["error"]["message"], str)
        return r.status_code, "error"
    async with client.stream("POST", url, json=body, headers=headers) as r:
        text = (await r.aread()).decode()
    if r.status_code != 200:
        assert isinstance(json.loads(text)["error"]["message"], str)
        return r.status_code, "error"
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    if events and events[-1] == "[DONE]":
        return 200, "ok"
    assert "error" in json.loads(events[-1]), text[-300:]  # a cut stream ends with an error event
    return 200, "error"


async def _drive(url: str, kill: Callable[[], None]) -> list[tuple[int, str]]:
    sem = asyncio.Semaphore(CONCURRENCY)
    done = 0
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def run(i: int) -> tuple[int, str]:
            nonlocal done
            async with sem:
                out = await _one(client, url, i)
            done += 1
            if done == KILL_AFTER:
                kill()
            return out

        return await asyncio.gather(*(run(i) for i in range(N_REQUESTS)))


def test_2000_requests_through_proxy_router_and_two_mocks_one_killed(tmp_path):
    with ExitStack() as stack:
        (u0, p0) = stack.enter_context(mock_engine("m0", tmp_path / "m0.log"))
        (u1, _p1) = stack.enter_context(mock_engine("m1", tmp_path / "m1.log"))
        rcfg = router.RouterConfig(replicas=[u0, u1], policy="prefix_locality",
                                   routing_output_dir=tmp_path / "routing", cooldown_s=60,
                                   tenant_isolation=True, tenant_source="header")  # fmt: skip
        rapp = router.create_app(rcfg)
        router_url = stack.enter_context(serve_in_thread(rapp, lifespan="on"))
        pcfg = proxy.ProxyConfig(upstream_base_url=router_url, trace_output_dir=tmp_path,
                                 trace_name="load", tenant_isolation=True,
                                 tenant_source="header")  # fmt: skip
        papp = proxy.create_app(pcfg)
        proxy_url = stack.enter_context(serve_in_thread(papp, lifespan="on"))
        killed: list[float] = []

        def kill() -> None:
            killed.append(time.monotonic())
            os.kill(p0.pid, signal.SIGKILL)

        t0 = time.monotonic()
        results = asyncio.run(_drive(proxy_url + "/v1/chat/completions", kill))
        elapsed = time.monotonic() - t0
        assert killed and p0.wait(10) == -signal.SIGKILL
        # a relay frees its slot when its answer ends, which may be just after the client has
        # read the last byte: wait (bounded) for the router to settle
        settle = time.monotonic() + 10
        while any(rapp.state.router.in_flight) and time.monotonic() < settle:
            time.sleep(0.05)
        in_flight = list(rapp.state.router.in_flight)
        routed = list(rapp.state.router.routed)
    # nothing lost: every request answered, served or a clean error
    assert len(results) == N_REQUESTS
    kinds = Counter(kind for _status, kind in results)
    assert set(kinds) <= {"ok", "error"}
    assert kinds["ok"] >= N_REQUESTS - CONCURRENCY, kinds  # only requests in flight at the kill
    assert routed[1] > routed[0] > 0  # both served; the survivor took over
    assert in_flight == [0, 0]
    # one trace record per request, by request id
    lines = (tmp_path / "load.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines[1:]]
    ids = Counter(r["request_id"] for r in records)
    assert len(records) == N_REQUESTS and set(ids.values()) == {1}
    assert set(ids) == {f"load-{i:05d}" for i in range(N_REQUESTS)}
    assert {r["tenant_id"] for r in records} == {f"tenant-{k}" for k in range(TENANTS)}
    errors = sum(1 for r in records if r.get("extra", {}).get("error"))
    assert errors == kinds["error"]
    (decisions,) = (tmp_path / "routing").glob("routing-*.jsonl")
    routed_ids = Counter(json.loads(x)["request_id"] for x in decisions.read_text().splitlines())
    missing = {r["request_id"]: r.get("extra", {}).get("error") for r in records
               if r["request_id"] not in routed_ids}  # fmt: skip
    assert not missing, f"no decision line for these (proxy's error): {missing}"
    assert set(routed_ids.values()) == {1}
    print(f"{N_REQUESTS} requests in {elapsed:.1f} s: {dict(kinds)}; routed {routed}")
