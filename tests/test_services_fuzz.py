"""Fuzz every service endpoint through FastAPI's TestClient: zero 5xx, zero uncaught exceptions.

Bodies are random JSON (NaN/Infinity literals, lone surrogates, deep nesting, wrong types in
every field a service reads), near-valid chat/completion requests, and raw bytes; headers carry
random Latin-1 values. After each example: the router holds no in-flight slot, the proxy wrote
at most one record, the mock's faults changed only on a 2xx. Examples are bounded (``EXAMPLES``
per service) so each service runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skv.services import mock_backend, proxy, router, sim_api

EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

#: pieces the segmenter and the services treat specially, and strings that cannot be UTF-8
SPECIAL = ["```", "~~~", "<document ", "<document>", "</document>", "<think>", "</think>",
           "Document 1:", "[Doc 2]", "CONTEXT:", "USER:", "Section 4.1", "§ 3", "\n", " ",
           "\ud800", "\udfff", "\ud83d\ude00", "\x00", "é", "日本"]  # fmt: skip
text = st.lists(st.one_of(st.characters(), st.sampled_from(SPECIAL)), max_size=12).map("".join)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
    max_leaves=12,
)
part = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "input_text"]), "text": text | json_values}
    ),
    text,
    json_values,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])
        | json_values
    },
    optional={
        "content": text | st.lists(part, max_size=3) | json_values,
        "tool_calls": json_values,
        "reasoning_content": text | json_values,
    },
)
request_body = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(message, max_size=4) | json_values,
        "prompt": text
        | st.lists(text, max_size=3)
        | st.lists(st.integers(-5, 2**40), max_size=5)
        | json_values,
        "tools": st.lists(json_values, max_size=2) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({"include_usage": json_values}) | json_values,
        "max_tokens": st.integers(-3, 2**40) | json_values,
        "model": text | json_values,
        "request_id": text | json_values,
        "session_id": text | json_values,
        "tenant_id": text | json_values,
    },
)
fault_body = st.dictionaries(
    st.sampled_from(["delay_s", "fail_status", "fail_count", "drop_after_chunks", "x"]),
    st.none() | st.booleans() | st.integers(-5, 1100) | st.floats(-1, 5) | text,
    max_size=3,
)


#: near-valid requests, so the fuzz also runs deep (segmentation, forwarding, streaming)
clean_text = st.lists(
    st.one_of(st.characters(), st.sampled_from([x for x in SPECIAL if x.isprintable()])),
    max_size=12,
).map("".join)
valid_body = st.one_of(
    st.fixed_dictionaries(
        {"messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                   "content": clean_text}),
            min_size=1, max_size=4)},
        optional={"stream": st.booleans(), "max_tokens": st.integers(0, 8), "model": clean_text,
                  "tools": st.lists(st.dictionaries(clean_text, clean_text), max_size=2),
                  "session_id": clean_text, "request_id": clean_text},
    ),
    st.fixed_dictionaries(
        {"prompt": clean_text | st.lists(clean_text, max_size=3)
                   | st.lists(st.integers(0, 50_000), min_size=1, max_size=40)},
        optional={"stream": st.booleans(), "max_tokens": st.integers(0, 8)},
    ),
)  # fmt: skip


FIELDS = ["messages", "prompt", "tools", "stream", "stream_options", "max_tokens", "n",
          "max_completion_tokens", "model", "request_id", "session_id", "tenant_id"]  # fmt: skip
#: a near-valid request with one field replaced by anything
poisoned_body = st.tuples(valid_body, st.sampled_from(FIELDS), json_values).map(
    lambda t: {**t[0], t[1]: t[2]}
)


def _encode(body: Any) -> bytes:
    """JSON as a lax client writes it: NaN/Infinity literals, surrogates as \\u escapes."""
    return json.dumps(body, allow_nan=True, ensure_ascii=True).encode()


raw_bodies = st.one_of(
    valid_body.map(_encode),
    poisoned_body.map(_encode),
    request_body.map(_encode),
    json_values.map(_encode),
    st.binary(max_size=64),
    st.integers(1, 3000).map(lambda n: b'{"messages": ' + b"[" * n + b"]" * n + b"}"),
    request_body.map(_encode).map(lambda b: b[: len(b) // 2]),  # truncated
)
latin1 = st.binary(max_size=12).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F))
headers = st.dictionaries(
    st.sampled_from(["x-session-id", "x-request-id", "x-tenant-id", "user-agent", "x-other"]),
    latin1,
    max_size=3,
)


def check(r: httpx.Response, what: str) -> None:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:300]}"


def _mock() -> Any:
    return mock_backend.create_app(mock_backend.MockConfig(max_tokens=4))


def _post(c: TestClient, path: str, content: bytes, hdrs: dict[str, bytes]) -> httpx.Response:
    return c.post(path, content=content, headers={"content-type": "application/json", **hdrs})


@FUZZ
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize"]),
    body=raw_bodies,
    hdrs=headers,
)
def test_fuzz_mock_completions(mock_client, path, body, hdrs):
    c, _app = mock_client
    check(_post(c, path, body, hdrs), path)
    for get in ("/health", "/v1/models", "/metrics"):
        check(c.get(get), get)


@FUZZ
@given(body=st.one_of(fault_body.map(_encode), raw_bodies))
def test_fuzz_mock_faults(mock_client, body):
    c, app = mock_client
    before = c.get("/mock/faults").json()
    r = c.post("/mock/faults", content=body)
    check(r, "/mock/faults")
    after = c.get("/mock/faults").json()
    if r.status_code >= 400:
        assert after == before  # refused: nothing changed
    else:  # accepted: only what the docstring allows
        assert type(after["delay_s"]) is float and 0 <= after["delay_s"] <= 3600
        assert after["fail_status"] is None or 400 <= after["fail_status"] <= 599
        assert type(after["fail_count"]) is int and after["fail_count"] >= -1
        assert after["drop_after_chunks"] is None or after["drop_after_chunks"] >= 0
    app.state.engine.faults.update({"delay_s": 0.0, "fail_status": None, "fail_count": -1,
                                    "drop_after_chunks": None})  # fmt: skip


@FUZZ
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=raw_bodies,
    hdrs=headers,
)
def test_fuzz_proxy(proxy_client, path, body, hdrs):
    c, app = proxy_client
    before = app.state.writer.out.count
    r = _post(c, path, body, hdrs)
    check(r, path)
    written = app.state.writer.out.count - before
    assert written in (0, 1) and (written == 1 or r.status_code >= 400)
    check(c.get("/health"), "/health")


@FUZZ
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=raw_bodies,
    hdrs=headers,
)
def test_fuzz_router(router_client, path, body, hdrs):
    c, app = router_client
    check(_post(c, path, body, hdrs), path)
    assert app.state.router.in_flight == [0, 0]  # no slot leaked, whatever happened
    for get in ("/health", "/router/state", "/metrics"):
        check(c.get(get), get)


@FUZZ
@given(
    path=st.sampled_from(["/v1/simulate/request", "/v1/simulate/reset"]),
    body=raw_bodies,
    hdrs=headers,
)
def test_fuzz_sim_api(sim_client, path, body, hdrs):
    c, _app = sim_client
    check(_post(c, path, body, hdrs), path)
    for get in ("/health", "/v1/simulate/stats"):
        check(c.get(get), get)


# one app and client per module: hypothesis runs every example against the same service


@pytest.fixture(scope="module")
def mock_client():
    app = _mock()
    with TestClient(app) as c:  # raise_server_exceptions: an uncaught exception fails the test
        yield c, app


@pytest.fixture(scope="module")
def proxy_client(tmp_path_factory):
    out: Path = tmp_path_factory.mktemp("proxy")
    cfg = proxy.ProxyConfig(upstream_base_url="http://up", trace_output_dir=out, trace_name="f")
    app = proxy.create_app(cfg, transport=httpx.ASGITransport(_mock()))
    with TestClient(app) as c:
        yield c, app


@pytest.fixture(scope="module")
def router_client():
    urls = ["http://r0", "http://r1"]
    mounts = {u: httpx.ASGITransport(_mock()) for u in urls}
    cfg = router.RouterConfig(replicas=urls, policy="prefix_locality", routing_output_dir=None)
    app = router.create_app(cfg, mounts=mounts)
    with TestClient(app) as c:
        yield c, app


@pytest.fixture(scope="module")
def sim_client():
    app = sim_api.create_app(sim_api.SimConfig())
    with TestClient(app) as c:
        yield c, app
