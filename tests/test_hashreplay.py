"""Hash-id trace -> token-id prompts for a real engine, and results -> skv trace (no engine)."""

from __future__ import annotations

import pytest

from skv.model import Request, Segment, SemanticType
from skv.replay import compile_trace, replay_trace
from skv.traces import load_trace
from skv.traces.native import write_skv_trace
from skv.vllm.client import RequestResult
from skv.vllm.hashreplay import (
    HashReplayConfig,
    HashTokenMapper,
    bench_summary,
    plan_hash_replay,
    prompts_and_arrivals,
    results_to_trace,
)

DATA = "tests/data/mooncake_tiny.jsonl"


def test_same_id_same_tokens_vocab_bounded_and_no_specials():
    cfg = HashReplayConfig(block_size=32, vocab_size=512, min_token_id=6, special_ids=(7,))
    a, b = HashTokenMapper(cfg), HashTokenMapper(cfg)
    assert a.block(5) == b.block(5) and len(a.block(5)) == 32
    assert a.block(5) != a.block(6)
    toks = [t for h in range(200) for t in a.block(h)]
    assert min(toks) >= 6 and max(toks) < 512 and 7 not in toks
    assert HashTokenMapper(HashReplayConfig(seed=1)).block(5) != a.block(5)


def test_mooncake_blocks_scale_one_to_one_and_share_prefixes():
    reqs = load_trace(DATA)
    plan = plan_hash_replay(reqs, HashReplayConfig(block_size=32, max_output_tokens=8))
    by_id = {it.request.request_id: it for it in plan.items}
    a, b = by_id["mooncake_tiny:1"], by_id["mooncake_tiny:2"]  # ids [0,1] and [0,1,2]
    assert a.prompt_tokens == 64  # 1024 tokens = 2 full 512-blocks -> 2 engine blocks
    assert b.token_ids[:64] == a.token_ids  # shared ids -> identical leading tokens
    assert b.prompt_tokens == 64 + round(476 * 32 / 512)  # partial block keeps its fraction
    c = by_id["mooncake_tiny:3"]  # [0, 3]: shares only block 0 with a
    assert c.token_ids[:32] == a.token_ids[:32] and c.token_ids[32:] != a.token_ids[32:]
    assert [it.arrival_s for it in plan.items] == [r.arrival_s for r in reqs]
    assert all(1 <= it.max_tokens <= 8 for it in plan.items)
    prompts, arrivals = prompts_and_arrivals(plan)
    assert prompts[0]["prompt"] == plan.items[0].token_ids and len(arrivals) == len(reqs)
    assert plan.totals["truncated_tokens"] == 0


def test_prompts_are_cut_to_the_context_budget_and_the_cut_is_recorded():
    r = Request(
        "x",
        5.0,
        [Segment(SemanticType.SYSTEM, 64 * 100)],
        output_tokens=50,
        hash_ids=list(range(100)),
        hash_block_size=64,
    )
    cfg = HashReplayConfig(block_size=32, max_model_len=1000, max_output_tokens=16, time_scale=2)
    (it,) = plan_hash_replay([r], cfg).items
    assert it.max_tokens == 16 and it.prompt_tokens == 1000 - 16
    assert it.scaled_tokens == 3200 and it.truncated_tokens == 3200 - 984
    assert len(it.hash_ids) == 31 and it.dropped_hash_ids == 69  # ceil(984/32) = 31 kept
    assert it.arrival_s == 0.0
    with pytest.raises(ValueError):
        plan_hash_replay([Request("y", 0.0, [Segment(SemanticType.SYSTEM, 10)])])


def _fake_results(plan, cached):
    out = []
    for i, (it, c) in enumerate(zip(plan.items, cached, strict=True)):
        out.append(
            RequestResult(
                id=it.request.request_id,
                ok=True,
                sent_at=0.1 * i,
                ttft=0.01 * (i + 1),
                e2e=0.05 * (i + 1),
                itl=[0.005, 0.006],
                chunks=3,
                prompt_tokens=it.prompt_tokens,
                completion_tokens=3,
                cached_tokens=c,
            )
        )
    return out


def test_results_make_a_trace_that_round_trips_and_replays(tmp_path):
    plan = plan_hash_replay(load_trace(DATA), HashReplayConfig(block_size=32))
    cached = [0, 32, 64, 32, 64, 32]
    results = _fake_results(plan, cached)
    results[3] = RequestResult(id="bad", ok=False, error="HTTP 500: boom", sent_at=0.3)
    trace = results_to_trace(plan, results)
    for req, it in zip(trace, plan.items, strict=True):
        assert req.prompt_tokens == it.prompt_tokens and req.hash_block_size == 32
        assert req.hash_ids == it.hash_ids
    assert trace[1].observed_cached_tokens == 32 and trace[1].observed_ttft_ms == pytest.approx(20)
    assert trace[3].observed_ttft_ms is None and trace[3].extra["error"].startswith("HTTP 500")
    assert trace[2].segments[0].stype == SemanticType.SYSTEM
    path = write_skv_trace(tmp_path / "t.jsonl", trace, meta=plan.meta())
    back = load_trace(path)
    assert [r.observed_cached_tokens for r in back] == [r.observed_cached_tokens for r in trace]
    rows = replay_trace(compile_trace(back), ["lru"], ["64"], progress=False)
    assert rows[0]["block_size"] == 32 and rows[0]["hit_tokens"] > 0


def test_bench_summary_uses_vllm_bench_names():
    plan = plan_hash_replay(load_trace(DATA), HashReplayConfig(block_size=32))
    res = _fake_results(plan, [0] * 6)
    res.append(RequestResult(ok=False, error="x", sent_at=0.0))
    s = bench_summary(res)
    for k in (
        "completed",
        "failed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
    ):
        assert k in s
    assert s["completed"] == 6 and s["failed"] == 1
    assert s["duration"] == pytest.approx(0.5 + 0.3)
    assert s["mean_ttft_ms"] == pytest.approx(35) and s["median_ttft_ms"] == pytest.approx(35)
    assert s["p99_ttft_ms"] == pytest.approx(10 + 50 * 0.99)
    assert s["mean_itl_ms"] == pytest.approx(5.5)
    assert s["mean_tpot_ms"] == pytest.approx(
        sum((0.05 * i - 0.01 * i) / 2 for i in range(1, 7)) / 6 * 1000
    )
