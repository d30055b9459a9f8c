"""skv.vllm without an engine: the streaming client against an in-process fake OpenAI server
(httpx.MockTransport), the /metrics parser, the server's command line, the replay loops."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from skv.vllm.client import StreamingClient, replay, summarize
from skv.vllm.metrics import (
    HITS,
    QUERIES,
    PrefixCacheCounters,
    hit_rate,
    parse_prometheus,
    prefix_cache_counters,
)

# ---------------------------------------------------------------------- a fake OpenAI server


def _sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


class FakeOpenAI:
    """Streams ``n_tokens`` chunks: the first after ``ttft`` seconds, the rest ``itl`` apart,
    then a usage chunk (when asked for) with ``cached`` tokens, then [DONE]. Records bodies."""

    def __init__(
        self,
        *,
        ttft=0.05,
        itl=0.01,
        n_tokens=4,
        prompt_tokens=100,
        cached=64,
        status=200,
        fail_after=None,
        usage_details=True,
    ):
        self.ttft, self.itl, self.n_tokens = ttft, itl, n_tokens
        self.prompt_tokens, self.cached, self.status = prompt_tokens, cached, status
        self.fail_after, self.usage_details = fail_after, usage_details
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent_at: list[float] = []

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.sent_at.append(time.perf_counter())
        if self.status != 200:
            return httpx.Response(
                self.status,
                json={"error": {"message": "prompt too long", "type": "BadRequestError"}},
            )
        chat = request.url.path.endswith("/chat/completions")
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=self._stream(body, chat)
        )

    async def _stream(self, body, chat):
        # in flight from the first to the last chunk, counted here rather than in a finally:
        # an async generator dropped by its reader is closed whenever the event loop gets to it
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.ttft)
        if chat:
            yield _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        n = body.get("max_tokens", self.n_tokens)
        for i in range(n):
            if i:
                await asyncio.sleep(self.itl)
            if self.fail_after is not None and i == self.fail_after:
                self.in_flight -= 1
                yield _sse({"error": {"message": "engine died", "code": 500}})
                return
            last = i == n - 1
            text = "" if i == 1 else f"t{i}"  # an empty piece is still a token
            choice = {"index": 0, "finish_reason": "length" if last else None}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            yield _sse({"choices": [choice]})
        self.in_flight -= 1
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": n,
                "total_tokens": self.prompt_tokens + n,
            }
            if self.usage_details:
                usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
            yield _sse({"choices": [], "usage": usage})
        yield _sse("[DONE]")


def run(coro):
    return asyncio.run(coro)


async def _one(fake: FakeOpenAI, call: str, *args, **kw):
    async with StreamingClient(
        "http://fake", "tiny", transport=httpx.MockTransport(fake.handler)
    ) as c:
        return await getattr(c, call)(*args, **kw)


# ---------------------------------------------------------------------- one request


def test_completion_records_ttft_itl_usage_and_cached_tokens():
    fake = FakeOpenAI(ttft=0.08, itl=0.02, prompt_tokens=120, cached=96)
    r = run(_one(fake, "complete", "hello", max_tokens=4))
    assert r.ok and r.error is None and r.status == 200
    assert r.endpoint == "completions"
    assert 0.07 <= r.ttft < 0.5
    assert len(r.itl) == 3  # 4 token chunks, the empty one included
    assert all(0.015 <= g < 0.5 for g in r.itl)
    assert r.e2e >= r.ttft + sum(r.itl) - 1e-3
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (120, 4, 96)
    assert r.hit_fraction == pytest.approx(0.8)
    assert r.tpot == pytest.approx((r.e2e - r.ttft) / 3)
    assert r.finish_reason == "length"
    assert r.text == "t0t2t3"
    assert r.chunks == 4


def test_the_request_asks_for_usage_and_streams():
    fake = FakeOpenAI()
    run(
        _one(fake, "complete", "hi", max_tokens=2, stream_options={"continuous_usage_stats": False})
    )
    body = fake.bodies[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["model"] == "tiny" and body["prompt"] == "hi" and body["max_tokens"] == 2
    assert body["ignore_eos"] is True and body["temperature"] == 0.0


def test_chat_ttft_is_the_role_chunk_and_it_opens_no_gap():
    fake = FakeOpenAI(ttft=0.05, itl=0.02)
    r = run(_one(fake, "chat", [{"role": "user", "content": "hi"}], max_tokens=3))
    assert r.ok and r.endpoint == "chat/completions"
    assert 0.04 <= r.ttft < 0.5
    assert r.chunks == 4  # role chunk + 3 tokens
    assert len(r.itl) == 2 and all(g >= 0.015 for g in r.itl)
    assert r.cached_tokens == 64 and r.text == "t0t2"
    assert fake.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]


def test_missing_prompt_tokens_details_leaves_cached_tokens_unknown():
    r = run(_one(FakeOpenAI(usage_details=False), "complete", "hi", max_tokens=2))
    assert r.ok and r.prompt_tokens == 100 and r.cached_tokens is None and r.hit_fraction is None


# ---------------------------------------------------------------------- errors are recorded


def test_http_error_is_recorded_not_raised():
    r = run(_one(FakeOpenAI(status=400), "complete", "x" * 10, max_tokens=2))
    assert not r.ok and r.status == 400
    assert r.error == "HTTP 400: prompt too long"
    assert r.ttft is None and r.e2e is not None


def test_error_event_mid_stream_is_recorded():
    r = run(_one(FakeOpenAI(fail_after=2), "complete", "hi", max_tokens=4))
    assert not r.ok and "engine died" in r.error
    assert r.ttft is not None and r.chunks == 2


def test_connection_error_is_recorded():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    async def go():
        async with StreamingClient("http://fake", "m", transport=httpx.MockTransport(refuse)) as c:
            return await c.complete("hi")

    r = run(go())
    assert not r.ok and r.status is None and r.error.startswith("ConnectError")


def test_a_stream_without_choices_is_an_error():
    async def empty(request):
        return httpx.Response(200, content=_sse("[DONE]"))

    async def go():
        async with StreamingClient("http://fake", "m", transport=httpx.MockTransport(empty)) as c:
            return await c.complete("hi")

    r = run(go())
    assert not r.ok and r.error == "stream ended without output"


def test_bad_prompt_types_are_rejected_up_front():
    with pytest.raises(ValueError, match="prompt"):
        run(_one(FakeOpenAI(), "request", {"max_tokens": 3}))
    with pytest.raises(TypeError):
        run(_one(FakeOpenAI(), "request", 42))


# ---------------------------------------------------------------------- replay


def _replay(fake, prompts, **kw):
    async def go():
        async with StreamingClient(
            "http://f", "m", transport=httpx.MockTransport(fake.handler)
        ) as c:
            return await replay(c, prompts, **kw)

    return run(go())


def test_open_loop_sends_at_the_given_offsets_whatever_is_in_flight():
    # a request takes 0.5 s: all three are in flight together even if the loop runs late (a
    # loaded machine has delayed a send by 0.12 s)
    fake = FakeOpenAI(ttft=0.5, itl=0.0)
    prompts = [
        "a",
        [{"role": "user", "content": "b"}],
        {"prompt": "c", "id": "req-c", "max_tokens": 1},
    ]
    results = _replay(fake, prompts, arrival_times=[0.0, 0.05, 0.10], max_tokens=2)
    assert [r.id for r in results] == [0, 1, "req-c"]
    assert [r.endpoint for r in results] == ["completions", "chat/completions", "completions"]
    assert [r.scheduled_at for r in results] == [0.0, 0.05, 0.10]
    for r in results:
        assert r.ok and r.sent_at >= r.scheduled_at - 1e-3 and r.sent_at < r.scheduled_at + 0.25
    assert fake.max_in_flight == 3  # each sent before the previous finished
    assert [b["max_tokens"] for b in fake.bodies] == [2, 2, 1]


def test_closed_loop_keeps_concurrency_in_flight():
    fake = FakeOpenAI(ttft=0.03, itl=0.005)
    results = _replay(fake, [f"p{i}" for i in range(7)], concurrency=3, max_tokens=2)
    assert [r.id for r in results] == list(range(7))
    assert all(r.ok for r in results)
    assert fake.max_in_flight == 3
    assert [b["prompt"] for b in fake.bodies] == [f"p{i}" for i in range(7)]
    s = summarize(results)
    assert s["requests"] == 7 and s["ok"] == 7 and s["errors"] == 0
    assert s["prompt_tokens"] == 700 and s["cached_fraction"] == pytest.approx(0.64)


def test_replay_records_errors_and_goes_on():
    fake = FakeOpenAI(status=503)
    results = _replay(fake, ["a", "b"], concurrency=1)
    assert [r.ok for r in results] == [False, False] and all("503" in r.error for r in results)
    assert summarize(results)["errors"] == 2


def test_replay_wants_exactly_one_loop_kind():
    fake = FakeOpenAI()
    with pytest.raises(ValueError, match="exactly one"):
        _replay(fake, ["a"])
    with pytest.raises(ValueError, match="exactly one"):
        _replay(fake, ["a"], arrival_times=[0.0], concurrency=1)
    with pytest.raises(ValueError, match="arrival times"):
        _replay(fake, ["a", "b"], arrival_times=[0.0])


# ---------------------------------------------------------------------- /metrics

METRICS = f"""\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
{QUERIES}{{engine="0",model_name="tiny"}} 3947.0
{QUERIES}{{engine="1",model_name="tiny"}} 53.0
vllm:prefix_cache_queries_created{{engine="0",model_name="tiny"}} 1.79594e+09
# TYPE vllm:prefix_cache_hits counter
{HITS}{{engine="0",model_name="tiny"}} 2304.0
{HITS}{{engine="1",model_name="tiny"}} 0
vllm:kv_cache_usage_perc{{engine="0",model_name="a \\"quoted\\", name"}} 0.25 1700000000
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="tiny"}} 7
process_open_fds 12.0
"""


def test_prometheus_text_is_parsed_with_labels_escapes_and_timestamps():
    m = parse_prometheus(METRICS)
    assert m[QUERIES] == [
        ({"engine": "0", "model_name": "tiny"}, 3947.0),
        ({"engine": "1", "model_name": "tiny"}, 53.0),
    ]
    assert m["vllm:kv_cache_usage_perc"] == [
        ({"engine": "0", "model_name": 'a "quoted", name'}, 0.25)
    ]
    assert m["vllm:e2e_request_latency_seconds_bucket"][0][0]["le"] == "+Inf"
    assert m["process_open_fds"] == [({}, 12.0)]


def test_prefix_cache_counters_sum_engines_and_filter_labels():
    assert prefix_cache_counters(METRICS) == PrefixCacheCounters(4000.0, 2304.0)
    assert prefix_cache_counters(METRICS, engine="1") == PrefixCacheCounters(53.0, 0.0)
    assert prefix_cache_counters("") == PrefixCacheCounters(0.0, 0.0)


def test_hit_rate_comes_from_deltas():
    before, after = PrefixCacheCounters(1000, 100), PrefixCacheCounters(1400, 400)
    assert hit_rate(before, after) == pytest.approx(0.75)
    assert (after - before) == PrefixCacheCounters(400, 300)
    assert hit_rate(after, after) is None


# ---------------------------------------------------------------------- the server's command line


def test_server_command_line_and_environment(tmp_path):
    from skv.vllm.server import VllmServer

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    srv = VllmServer(
        model,
        python="/nowhere/python",
        num_gpu_blocks=64,
        block_size=32,
        kv_events=True,
        log_path=tmp_path / "log.txt",
    )
    try:
        cmd = srv.command()
        assert cmd[:3] == ["/nowhere/python", "-m", "vllm.entrypoints.openai.api_server"]
        for flag in (
            "--enforce-eager",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
        ):
            assert flag in cmd
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
        assert int(cmd[cmd.index("--port") + 1]) == srv.port > 0
        assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "64"
        assert cmd[cmd.index("--block-size") + 1] == "32"
        assert cmd[cmd.index("--dtype") + 1] == "float32"
        assert cmd[cmd.index("--max-model-len") + 1] == "2048"
        cfg = json.loads(cmd[cmd.index("--kv-events-config") + 1])
        assert cfg["enable_kv_cache_events"] and cfg["publisher"] == "zmq"
        assert cfg["endpoint"].startswith("ipc://") and cfg["endpoint"] == srv.kv_events_endpoint
        env = srv.environment()
        for k in (
            "VLLM_CPU_KVCACHE_SPACE",
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
            "VLLM_NO_USAGE_STATS",
        ):
            assert env[k]
        assert srv.model_name == "m" and srv.base_url == f"http://127.0.0.1:{srv.port}"
    finally:
        srv.close()


def test_server_rejects_cpu_unfriendly_block_sizes_and_missing_models(tmp_path):
    from skv.vllm.server import VllmServer

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="multiples of 32"):
        VllmServer(tmp_path, python="/x", block_size=16)
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        VllmServer(tmp_path / "absent", python="/x")


def test_server_that_exits_at_once_reports_its_log(tmp_path):
    import sys

    from skv.vllm.server import ServerError, VllmServer

    (tmp_path / "config.json").write_text("{}")
    fake_py = tmp_path / "python"
    fake_py.write_text(
        f"#!{sys.executable}\nimport sys\nprint('boom: no engine here')\nsys.exit(3)\n"
    )
    fake_py.chmod(0o755)
    srv = VllmServer(tmp_path, python=fake_py, log_path=tmp_path / "server.log", startup_timeout=30)
    with pytest.raises(ServerError, match=r"exited with 3(.|\n)*boom: no engine here"):
        srv.start()
    assert not srv.is_running()


def test_stop_reaps_what_the_server_leaves_behind_so_its_cpu_time_is_counted(tmp_path):
    """vLLM's EngineCore outlives its API server on SIGTERM; the harness is the subreaper of
    what it starts and reaps it, so a step's CPU time (wait4 in the pipeline) includes it.
    Here a fake server starts a child in its group that burns 1 s of CPU, then both sleep."""
    import resource
    import sys

    from skv.vllm.server import VllmServer

    (tmp_path / "config.json").write_text("{}")
    done = tmp_path / "burnt"
    burn = (
        "import time, pathlib\nt = time.process_time()\n"
        "while time.process_time() - t < 1.0: pass\n"
        f"pathlib.Path({str(done)!r}).touch()\ntime.sleep(60)\n"
    )
    fake_py = tmp_path / "python"
    fake_py.write_text(
        f"#!{sys.executable}\nimport subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(60)\n"
    )
    fake_py.chmod(0o755)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    srv = VllmServer(tmp_path, python=fake_py, log_path=tmp_path / "server.log")
    srv.start(wait=False)
    deadline = time.monotonic() + 30
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists()
    srv.stop(timeout=5)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) >= 0.95


def test_cli_registers_the_vllm_commands():
    import argparse

    from skv.vllm.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    a = parser.parse_args(
        ["vllm", "serve", "--model", "d", "--num-gpu-blocks", "64", "--port", "8001"]
    )
    assert (a.model, a.num_gpu_blocks, a.port) == ("d", 64, 8001)
    a = parser.parse_args(["vllm", "tiny-model", "out"])
    assert a.dir == "out" and a.func.__name__ == "cmd_vllm_tiny_model"
    assert parser.parse_args(["vllm", "setup", "--force"]).force
