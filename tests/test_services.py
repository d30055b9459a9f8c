"""skv.services: mock engine, telemetry proxy, cache-locality router, simulation API.

In-process apps over httpx's ASGI transport, plus real uvicorn servers on 127.0.0.1 (random
free ports) where a stream must really pass through or break. Loopback only, bounded loops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from helpers import serve_app, wait_until  # noqa: E402

from skv.services import mock_backend, proxy, router, sim_api  # noqa: E402
from skv.traces import load_trace  # noqa: E402

SYSTEM = "You are a concise assistant for the support team. " * 12
MSGS = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "CONTEXT: shared document about refunds.\n\nUSER: summarize it"},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def asgi(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test", timeout=10)


def records(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["skv_trace"] == 1
    return [json.loads(x) for x in lines[1:]]


# --------------------------------------------------------------------------- mock backend


def test_mock_backend_reports_cached_tokens_and_metrics():
    async def go():
        app = mock_backend.create_app(mock_backend.MockConfig())
        async with asgi(app) as c:
            r1 = (await c.post("/v1/chat/completions", json={"messages": MSGS})).json()
            r2 = (await c.post("/v1/chat/completions", json={"messages": MSGS})).json()
            assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert r1["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
            r3 = (await c.post("/v1/completions", json={"prompt": "hello there"})).json()
            assert r3["choices"][0]["text"]
            m = (await c.get("/metrics")).text
            assert "vllm:prefix_cache_hits_total" in m and "vllm:prefix_cache_queries_total" in m
            assert (await c.get("/health")).json()["status"] == "ok"

    asyncio.run(go())


# --------------------------------------------------------------------------- proxy


def _proxy(tmp_path: Path, upstream: str, timeout: float = 5.0, name: str = "t"):
    cfg = proxy.ProxyConfig(
        upstream_base_url=upstream, trace_output_dir=tmp_path, timeout_s=timeout, trace_name=name
    )
    return proxy.create_app(cfg), tmp_path / f"{name}.jsonl"


def test_proxy_streams_through_real_server_and_records(tmp_path):
    backend = mock_backend.create_app(mock_backend.MockConfig(time_scale=0.2, itl_ms=2))
    with serve_app(backend) as up:
        app, trace = _proxy(tmp_path, up)
        with serve_app(app) as px, httpx.Client(base_url=px, timeout=10) as c:
            hdr = {"X-Session-ID": "s1", "X-Tenant-ID": "t1"}
            r = c.post("/v1/chat/completions", json={"messages": MSGS}, headers=hdr)
            assert r.status_code == 200
            direct = httpx.post(
                up + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 5}
            )
            assert direct.status_code == 200
            events = []
            with c.stream(
                "POST", "/v1/chat/completions",
                json={"messages": MSGS, "stream": True}, headers=hdr,
            ) as s:  # fmt: skip
                assert s.status_code == 200
                assert s.headers["content-type"].startswith("text/event-stream")
                for line in s.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            # the usage chunk the proxy asked for is not shown to a client that did not ask
            assert all(ch["choices"] for ch in chunks)
            text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks)
            assert text == r.json()["choices"][0]["message"]["content"]
    reqs = load_trace(trace)
    assert len(reqs) == 2
    first, second = sorted(reqs, key=lambda q: q.arrival_s)
    assert first.session_id == "s1" and first.tenant_id == "t1"
    assert second.parent_id == first.request_id
    assert all(q.observed_ttft_ms and q.observed_ttft_ms > 0 for q in reqs)
    assert second.observed_cached_tokens and second.observed_cached_tokens > 0
    assert second.extra["stream"] is True and "total_latency_ms" in second.extra
    assert all(s.text is None for q in reqs for s in q.segments)  # redacted by default
    assert {s.stype.value for s in first.segments} >= {"system", "retrieved_context"}


def test_proxy_faults_give_clear_errors_and_records(tmp_path):
    engine_app = mock_backend.create_app(mock_backend.MockConfig())
    faults = engine_app.state.engine.faults
    with serve_app(engine_app) as up:
        app, trace = _proxy(tmp_path, up, timeout=0.5)
        with serve_app(app) as px, httpx.Client(base_url=px, timeout=10) as c:
            body = {"messages": MSGS}
            faults.update({"delay_s": 2.0})
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
            faults.update({"delay_s": 0.0, "fail_status": 503, "fail_count": 1})
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_5xx"
            faults.update({"drop_after_chunks": 2})
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
                assert s.status_code == 200  # headers were out before the break
                lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
            assert "[DONE]" not in lines[-1]
            assert json.loads(lines[-1][6:])["error"]["type"] == "dropped_stream"
            faults.update({"drop_after_chunks": None})
            r = c.post("/v1/chat/completions", json=body)  # still serving
            assert r.status_code == 200
    recs = records(trace)
    kinds = [r.get("extra", {}).get("error", {}).get("kind") for r in recs]
    assert kinds == ["timeout", "upstream_5xx", "dropped_stream", None]
    assert [r["extra"]["status"] for r in recs][:2] == [504, 502]
    assert len(load_trace(trace)) == 4


def test_proxy_connection_refused(tmp_path):
    async def go():
        app, trace = _proxy(tmp_path, f"http://127.0.0.1:{free_port()}")
        async with asgi(app) as c:
            r = await c.post("/v1/chat/completions", json={"messages": MSGS})
            assert r.status_code == 502 and r.json()["error"]["type"] == "connect"
            assert (await c.get("/health")).status_code == 200
            bad = await c.post("/v1/chat/completions", json={"messages": "nope"})
            assert bad.status_code == 400
        (rec,) = records(trace)
        assert rec["extra"]["error"]["kind"] == "connect"

    asyncio.run(go())


# --------------------------------------------------------------------------- router


def _replicas(n: int, **kw):
    apps = [mock_backend.create_app(mock_backend.MockConfig(name=f"r{i}", **kw)) for i in range(n)]
    mounts = {f"http://replica-{i}": httpx.ASGITransport(a) for i, a in enumerate(apps)}
    return apps, [f"http://replica-{i}" for i in range(n)], mounts


def _router(tmp_path, policy, urls, mounts):
    cfg = router.RouterConfig(replicas=urls, policy=policy, routing_output_dir=tmp_path)
    return router.create_app(cfg, mounts=mounts)


def _msgs(k: int) -> list[dict]:
    return [
        {"role": "system", "content": f"You are assistant number {k}. " + "Be precise. " * 40},
        {"role": "user", "content": f"question {k}"},
    ]


def test_router_round_robin_spreads(tmp_path):
    async def go():
        apps, urls, mounts = _replicas(3)
        app = _router(tmp_path, "round_robin", urls, mounts)
        async with asgi(app) as c:
            for _ in range(6):
                r = await c.post("/v1/chat/completions", json={"messages": _msgs(0)})
                assert r.status_code == 200
        assert [a.state.engine.calls for a in apps] == [2, 2, 2]
        (log,) = list(tmp_path.glob("routing-*.jsonl"))
        assert [json.loads(x)["chosen"] for x in log.read_text().splitlines()] == [0, 1, 2] * 2

    asyncio.run(go())


@pytest.mark.parametrize("policy", ["prefix_locality", "semantic_locality"])
def test_router_locality_keeps_prefixes_together(tmp_path, policy):
    async def go():
        apps, urls, mounts = _replicas(3)
        app = _router(tmp_path, policy, urls, mounts)
        chosen: dict[int, set[str]] = {}
        async with asgi(app) as c:
            for _rep in range(3):
                for k in range(4):
                    r = await c.post("/v1/chat/completions", json={"messages": _msgs(k)})
                    assert r.status_code == 200
            log = next(tmp_path.glob("routing-*.jsonl")).read_text().splitlines()
        for i, line in enumerate(log):
            chosen.setdefault(i % 4, set()).add(json.loads(line)["chosen"])
        assert all(len(v) == 1 for v in chosen.values())  # each prefix stayed on one replica
        assert len(set().union(*chosen.values())) > 1  # and distinct prefixes spread out
        hits = sum(a.state.engine.counters["prefix_cache_hits"] for a in apps)
        assert hits > 0

    asyncio.run(go())


def _precise_router(tmp_path, urls, mounts, endpoints):
    cfg = router.RouterConfig(
        replicas=urls, policy="precise", routing_output_dir=tmp_path, kv_events=endpoints,
        kv_events_topic="kv",
    )  # fmt: skip
    return router.create_app(cfg, mounts=mounts)


def test_router_precise_follows_kv_events(tmp_path):
    from helpers import KVPublisher

    from skv.vllm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    endpoints = [f"ipc://{tmp_path}/r{i}.sock" for i in range(2)]
    pubs = [KVPublisher(e) for e in endpoints]
    apps, urls, mounts = _replicas(2)
    app = _precise_router(tmp_path, urls, mounts, endpoints)
    index = app.state.router.index
    ids: list[int] = []
    bs = 4

    def publish(i: int, events) -> None:
        before = index.state(i).stores + index.state(i).removals
        pubs[i].send(events)
        wait_until(lambda: index.state(i).stores + index.state(i).removals > before, "events")

    async def go():
        for i, pub in enumerate(pubs):  # the slow joiner: probe until each subscription is up
            wait_until(lambda i=i, pub=pub: pub.send([AllBlocksCleared()]) or index.state(i).clears,
                  f"subscriber {i}")  # fmt: skip
        async with asgi(apps[1]) as r1:  # the tokens replica 1's engine would see
            tok = (await r1.post("/tokenize", json={"messages": _msgs(0)})).json()
        ids.extend(tok["tokens"])
        async with asgi(app) as c:
            assert tok["count"] == len(ids) > 3 * bs
            # replica 1's engine reports the first three blocks of this prompt as stored
            publish(1, [BlockStored((b"a", b"b"), None, tuple(ids[: 2 * bs]), bs)])
            publish(1, [BlockStored((b"c",), b"b", tuple(ids[2 * bs : 3 * bs]), bs)])
            r = await c.post("/v1/chat/completions", json={"messages": _msgs(0)})
            assert r.status_code == 200
            other = [{"role": "user", "content": "Unrelated question about invoices."}]
            r = await c.post("/v1/chat/completions", json={"messages": other})  # no match
            publish(1, [BlockRemoved((b"b",))])  # a hole after the first block
            r = await c.post("/v1/chat/completions", json={"messages": _msgs(0)})
            # a token-id completion prompt needs no /tokenize
            publish(0, [BlockStored((7,), None, (1, 2, 3, 4), bs)])
            r = await c.post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5], "max_tokens": 2})
            assert r.status_code == 200
            st = (await c.get("/router/state")).json()
        for sub in app.state.kv_subscribers:
            sub.close()
        return st

    try:
        st = asyncio.run(go())
    finally:
        for pub in pubs:
            pub.close()
    log = [json.loads(x) for x in next(tmp_path.glob("routing-*.jsonl")).read_text().splitlines()]
    assert [d["chosen"] for d in log] == [1, 0, 1, 0]
    assert [d["scores"] for d in log] == [[0, 3], [0, 0], [0, 1], [1, 0]]
    assert log[0]["engine_tokens"] == len(ids) and "tokenize_error" not in log[0]
    assert log[1]["reason"] == "precise: no match, least loaded"
    assert log[3]["engine_tokens"] == 5
    assert st["replicas"][1]["kv_events"]["removed_blocks"] == 1


def test_router_precise_needs_an_endpoint_per_replica():
    with pytest.raises(ValueError, match="one KV-event endpoint per replica"):
        router.RouterConfig(replicas=["http://a", "http://b"], policy="precise", kv_events=["x"])


def test_router_precise_tokenizes_on_a_live_replica(tmp_path):
    """A replica that refuses connections is skipped for /tokenize (and for the request)."""
    _apps, urls, mounts = _replicas(1)
    dead = f"http://127.0.0.1:{free_port()}"
    endpoints = [f"ipc://{tmp_path}/r{i}.sock" for i in range(2)]
    app = _precise_router(tmp_path, [dead, *urls], mounts, endpoints)

    async def go():
        async with asgi(app) as c:
            r = await c.post("/v1/chat/completions", json={"messages": _msgs(2)})
            assert r.status_code == 200
        for sub in app.state.kv_subscribers:
            sub.close()

    asyncio.run(go())
    (d,) = [json.loads(x) for x in next(tmp_path.glob("routing-*.jsonl")).read_text().splitlines()]
    assert d["chosen"] == 1 and d["engine_tokens"] > 0 and "tokenize_error" not in d
    assert d["attempts"][0]["error"] == "connect"


def test_router_locality_matches_token_id_prompts_by_block_prefix(tmp_path):
    """Token-id prompts (hash-id trace replays) share approximate-cache keys block by block."""
    cfg = router.RouterConfig(replicas=["http://a", "http://b"], policy="prefix_locality",
                              routing_output_dir=None, block_size=4)  # fmt: skip
    state = router.RouterState(cfg)
    head = list(range(100, 112))  # three blocks
    first = state.blocks(router.token_segments([*head, 1, 2, 3, 4, 5], 4), None)
    state.finish(1, first, ok=True)
    other_tail = state.blocks(router.token_segments([*head, 9, 9, 9, 9], 4), None)
    order, scores, why = state.candidates(other_tail)
    assert scores == [0.0, 3.0]
    assert order == [1, 0] and why == "prefix_locality"


def test_router_state_ranks_with_the_shared_router_then_puts_cooling_replicas_last():
    """The service passes its max_imbalance (8) to the locality routers, reads in-flight load,
    and moves a replica cooling down after a failure behind the healthy ones."""
    cfg = router.RouterConfig(
        replicas=["http://a", "http://b", "http://c"],
        policy="prefix_locality",
        routing_output_dir=None,
        block_size=4,
    )
    state = router.RouterState(cfg)
    rb = state.blocks(router.token_segments(list(range(100, 112)), 4), None)
    state.finish(0, rb, ok=True)
    state.in_flight = [8, 1, 0]  # 8 - 0 is not more than 8: locality holds
    assert state.candidates(rb) == ([0, 2, 1], [3.0, 0.0, 0.0], "prefix_locality")
    state.in_flight = [10, 1, 1]  # 10 - 1 > 8: locality gives way
    order, _, why = state.candidates(rb)
    assert order == [1, 0, 2] and why == "prefix_locality: imbalance > 8, least loaded"
    state.finish(1, None, ok=False)  # replica 1 cools down: tried last
    assert state.candidates(rb)[0] == [0, 2, 1]


def test_router_fails_over(tmp_path):
    async def go():
        apps, urls, mounts = _replicas(2)
        dead = f"http://127.0.0.1:{free_port()}"
        cfg = router.RouterConfig(
            replicas=[dead, *urls], policy="round_robin", routing_output_dir=tmp_path
        )
        app = router.create_app(cfg, mounts=mounts)
        apps[0].state.engine.faults.update({"fail_status": 500, "fail_count": -1})
        async with asgi(app) as c:
            for _ in range(4):
                r = await c.post("/v1/chat/completions", json={"messages": _msgs(1)})
                assert r.status_code == 200
            st = (await c.get("/router/state")).json()
        assert st["replicas"][0]["failures"] >= 1 and st["replicas"][2]["routed"] == 4
        log = [
            json.loads(x) for x in next(tmp_path.glob("routing-*.jsonl")).read_text().splitlines()
        ]
        assert all(d["chosen"] == 2 for d in log)
        assert log[0]["attempts"][0]["error"] == "connect"

    asyncio.run(go())


def test_router_all_down_is_502(tmp_path):
    async def go():
        cfg = router.RouterConfig(
            replicas=[f"http://127.0.0.1:{free_port()}"], routing_output_dir=None
        )
        async with asgi(router.create_app(cfg)) as c:
            r = await c.post("/v1/chat/completions", json={"messages": MSGS})
            assert r.status_code == 502 and "replicas failed" in r.json()["error"]["message"]

    asyncio.run(go())


# --------------------------------------------------------------------------- sim API


def test_sim_api_hits_on_repeat():
    async def go():
        async with asgi(sim_api.create_app(sim_api.SimConfig())) as c:
            assert (await c.get("/health")).json()["status"] == "ok"
            body = {"request_id": "req_001", "session_id": "sess_001", "messages": MSGS}
            a = (await c.post("/v1/simulate/request", json=body)).json()
            b = (await c.post("/v1/simulate/request", json=body)).json()
            assert a["hit_tokens"] == 0 and b["hit_tokens"] == b["prompt_tokens"] > 0
            assert b["estimated_ttft_ms"] < a["estimated_ttft_ms"]
            assert all(blk["hit"] for blk in b["blocks"]) and a["blocks"]
            assert (await c.post("/v1/simulate/request", json={"x": 1})).status_code == 400

    asyncio.run(go())


def test_cli_register_and_demo(capsys):
    import argparse

    from skv.services import cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers())
    for cmd in ("serve-mock", "proxy", "router", "sim-api"):
        assert p.parse_args([cmd]).host == "127.0.0.1"
    args = p.parse_args(["demo-router", "--requests", "30", "--policies", "round_robin",
                         "prefix_locality"])  # fmt: skip
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "round_robin" in out and "prefix_locality" in out and "%" in out


def test_router_refuses_token_ids_out_of_range(tmp_path):
    async def go():
        _apps, urls, mounts = _replicas(1)
        async with asgi(_router(tmp_path, "prefix_locality", urls, mounts)) as c:
            r = await c.post("/v1/completions", json={"prompt": [1, -1], "max_tokens": 1})
            assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]

    asyncio.run(go())


# --------------------------------------------------------------------------- seed env names


SEED_ENV = {  # every SEMANTICKV_ variable the seed project documents
    "SEMANTICKV_UPSTREAM_BASE_URL": "http://seed-upstream:8001",
    "SEMANTICKV_TRACE_OUTPUT_DIR": "seed_traces",
    "SEMANTICKV_REDACT_TEXT": "false",
    "SEMANTICKV_PROXY_TIMEOUT_SECONDS": "7.5",
    "SEMANTICKV_REPLICAS": "http://seed-a:8101,http://seed-b:8102",
    "SEMANTICKV_ROUTING_POLICY": "semantic_locality",
}


@pytest.fixture
def seed_env(monkeypatch):
    from skv.services import _common

    monkeypatch.setattr(_common, "_warned_legacy", set())
    for name in [*SEED_ENV, *(n.replace("SEMANTICKV_", "SKV_") for n in SEED_ENV)]:
        monkeypatch.delenv(name, raising=False)
    for name, value in SEED_ENV.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_seed_env_names_are_aliases_with_one_warning_each(seed_env, caplog):
    caplog.set_level("WARNING", logger="skv.services._common")
    for _ in range(2):  # read twice: still one warning per variable
        pc = proxy.ProxyConfig.from_env()
        rc = router.RouterConfig.from_env()
    assert pc.upstream_base_url == "http://seed-upstream:8001"
    assert pc.trace_output_dir == Path("seed_traces")
    assert pc.redact_text is False and pc.timeout_s == 7.5
    assert rc.replicas == ["http://seed-a:8101", "http://seed-b:8102"]
    assert rc.policy == "semantic_locality"
    warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert sorted(warned) == sorted(
        f"{n} is deprecated; use {n.replace('SEMANTICKV_', 'SKV_')} (read as its alias)"
        for n in SEED_ENV
    )


def test_skv_env_name_wins_over_the_seed_alias(seed_env, caplog):
    seed_env.setenv("SKV_UPSTREAM_BASE_URL", "http://skv-upstream:9001")
    seed_env.setenv("SKV_ROUTING_POLICY", "least_loaded")
    caplog.set_level("WARNING", logger="skv.services._common")
    assert proxy.ProxyConfig.from_env().upstream_base_url == "http://skv-upstream:9001"
    assert router.RouterConfig.from_env().policy == "least_loaded"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "SEMANTICKV_UPSTREAM_BASE_URL" not in warned
    assert "SEMANTICKV_REPLICAS is deprecated" in warned  # the alias still used is still named


# --------------------------------------------------------------------------- router /metrics


def _samples(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value}; every line must parse."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = re.fullmatch(r'([a-z_:][a-z0-9_:]*(?:\{(?:[a-z_]+="[^"]*",?)*\})?) (\S+)', line)
        assert m, f"not a Prometheus sample line: {line!r}"
        out[m.group(1)] = float(m.group(2))
    return out


def test_router_metrics_count_routing_failovers_and_errors(tmp_path):
    async def go():
        _apps, urls, mounts = _replicas(2)
        dead = f"http://127.0.0.1:{free_port()}"
        cfg = router.RouterConfig(
            replicas=[dead, *urls], policy="round_robin", routing_output_dir=None
        )
        async with asgi(router.create_app(cfg, mounts=mounts)) as c:
            for _ in range(3):  # round robin starts at dead, replica-0, replica-1
                assert (await c.post("/v1/chat/completions", json={"messages": MSGS})).is_success
            r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "# TYPE skv_router_routed_total counter" in r.text
        assert "# TYPE skv_router_in_flight gauge" in r.text
        m = _samples(r.text)
        rr = 'policy="round_robin"'
        assert m[f'skv_router_routed_total{{replica="{dead}",{rr}}}'] == 0
        assert m[f'skv_router_routed_total{{replica="http://replica-0",{rr}}}'] == 2
        assert m[f'skv_router_routed_total{{replica="http://replica-1",{rr}}}'] == 1
        assert m[f'skv_router_replica_failures_total{{replica="{dead}"}}'] == 1
        assert m[f"skv_router_failovers_total{{{rr}}}"] == 1
        assert m[f"skv_router_errors_total{{{rr}}}"] == 0
        assert all(m[f'skv_router_in_flight{{replica="{u}"}}'] == 0 for u in [dead, *urls])

        cfg = router.RouterConfig(replicas=[dead], routing_output_dir=None)
        async with asgi(router.create_app(cfg)) as c:
            r = await c.post("/v1/chat/completions", json={"messages": MSGS})
            assert r.status_code == 502
            m = _samples((await c.get("/metrics")).text)
        assert m[f"skv_router_errors_total{{{rr}}}"] == 1
        assert m[f"skv_router_failovers_total{{{rr}}}"] == 0  # nowhere else to go

    asyncio.run(go())


def test_router_metrics_escape_label_values():
    assert router._label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


# --------------------------------------------------------------------------- demo-router logs


def test_demo_router_is_quiet_unless_verbose(caplog, capsys):
    import argparse

    from skv.services import cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers())
    caplog.set_level("INFO")
    base = ["demo-router", "--requests", "4", "--replicas", "2", "--policies", "round_robin"]
    args = p.parse_args(base)
    assert args.func(args) == 0
    assert not [r for r in caplog.records if "HTTP Request" in r.getMessage()]
    assert "round_robin" in capsys.readouterr().out
    assert logging.getLogger("httpx").level == logging.NOTSET  # restored afterwards

    args = p.parse_args([*base, "--verbose"])
    assert args.func(args) == 0
    lines = [r for r in caplog.records if "HTTP Request" in r.getMessage()]
    assert len(lines) == 8  # client -> router -> replica, per request
