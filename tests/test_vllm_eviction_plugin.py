"""The vLLM eviction plugin's engine-free parts: the xargs wire format, the policy's view of an
engine request, settings, the server's guards, the CLI and the services' type forwarding.
(The engine-side tests, against vLLM's own block pool and a served model, are in
tests/test_vllm_eviction.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fastapi import Request as HTTPRequest

from skv.model import TYPE_INDEX, Request, Segment, SemanticType
from skv.vllm import eviction_plugin as ep

T = SemanticType


def test_xargs_round_trip():
    r = Request(
        "a", 12.5, [Segment(T.SYSTEM, 40), Segment(T.TOOL_OUTPUT, 30), Segment(T.USER_QUERY, 7)],
        session_id="s1", turn=3, templated=True,
    )  # fmt: skip
    x = ep.semantic_xargs(r)
    assert x == {
        "skv_types": ["system", "tool_output", "user_query"], "skv_tokens": [40, 30, 7],
        "skv_session": "s1", "skv_turn": 3, "skv_templated": 1, "skv_time": 12.5,
    }  # fmt: skip
    json.dumps(x)  # the OpenAI endpoints take str | int | float | list of those
    segs, fields = ep.parse_xargs(x, 77)
    assert [(s.stype, s.num_tokens) for s in segs] == [
        (T.SYSTEM, 40), (T.TOOL_OUTPUT, 30), (T.USER_QUERY, 7)
    ]  # fmt: skip
    assert fields == {"session_id": "s1", "turn": 3, "templated": True, "time": 12.5}
    assert "skv_time" not in ep.semantic_xargs(r, with_time=False)


def test_counts_are_clipped_to_the_prompt_and_the_rest_is_unknown():
    segs, _ = ep.parse_xargs({"skv_types": ["system", "user_query"], "skv_tokens": [50, 50]}, 70)
    assert [(s.stype, s.num_tokens) for s in segs] == [(T.SYSTEM, 50), (T.USER_QUERY, 20)]
    segs, _ = ep.parse_xargs({"skv_types": ["system"], "skv_tokens": [10]}, 30)
    assert [(s.stype, s.num_tokens) for s in segs] == [(T.SYSTEM, 10), (T.UNKNOWN, 20)]
    segs, fields = ep.parse_xargs(None, 30)
    assert [(s.stype, s.num_tokens) for s in segs] == [(T.UNKNOWN, 30)] and fields == {}


@pytest.mark.parametrize(
    ("xargs", "field"),
    [
        ({"skv_types": ["system"]}, "both be lists"),
        ({"skv_types": "system", "skv_tokens": [3]}, "both be lists"),
        ({"skv_types": ["system", "code"], "skv_tokens": [3]}, "2 entries"),
        ({"skv_types": ["sistem"], "skv_tokens": [3]}, "unknown semantic type 'sistem'"),
        ({"skv_types": ["system"], "skv_tokens": [-1]}, "not a token count"),
        ({"skv_types": ["system"], "skv_tokens": [True]}, "not a token count"),
        ({"skv_types": ["system"], "skv_tokens": [2.5]}, "not a token count"),
        ({"skv_types": ["system"] * 5000, "skv_tokens": [1] * 5000}, "more than 4096"),
        ({"skv_session": ["x"]}, "skv_session"),
        ({"skv_turn": -1}, "skv_turn"),
        ({"skv_turn": 2**40}, "skv_turn"),  # would overflow the C int of a request's turn
        ({"skv_turn": True}, "skv_turn"),
        ({"skv_time": 10**400}, "skv_time"),
        ({"skv_time": float("nan")}, "skv_time"),
        ({"skv_time": float("inf")}, "skv_time"),
        ({"skv_time": -3}, "skv_time"),
        ({"skv_time": True}, "skv_time"),
    ],
)
def test_malformed_xargs_name_the_field(xargs, field):
    with pytest.raises(ValueError, match=field):
        ep.parse_xargs(xargs, 100)


def test_request_view_types_blocks_by_their_first_token_and_keys_by_engine_hashes():
    hashes = [b"h0", b"h1", b"h2"]
    x = {"skv_types": ["system", "tool_output", "user_query"], "skv_tokens": [40, 60, 10],
         "skv_time": 7.0}  # fmt: skip
    rb, t = ep.request_view("r1", 110, hashes, 32, x, index=4, now=99.0)
    assert t == 7.0 and rb.arrival_s == 7.0 and rb.index == 4
    # blocks start at tokens 0, 32, 64, 96: system, system, tool_output, tool_output
    assert rb.stypes == [TYPE_INDEX[T.SYSTEM]] * 2 + [TYPE_INDEX[T.TOOL_OUTPUT]] * 2
    assert rb.tokens == [32, 32, 32, 14] and rb.block_size == 32 and rb.prompt_tokens == 110
    assert rb.keys[:3] == hashes and rb.keys[3] == ("partial", "r1")
    rb2, _ = ep.request_view("r2", 110, hashes, 32, None, index=5, now=99.0)
    assert rb2.keys[3] != rb.keys[3] and rb2.arrival_s == 99.0
    assert set(rb2.stypes) == {TYPE_INDEX[T.UNKNOWN]}


def test_request_view_types_a_malformed_request_unknown_and_warns_once(caplog):
    ep._warned.clear()
    bad = {"skv_types": ["nope"], "skv_tokens": [5]}
    with caplog.at_level("WARNING", logger="skv.vllm.eviction_plugin"):
        for i in range(3):
            rb, t = ep.request_view(f"r{i}", 64, [b"a", b"b"], 32, bad, index=i, now=1.0)
            assert set(rb.stypes) == {TYPE_INDEX[T.UNKNOWN]} and t is None
    assert sum("unknown semantic type" in r.message for r in caplog.records) == 1


def test_settings_from_env(monkeypatch):
    for k in (ep.ENV_POLICY, ep.ENV_PARAMS, ep.ENV_LOG, ep.ENV_LOG_EVERY, ep.ENV_NEXT):
        monkeypatch.delenv(k, raising=False)
    assert ep.settings_from_env() is None  # off: stock vLLM
    monkeypatch.setenv(ep.ENV_POLICY, "static_semantic")
    monkeypatch.setenv(ep.ENV_PARAMS, '{"half_life_s": 5}')
    monkeypatch.setenv(ep.ENV_LOG, "/tmp/x.jsonl")
    got = ep.settings_from_env()
    assert got == {"policy": "static_semantic", "params": {"half_life_s": 5},
                   "log": "/tmp/x.jsonl", "log_every": 16, "clock": "wall",
                   "next": None}  # fmt: skip
    monkeypatch.setenv(ep.ENV_CLOCK, "client")
    assert ep.settings_from_env()["clock"] == "client"
    monkeypatch.setenv(ep.ENV_CLOCK, "sundial")
    with pytest.raises(ep.PluginError, match="wall, client"):
        ep.settings_from_env()
    monkeypatch.delenv(ep.ENV_CLOCK)
    for value, msg in [("{bad", "not JSON"), ("[1]", "JSON object"), ('{"zz": 1}', "bad param")]:
        monkeypatch.setenv(ep.ENV_PARAMS, value)
        with pytest.raises(ep.PluginError, match=msg):
            ep.settings_from_env()
    monkeypatch.delenv(ep.ENV_PARAMS)
    monkeypatch.setenv(ep.ENV_POLICY, "belady")
    with pytest.raises(ep.PluginError, match="cannot order vLLM's free queue"):
        ep.settings_from_env()
    monkeypatch.setenv(ep.ENV_POLICY, "lru")
    monkeypatch.setenv(ep.ENV_LOG_EVERY, "0")
    with pytest.raises(ep.PluginError, match="integer >= 1"):
        ep.settings_from_env()


# ------------------------------------------------------------------ the server's guards


@pytest.fixture
def fake_model(tmp_path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_server_environment_carries_the_policy_and_strips_an_inherited_one(fake_model, monkeypatch):
    from skv.vllm.server import VllmServer

    monkeypatch.setenv("SKV_EVICTION", "gdsf")  # a stray setting must not switch the plugin on
    stock = VllmServer(fake_model, python=sys.executable)
    assert not any(k.startswith("SKV_EVICTION") for k in stock.environment())
    srv = VllmServer(
        fake_model, python=sys.executable, eviction="saecache",
        eviction_params={"eta": 0.3}, log_path=fake_model / "s.log",
    )  # fmt: skip
    env = srv.environment()
    assert env["SKV_EVICTION"] == "saecache"
    assert json.loads(env["SKV_EVICTION_PARAMS"]) == {"eta": 0.3}
    assert env["SKV_EVICTION_LOG"] == str(fake_model / "eviction.jsonl")
    assert (Path(env["SKV_CHECKOUT"]) / "skv" / "vllm" / "eviction_plugin.py").is_file()


def test_server_refuses_a_bad_policy_before_starting(fake_model):
    from skv.vllm.server import VllmServer

    with pytest.raises(ValueError, match="unknown policy 'lruu'"):
        VllmServer(fake_model, python=sys.executable, eviction="lruu")
    with pytest.raises(ValueError, match="bad parameters"):
        VllmServer(fake_model, python=sys.executable, eviction="lru", eviction_params={"k": 1})


def test_server_refuses_an_engine_venv_without_the_plugin(fake_model):
    """Without the plugin vLLM would silently serve with its own LRU: refuse instead."""
    from skv.vllm.server import ServerError, VllmServer

    srv = VllmServer(fake_model, python=sys.executable, eviction="lru")  # no plugin in this venv
    with pytest.raises(ServerError, match="not installed in the engine venv"):
        srv.start()
    assert srv.proc is None


def test_server_notices_a_plugin_that_did_not_load(fake_model):
    from skv.vllm.server import ServerError, VllmServer

    srv = VllmServer(fake_model, python=sys.executable, eviction="lru", log_path=fake_model / "l")
    with pytest.raises(ServerError, match="pool was not built"):
        srv._check_plugin_loaded()  # no side file at all
    srv.eviction_log.write_text(json.dumps({"event": "start", "policy": "gdsf"}) + "\n")
    with pytest.raises(ServerError, match="pool was not built"):
        srv._check_plugin_loaded()  # another policy's start line
    srv.eviction_log.write_text(json.dumps({"event": "start", "policy": "lru"}) + "\n")
    srv._check_plugin_loaded()


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--eviction", "lru", "--eviction-params", "{bad"], "--eviction-params: not JSON"),
        (["--eviction", "lru", "--eviction-params", "[1]"], "expected a JSON object"),
        (["--eviction-params", "{}"], "needs --eviction"),
        (["--eviction", "belady"], "cannot order vLLM's free queue"),
    ],
)
def test_cli_serve_rejects_bad_eviction_arguments(fake_model, args, msg, capsys):
    from skv.cli import main

    code = main(["vllm", "serve", "--model", str(fake_model), "--venv", sys.prefix, *args])
    assert code == 2
    assert msg in capsys.readouterr().err


# ------------------------------------------------------------------ clients and services


def test_typed_hash_replay_sends_engine_unit_types():
    from skv.vllm.hashreplay import HashReplayConfig, plan_hash_replay, prompts_and_arrivals

    r = Request(
        "a", 3.0, [Segment(T.SYSTEM, 64), Segment(T.TOOL_OUTPUT, 40)],
        hash_ids=[1, 2, 3, 4], hash_block_size=32, session_id="s", turn=2,
    )  # fmt: skip
    plan = plan_hash_replay([r], HashReplayConfig(block_size=32, max_output_tokens=1))
    plain, _ = prompts_and_arrivals(plan)
    assert "vllm_xargs" not in plain[0]
    typed, _ = prompts_and_arrivals(plan, typed=True)
    x = typed[0]["vllm_xargs"]
    assert x["skv_types"] == ["system", "tool_output"] and sum(x["skv_tokens"]) == 104
    # the plan's own time (arrivals rebased to the first request), which results_to_trace keeps
    assert (
        x["skv_time"] == plan.items[0].arrival_s and x["skv_session"] == "s" and x["skv_turn"] == 2
    )


def test_services_add_types_only_when_asked_and_never_over_the_clients():
    from skv.services.typed import with_semantic_xargs

    segs = [Segment(T.SYSTEM, 12, content_hash="ab", text="secret"), Segment(T.USER_QUERY, 3)]
    body = {"prompt": "x", "vllm_xargs": {"other": 1}}
    out = with_semantic_xargs(body, segs, "sess")
    assert out["vllm_xargs"] == {"other": 1, "skv_types": ["system", "user_query"],
                                 "skv_tokens": [12, 3], "skv_session": "sess"}  # fmt: skip
    assert "secret" not in json.dumps(out) and "ab" not in json.dumps(out["vllm_xargs"])
    assert body == {"prompt": "x", "vllm_xargs": {"other": 1}}  # not mutated
    own = {"prompt": "x", "vllm_xargs": {"skv_types": ["code"], "skv_tokens": [1]}}
    assert with_semantic_xargs(own, segs, None) == own
    odd = {"prompt": "x", "vllm_xargs": "not an object"}
    assert with_semantic_xargs(odd, segs, None) == odd


def test_proxy_forwards_types_to_the_engine(tmp_path):
    """End to end through the telemetry proxy and a recording upstream: with forward_types the
    forwarded body carries the segmenter's types; without, the body is forwarded as sent."""
    import httpx
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from skv.services._common import serve_in_thread
    from skv.services.proxy import ProxyConfig, create_app

    seen: list[dict] = []
    up = FastAPI()

    @up.post("/v1/completions")
    async def complete(req: HTTPRequest):
        seen.append(await req.json())
        return JSONResponse({"id": "x", "object": "text_completion", "choices": [
            {"index": 0, "text": "ok", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})  # fmt: skip

    with serve_in_thread(up) as up_url:
        for forward in (False, True):
            cfg = ProxyConfig(upstream_base_url=up_url, trace_output_dir=tmp_path / str(forward),
                              forward_types=forward)  # fmt: skip
            with serve_in_thread(create_app(cfg)) as url:
                r = httpx.post(f"{url}/v1/completions", timeout=30,
                               json={"model": "m", "prompt": "You are a helpful bot. Hi!"},
                               headers={"X-Session-ID": "s9"})  # fmt: skip
                assert r.status_code == 200, r.text
    assert "vllm_xargs" not in seen[0]
    x = seen[1]["vllm_xargs"]
    assert x["skv_session"] == "s9" and len(x["skv_types"]) == len(x["skv_tokens"]) >= 1
    assert all(t in {s.value for s in SemanticType} for t in x["skv_types"])


def test_router_forwards_types_to_the_replica(tmp_path):
    """The router, with forward_types, adds its segmenter's types to the body it sends the
    chosen replica (a recording upstream here); off, the body goes as sent."""
    import asyncio

    import httpx
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from skv.services import router

    seen: list[dict] = []
    up = FastAPI()

    @up.post("/v1/chat/completions")
    async def chat(req: HTTPRequest):
        seen.append(await req.json())
        return JSONResponse({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"},
             "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})  # fmt: skip

    msgs = [{"role": "system", "content": "You are terse. " * 20},
            {"role": "user", "content": "hi"}]  # fmt: skip

    async def go():
        for forward in (False, True):
            cfg = router.RouterConfig(replicas=["http://r0"], policy="round_robin",
                                      routing_output_dir=None, forward_types=forward)  # fmt: skip
            app = router.create_app(cfg, mounts={"http://r0": httpx.ASGITransport(up)})
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
                r = await c.post("/v1/chat/completions", json={"messages": msgs},
                                 headers={"X-Session-ID": "s1"})  # fmt: skip
                assert r.status_code == 200, r.text

    asyncio.run(go())
    assert "vllm_xargs" not in seen[0]
    x = seen[1]["vllm_xargs"]
    assert "system" in x["skv_types"] and x["skv_session"] == "s1"
    assert len(x["skv_types"]) == len(x["skv_tokens"]) and all(n > 0 for n in x["skv_tokens"])


def test_decoded_blocks_extend_the_view_as_output():
    rb, _ = ep.request_view("r", 70, [b"a", b"b"], 32, None, index=0, now=0.0)
    assert len(rb.keys) == 3  # two full blocks and the prompt's partial one
    ep.grow_view(rb, 4, [b"a", b"b", b"c", b"d", b"e"], 32)
    assert rb.keys[3:] == [b"d", b"e"] and rb.parents[4] == b"d"
    assert rb.stypes[3:] == [TYPE_INDEX[T.OUTPUT]] * 2
    assert rb.seg_tokens[3:] == [128 - 70, 160 - 70] and rb.tokens[3:] == [32, 32]


def test_server_passes_the_clock_and_refuses_an_unknown_one(fake_model):
    from skv.vllm.server import VllmServer

    srv = VllmServer(fake_model, python=sys.executable, eviction="lru", eviction_clock="client")
    assert srv.environment()["SKV_EVICTION_CLOCK"] == "client"
    assert (
        VllmServer(fake_model, python=sys.executable, eviction="lru").environment()[
            "SKV_EVICTION_CLOCK"
        ]
        == "wall"
    )
    with pytest.raises(ValueError, match="eviction_clock"):
        VllmServer(fake_model, python=sys.executable, eviction="lru", eviction_clock="x")


# ------------------------------------------------------------------------------ the free queue


class _FakeBlock:
    """What the free queue reads of a vLLM ``KVCacheBlock``."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.is_null = block_id == 0
        self.block_hash = None

    def __repr__(self) -> str:
        return f"B{self.block_id}"


def _fake_pool(monkeypatch, **settings_over):
    """The plugin's block pool (and its ``PolicyFreeQueue``), built against stand-ins for the
    two vLLM classes they subclass (no vLLM, no engine)."""
    import types

    class StockQueue:
        def __init__(self, blocks):
            self.blocks = list(blocks)

        def get_all_free_blocks(self):
            return list(self.blocks)

    class StockPool:
        def __init__(self, num_gpu_blocks):
            self.num_gpu_blocks = num_gpu_blocks
            self.hash_block_size = 4
            self.blocks = [_FakeBlock(i) for i in range(num_gpu_blocks)]
            self.free_block_queue = StockQueue(self.blocks[1:])

        def reset_prefix_cache(self):
            return True

    mods = {name: types.ModuleType(name) for name in
            ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.block_pool",
             "vllm.v1.core.kv_cache_utils")}  # fmt: skip
    mods["vllm.v1.core.block_pool"].BlockPool = StockPool
    mods["vllm.v1.core.kv_cache_utils"].FreeKVCacheBlockQueue = StockQueue
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    settings = {"policy": "lru", "params": {}, "log": None, "log_every": 16, "clock": "client"}
    pool = ep.make_pool_class({**settings, **settings_over})(4)
    assert pool.free_block_queue.num_free_blocks == 3  # blocks 1..3 (0 is vLLM's null block)
    return pool


def _free_queue_class(monkeypatch):
    return type(_fake_pool(monkeypatch).free_block_queue)


def test_the_plugin_free_queue_prepends_in_order_counts_removals_and_pops_unhashed_first(
    monkeypatch,
):
    """Eight fake blocks; unhashed free blocks 1, 2; cached blocks 4 and 5 (an lru policy),
    freed in that order, then appended (counted, not queued: the policy orders them).
    ``prepend_n([3, 6])`` puts 3 then 6 in front: the unhashed part is 3, 6, 1, 2, and 6 free
    blocks in all. A hit on free cached block 5 (touched, then ``remove``): 5 free, the
    unhashed part unchanged. Then ``popleft`` gives 3, ``popleft_n(3)`` 6, 1, 2 and the next
    ``popleft`` the policy's victim, 4 (5 is held): 0 free, and one more pop is refused."""
    from helpers import rb

    from skv.cache.free_order import FreeOrder
    from skv.policies.registry import make_policy

    queue_class = _free_queue_class(monkeypatch)
    blocks = [_FakeBlock(i) for i in range(8)]
    order = FreeOrder(make_policy("lru"))
    req = rb([104, 105])
    for i, bid in enumerate((4, 5)):
        order.hashed(bid, 100 + bid, 4, 0, i, req, 1, 1.0)
    order.freed(4, 2.0)
    order.freed(5, 3.0)
    q = queue_class([blocks[1], blocks[2]], blocks, order, lambda: 5.0)
    assert q.num_free_blocks == 2
    q.append_n([blocks[4], blocks[5]])
    assert q.num_free_blocks == 4 and list(q.unhashed) == [blocks[1], blocks[2]]
    q.prepend_n([blocks[3], blocks[6]])
    assert list(q.unhashed) == [blocks[3], blocks[6], blocks[1], blocks[2]]
    assert q.num_free_blocks == 6
    assert q.get_all_free_blocks()[:4] == [blocks[3], blocks[6], blocks[1], blocks[2]]
    order.touched(5, 4.0)
    q.remove(blocks[5])
    assert q.num_free_blocks == 5 and len(q.unhashed) == 4
    assert q.popleft() is blocks[3]
    assert q.popleft_n(3) == [blocks[6], blocks[1], blocks[2]]
    assert q.num_free_blocks == 1
    assert q.popleft() is blocks[4] and order.evictions == 1 and 4 not in order.blocks
    assert q.num_free_blocks == 0
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    with pytest.raises(ep.PluginError, match="cached block was prepended"):
        q.prepend_n([blocks[5]])


def test_a_reset_cache_starts_the_client_clock_and_the_request_count_again(monkeypatch):
    """Two passes of the same arrivals with a cache reset between them (what a load study
    does): the second pass's skv_time restarts at 0, and the policy's clock must follow it,
    not stay at the first pass's last arrival (every age would be wrong for the whole pass)."""
    import types

    pool = _fake_pool(monkeypatch)

    def request(rid: str, t: float):
        sp = types.SimpleNamespace(extra_args={"skv_time": t})
        return types.SimpleNamespace(request_id=rid, num_prompt_tokens=8, block_hashes=[],
                                     sampling_params=sp)  # fmt: skip

    for i, t in enumerate((0.0, 5.0, 28.0)):
        pool.begin(request(f"a{i}", t))
    assert pool.now() == 28.0 and pool._index == 3
    assert pool.reset_prefix_cache()
    assert pool.now() == 0.0 and pool._index == 0
    pool.begin(request("b0", 1.5))
    assert pool.now() == 1.5
    assert pool._views["b0"].arrival_s == 1.5


def test_a_reset_switches_to_the_policy_the_next_file_names_and_a_bad_file_keeps_it(
    monkeypatch, tmp_path, caplog
):
    """SKV_EVICTION_NEXT: at a prefix-cache reset the pool builds the policy the file names
    (with its ghost list when it keeps one), and its log's reset line names the policy in
    force; no file, a file that does not parse or a policy that cannot be built keep the
    policy in force (logged, never raised inside the engine)."""
    nxt, log = tmp_path / "next.json", tmp_path / "ev.jsonl"
    pool = _fake_pool(monkeypatch, next=str(nxt), log=str(log))
    assert type(pool.skv_order.policy).__name__.lower().startswith("lru")

    def reset_to(spec: str | None) -> dict:
        if spec is not None:
            nxt.write_text(spec)
        assert pool.reset_prefix_cache()
        return json.loads(log.read_text().splitlines()[-1])

    assert reset_to(None)["policy"] == "lru"  # no file yet: kept
    line = reset_to('{"policy": "saecache", "params": {"eta": 0.2}}')
    assert line == {"event": "reset", "policy": "saecache", "params": {"eta": 0.2}}
    assert "SAECache" in type(pool.skv_order.policy).__name__
    assert pool.skv_order.ghost.capacity == (4 if pool.skv_order.policy.uses_ghost_list else 0)
    for bad in ("{oops", '{"policy": "belady"}', '{"policy": "lru", "params": [1]}', "[]"):
        assert reset_to(bad)["policy"] == "saecache", bad
    assert "the policy in force stays" in caplog.text
    assert reset_to('{"policy": "lru"}') == {"event": "reset", "policy": "lru", "params": {}}
