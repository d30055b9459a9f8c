"""Fuzz EVERY route of every service, with random methods, query strings, headers and bodies.

``test_services_fuzz.py`` fuzzes the request bodies of the POST endpoints; this suite takes the
routes from each app's own route table (a new endpoint is fuzzed without touching this file),
adds query strings (valid, percent-garbled, huge), any HTTP method, random tenant/session
headers, and runs the proxy and router with tenant isolation ON (the router both with its
approximate caches and with ``precise`` over a :class:`TenantKVIndex`). Zero 5xx and zero
uncaught exceptions (TestClient re-raises them); after every example the router holds no
in-flight slot and no stamp, and the proxy wrote at most one record. Bounded and derandomized.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_services_fuzz import latin1, raw_bodies

from skv.services import mock_backend, proxy, router, sim_api

FUZZ = settings(
    max_examples=int(os.environ.get("SKV_FUZZ_EXAMPLES", "150")),  # deeper runs: raise it
    deadline=timedelta(seconds=5),
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
CLEAR_FAULTS = {"delay_s": 0.0, "fail_status": None, "fail_count": -1, "drop_after_chunks": None}
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]

query_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
queries = st.one_of(
    st.dictionaries(query_text, query_text | st.lists(query_text, max_size=3), max_size=4).map(
        lambda q: "?" + str(httpx.QueryParams(q))
    ),
    st.sampled_from(["?%zz", "?%", "?a=%ff%fe", "?&&==&", "?x=" + "a" * 8000, "?a b", ""]),
    st.just(""),
)
headers = st.dictionaries(
    st.sampled_from(["x-tenant-id", "x-session-id", "x-request-id", "content-type", "x-other"]),
    latin1,
    max_size=4,
)


def _routes(app: Any) -> list[tuple[str, list[str]]]:
    """(path, methods) of every route the app declares."""
    return [(r.path, sorted(r.methods)) for r in app.routes if isinstance(r, APIRoute)]


@st.composite
def calls(draw: st.DrawFn, routes: list[tuple[str, list[str]]]) -> tuple[str, str, bytes, dict]:
    path, methods = draw(st.sampled_from(routes))
    method = draw(st.sampled_from(methods) | st.sampled_from(METHODS))
    if draw(st.integers(0, 9)) == 0:
        path = draw(st.sampled_from(["/", "/v1", "/v1/models/x", "/does-not-exist", "/%2e%2e/x"]))
    body = draw(raw_bodies) if method in ("POST", "PUT", "PATCH") else b""
    return method, path + draw(queries), body, draw(headers)


def _mock() -> Any:
    return mock_backend.create_app(mock_backend.MockConfig(max_tokens=4))


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> Iterator[dict[str, tuple[TestClient, Any]]]:
    out: Path = tmp_path_factory.mktemp("fuzz")
    urls = ["http://r0", "http://r1"]
    apps: dict[str, Any] = {
        "mock": _mock(),
        "proxy": proxy.create_app(
            proxy.ProxyConfig(upstream_base_url="http://up", trace_output_dir=out,
                              trace_name="f", tenant_isolation=True, tenant_source="header"),
            transport=httpx.ASGITransport(_mock()),
        ),
        "router": router.create_app(
            router.RouterConfig(replicas=urls, policy="prefix_locality", routing_output_dir=None,
                                tenant_isolation=True, tenant_source="header"),
            mounts={u: httpx.ASGITransport(_mock()) for u in urls},
        ),
        "router_precise": router.create_app(
            router.RouterConfig(replicas=urls, policy="precise", routing_output_dir=None,
                                kv_events=["ipc:///nonexistent/a", "ipc:///nonexistent/b"],
                                kv_block_size=4, tenant_isolation=True, tenant_source="header"),
            mounts={u: httpx.ASGITransport(_mock()) for u in urls},
        ),
        "sim_api": sim_api.create_app(sim_api.SimConfig()),
    }  # fmt: skip
    clients = {name: TestClient(app) for name, app in apps.items()}
    for c in clients.values():
        c.__enter__()
    try:
        yield {name: (clients[name], apps[name]) for name in apps}
    finally:
        for c in clients.values():
            c.__exit__(None, None, None)


SERVICES = ["mock", "proxy", "router", "router_precise", "sim_api"]


def test_every_service_declares_its_routes(services):
    for name in SERVICES:
        paths = {p for p, _m in _routes(services[name][1])}
        assert "/health" in paths, name
    assert "/mock/faults" in {p for p, _ in _routes(services["mock"][1])}


@pytest.mark.parametrize("name", SERVICES)
def test_fuzz_every_route(services, name):
    client, app = services[name]

    @FUZZ
    @given(call=calls(_routes(app)))
    def run(call: tuple[str, str, bytes, dict]) -> None:
        method, url, body, hdrs = call
        before = app.state.writer.out.count if name == "proxy" else 0
        r = client.request(method, url, content=body or None, headers=hdrs)
        assert r.status_code < 500, f"{method} {url[:80]}: {r.status_code} {r.text[:300]}"
        if name == "proxy":
            assert app.state.writer.out.count - before in (0, 1)
        if name.startswith("router"):
            state = app.state.router
            assert state.in_flight == [0, 0]  # no slot leaked, whatever happened
            assert not getattr(state.index, "_active", None)  # no stamp left open
        if name == "mock":  # a fault the fuzz set must not break the next examples
            app.state.engine.faults.update(CLEAR_FAULTS)

    run()
