"""Cache-only replay: compiling a trace, policy-independent totals, result rows and files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import rb, req, seg

from skv.model import TYPES, SemanticType
from skv.replay import (
    CSV_COLUMNS,
    annotate_next_use,
    compile_trace,
    replay_one,
    replay_trace,
    resolve_capacities,
    trace_totals,
    write_results,
)

T = SemanticType
TYPE_NAMES = {t.value for t in TYPES}


def rag_requests():
    """Three system prompts x two documents x queries: shared prefixes and shared documents."""
    out = []
    for i in range(12):
        out.append(
            req(
                seg(T.SYSTEM, 8, f"sys{i % 3}"),
                seg(T.RETRIEVED_CONTEXT, 12, f"doc{i % 2}"),
                seg(T.USER_QUERY, 5, f"q{i % 4}"),
                request_id=f"r{i}",
            )
        )
    for i, r in enumerate(out):
        r.arrival_s = float(i)
    return out


def rag_trace(mode="prefix", block_size=4):
    return compile_trace(rag_requests(), block_size, mode)


# ---------------------------------------------------------------- compile and totals


def test_compile_trace_indexes_requests_in_arrival_order():
    trace = rag_trace()
    assert [r.index for r in trace] == list(range(12))
    assert [r.arrival_s for r in trace] == [float(i) for i in range(12)]
    assert all(r.block_size == 4 for r in trace)


def test_trace_totals_on_a_hand_checked_trace():
    trace = [
        rb([1, 2], tokens=[4, 2], index=0),
        rb([1, 3], tokens=[4, 4], index=1),
        rb([1, 2], tokens=[4, 2], index=2),
    ]
    t = trace_totals(trace)
    assert (t.requests, t.prompt_tokens, t.block_accesses, t.unique_blocks) == (3, 20, 6, 3)
    assert (t.ceiling_hit_blocks, t.ceiling_hit_tokens) == (3, 10)
    assert t.ceiling_block_hit_rate == pytest.approx(3 / 6)
    assert t.ceiling_token_hit_rate == pytest.approx(10 / 20)


def test_ceiling_stops_a_run_at_its_first_unseen_block():
    trace = [rb([1, 2, 3], index=0), rb([1, 9, 3], parents=[None, 1, 9], index=1)]
    assert trace_totals(trace).ceiling_hit_blocks == 1


def test_ceiling_restarts_a_run_at_each_chain_root():
    trace = [
        rb([5, 6], index=0),
        rb([9, 5, 6], parents=[None, None, 5], index=1),
    ]
    assert trace_totals(trace).ceiling_hit_blocks == 2


def test_ceiling_counts_a_document_repeated_within_one_request():
    # segment keying gives both copies the same keys; the cache hits the second copy
    r = req(seg(T.RETRIEVED_CONTEXT, 8, "doc"), seg(T.RETRIEVED_CONTEXT, 8, "doc"))
    trace = compile_trace([r], 4, "segment")
    assert trace[0].keys[:2] == trace[0].keys[2:]
    totals = trace_totals(trace)
    assert totals.ceiling_hit_blocks == 2
    row = replay_one(trace, "lru", 8, progress=False)
    assert row["hit_blocks"] == totals.ceiling_hit_blocks


def test_trace_totals_count_tokens_and_blocks_per_type():
    t = trace_totals(rag_trace())
    idx = {t_.value: i for i, t_ in enumerate(TYPES)}
    assert t.tokens_by_type[idx["system"]] == 12 * 8
    assert t.tokens_by_type[idx["retrieved_context"]] == 12 * 12
    assert sum(t.tokens_by_type) == t.prompt_tokens
    assert sum(t.blocks_by_type) == t.block_accesses


# ---------------------------------------------------------------- next use


def test_annotate_next_use_on_a_hand_checked_trace():
    trace = [rb([1, 2], index=0), rb([1, 3], index=1), rb([2, 1], index=2), rb([4], index=3)]
    annotate_next_use(trace)
    never = len(trace) + 1
    assert trace[0].next_use == [1, 2]
    assert trace[1].next_use == [2, never]
    assert trace[2].next_use == [never, never]
    assert trace[3].next_use == [never]


def test_annotate_next_use_uses_the_request_index():
    trace = [rb([1], index=10), rb([1], index=20)]
    annotate_next_use(trace)
    assert trace[0].next_use == [20]


# ---------------------------------------------------------------- capacities


def test_capacity_specs_resolve_to_blocks():
    out = resolve_capacities(
        ["8", "50%", "64tok", "1MB"], block_size=16, unique_blocks=10, model="tiny-llama"
    )
    # tiny-llama: 2 * 2 layers * 2 kv heads * 64 * 4 bytes = 2048 B/token, 32768 B/block
    assert out == [("8", 8), ("50%", 5), ("64tok", 4), ("1MB", 10**6 // 32768)]


def test_a_bad_capacity_spec_fails_before_any_replay():
    with pytest.raises(ValueError, match="lots"):
        replay_trace(rag_trace(), ["lru"], ["lots"])


# ---------------------------------------------------------------- rows


def test_replay_trace_gives_one_row_per_capacity_and_policy_in_that_order():
    rows = replay_trace(rag_trace(), ["lru", "vllm"], ["6", "50%"], progress=False)
    unique = trace_totals(rag_trace()).unique_blocks
    assert [(r["capacity"], r["policy"]) for r in rows] == [
        ("6", "lru"),
        ("6", "vllm"),
        ("50%", "lru"),
        ("50%", "vllm"),
    ]
    assert [r["capacity_blocks"] for r in rows] == [6, 6, round(unique / 2), round(unique / 2)]
    assert all(r["block_size"] == 4 for r in rows)


def test_rows_carry_hit_rates_and_per_type_tables():
    trace = rag_trace()
    totals = trace_totals(trace)
    for r in replay_trace(trace, ["lru", "vllm"], ["6"], progress=False):
        assert r["requests"] == 12
        assert r["prompt_tokens"] == totals.prompt_tokens
        assert r["block_accesses"] == totals.block_accesses
        assert r["token_hit_rate"] == pytest.approx(r["hit_tokens"] / r["prompt_tokens"])
        assert r["block_hit_rate"] == pytest.approx(r["hit_blocks"] / r["block_accesses"])
        assert 0.0 <= r["token_hit_rate"] <= r["ceiling_token_hit_rate"] <= 1.0
        assert set(r["evictions_by_type"]) <= TYPE_NAMES
        assert sum(r["evictions_by_type"].values()) == r["evictions"]
        assert set(r["hit_rate_by_type"]) == {"system", "retrieved_context", "user_query"}
        assert all(0.0 <= v <= 1.0 for v in r["hit_rate_by_type"].values())


def test_segment_keying_beats_prefix_keying_on_shared_documents():
    prefix = replay_one(rag_trace("prefix"), "lru", 10_000, progress=False)
    segment = replay_one(rag_trace("segment"), "lru", 10_000, progress=False)
    assert (
        segment["hit_rate_by_type"]["retrieved_context"]
        > prefix["hit_rate_by_type"]["retrieved_context"]
    )


def test_an_offline_policy_is_annotated_by_replay_itself():
    trace = rag_trace()
    assert trace[0].next_use is None
    row = replay_one(trace, "belady", 6, progress=False)
    assert trace[0].next_use is not None
    assert row["hit_blocks"] >= replay_one(rag_trace(), "lru", 6, progress=False)["hit_blocks"]


def test_an_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="nope"):
        replay_one(rag_trace(), "nope", 6, progress=False)


# ---------------------------------------------------------------- result files


def _run_and_write(out: Path) -> None:
    rows = replay_trace(rag_trace(), ["lru", "vllm"], ["6", "50%"], progress=False)
    write_results(rows, out, {"trace": "rag", "block_size": 4})


def test_write_results_writes_csv_and_json_that_parse(tmp_path):
    _run_and_write(tmp_path)
    with (tmp_path / "replay_results.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        lines = list(reader)
        header = reader.fieldnames
    assert header is not None
    assert header[: len(CSV_COLUMNS)] == CSV_COLUMNS
    assert {f"hit_rate_{t}" for t in TYPE_NAMES} <= set(header)
    assert {f"evictions_{t}" for t in TYPE_NAMES} <= set(header)
    assert len(lines) == 4
    assert [line["policy"] for line in lines] == ["lru", "vllm", "lru", "vllm"]
    assert all(0.0 <= float(line["token_hit_rate"]) <= 1.0 for line in lines)

    payload = json.loads((tmp_path / "replay_results.json").read_text())
    assert payload["meta"] == {"trace": "rag", "block_size": 4}
    assert len(payload["results"]) == 4
    assert all("replay_seconds" not in r for r in payload["results"])
    assert payload["results"][0]["hit_rate_by_type"]


def test_the_csv_and_json_agree(tmp_path):
    _run_and_write(tmp_path)
    with (tmp_path / "replay_results.csv").open(newline="") as f:
        lines = list(csv.DictReader(f))
    results = json.loads((tmp_path / "replay_results.json").read_text())["results"]
    for line, r in zip(lines, results, strict=True):
        assert int(line["hit_blocks"]) == r["hit_blocks"]
        assert float(line["block_hit_rate"]) == pytest.approx(r["block_hit_rate"], abs=1e-6)


def test_two_runs_write_byte_identical_files(tmp_path):
    _run_and_write(tmp_path / "a")
    _run_and_write(tmp_path / "b")
    for name in ("replay_results.csv", "replay_results.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_write_results_leaves_no_temporary_files(tmp_path):
    _run_and_write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "replay_results.csv",
        "replay_results.json",
    ]
