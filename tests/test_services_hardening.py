"""skv.services under bad input and failure: clear 4xx (never a 500), no leaked in-flight slot,
a record for every forwarded request, checked faults, a body limit, no prompt text in redacted
traces, separate upstream timeouts, CPU work off the event loop (issue 16, "Services").

In-process apps (FastAPI's TestClient, httpx's ASGI transport) plus real uvicorn servers on
127.0.0.1 where a connection must really break or a clock must really run.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.testclient import TestClient
from helpers import serve_app, wait_until

from skv.segmenter import Segmenter
from skv.services import checks, cli, mock_backend, proxy, relay, router, sim_api

MSGS = [
    {"role": "system", "content": "You are terse. " * 30},
    {"role": "user", "content": "CONTEXT: refunds.\n\nUSER: summarize"},
]
CHAT = "/v1/chat/completions"
SIM = "/v1/simulate/request"


def mock_app(**kw) -> FastAPI:
    return mock_backend.create_app(mock_backend.MockConfig(**kw))


def proxy_app(tmp_path: Path, upstream: FastAPI | None = None, **kw):
    cfg = proxy.ProxyConfig(
        upstream_base_url="http://upstream", trace_output_dir=tmp_path, trace_name="t", **kw
    )
    app = proxy.create_app(cfg, transport=httpx.ASGITransport(upstream or mock_app()))
    return app, tmp_path / "t.jsonl"


def router_app(tmp_path: Path, replicas: list, **kw) -> FastAPI:
    urls = [f"http://replica-{i}" for i in range(len(replicas))]
    mounts = {
        u: r if isinstance(r, httpx.AsyncBaseTransport) else httpx.ASGITransport(r)
        for u, r in zip(urls, replicas, strict=True)
    }
    cfg = router.RouterConfig(replicas=urls, routing_output_dir=tmp_path, **kw)
    return router.create_app(cfg, mounts=mounts)


def decisions(tmp_path: Path) -> list[dict]:
    (path,) = tmp_path.glob("routing-*.jsonl")
    return [json.loads(x) for x in path.read_text().splitlines()]


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()[1:]]


def _apps(tmp_path: Path) -> dict[str, tuple[FastAPI, str]]:
    return {
        "mock": (mock_app(), CHAT),
        "proxy": (proxy_app(tmp_path)[0], CHAT),
        "router": (router_app(tmp_path, [mock_app()]), CHAT),
        "sim": (sim_api.create_app(sim_api.SimConfig()), SIM),
    }


def _body(**extra) -> bytes:
    return json.dumps({"messages": MSGS, **extra}).encode()


# --------------------------------------------------------------------------- 4xx, never 500

BAD_BODIES = {
    "scalar tools": _body(tools=5),
    "string tools": _body(tools="search"),
    "dict tools": _body(tools={"name": "search"}),
    "deep nesting": b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "nesting over the limit": _body(x=json.loads("[" * 70 + "]" * 70)),
    "NaN literal": _body()[:-1] + b', "temperature": NaN}',
    "Infinity literal": _body()[:-1] + b', "temperature": Infinity}',
    "-Infinity literal": _body()[:-1] + b', "top_p": -Infinity}',
    "float overflow": _body()[:-1] + b', "temperature": 1e999}',
    "lone surrogate in content": b'{"messages": [{"role": "user", "content": "hi \\ud800"}]}',
    "lone surrogate in model": _body()[:-1] + b', "model": "\\udc00x"}',
    "lone surrogate in a key": _body()[:-1] + b', "\\ud83d": 1}',
    "not an object": b"[1, 2]",
    "not JSON": b"{nope",
    "not UTF-8": b'{"messages": "\xff\xfe"}',
    "huge integer": _body()[:-1] + b', "n": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
@pytest.mark.parametrize("service", ["mock", "proxy", "router", "sim"])
def test_bad_body_is_a_clear_400(tmp_path, service, case):
    app, path = _apps(tmp_path)[service]
    with TestClient(app) as c:  # an uncaught exception would raise here
        r = c.post(path, content=BAD_BODIES[case], headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
        if service == "router":
            assert app.state.router.in_flight == [0]


def test_paired_surrogates_are_fine(tmp_path):
    app, path = _apps(tmp_path)["proxy"]
    with TestClient(app) as c:
        body = b'{"messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}]}'
        assert c.post(path, content=body).status_code == 200


@pytest.mark.parametrize("value", [5, 1.5, True, {"a": 1}, ["s"]])
@pytest.mark.parametrize("key", ["session_id", "tenant_id", "request_id"])
def test_sim_api_ids_must_be_strings(key, value):
    with TestClient(sim_api.create_app(sim_api.SimConfig())) as c:
        r = c.post(SIM, json={"messages": MSGS, key: value})
        assert r.status_code == 400 and key in r.json()["error"]["message"]
        assert c.post(SIM, json={"messages": MSGS, key: "s1"}).status_code == 200


@pytest.mark.parametrize("service", ["proxy", "router"])
def test_non_ascii_header_value_is_400(tmp_path, service):
    app, path = _apps(tmp_path)[service]
    with TestClient(app) as c:
        for name in ("x-session-id", "x-request-id", "user-agent"):
            r = c.post(path, content=_body(), headers={name: "café".encode("latin-1")})
            assert r.status_code == 400 and name in r.json()["error"]["message"]
        assert c.post(path, content=_body(), headers={"x-session-id": "cafe"}).status_code == 200
    if service == "router":
        assert app.state.router.in_flight == [0]


def test_segmenter_refuses_non_list_tools():
    seg = Segmenter()
    for tools in (5, "search", {"name": "x"}, 1.5, True):
        with pytest.raises(ValueError, match="'tools' must be a list"):
            seg.messages(MSGS, tools)
    assert seg.messages(MSGS, []) == seg.messages(MSGS, None)
    assert seg.messages(MSGS, ({"name": "x"},))[0].stype.value == "tool_schema"


# --------------------------------------------------------------------------- in-flight, records


class Boom(httpx.AsyncBaseTransport):
    """An in-process replica whose transport raises what no httpx transport would."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise RuntimeError(f"boom: {request.content.decode()}")


