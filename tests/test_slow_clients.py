"""Slow clients cannot hold the services (issue 33).

A request body that stops arriving is answered 408 and its connection closed once the body
read timeout runs out; a connection that never completes its headers is closed after the same
time; beyond the connection cap new requests get 503 instead of queueing behind the stalled.
Measured on the real HTTP path (uvicorn in a thread, raw sockets for the stalled clients).
"""

from __future__ import annotations

import selectors
import socket
import statistics
import time
from typing import Any

import httpx
import pytest

from skv.services import proxy, router
from skv.services._common import serve_in_thread, server_options

BODY = {"messages": [{"role": "user", "content": "hello there"}]}
STALLED = 250
TIMEOUT_S = 2.0


def _answer(request: httpx.Request) -> httpx.Response:
    answer = {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip
    return httpx.Response(200, json=answer)


def _app(kind: str, tmp_path: Any, timeout_s: float = TIMEOUT_S) -> Any:
    up = httpx.MockTransport(_answer)
    if kind == "proxy":
        cfg = proxy.ProxyConfig(upstream_base_url="http://up", trace_output_dir=tmp_path,
                                trace_name="t", body_read_timeout_s=timeout_s)  # fmt: skip
        return proxy.create_app(cfg, transport=up)
    cfg = router.RouterConfig(replicas=["http://r0"], routing_output_dir=None,
                              body_read_timeout_s=timeout_s)  # fmt: skip
    return router.create_app(cfg, transport=up)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _stall(port: int, n: int, *, headers_only: bool = False) -> list[socket.socket]:
    """``n`` connections that send a request's headers (announcing 10,000 body bytes) and 100
    bytes of body, then nothing; ``headers_only``: half a header line, then nothing."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        if headers_only:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        else:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n" + b"{" * 100
            )
        socks.append(s)
    return socks


def _wait_closed(
    socks: list[socket.socket], limit_s: float, since: float | None = None
) -> tuple[dict[int, float], dict]:
    """Seconds from ``since`` (``time.monotonic()``; default now) until each socket saw EOF from
    the server (by index), and what each received."""
    t0 = time.monotonic() if since is None else since
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    closed: dict[int, float] = {}
    got: dict[int, bytes] = {}
    while len(closed) < len(socks) and time.monotonic() - t0 < limit_s:
        for key, _ in sel.select(timeout=0.1):
            i = key.data
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                data = b""
            if data:
                got[i] = got.get(i, b"") + data
            else:
                closed[i] = time.monotonic() - t0
                sel.unregister(key.fileobj)
    sel.close()
    return closed, got


def _latencies(client: httpx.Client, n: int = 15) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post("/v1/chat/completions", json=BODY)
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
    return out


@pytest.mark.parametrize("kind", ["proxy", "router"])
def test_stalled_uploads_are_closed_in_time_and_others_keep_their_latency(tmp_path, kind):
    with serve_in_thread(_app(kind, tmp_path), read_timeout_s=TIMEOUT_S) as url, \
            httpx.Client(base_url=url, timeout=10) as client:  # fmt: skip
        _latencies(client, 5)  # warm-up
        before = statistics.median(_latencies(client))
        t0 = time.monotonic()
        socks = _stall(_port(url), STALLED)
        opened = time.monotonic() - t0
        during = statistics.median(_latencies(client))
        closed, got = _wait_closed(socks, TIMEOUT_S + 8, since=t0)
        waited = max(closed.values(), default=float("inf"))
        first = min(closed.values(), default=0.0)
        after = statistics.median(_latencies(client))
        for s in socks:
            s.close()
    print(f"\n{kind}: {STALLED} stalled uploads; median latency of a normal request: "
          f"{before * 1e3:.1f} ms before, {during * 1e3:.1f} ms while stalled, "
          f"{after * 1e3:.1f} ms after; stalled closed {first:.2f} to {waited:.2f} s after the "
          f"first opened (timeout {TIMEOUT_S:g} s; opening them took {opened:.2f} s)")  # fmt: skip
    assert len(closed) == STALLED, f"{STALLED - len(closed)} stalled connections still open"
    assert first >= TIMEOUT_S and waited < TIMEOUT_S + opened + 2
    assert all(g.startswith(b"HTTP/1.1 408") for g in got.values()) and len(got) == STALLED
    assert during < max(3 * before, before + 0.05), (before, during)  # served alongside


def test_a_slow_body_within_the_timeout_is_served(tmp_path):
    with serve_in_thread(_app("proxy", tmp_path), read_timeout_s=TIMEOUT_S) as url:
        body = b'{"messages": [{"role": "user", "content": "hi"}]}'
        s = socket.create_connection(("127.0.0.1", _port(url)))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n")  # fmt: skip
        for i in range(0, len(body), 20):  # in three pieces over ~0.6 s
            time.sleep(0.3)
            s.sendall(body[i : i + 20])
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.close()


def test_connections_that_never_finish_their_headers_are_closed(tmp_path):
    with serve_in_thread(_app("router", tmp_path), read_timeout_s=1.0) as url:
        socks = _stall(_port(url), 20, headers_only=True)
        idle = [socket.create_connection(("127.0.0.1", _port(url))) for _ in range(5)]
        # one served request, then half of the next one's headers on the same connection
        again = socket.create_connection(("127.0.0.1", _port(url)))
        body = b'{"messages": [{"role": "user", "content": "hi"}]}'
        again.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
        again.settimeout(5)
        assert again.recv(65536).startswith(b"HTTP/1.1 200")
        again.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        closed, _ = _wait_closed([*socks, *idle, again], 6)
        for s in [*socks, *idle, again]:
            s.close()
    assert len(closed) == 26 and max(closed.values()) < 3.0, closed


def test_beyond_the_connection_cap_requests_get_503_until_the_stalled_are_let_go(tmp_path):
    with serve_in_thread(_app("proxy", tmp_path, 1.5), read_timeout_s=1.5,
                         max_connections=20) as url:  # fmt: skip
        # connections count from the moment they open; a request is checked when its headers
        # are in: 25 half-sent headers hold 25 connections without being checked themselves
        socks = _stall(_port(url), 25, headers_only=True)
        time.sleep(0.3)
        with httpx.Client(base_url=url, timeout=5) as client:
            r = client.post("/v1/chat/completions", json=BODY)
            assert r.status_code == 503 and r.headers["connection"] == "close"
        closed, _ = _wait_closed(socks, 5)
        assert len(closed) == 25
        with httpx.Client(base_url=url, timeout=5) as client:
            assert client.post("/v1/chat/completions", json=BODY).status_code == 200
        for s in socks:
            s.close()


def test_server_options_defaults_and_checks():
    opts = server_options()
    assert opts["limit_concurrency"] == 512 and opts["http"].__name__ == "GuardedH11Protocol"
    assert server_options(7, 3.0)["limit_concurrency"] == 7
    for bad in ((0, None), (None, 0.0), (None, -1.0)):
        with pytest.raises(ValueError):
            server_options(*bad)
    with pytest.raises(ValueError, match="body read timeout"):
        proxy.create_app(proxy.ProxyConfig(body_read_timeout_s=0.0))
