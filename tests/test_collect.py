"""Trace collection: mock engine, collector, `skv collect-mock`, and replaying its trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skv.cli import main
from skv.latency import fit_from_requests
from skv.model import SemanticType
from skv.services.collect import (
    HandlerResponse,
    MockHandler,
    TraceCollector,
    collect_mock,
    mock_calls,
)
from skv.traces import load_trace

SYSTEM = "You are a careful assistant for the billing team. " * 20
MSGS = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Document 1:\nThe invoice total is due in thirty days.\n\n"
     "Question: when is the invoice due?"},
]  # fmt: skip


def _collect_cli(tmp_path: Path, n: int, *extra: str) -> Path:
    out = tmp_path / "mock.jsonl"
    assert main(["collect-mock", "--requests", str(n), "--output", str(out), *extra]) == 0
    return out


def test_mock_reports_cached_tokens_on_repeated_prefixes():
    mock = MockHandler(jitter=0.0)
    first = mock(MSGS)
    second = mock(MSGS)
    assert first.cached_tokens == 0
    assert second.prompt_tokens == first.prompt_tokens
    # the whole repeated prompt hits (skv's cache keeps the partial last block too)
    assert second.cached_tokens == second.prompt_tokens > 0
    assert second.ttft_ms < first.ttft_ms
    expect = 30.0 + 0.12 * (second.prompt_tokens - second.cached_tokens)
    assert second.ttft_ms == pytest.approx(expect + 0.01 * second.cached_tokens)
    assert first.content == second.content  # the answer is seeded by the prompt
    # a new question after the same system prompt hits the system prompt's full blocks
    other = mock([MSGS[0], {"role": "user", "content": "Something else entirely."}])
    assert 0 < other.cached_tokens < other.prompt_tokens


def test_collect_mock_writes_a_replayable_redacted_trace(tmp_path, capsys):
    out = _collect_cli(tmp_path, 40)
    assert "wrote 40 requests" in capsys.readouterr().out
    assert not out.with_name(out.name + ".partial").exists()
    header = json.loads(out.read_text().splitlines()[0])
    assert header["skv_trace"] == 1 and header["num_requests"] == 40
    assert header["meta"]["redacted"] is True
    assert "SIMULATED" in header["meta"]["observed_ttft"]
    reqs = load_trace(out)
    assert len(reqs) == 40
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    for r in reqs:
        assert r.observed_ttft_ms is not None and r.observed_ttft_ms > 0
        assert r.observed_cached_tokens is not None
        assert 0 <= r.observed_cached_tokens <= r.prompt_tokens
        assert r.output_tokens > 0 and r.session_id and r.tenant_id
        assert all(s.text is None and s.token_ids is None for s in r.segments)
        assert all(s.content_hash and s.num_tokens > 0 for s in r.segments)
        assert "response_text" not in r.extra
    assert sum(r.observed_cached_tokens for r in reqs) > 0
    kinds = {s.stype for r in reqs for s in r.segments}
    assert {SemanticType.SYSTEM, SemanticType.USER_QUERY} <= kinds
    raw = out.read_text()
    assert "You are the assistant" not in raw and "Question:" not in raw  # no prompt text
    # the trace replays, cache-only and timed
    assert main(["replay", str(out), "--capacity", "50%", "--quiet", "--output",
                 str(tmp_path / "cache")]) == 0  # fmt: skip
    assert (tmp_path / "cache" / "replay_results.csv").is_file()
    timed = tmp_path / "timed"
    argv = ["replay", str(out), "--cache-token-budget", "10000", "--calibrate-from-trace"]
    assert main([*argv, "--policies", "lru", "adaptive_semantic", "--quiet", "--output",
                 str(timed)]) == 0  # fmt: skip
    cal = json.loads((timed / "replay_results.json").read_text())["meta"]["calibration"]
    assert cal["r2"] > 0.9
    assert (timed / "observed_vs_simulated_ttft.png").is_file()


def test_no_redact_keeps_text(tmp_path):
    out = _collect_cli(tmp_path, 5, "--no-redact")
    reqs = load_trace(out)
    assert all(s.text for r in reqs for s in r.segments)
    assert all(isinstance(r.extra.get("response_text"), str) for r in reqs)
    assert json.loads(out.read_text().splitlines()[0])["meta"]["redacted"] is False


def test_collect_mock_default_path_and_determinism(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["collect-mock", "--requests", "25", "--output-name", "demo"]) == 0
    first = (tmp_path / "outputs" / "live_traces" / "demo.jsonl").read_bytes()
    assert main(["collect-mock", "--requests", "25", "--output-name", "again"]) == 0
    assert (tmp_path / "outputs" / "live_traces" / "again.jsonl").read_bytes() == first
    assert main(["collect-mock", "--requests", "25", "--output-name", "s1", "--seed", "1"]) == 0
    assert (tmp_path / "outputs" / "live_traces" / "s1.jsonl").read_bytes() != first


def test_mock_trace_calibrates_to_the_mock_model(tmp_path):
    mock = MockHandler(base_ms=20.0, ms_per_uncached_token=0.1, ms_per_cached_token=0.02)
    reqs = collect_mock(80, tmp_path / "m.jsonl", handler=mock, seed=2)
    fit = fit_from_requests(reqs)
    assert fit.r2 > 0.95
    assert fit.base_ms == pytest.approx(20.0, rel=0.15)
    assert fit.ms_per_uncached_token == pytest.approx(0.1, rel=0.05)
    assert fit.ms_per_cached_token == pytest.approx(0.02, rel=0.3)


def test_sessions_link_turns_and_answer_identity(tmp_path):
    reqs = collect_mock(60, None, seed=4)
    by_id = {r.request_id: r for r in reqs}
    later = [r for r in reqs if r.turn]
    assert later, "some session should have a second turn"
    for r in later:
        parent = by_id[r.parent_id]
        assert parent.session_id == r.session_id and parent.turn == r.turn - 1
        # the parent's answer comes back as this turn's assistant history, same identity
        history = [s for s in r.segments if s.stype is SemanticType.ASSISTANT_HISTORY]
        assert parent.output_hash in {s.content_hash for s in history}
        assert parent.observed_ttft_ms is not None
        assert r.prompt_tokens > parent.prompt_tokens


def test_mock_calls_are_seeded_and_ordered():
    a = mock_calls(30, seed=5)
    assert len(a) == 30 and a == mock_calls(30, seed=5)
    assert [c.arrival_s for c in a] == sorted(c.arrival_s for c in a)
    assert mock_calls(30, seed=6) != a
    turns: dict[str, list[int]] = {}
    for c in a:
        turns.setdefault(c.session_id, []).append(c.turn)
    assert all(t == list(range(len(t))) for t in turns.values())
    assert mock_calls(0) == []
    with pytest.raises(ValueError, match="session kind"):
        mock_calls(3, kinds=("chat", "poetry"))


def test_collector_wraps_any_handler_and_flushes_per_record(tmp_path):
    calls = []

    def openai_like(messages, tools=None):
        calls.append(messages)
        return {
            "choices": [{"message": {"role": "assistant", "content": "Thirty days."}}],
            "usage": {
                "prompt_tokens": 999,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 10_000},
            },
        }

    path = tmp_path / "live.jsonl"
    col = TraceCollector(openai_like, path, meta={"backend": "test"})
    col(MSGS, arrival_s=0.0, session_id="a", tenant_id="t")
    col(MSGS, session_id="a")  # arrival from the collector's clock
    partial = path.with_name(path.name + ".partial")
    assert not path.exists() and len(load_trace(partial, "skv")) == 2  # readable mid-run
    assert col.close() == path and not partial.exists()
    reqs = load_trace(path)
    assert len(calls) == 2 and len(reqs) == 2
    first, second = reqs
    assert first.observed_cached_tokens == first.prompt_tokens  # clipped to the prompt
    assert first.extra["engine_prompt_tokens"] == 999
    assert first.output_tokens == 4 and first.observed_ttft_ms >= 0  # wall clock
    assert second.parent_id == first.request_id and second.arrival_s >= 0
    assert json.loads(path.read_text().splitlines()[0])["meta"]["backend"] == "test"
    with pytest.raises(RuntimeError, match="closed"):
        col(MSGS)


def test_collector_rejects_bad_requests_and_responses(tmp_path):
    col = TraceCollector(lambda m, tools=None: HandlerResponse("ok", ttft_ms=1.0), None)
    with pytest.raises(ValueError, match="role"):
        col([{"content": "no role"}])
    assert col.requests == []
    bad = TraceCollector(lambda m, tools=None: 42, None)
    with pytest.raises(TypeError, match="HandlerResponse"):
        bad(MSGS)
    col(MSGS)
    assert col.requests[0].observed_ttft_ms == 1.0 and col.close() is None