async def _relay_bug(*args, **kw):
    raise RuntimeError("a bug in the relay, after routing")


class Hang(httpx.AsyncBaseTransport):
    """A replica that never answers (until cancelled)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.entered.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_router_releases_in_flight_when_the_relay_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(router, "relay_response", _relay_bug)
    app = router_app(tmp_path, [mock_app()])
    with TestClient(app) as c:
        r = c.post(CHAT, json={"messages": MSGS})
        assert r.status_code == 500 and r.json()["error"]["type"] == "router_error"
    st = app.state.router
    assert st.in_flight == [0] and st.failures == [0]  # a router bug is not the replica's fault
    (d,) = decisions(tmp_path)
    assert d["chosen"] == 0 and d["error"] == "router_error" and d["status"] == 500


def test_an_upstream_that_raises_is_a_failed_replica(tmp_path):
    """An in-process replica raising (not an httpx error) is failed over, not a 500."""
    app = router_app(tmp_path, [Boom(), mock_app()])
    with TestClient(app) as c:
        assert c.post(CHAT, json={"messages": MSGS}).status_code == 200
    st = app.state.router
    assert st.in_flight == [0, 0] and st.failures == [1, 0]
    (d,) = decisions(tmp_path)
    assert d["attempts"][0]["error"] == "upstream_error" and d["chosen"] == 1


def test_router_releases_in_flight_when_the_client_goes_away(tmp_path):
    hang = Hang()
    app = router_app(tmp_path, [hang])

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            task = asyncio.create_task(c.post(CHAT, json={"messages": MSGS}))
            await asyncio.wait_for(hang.entered.wait(), 5)
            assert app.state.router.in_flight == [1]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert app.state.router.in_flight == [0] and app.state.router.failures == [0]
    (d,) = decisions(tmp_path)
    assert d["error"] == "client_gone" and d["status"] == 499


def test_proxy_records_a_request_whose_forward_fails(tmp_path, monkeypatch):
    cfg = proxy.ProxyConfig(upstream_base_url="http://u", trace_output_dir=tmp_path, trace_name="t")
    with TestClient(proxy.create_app(cfg, transport=Boom())) as c:
        r = c.post(CHAT, json={"messages": MSGS}, headers={"x-request-id": "r1"})
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error"
    monkeypatch.setattr(proxy, "relay_response", _relay_bug)
    with TestClient(proxy.create_app(cfg, transport=httpx.ASGITransport(mock_app()))) as c:
        r = c.post(CHAT, json={"messages": MSGS}, headers={"x-request-id": "r2"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "proxy_error"
    r1, r2 = records(tmp_path / "t.jsonl")
    assert r1["request_id"] == "r1" and r1["extra"]["error"]["kind"] == "upstream_error"
    assert "boom" not in json.dumps(r1)  # an upstream's exception text may echo the request
    assert r2["request_id"] == "r2" and r2["extra"]["error"]["kind"] == "proxy_error"
    assert r2["extra"]["error"]["message"] == "forwarding failed: RuntimeError"


def test_proxy_records_a_request_whose_client_went_away(tmp_path):
    hang = Hang()
    cfg = proxy.ProxyConfig(upstream_base_url="http://u", trace_output_dir=tmp_path, trace_name="t")
    app = proxy.create_app(cfg, transport=hang)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            task = asyncio.create_task(c.post(CHAT, json={"messages": MSGS}))
            await asyncio.wait_for(hang.entered.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    (rec,) = records(tmp_path / "t.jsonl")
    assert rec["extra"]["error"]["kind"] == "client_gone" and rec["extra"]["status"] == 499


def test_stream_abandoned_mid_way_is_released_and_recorded(tmp_path):
    """Client -> proxy -> router -> slow streaming mock over real sockets; the client hangs up
    after the first event: the router's slot comes back, both logs say client_gone."""
    engine = mock_app(time_scale=1.0, itl_ms=300, max_tokens=20)
    with serve_app(engine) as up:
        cfg = router.RouterConfig(replicas=[up], routing_output_dir=tmp_path)
        rapp = router.create_app(cfg)
        with serve_app(rapp) as rurl:
            pcfg = proxy.ProxyConfig(
                upstream_base_url=rurl, trace_output_dir=tmp_path, trace_name="p"
            )
            papp = proxy.create_app(pcfg)
            with serve_app(papp) as purl, httpx.Client(base_url=purl, timeout=10) as c:
                body = {"messages": MSGS, "stream": True}
                with c.stream("POST", CHAT, json=body) as s:
                    assert s.status_code == 200
                    next(s.iter_lines())
                wait_until(lambda: rapp.state.router.in_flight == [0], "slot released", 10)
                wait_until(lambda: papp.state.writer.out.count == 1, "proxy record", 10)
    (rec,) = records(tmp_path / "p.jsonl")
    assert rec["extra"]["error"]["kind"] == "client_gone"
    wait_until(lambda: len(decisions(tmp_path)) == 1, "decision", 5)
    (d,) = decisions(tmp_path)
    assert d["error"] == "client_gone" and d["chosen"] == 0
    assert rapp.state.router.failures == [0]


