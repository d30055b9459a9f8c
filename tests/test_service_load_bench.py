"""benchmarks/service_load.py at a tiny scale: the whole chain in four processes (proxy ->
router -> 2 mocks), mock 0 killed and restarted during the load, the JSON complete, nothing
lost. Not a timed test: no assertion on latency or throughput, only that they are reported."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from skv.services import mock_backend
from skv.services._common import DEFAULT_KEEP_ALIVE_S, serve_in_thread, server_options

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "service_load.py"
N = 300


def test_service_load_benchmark_tiny_run_kill_and_restart(tmp_path):
    out, work = tmp_path / "service_load.json", tmp_path / "work"
    argv = [
        sys.executable,
        str(SCRIPT),
        "--requests",
        str(N),
        "--concurrency",
        "16",
        "--kill-at",
        "0.1",
        "--down",
        "0.5",
        "--sample-interval",
        "0.2",
        "--settle",
        "0.2",
        "--out",
        str(out),
        "--work-dir",
        str(work),
    ]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert "LOST 0" in proc.stdout and str(out) in proc.stdout

    # provenance
    assert res["benchmark"] == "service_load" and res["date"]
    assert set(res["machine"]) == {"cores", "memory_gib", "cpu"}
    assert res["args"]["requests"] == N and res["args"]["concurrency"] == 16
    assert "commit" in res["git"] and res["command"].startswith("python benchmarks/service_load.py")

    # every request sent, answered and accounted for; none lost, none cut off
    assert res["requests"] == res["sent"] == N and res["concurrency"] == 16
    assert res["lost"] == 0 and res["truncated"] == 0, res["exceptions"]
    assert res["answered"] == N
    assert res["succeeded"] + res["failed"] == N
    assert res["failed"] == sum(res["failed_by_kind"].values())
    assert res["proxy_trace_records"] == N and res["router_decisions"] == N

    # the kill and the restart happened, on the same port
    kill = res["kill"]
    assert kill["replica"] == "mock0" and kill["after_answers"] == N // 10
    assert kill["at_s"] is not None and kill["restart_healthy_at_s"] > kill["at_s"]
    assert res["services"]["mock0"]["starts"] == 2 and res["services"]["mock1"]["starts"] == 1
    assert res["router"]["at_kill"] and res["router"]["at_restart"]
    assert res["router"]["end"]["in_flight"] == [0, 0]
    assert sum(res["router"]["end"]["routed"]) == res["succeeded"] + res["failed_by_kind"].get(
        "stream_error", 0
    )

    # per phase: counts add up, the fields are there
    phases = res["phases"]
    assert set(phases) == {"before_kill", "replica_down", "after_restart"}
    assert sum(p["requests"] for p in phases.values()) == N
    assert sum(p["lost"] for p in phases.values()) == 0
    assert phases["before_kill"]["requests"] >= N // 10
    for p in phases.values():
        assert {"p50", "p90", "p99", "max", "mean", "count"} <= set(p["latency_ms"])
    assert res["latency_ms"]["count"] == N and res["latency_ms"]["p99"] > 0

    # memory of every service process, the restarted mock as its own
    assert set(res["rss"]) == {"proxy", "router", "mock0", "mock1", "mock0_restarted"}
    for name, m in res["rss"].items():
        assert m["start_mib"] > 0 and m["peak_mib"] >= m["start_mib"], (name, m)
        assert abs(m["growth_mib"] - (m["end_mib"] - m["start_mib"])) <= 0.15, (name, m)


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response with a Content-Length body (b"" if the server closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_services_keep_idle_connections_past_the_clients_keepalive_expiry():
    """Found by the benchmark: 2 of 20,000 requests got no response (ReadError, never seen by
    the proxy) when the services closed idle connections at uvicorn's 5 s, which is also
    httpx's (and the OpenAI SDK's) keep-alive expiry: a client reusing a connection just
    before its expiry can send on one the server is closing. The services keep them longer."""
    assert DEFAULT_KEEP_ALIVE_S > 15  # httpx / OpenAI SDK: 5 s, aiohttp: 15 s
    assert server_options()["timeout_keep_alive"] == DEFAULT_KEEP_ALIVE_S
    app = mock_backend.create_app(mock_backend.MockConfig())
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        request = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request)
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(6.0)  # idle past a 5 s client expiry (and uvicorn's own 5 s default)
            try:
                sock.sendall(request)
                again = _read_response(sock)
            except ConnectionError as exc:
                again = repr(exc).encode()
            assert again.startswith(b"HTTP/1.1 200"), again[:200]
