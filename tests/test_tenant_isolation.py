"""Tenant isolation in the proxy and the router (issue 16): vLLM's ``cache_salt``.

With the switch on, a prefix cached for one tenant never counts as a hit for another in the
router's scoring or routing (approximate caches and the precise KV-event index), the same
prefix within a tenant does, and every forwarded body carries the tenant's salt. With it off,
everything is as before: tenants share caches and bodies are forwarded as sent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from skv.services import cli, mock_backend, proxy, router, tenancy
from skv.services.checks import encode_json
from skv.services.tenant_index import TenantKVIndex
from skv.vllm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, content_keys

SYSTEM = "You are the support assistant of one company; answer briefly and politely. " * 10
BODY = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}


# --------------------------------------------------------------------------- salts


def test_salt_is_deterministic_per_tenant_and_hides_the_id():
    a, b = tenancy.cache_salt("acme"), tenancy.cache_salt("globex")
    assert a == tenancy.cache_salt("acme") and a != b
    assert "acme" not in a and a.startswith("skv1-") and len(a) == 5 + 32
    assert tenancy.cache_salt("acme", "s3cret") != a  # the secret keys the salts
    assert tenancy.tenant_of({}) == tenancy.tenant_of({"x-tenant-id": "  "}) == "default"
    assert tenancy.tenant_of({"x-tenant-id": " acme "}) == "acme"


def test_flag_and_env(monkeypatch):
    monkeypatch.delenv("SKV_TENANT_ISOLATION", raising=False)
    monkeypatch.setenv("SKV_REPLICAS", "http://a")
    assert not proxy.ProxyConfig.from_env().tenant_isolation
    assert not router.RouterConfig.from_env().tenant_isolation
    monkeypatch.setenv("SKV_TENANT_ISOLATION", "true")
    monkeypatch.setenv("SKV_TENANT_SALT_SECRET", "k")
    for cfg in (proxy.ProxyConfig.from_env(), router.RouterConfig.from_env()):
        assert cfg.tenant_isolation and cfg.tenant_salt_secret == "k"
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    for name in ("proxy", "router"):
        assert parser.parse_args(["services", name]).tenant_isolation is None  # env decides
        assert parser.parse_args(["services", name, "--tenant-isolation"]).tenant_isolation
        args = parser.parse_args(["services", name, "--no-tenant-isolation"])
        assert args.tenant_isolation is False


# --------------------------------------------------------------------------- forwarding


class Capture:
    """An upstream that records every body it gets and answers a minimal completion."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.raw.append(request.content)
        self.bodies.append(json.loads(request.content))
        answer = {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip
        return httpx.Response(200, json=answer)


def _proxy(tmp_path: Path, on: bool, up: Capture) -> Any:
    cfg = proxy.ProxyConfig(upstream_base_url="http://up", trace_output_dir=tmp_path,
                            trace_name="t", tenant_isolation=on,
                            tenant_source="header")  # fmt: skip
    return proxy.create_app(cfg, transport=httpx.MockTransport(up))


def _capture_router(on: bool, up: Capture) -> Any:
    cfg = router.RouterConfig(replicas=["http://r0"], policy="prefix_locality",
                              routing_output_dir=None, tenant_isolation=on,
                              tenant_source="header")  # fmt: skip
    return router.create_app(cfg, transport=httpx.MockTransport(up))


@pytest.mark.parametrize("service", ["proxy", "router"])
def test_forwarded_body_carries_the_tenants_salt_only_when_on(tmp_path, service):
    bodies = {}
    for on in (False, True):
        up = Capture()
        app = _proxy(tmp_path / str(on), on, up) if service == "proxy" else _capture_router(on, up)
        with TestClient(app) as c:
            for headers in ({"x-tenant-id": "acme"}, {"x-tenant-id": "globex"}, {}):
                r = c.post("/v1/chat/completions", json=BODY, headers=headers)
                assert r.status_code == 200, r.text
            # a client's own salt: replaced when on (it could name another tenant's salt)
            spoof = {**BODY, "cache_salt": tenancy.cache_salt("globex")}
            c.post("/v1/chat/completions", json=spoof, headers={"x-tenant-id": "acme"})
        bodies[on] = up
    off, on_ = bodies[False], bodies[True]
    assert all("cache_salt" not in b for b in off.bodies[:3])
    assert off.bodies[3]["cache_salt"] == tenancy.cache_salt("globex")  # passed on unchanged
    if service == "router":  # off: forwarded byte for byte as before
        assert off.raw[0] == encode_json(BODY)
    salts = [b["cache_salt"] for b in on_.bodies]
    expected = [tenancy.cache_salt(t) for t in ("acme", "globex", "default", "acme")]
    assert salts == expected
    assert all({k: v for k, v in b.items() if k != "cache_salt"} == BODY for b in on_.bodies)


def test_proxy_records_the_default_tenant_when_on(tmp_path):
    up = Capture()
    with TestClient(_proxy(tmp_path, True, up)) as c:
        assert c.post("/v1/chat/completions", json=BODY).status_code == 200
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["meta"]["tenant_isolation"] is True
    assert json.loads(lines[1])["tenant_id"] == "default"
    assert tenancy.cache_salt("default") not in "\n".join(lines)  # no salt in the trace


def test_proxy_off_keeps_the_trace_as_before(tmp_path):
    up = Capture()
    with TestClient(_proxy(tmp_path, False, up)) as c:
        assert c.post("/v1/chat/completions", json=BODY).status_code == 200
    header, rec = (json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines())
    assert "tenant_isolation" not in header["meta"] and "tenant_id" not in rec


# --------------------------------------------------------------------------- mock engine


def test_mock_engine_isolates_by_cache_salt():
    with TestClient(mock_backend.create_app(mock_backend.MockConfig(max_tokens=2))) as c:

        def cached(**extra: Any) -> int:
            r = c.post("/v1/chat/completions", json={**BODY, **extra})
            assert r.status_code == 200
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached(cache_salt="a") == 0
        assert cached(cache_salt="b") == 0  # same prompt, other salt: no hit
        assert cached(cache_salt="a") > 0
        assert cached() == 0  # unsalted is a tenant of its own
        for bad in (1, "", ["a"]):
            r = c.post("/v1/chat/completions", json={**BODY, "cache_salt": bad})
            assert r.status_code == 400 and "cache_salt" in r.text


# --------------------------------------------------------------------------- router scoring


def _state(on: bool, policy: str = "prefix_locality") -> router.RouterState:
    cfg = router.RouterConfig(replicas=["http://a", "http://b"], policy=policy,
                              routing_output_dir=None, block_size=4, tenant_isolation=on,
                              tenant_source="header",
                              kv_events=["ipc:///x0", "ipc:///x1"] if policy == "precise" else [],
                              kv_block_size=4)  # fmt: skip
    return router.RouterState(cfg)


@pytest.mark.parametrize("policy", ["prefix_locality", "semantic_locality", "consistent_hashing"])
def test_router_state_scores_a_prefix_only_within_its_tenant(policy):
    segs = router.token_segments(list(range(100, 132)), 4)
    state = _state(True, policy)
    rb_a = state.blocks(segs, None, "acme")
    rb_b = state.blocks(segs, None, "globex")
    assert not set(rb_a.keys) & set(rb_b.keys)  # no key of one tenant is a key of another
    state.finish(1, rb_a, ok=True)  # acme's prompt cached (approximately) on replica 1
    if policy != "consistent_hashing":
        assert state.candidates(rb_b)[1] == [0.0, 0.0]  # cross-tenant: no hit anywhere
        assert state.candidates(state.blocks(segs, None, "acme"))[1][1] > 0  # same tenant: hit
        assert state.candidates(state.blocks(segs, None, "acme"))[0][0] == 1
    # the salt is skv.blocks' salt_by_tenant, exactly
    from skv.blocks import request_blocks
    from skv.model import Request

    ref = request_blocks(Request("x", 0.0, segs, tenant_id="acme"), 4, salt_by_tenant=True)
    assert ref.keys == rb_a.keys


def test_router_state_off_shares_prefixes_across_tenants():
    segs = router.token_segments(list(range(100, 132)), 4)
    state = _state(False)
    rb_a, rb_b = state.blocks(segs, None, "acme"), state.blocks(segs, None, "globex")
    assert rb_a.keys == rb_b.keys == state.blocks(segs, None).keys
    state.finish(1, rb_a, ok=True)
    assert state.candidates(rb_b)[:2] == ([1, 0], [0.0, 8.0])  # 8 blocks of 4


def _chat(c: TestClient, tenant: str | None) -> httpx.Response:
    headers = {"x-tenant-id": tenant} if tenant else {}
    r = c.post("/v1/chat/completions", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    return r


def _routed(tmp_path: Path, on: bool, tenants: list[str | None]) -> tuple[list[dict], list[int]]:
    urls = ["http://r0", "http://r1"]
    mocks = [mock_backend.create_app(mock_backend.MockConfig(name=f"r{i}", max_tokens=2))
             for i in range(2)]  # fmt: skip
    mounts = {u: httpx.ASGITransport(m) for u, m in zip(urls, mocks, strict=True)}
    cfg = router.RouterConfig(replicas=urls, policy="prefix_locality",
                              routing_output_dir=tmp_path, tenant_isolation=on,
                              tenant_source="header")  # fmt: skip
    cached = []
    with TestClient(router.create_app(cfg, mounts=mounts)) as c:
        for t in tenants:
            usage = _chat(c, t).json()["usage"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
    (log,) = tmp_path.glob("routing-*.jsonl")
    return [json.loads(x) for x in log.read_text().splitlines()], cached


def test_router_never_routes_on_another_tenants_prefix(tmp_path):
    tenants = ["acme", "globex", None, "acme", "globex", None]
    decisions, cached = _routed(tmp_path, True, tenants)
    first = {}
    for t, d, hit in zip(tenants, decisions, cached, strict=True):
        if t not in first:  # a tenant's first request: nothing of its own is cached anywhere
            assert d["scores"] == [0.0, 0.0], d
            assert hit == 0  # and the engine (salted) hits nothing of the others' either
            first[t] = d["chosen"]
        else:  # the same prefix within the tenant: a hit, on the replica that has it
            assert max(d["scores"]) > 0 and d["chosen"] == first[t]
            assert hit > 0
    assert [d["tenant_id"] for d in decisions] == ["acme", "globex", "default"] * 2


def test_router_off_routes_every_tenant_to_the_shared_prefix(tmp_path):
    tenants = ["acme", "globex", None]
    decisions, cached = _routed(tmp_path, False, tenants)
    assert decisions[0]["scores"] == [0.0, 0.0] and cached[0] == 0
    for d, hit in zip(decisions[1:], cached[1:], strict=True):  # as today: shared across tenants
        assert max(d["scores"]) > 0 and d["chosen"] == decisions[0]["chosen"] and hit > 0
    assert [d["tenant_id"] for d in decisions] == ["acme", "globex", None]


# --------------------------------------------------------------------------- precise index


def _stored(tokens: list[int], bs: int, salt: int, parent: int | None = None) -> BlockStored:
    """An engine's BlockStored for ``tokens``; ``salt`` makes the (engine) hashes differ."""
    n = len(tokens) // bs
    return BlockStored(tuple((salt, i) for i in range(n)), parent, tuple(tokens[: n * bs]), bs)


def test_tenant_index_counts_only_owned_blocks():
    tokens = list(range(40, 56))  # 4 blocks of 4
    idx = TenantKVIndex(block_size=4)
    s = idx.begin()
    idx.apply(0, _stored(tokens, 4, salt=1))  # acme's copy, stored while serving
    idx.claim(0, "acme", tokens, s)
    assert idx.tenant_overlaps(tokens, "acme") == {0: 4}
    assert idx.tenant_overlaps(tokens, "globex") == {0: 0}  # content held, but not globex's
    assert idx.token_overlaps(tokens) == {0: 4}  # the content-only view would count it
    s = idx.begin()
    idx.apply(0, _stored(tokens, 4, salt=2))  # globex's own copy
    idx.claim(0, "globex", tokens, s)
    assert idx.tenant_overlaps(tokens, "globex") == {0: 4}
    # one copy of block 2 goes: nobody can tell whose, so neither tenant counts it any more
    idx.apply(0, BlockRemoved(((2, 2),)))
    assert idx.tenant_overlaps(tokens, "acme") == idx.tenant_overlaps(tokens, "globex") == {0: 2}
    # a claim of a request that started before a removal skips what was removed
    s = idx.begin()
    idx.apply(0, BlockRemoved(((1, 1),)))
    idx.claim(0, "acme", tokens, s)
    assert idx.tenant_overlaps(tokens, "acme") == {0: 1}
    idx.apply(0, AllBlocksCleared())
    assert idx.tenant_overlaps(tokens, "acme") == {0: 0}
    assert not idx._active  # every stamp was spent


def test_precise_router_scores_per_tenant():
    tokens = list(range(40, 56))
    state = _state(True, "precise")
    index = state.index
    assert isinstance(index, TenantKVIndex)
    segs = router.token_segments(tokens, 4)
    s = index.begin()
    index.apply(1, _stored(tokens, 4, salt=1))
    index.claim(1, "acme", tokens, s)
    rb = state.blocks(segs, None, "globex")
    assert state.candidates(rb, tokens, "globex")[1] == [0.0, 0.0]
    assert state.candidates(rb, tokens, "acme")[:2] == ([1, 0], [0.0, 4.0])
    off = _state(False, "precise")
    off.index.apply(1, _stored(tokens, 4, salt=1))
    assert off.candidates(rb, tokens, "globex")[1] == [0.0, 4.0]  # off: content is shared


def test_precise_router_claims_what_it_served(tmp_path):
    """Through the app: a served request makes its tenant the owner of the prompt's blocks on
    the replica that served it (events fed by hand; the mock's /tokenize gives the tokens)."""
    urls = ["http://r0", "http://r1"]
    mocks = [mock_backend.create_app(mock_backend.MockConfig(max_tokens=2)) for _ in urls]
    mounts = {u: httpx.ASGITransport(m) for u, m in zip(urls, mocks, strict=True)}
    cfg = router.RouterConfig(replicas=urls, policy="precise", routing_output_dir=tmp_path,
                              kv_events=["ipc:///unused0", "ipc:///unused1"], kv_block_size=4,
                              tenant_isolation=True, tenant_source="header")  # fmt: skip
    app = router.create_app(cfg, mounts=mounts)
    for sub in app.state.kv_subscribers:  # no engine publishes: events come by hand
        sub.close()
    index = app.state.router.index
    with TestClient(app) as c:
        tokens = asyncio.run(_tokens(mocks[0]))
        _chat(c, "acme")
        (line,) = next(tmp_path.glob("routing-*.jsonl")).read_text().splitlines()
        chosen = json.loads(line)["chosen"]
        index.apply(chosen, _stored(tokens, 4, salt=1))
        _chat(c, "globex")
        _chat(c, "acme")
    lines = [json.loads(x) for x in next(tmp_path.glob("routing-*.jsonl")).read_text().splitlines()]
    assert max(lines[1]["scores"]) == 0  # globex: acme's blocks do not count
    assert (
        lines[2]["scores"][chosen] == len(content_keys(tokens, 4)) and lines[2]["chosen"] == chosen
    )
    assert not index._active


async def _tokens(mock: Any) -> list[int]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(mock), base_url="http://m") as c:
        return (await c.post("/tokenize", json=BODY)).json()["tokens"]