@pytest.mark.parametrize("gone_at", ["http.response.start", "http.response.body"])
def test_relayed_stream_finishes_even_if_its_body_is_never_pulled(gone_at):
    """The client is gone before the stream starts, or while a chunk is sent (the body iterator
    is left suspended, still referenced): the relay still finishes at once, exactly once."""

    async def events():
        for k in range(3):
            yield b'data: {"choices": [{"delta": {"content": "w%d"}}]}\n\n' % k

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            resp = await client.send(client.build_request("POST", "http://u/x"), stream=True)
            ended: list[relay.Outcome] = []
            now = time.perf_counter()
            response = await relay.relay_response(
                resp, relay.Outcome(), now, ended.append, deadline=now + 10
            )

            async def receive():
                await asyncio.sleep(3600)

            async def send(message):
                if message["type"] == gone_at:
                    raise OSError("client gone")

            scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
            with pytest.raises(Exception):  # noqa: B017 (starlette wraps it: ClientDisconnect)
                await response(scope, receive, send)
            assert len(ended) == 1 and ended[0].error_kind == "client_gone"
            assert ended[0].status == 499 and resp.is_closed
            return response  # held until here: no garbage collection did the work

    asyncio.run(go())


def test_router_passes_a_4xx_on_without_blaming_the_replica(tmp_path):
    engine = mock_app()
    engine.state.engine.faults.update({"fail_status": 429, "fail_count": 1})
    app = router_app(tmp_path, [engine, mock_app()], policy="prefix_locality")
    with TestClient(app) as c:
        r = c.post(CHAT, json={"messages": MSGS})
        assert r.status_code == 429
        st = app.state.router
        assert st.failures == [0, 0] and st.failovers == 0 and st.in_flight == [0, 0]
        assert max(st.down_until) == 0.0  # nobody cools down
        assert c.post(CHAT, json={"messages": MSGS}).status_code == 200


