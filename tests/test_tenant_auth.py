"""Tenants that cannot be impersonated (issue 33).

With isolation on, the tenant comes from the client's API key (stored hashed, compared in
constant time); a client's ``X-Tenant-ID`` or ``cache_salt`` cannot make it another tenant, so
tenant B never obtains a cached token of tenant A's prompt, through the proxy or the router,
whatever headers it sends. Neither the raw tenant id nor the client's key reaches the upstream.
Header mode (behind a gateway) stays; two tenant headers are a 400 in every mode.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from skv.services import cli, mock_backend, proxy, router, tenancy
from skv.services.tenancy import ApiKeys, TenantPolicy, hash_key

SYSTEM = "You are the support assistant of one company; answer briefly and politely. " * 10
BODY = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}
KEY_A, KEY_B = "key-of-acme-0123", "key-of-globex-4567"
KEYS = f"{hash_key(KEY_A)} acme,{hash_key(KEY_B)} globex"


def bearer(key: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {key}")


# --------------------------------------------------------------------------- keys


def test_keys_file_holds_hashes_and_errors_name_file_and_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# tenants\n\n{hash_key(KEY_A)}  acme corp\n{hash_key(KEY_B)}\tglobex\n")
    keys = ApiKeys.load(path)
    assert keys.tenant(KEY_A) == "acme corp" and keys.tenant(KEY_B) == "globex"
    assert keys.tenant("nope") is None and keys.tenant("") is None
    assert KEY_A not in path.read_text()  # only its hash is stored
    for text, why in [
        (f"{KEY_A} acme\n", "64 hex digits"),  # a raw key pasted in
        (f"{hash_key(KEY_A)}\n", "tenant"),
        (f"{hash_key(KEY_A)} a\n{hash_key(KEY_A)} b\n", "same key hash as line 1"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=why) as err:
            ApiKeys.load(path)
        assert f"{path}:" in str(err.value) and KEY_A not in str(err.value)
    assert ApiKeys.load(None, KEYS).tenant(KEY_B) == "globex"
    with pytest.raises(ValueError, match="cannot read"):
        ApiKeys.load(tmp_path / "missing")


def test_every_stored_digest_is_compared(monkeypatch):
    """Constant time: the lookup compares with hmac.compare_digest, against every entry."""
    calls = []
    real = tenancy.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(tenancy.hmac, "compare_digest", counting)
    keys = ApiKeys.load(None, KEYS + f",{hash_key('k3')} initech")
    assert keys.tenant(KEY_A) == "acme" and len(calls) == 3  # no early exit on a match


def test_isolation_by_key_without_keys_is_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="no key is configured"):
        proxy.create_app(proxy.ProxyConfig(trace_output_dir=tmp_path, tenant_isolation=True))
    with pytest.raises(ValueError, match="no key is configured"):
        router.create_app(router.RouterConfig(replicas=["http://r"], routing_output_dir=None,
                                              tenant_isolation=True))  # fmt: skip
    with pytest.raises(ValueError, match="tenant source"):
        TenantPolicy(source="cookie")
    assert TenantPolicy(isolation=True, source="header").identifies  # gateway mode: no keys


def test_settings_from_env_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("SKV_REPLICAS", "http://a")
    for cls in (proxy.ProxyConfig, router.RouterConfig):
        cfg = cls.from_env()
        assert (cfg.tenant_source, cfg.tenant_keys_file, cfg.tenant_keys) == ("key", None, None)
        assert cfg.body_read_timeout_s == 30.0
    monkeypatch.setenv("SKV_TENANT_SOURCE", "header")
    monkeypatch.setenv("SKV_TENANT_KEYS_FILE", str(tmp_path / "k"))
    monkeypatch.setenv("SKV_TENANT_KEYS", KEYS)
    monkeypatch.setenv("SKV_UPSTREAM_API_KEY", "engine-key")
    monkeypatch.setenv("SKV_BODY_READ_TIMEOUT_SECONDS", "7")
    for cls in (proxy.ProxyConfig, router.RouterConfig):
        cfg = cls.from_env()
        assert cfg.tenant_source == "header" and cfg.tenant_keys_file == tmp_path / "k"
        assert cfg.tenant_keys == KEYS and cfg.upstream_api_key == "engine-key"
        assert cfg.body_read_timeout_s == 7.0
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    for name in ("proxy", "router"):
        args = parser.parse_args(["services", name, "--tenant-source", "header",
                                  "--tenant-keys-file", "kf", "--body-read-timeout", "3",
                                  "--max-connections", "9"])  # fmt: skip
        cfg = proxy.ProxyConfig()
        cli._set_isolation(cfg, args)
        assert (cfg.tenant_source, cfg.tenant_keys_file, cfg.body_read_timeout_s) == (
            "header", Path("kf"), 3.0)  # fmt: skip
        assert cli._max_connections(args) == 9
    with pytest.raises(SystemExit):
        parser.parse_args(["services", "proxy", "--tenant-source", "cookie"])


def test_hash_key_cli(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    monkeypatch.setattr(sys, "stdin", io.StringIO(KEY_A + "\n"))
    args = parser.parse_args(["services", "hash-key", "--tenant", "acme"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert out.out == f"{hash_key(KEY_A)} acme\n" and KEY_A not in out.out + out.err
    args = parser.parse_args(["services", "hash-key", "--tenant", "globex", "--generate"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    key = out.err.rsplit(" ", 1)[1].strip()
    assert ApiKeys.parse(out.out.splitlines(), "stdout").tenant(key) == "globex"


# --------------------------------------------------------------------------- no impersonation


def _service(
    kind: str, tmp_path: Path, policy: str = "prefix_locality", **tenancy_cfg: Any
) -> tuple[Any, list[Any]]:
    """A proxy over one mock engine, or a router over two; isolation by API key unless
    ``tenancy_cfg`` says otherwise."""
    opts = {"tenant_isolation": True, "tenant_keys": KEYS, **tenancy_cfg}
    if kind == "proxy":
        mock = mock_backend.create_app(mock_backend.MockConfig(max_tokens=2))
        cfg = proxy.ProxyConfig(upstream_base_url="http://engine", trace_output_dir=tmp_path,
                                trace_name="t", **opts)  # fmt: skip
        return proxy.create_app(cfg, transport=httpx.ASGITransport(mock)), [mock]
    urls = ["http://r0", "http://r1"]
    mocks = [mock_backend.create_app(mock_backend.MockConfig(max_tokens=2)) for _ in urls]
    mounts = {u: httpx.ASGITransport(m) for u, m in zip(urls, mocks, strict=True)}
    cfg = router.RouterConfig(replicas=urls, policy=policy, routing_output_dir=tmp_path,
                              **opts)  # fmt: skip
    return router.create_app(cfg, mounts=mounts), mocks


def _cached(r: httpx.Response) -> int:
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


SPOOF_SALT = tenancy.cache_salt("acme")
#: what tenant B sends along with A's prompt: (headers, extra body fields)
B_ATTEMPTS: list[tuple[list[tuple[str, str]], dict[str, Any]]] = [
    ([bearer(KEY_B)], {}),
    ([bearer(KEY_B), ("x-tenant-id", "acme")], {}),
    ([bearer(KEY_B), ("X-Tenant-ID", " acme ")], {}),
    ([bearer(KEY_B), ("x-tenant-id", "default")], {}),
    ([bearer(KEY_B), ("x-tenant-id", "acme"), ("x-tenant-id", "globex")], {}),
    ([bearer(KEY_B), ("x-tenant-id", "globex"), ("x-tenant-id", "acme")], {}),
    ([bearer(KEY_B)], {"cache_salt": SPOOF_SALT}),
    ([bearer(KEY_B), ("x-tenant-id", "acme")], {"cache_salt": SPOOF_SALT}),
    ([("authorization", f"bearer {KEY_B}"), ("x-tenant-id", "acme")], {}),
    ([bearer(KEY_B), bearer(KEY_A)], {}),  # two keys: refused, not "the first wins"
    ([bearer(KEY_A + "x"), ("x-tenant-id", "acme")], {}),
    ([("x-tenant-id", "acme")], {}),
    ([("x-tenant-id", "acme")], {"cache_salt": SPOOF_SALT}),
    ([("authorization", f"Basic {KEY_B}"), ("x-tenant-id", "acme")], {}),
    ([("x-api-key", KEY_A), ("x-tenant-id", "acme")], {}),
    ([("authorization", "Bearer "), ("x-tenant-id", "acme")], {}),
]


@pytest.mark.parametrize("kind", ["proxy", "router"])
def test_tenant_b_never_gets_a_cached_token_of_tenant_as_prompt(tmp_path, kind):
    served = refused = 0
    for k, (headers, extra) in enumerate(B_ATTEMPTS):
        # fresh engines: only A's prompt cached. The router goes round robin, so A's warm-up
        # puts the prompt on both replicas and B's request meets it wherever it goes: only the
        # engine's cache_salt can keep it from B, not the router's per-tenant scoring
        app, _ = _service(kind, tmp_path / str(k), policy="round_robin")
        with TestClient(app) as c:
            warm = [c.post("/v1/chat/completions", json=BODY, headers=[bearer(KEY_A)])
                    for _ in range(3)]  # fmt: skip
            assert all(r.status_code == 200 for r in warm) and _cached(warm[2]) > 0  # A hits
            r = c.post("/v1/chat/completions", json={**BODY, **extra}, headers=headers)
            if r.status_code == 200:
                served += 1
                assert _cached(r) == 0, (headers, extra, r.json()["usage"])
            else:
                refused += 1
                assert r.status_code in (400, 401), r.text
            again = c.post("/v1/chat/completions", json=BODY, headers=[bearer(KEY_A)])
            assert _cached(again) > 0  # A's cache was there all along
    assert served >= 5 and refused >= 5


@pytest.mark.parametrize("kind", ["proxy", "router"])
def test_missing_or_unknown_keys_are_401_without_echo(tmp_path, kind):
    app, mocks = _service(kind, tmp_path)
    secret_prompt = {"messages": [{"role": "user", "content": "TOP-SECRET-PROMPT"}]}
    with TestClient(app) as c:
        for headers in ([], [bearer("WRONG-KEY-9")], [("authorization", "WRONG-KEY-9")],
                        [("authorization", "Bearer")]):  # fmt: skip
            r = c.post("/v1/chat/completions", json=secret_prompt, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["type"] == "authentication_error"
            assert "WRONG-KEY" not in r.text and "TOP-SECRET" not in r.text
            r = c.post("/v1/completions", content=b"not json", headers=headers)
            assert r.status_code == 401  # before the body is read
        r = c.post("/v1/chat/completions", json=BODY, headers=[bearer(KEY_B), bearer(KEY_B)])
        assert r.status_code == 400 and "Authorization" in r.text  # two keys: never "first wins"
        assert c.get("/health").status_code == 200  # probes need no key
    assert sum(m.state.engine.calls for m in mocks) == 0  # nothing reached an engine
    if kind == "proxy":
        assert not (tmp_path / "t.jsonl").exists()  # nothing recorded


@pytest.mark.parametrize("kind", ["proxy", "router"])
@pytest.mark.parametrize(
    "mode",
    [
        {"tenant_isolation": False, "tenant_keys": None},
        {"tenant_isolation": False},
        {"tenant_isolation": True, "tenant_source": "header", "tenant_keys": None},
        {"tenant_isolation": True},
    ],
    ids=["off", "keys-only", "header", "key"],
)
def test_two_tenant_headers_are_a_400_in_every_mode(tmp_path, kind, mode):
    app, _ = _service(kind, tmp_path, **mode)
    with TestClient(app) as c:
        for pair in (("acme", "globex"), ("acme", "acme"), ("", "acme")):
            headers = [bearer(KEY_B), *(("x-tenant-id", t) for t in pair)]
            r = c.post("/v1/chat/completions", json=BODY, headers=headers)
            assert r.status_code == 400 and "X-Tenant-ID" in r.text, r.text
        r = c.post("/v1/chat/completions", json=BODY, headers=[bearer(KEY_B)])
        assert r.status_code == 200


# --------------------------------------------------------------------------- what goes upstream


class Capture:
    """An upstream that records the headers and body it gets."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.headers.append(request.headers)
        wire = b"".join(k + b": " + v + b"\n" for k, v in request.headers.raw)
        self.seen.append(wire + request.content)
        answer = {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip
        return httpx.Response(200, json=answer)


def _captured(kind: str, tmp_path: Path, up: Capture, **opts: Any) -> Any:
    if kind == "proxy":
        cfg = proxy.ProxyConfig(upstream_base_url="http://up", trace_output_dir=tmp_path,
                                trace_name="t", **opts)  # fmt: skip
        return proxy.create_app(cfg, transport=httpx.MockTransport(up))
    cfg = router.RouterConfig(replicas=["http://r0"], policy="prefix_locality",
                              routing_output_dir=tmp_path, **opts)  # fmt: skip
    return router.create_app(cfg, transport=httpx.MockTransport(up))


@pytest.mark.parametrize("kind", ["proxy", "router"])
def test_neither_the_tenant_id_nor_the_key_reaches_the_upstream(tmp_path, kind):
    key = "sk-tenant-key-77"
    keys = f"{hash_key(key)} acme-raw-tenant-id"
    cases = [  # (config, headers, what must not reach the upstream, the tenant on record)
        ({"tenant_isolation": True, "tenant_keys": keys},
         [bearer(key), ("x-tenant-id", "spoofed-tenant-5")],
         ["acme-raw-tenant-id", key, "spoofed-tenant-5"], "acme-raw-tenant-id"),
        ({"tenant_isolation": True, "tenant_source": "header"},
         [("x-tenant-id", "gateway-tenant-42")], ["gateway-tenant-42"], "gateway-tenant-42"),
        ({"tenant_isolation": False, "tenant_keys": keys},
         [bearer(key), ("x-tenant-id", "spoofed-tenant-5")],
         ["acme-raw-tenant-id", key, "spoofed-tenant-5"], "acme-raw-tenant-id"),
    ]  # fmt: skip
    for n, (opts, headers, secrets, tenant) in enumerate(cases):
        up = Capture()
        out = tmp_path / str(n)
        with TestClient(_captured(kind, out, up, **opts)) as c:
            for endpoint in ("/v1/chat/completions", "/v1/completions"):
                body = BODY if "chat" in endpoint else {"prompt": "hello", "stream": True}
                r = c.post(endpoint, json=body, headers=headers)
                assert r.status_code == 200, r.text
        assert len(up.seen) == 2
        for wire in up.seen:
            for s in secrets:
                assert s.encode() not in wire, (opts, s, wire[:300])
        assert all("x-tenant-id" not in h and "authorization" not in h for h in up.headers)
        if opts["tenant_isolation"]:
            assert all(json.loads(w.split(b"\n")[-1])["cache_salt"].startswith("skv1-")
                       for w in up.seen)  # fmt: skip
        logged = "".join(p.read_text() for p in out.glob("*.jsonl"))
        assert f'"tenant_id": "{tenant}"' in logged.replace('":"', '": "')  # on record


@pytest.mark.parametrize("kind", ["proxy", "router"])
def test_the_upstream_gets_its_own_key_when_configured(tmp_path, kind):
    up = Capture()
    opts = {"tenant_isolation": True, "tenant_keys": KEYS, "upstream_api_key": "engine-key"}
    with TestClient(_captured(kind, tmp_path, up, **opts)) as c:
        r = c.post("/v1/chat/completions", json=BODY, headers=[bearer(KEY_A)])
        assert r.status_code == 200
    assert up.headers[0]["authorization"] == "Bearer engine-key"
    assert KEY_A.encode() not in up.seen[0]


@pytest.mark.parametrize("kind", ["proxy", "router"])
def test_off_and_keyless_forwards_headers_as_before(tmp_path, kind):
    up = Capture()
    with TestClient(_captured(kind, tmp_path, up)) as c:
        headers = [("x-tenant-id", "label"), ("authorization", "Bearer engine-key")]
        assert c.post("/v1/chat/completions", json=BODY, headers=headers).status_code == 200
    assert up.headers[0]["x-tenant-id"] == "label"
    assert up.headers[0]["authorization"] == "Bearer engine-key"