# --------------------------------------------------------------------------- /mock/faults

BAD_FAULTS = [
    [1],
    "x",
    {"delay_s": "abc"},
    {"delay_s": -1},
    {"delay_s": True},
    {"delay_s": 4000},
    {"fail_status": 99},
    {"fail_status": 1000},
    {"fail_status": 200},
    {"fail_status": 500.0},
    {"fail_status": "500"},
    {"fail_count": -2},
    {"fail_count": 1.5},
    {"drop_after_chunks": -1},
    {"nope": 1},
    {"delay_s": 0.5, "fail_status": 99},  # one bad field: nothing changes
]


@pytest.mark.parametrize("body", BAD_FAULTS, ids=[json.dumps(b) for b in BAD_FAULTS])
def test_mock_faults_refuses_bad_input_and_keeps_state(body):
    app = mock_app()
    with TestClient(app) as c:
        before = c.get("/mock/faults").json()
        r = c.post("/mock/faults", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"]
        assert c.get("/mock/faults").json() == before
        assert c.post(CHAT, json={"messages": MSGS}).status_code == 200


def test_mock_faults_accepts_good_input():
    app = mock_app()
    with TestClient(app) as c:
        r = c.post("/mock/faults", json={"fail_status": 503, "fail_count": 1, "delay_s": 0})
        assert r.status_code == 200 and r.json()["fail_status"] == 503
        assert c.post(CHAT, json={"messages": MSGS}).status_code == 503
        assert c.post(CHAT, json={"messages": MSGS}).status_code == 200
        assert c.post("/mock/faults", json={"fail_status": None}).status_code == 200


def test_faults_are_checked_on_creation_too():
    with pytest.raises(ValueError, match="fail_status"):
        mock_backend.Faults(fail_status=99)
    with pytest.raises(ValueError, match="delay_s"):
        mock_backend.Faults(delay_s=float("nan"))


# --------------------------------------------------------------------------- body limit


def _limited_apps(tmp_path: Path, limit: int) -> dict[str, tuple[FastAPI, str]]:
    return {
        "mock": (mock_app(max_body_bytes=limit), CHAT),
        "proxy": (proxy_app(tmp_path, max_body_bytes=limit)[0], CHAT),
        "router": (router_app(tmp_path, [mock_app()], max_body_bytes=limit), CHAT),
        "sim": (sim_api.create_app(sim_api.SimConfig(max_body_bytes=limit)), SIM),
    }


@pytest.mark.parametrize("service", ["mock", "proxy", "router", "sim"])
def test_body_over_the_limit_is_413(tmp_path, service):
    app, path = _limited_apps(tmp_path, 2000)[service]
    big = _body(pad="x" * 3000)

    def chunks():
        for _ in range(100):  # no Content-Length: counted as it arrives
            yield b" " * 100

    with TestClient(app) as c:
        for content in (big, chunks()):
            r = c.post(path, content=content)
            assert r.status_code == 413 and "SKV_MAX_BODY_BYTES" in r.json()["error"]["message"]
        assert c.post(path, content=_body()).status_code == 200
        assert c.get("/health").status_code == 200


def _raw_post(url: str, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send a request's head and only ``body_parts`` over a raw socket; the answer's first line."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        return sock.recv(4096).split(b"\r\n", 1)[0]


def test_body_limit_answers_before_the_body_is_sent():
    """Over a real socket: the 413 comes while the client still owes most of its body (a 50 MB
    Content-Length with no body sent; a chunked body 50 kB past the limit)."""
    app = sim_api.create_app(sim_api.SimConfig(max_body_bytes=100_000))
    with serve_app(app) as url:
        head = f"POST {SIM} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        first = _raw_post(url, (head + "Content-Length: 50000000\r\n\r\n").encode(), [])
        assert first == b"HTTP/1.1 413 Request Entity Too Large"
        chunk = b"%x\r\n%s\r\n" % (10_000, b" " * 10_000)
        first = _raw_post(url, (head + "Transfer-Encoding: chunked\r\n\r\n").encode(), [chunk] * 15)
        assert first == b"HTTP/1.1 413 Request Entity Too Large"
        assert httpx.get(url + "/health").status_code == 200


def test_body_limit_default_and_env(monkeypatch):
    assert checks.DEFAULT_MAX_BODY_BYTES == 4 * 1024 * 1024
    assert proxy.ProxyConfig().max_body_bytes == checks.DEFAULT_MAX_BODY_BYTES
    monkeypatch.setenv("SKV_MAX_BODY_BYTES", "12345")
    assert proxy.ProxyConfig.from_env().max_body_bytes == 12345
    assert sim_api.SimConfig.from_env().max_body_bytes == 12345
    monkeypatch.setenv("SKV_REPLICAS", "http://a")
    assert router.RouterConfig.from_env().max_body_bytes == 12345
    monkeypatch.setenv("SKV_MAX_BODY_BYTES", "lots")
    with pytest.raises(ValueError, match="SKV_MAX_BODY_BYTES"):
        proxy.ProxyConfig.from_env()


# --------------------------------------------------------------------------- redaction

MARKER = "zebra-octopus-4711"


def echo_upstream() -> FastAPI:
    """An upstream (served over a socket) that echoes the request in its answers: 422 and 500
    error bodies (as FastAPI's validation error does), the answer text, a stream it then cuts."""
    app = FastAPI()
    calls = {"n": 0}

    @app.post(CHAT)
    async def chat(request: Request):
        body = await request.json()
        calls["n"] += 1
        echo = json.dumps(body)
        if calls["n"] == 1:
            return JSONResponse({"detail": [{"input": body}]}, status_code=422)
        if calls["n"] == 2:
            return JSONResponse({"error": echo}, status_code=500)
        if calls["n"] == 3:
            choice = {"message": {"role": "assistant", "content": echo}}
            return {"choices": [choice], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}

        async def events():
            chunk = {"choices": [{"delta": {"content": echo}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            if calls["n"] == 4:
                raise ConnectionResetError("cut")
            error = {"error": {"message": f"cannot go on with {echo}", "type": "x", "code": 400}}
            yield f"data: {json.dumps(error)}\n\n".encode()  # in-band, as vLLM sends it

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize("redact", [True, False])
def test_redacted_trace_holds_nothing_the_client_sent(tmp_path, redact):
    msgs = [{"role": "user", "content": f"secret {MARKER} here"}]
    with serve_app(echo_upstream()) as up:
        cfg = proxy.ProxyConfig(
            upstream_base_url=up, trace_output_dir=tmp_path, trace_name="t", redact_text=redact
        )
        trace = tmp_path / "t.jsonl"
        with TestClient(proxy.create_app(cfg)) as c:
            assert c.post(CHAT, json={"messages": msgs, "model": MARKER}).status_code == 422
            r = c.post(CHAT, json={"messages": msgs})
            assert r.status_code == 502 and MARKER in r.text  # the client sees its own echo
            assert c.post(CHAT, json={"messages": msgs}).status_code == 200
            for _ in range(2):  # cut, then an error event
                with c.stream("POST", CHAT, json={"messages": msgs, "stream": True}) as s:
                    list(s.iter_lines())
    recs = records(trace)
    assert [r.get("extra", {}).get("error", {}).get("kind") for r in recs] == [
        "upstream_422", "upstream_5xx", None, "dropped_stream", "stream_error",
    ]  # fmt: skip
    text = trace.read_text()
    if redact:
        assert MARKER not in text
        assert json.loads(text.splitlines()[0])["meta"]["redacted"] is True
    else:  # the switch is what hides it: unredacted, error bodies are kept
        assert MARKER in recs[0]["extra"]["error"]["body"]
        assert MARKER in recs[1]["extra"]["error"]["body"]
        assert MARKER in recs[4]["extra"]["error"]["body"]


# --------------------------------------------------------------------------- timeouts


def test_timeout_defaults_and_env(monkeypatch):
    t = relay.Timeouts()
    assert (t.connect_s, t.first_byte_s, t.total_s) == (5.0, 60.0, 600.0)
    pc = proxy.ProxyConfig()
    assert pc.timeouts == t
    assert router.RouterConfig(replicas=["http://a"]).timeouts == t
    for prefix in ("SKV_PROXY", "SKV_ROUTER"):
        monkeypatch.setenv(f"{prefix}_CONNECT_TIMEOUT_SECONDS", "1.5")
        monkeypatch.setenv(f"{prefix}_FIRST_BYTE_TIMEOUT_SECONDS", "2.5")
        monkeypatch.setenv(f"{prefix}_TIMEOUT_SECONDS", "30")
    monkeypatch.setenv("SKV_REPLICAS", "http://a")
    expect = relay.Timeouts(1.5, 2.5, 30.0)
    assert proxy.ProxyConfig.from_env().timeouts == expect
    assert router.RouterConfig.from_env().timeouts == expect
    httpx_t = expect.client()
    assert (httpx_t.connect, httpx_t.read, httpx_t.write) == (1.5, 2.5, 2.5)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            relay.Timeouts(first_byte_s=bad)
    with pytest.raises(ValueError, match="connect_s"):
        router.RouterConfig(replicas=["http://a"], connect_timeout_s=0)


def test_cli_timeout_and_body_flags(monkeypatch):
    import argparse

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers())
    args = p.parse_args(["proxy", "--connect-timeout", "1", "--first-byte-timeout", "2",
                         "--timeout", "3", "--max-body-bytes", "99"])  # fmt: skip
    cfg = proxy.ProxyConfig()
    cli._set_timeouts(cfg, args)
    assert cfg.timeouts == relay.Timeouts(1.0, 2.0, 3.0) and cli._max_body(args) == 99
    args = p.parse_args(["router", "--first-byte-timeout", "0"])
    with pytest.raises(ValueError, match="first_byte_s"):
        cli._set_timeouts(router.RouterConfig(replicas=["http://a"]), args)


def test_first_byte_timeout_lets_go_of_a_hung_engine(tmp_path):
    engine = mock_app()
    engine.state.engine.faults.update({"delay_s": 5.0})
    with serve_app(engine) as up:
        cfg = proxy.ProxyConfig(upstream_base_url=up, trace_output_dir=tmp_path, trace_name="t",
                                first_byte_timeout_s=0.3, timeout_s=30)  # fmt: skip
        with serve_app(proxy.create_app(cfg)) as px, httpx.Client(base_url=px, timeout=10) as c:
            t0 = time.perf_counter()
            r = c.post(CHAT, json={"messages": MSGS})
            assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
            assert time.perf_counter() - t0 < 2.5
            assert "0.3 s" in r.json()["error"]["message"]


def test_silent_stream_and_total_deadline_end_the_stream(tmp_path):
    """A stream silent longer than first_byte_timeout_s, and one that keeps talking past the
    total timeout, both end with a timeout event (headers were already sent) and a record."""
    slow = mock_app(time_scale=1.0, itl_ms=1000, max_tokens=10)  # 1 s between tokens
    chatty = mock_app(time_scale=1.0, itl_ms=50, max_tokens=60)  # 3 s in all
    with serve_app(slow) as up_slow, serve_app(chatty) as up_chatty:
        cases = [(up_slow, {"first_byte_timeout_s": 0.4, "timeout_s": 30}),
                 (up_chatty, {"first_byte_timeout_s": 5, "timeout_s": 0.8})]  # fmt: skip
        for k, (up, kw) in enumerate(cases):
            cfg = proxy.ProxyConfig(
                upstream_base_url=up, trace_output_dir=tmp_path, trace_name=f"t{k}", **kw
            )
            app = proxy.create_app(cfg)
            with serve_app(app) as px, httpx.Client(base_url=px, timeout=10) as c:
                t0 = time.perf_counter()
                body = {"messages": MSGS, "stream": True}
                with c.stream("POST", CHAT, json=body) as s:
                    assert s.status_code == 200
                    lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
                assert time.perf_counter() - t0 < 2.5
                assert json.loads(lines[-1][6:])["error"]["type"] == "timeout"
                wait_until(lambda app=app: app.state.writer.out.count == 1, "record", 5)
            (rec,) = records(tmp_path / f"t{k}.jsonl")
            assert rec["extra"]["error"]["kind"] == "timeout"


def test_router_fails_over_after_a_first_byte_timeout(tmp_path):
    hung = mock_app(name="hung")
    hung.state.engine.faults.update({"delay_s": 5.0})
    app = router_app(tmp_path, [hung, mock_app(name="ok")], first_byte_timeout_s=0.3)
    with TestClient(app) as c:
        t0 = time.perf_counter()
        r = c.post(CHAT, json={"messages": MSGS})
        assert r.status_code == 200 and r.json()["skv_mock"]["engine"] == "ok"
        assert time.perf_counter() - t0 < 2.5
    (d,) = decisions(tmp_path)
    assert d["attempts"][0]["error"] == "timeout" and d["chosen"] == 1
    assert app.state.router.in_flight == [0, 0]


# --------------------------------------------------------------------------- off the event loop


def _slow(fn, seconds: float = 0.8):
    def wrapped(*args, **kw):
        time.sleep(seconds)  # a stand-in for heavy segmentation
        return fn(*args, **kw)

    return wrapped


@pytest.mark.parametrize("service", ["json", "mock", "proxy", "router", "sim"])
def test_cpu_work_runs_off_the_event_loop(tmp_path, monkeypatch, service):
    """/health answers at once while a request is being segmented (slowed down here)."""
    targets = {
        "json": (checks, "parse_json_object"),
        "mock": (mock_backend, "prompt_segments"),
        "proxy": (proxy, "segment_body"),
        "router": (router, "request_segments"),
        "sim": (sim_api, "segment_body"),
    }
    module, name = targets[service]
    monkeypatch.setattr(module, name, _slow(getattr(module, name)))
    app, path = _apps(tmp_path)["sim" if service == "json" else service]

    async def go():
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as c:
            t0 = time.perf_counter()
            slow = asyncio.create_task(c.post(path, json={"messages": MSGS}))
            await asyncio.sleep(0.1)  # the slow request is in its CPU step by now
            assert (await c.get("/health")).status_code == 200
            health_done = time.perf_counter() - t0  # on the loop, the step would hold it 0.8 s
            assert (await slow).status_code == 200
            return health_done

    assert asyncio.run(go()) < 0.5


def test_health_answers_during_a_big_request(tmp_path):
    """A megabyte-sized prompt, over real sockets: /health is never held for long (the
    tokenizer's C calls still hold the GIL, ~0.15 s per MB of prompt)."""
    text = ("Tokens and more tokens, 42 of them. " * 30 + "\n") * 1200  # ~1.3 MB
    body = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
    with serve_app(sim_api.create_app(sim_api.SimConfig())) as url:
        worst = 0.0
        result: dict = {}

        def post():
            result["r"] = httpx.post(url + SIM, content=body, timeout=60)

        th = threading.Thread(target=post)
        th.start()
        with httpx.Client(base_url=url, timeout=10) as c:
            while th.is_alive():
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                worst = max(worst, time.perf_counter() - t0)
                time.sleep(0.01)
        th.join()
        assert result["r"].status_code == 200
        assert worst < 1.0


def test_a_client_that_hangs_up_right_after_done_was_served():
    """The client has read ``[DONE]`` and closes while the upstream has not yet closed its end
    (real engines do this): that request was served, so it is recorded with its TTFT, not as
    ``client_gone`` (a real-engine chain test caught this; here without an engine)."""

    async def events():
        yield b'data: {"choices": [{"delta": {"content": "w"}}]}\n\n'
        yield b"data: [DONE]\n\n"
        await asyncio.sleep(3600)  # the upstream keeps its connection open a while

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            resp = await client.send(client.build_request("POST", "http://u/x"), stream=True)
            ended: list[relay.Outcome] = []
            now = time.perf_counter()
            response = await relay.relay_response(
                resp, relay.Outcome(), now, ended.append, deadline=now + 10
            )
            got_done = asyncio.Event()

            async def receive():
                await got_done.wait()
                return {"type": "http.disconnect"}

            async def send(message):
                if b"[DONE]" in message.get("body", b""):
                    got_done.set()

            scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
            await asyncio.wait_for(response(scope, receive, send), 10)
            assert len(ended) == 1
            assert ended[0].error_kind is None and ended[0].ttft_ms is not None
            return response

    asyncio.run(go())


@pytest.mark.parametrize("service", ["proxy", "router"])
def test_idle_upstream_connections_are_let_go_before_the_server_closes_them(tmp_path, service):
    """uvicorn (so vLLM's server) closes a connection idle for 5 s; a client that keeps it as
    long may send a request just as it closes (the request then fails with no answer: a 502,
    and for a router a replica marked down). The services let an idle connection go after
    UPSTREAM_KEEPALIVE_S: reused before that, a fresh one after."""
    assert relay.UPSTREAM_KEEPALIVE_S <= 2.5  # half uvicorn's 5 s: room for a loaded loop
    upstream = FastAPI()

    @upstream.post("/v1/chat/completions")
    async def answer(request: Request) -> JSONResponse:
        port = request.client.port if request.client else None
        return JSONResponse({"choices": [{"message": {"content": str(port)}}]})

    def port_seen(c: httpx.Client) -> str:
        r = c.post(CHAT, json={"messages": MSGS})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with serve_app(upstream) as up:
        if service == "proxy":
            cfg = proxy.ProxyConfig(upstream_base_url=up, trace_output_dir=tmp_path)
            app = proxy.create_app(cfg)
        else:
            app = router.create_app(router.RouterConfig(replicas=[up], routing_output_dir=None))
        with serve_app(app) as svc, httpx.Client(base_url=svc, timeout=10) as c:
            first = port_seen(c)
            time.sleep(0.2)
            assert port_seen(c) == first  # kept while briefly idle
            time.sleep(relay.UPSTREAM_KEEPALIVE_S + 0.5)
            assert port_seen(c) != first  # let go: a new connection
