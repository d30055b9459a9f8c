"""One-pass lru hit-rate curves and SHARDS sampling (skv.mrc).

The curve must give exactly the hit blocks and tokens of skv's own ``lru`` cache-only replay
(``replay_one``) at every capacity tested, pinning included (capacity 1, capacities below a
request's size), for prefix and segment keying, hash-id traces and random forests with repeated
keys in one request (the per-block path). SHARDS must be deterministic and equal the full
replay at rate 1.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import skv.mrc
from skv.blocks import RequestBlocks
from skv.cli import main
from skv.compact_trace import CompactTrace
from skv.model import Request, Segment, SemanticType
from skv.mrc import (
    distance_counts,
    key_sampled,
    lru_curve,
    sample_trace,
    scaled_capacity,
    shards_curve,
)
from skv.replay import compile_trace, replay_one, trace_totals
from skv.workloads import make_workload

#: key_sampled's verdicts on a fixed probe at rate 0.5, seed 0
PINNED_VERDICTS = [False, True, False, True, False, False]

MOONCAKE = Path(__file__).parent / "data" / "mooncake_tiny.jsonl"


def _check_exact(trace: list[RequestBlocks], capacities) -> None:
    curve = lru_curve(trace)
    totals = trace_totals(trace)
    blocks, tokens, _ = distance_counts(CompactTrace(trace))  # every access counted once
    assert (blocks.sum(), tokens.sum()) == (
        totals.block_accesses,
        sum(map(sum, (rb.tokens for rb in trace))),
    )
    for cap in capacities:
        row = replay_one(trace, "lru", cap, totals=totals, progress=False)
        assert curve.hits(cap) == (row["hit_blocks"], row["hit_tokens"]), cap
        assert curve.block_hit_rate(cap) == pytest.approx(row["block_hit_rate"], abs=0)
        assert curve.token_hit_rate(cap) == pytest.approx(row["token_hit_rate"], abs=0)


def _capacities(unique: int) -> list[int]:
    return sorted(
        {1, 2, 3, 5, 8, 13, 30, 77, 200, 600, unique // 4, unique - 1, unique, unique + 7}
    )


@pytest.mark.parametrize("mode", ["prefix", "segment"])
@pytest.mark.parametrize("workload", ["multi_turn_chat", "rag", "tool_agent"])
def test_curve_equals_lru_replay_at_every_capacity(workload, mode):
    trace = compile_trace(make_workload(workload, seed=3, num_requests=80), mode=mode)
    _check_exact(trace, _capacities(trace_totals(trace).unique_blocks))


def _hash_id_trace(seed: int, n: int = 150) -> list[Request]:
    """Sessions whose turns extend the previous prompt, sharing a 2-block system prompt;
    the last block is partial (Mooncake-like: 16-token blocks)."""
    rng = random.Random(seed)
    sessions: list[list[int]] = []
    reqs = []
    next_id = 10
    for i in range(n):
        if not sessions or rng.random() < 0.3:
            sessions.append([1, 2])
        s = rng.randrange(len(sessions))
        grow = rng.randint(1, 6)
        sessions[s] = sessions[s] + list(range(next_id, next_id + grow))
        next_id += grow
        ids = list(sessions[s])
        tokens = 16 * (len(ids) - 1) + rng.randint(1, 16)
        reqs.append(
            Request(
                f"r{i}",
                float(i),
                [Segment(SemanticType.UNKNOWN, tokens)],
                hash_ids=ids,
                hash_block_size=16,
            )
        )
    return reqs


def test_curve_equals_lru_replay_on_a_hash_id_trace():
    trace = compile_trace(_hash_id_trace(0))
    assert trace[0].block_size == 16
    _check_exact(trace, _capacities(trace_totals(trace).unique_blocks))


def _random_forest_trace(seed: int, n: int = 120) -> list[RequestBlocks]:
    """Requests made of 1-3 root-to-node paths of a random forest, a path sometimes twice in
    one request (repeated keys, several chain roots: the per-block path)."""
    rng = random.Random(seed)
    parent: list[int | None] = []
    for node in range(300):
        parent.append(None if node < 4 or rng.random() < 0.05 else rng.randrange(node))
    trace = []
    for i in range(n):
        keys: list[int] = []
        parents: list[int | None] = []
        paths = [rng.randrange(300) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.2:
            paths.append(paths[0])
        for leaf in paths:
            path = [leaf]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])
            path.reverse()
            keys += [k + 1000 for k in path]
            parents += [None] + [k + 1000 for k in path[:-1]]
        tokens = [rng.randint(1, 16) for _ in keys]
        trace.append(
            RequestBlocks(
                i, float(i), keys, parents, tokens, [0] * len(keys), tokens, None, 0, False, 16
            )
        )
    return trace


@pytest.mark.parametrize("small", [0, 64, 10**9])  # vectorised checks, the default, lists only
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_curve_equals_lru_replay_on_random_forests_at_every_capacity(seed, small, monkeypatch):
    monkeypatch.setattr(skv.mrc, "SMALL", small)
    trace = _random_forest_trace(seed)
    unique = trace_totals(trace).unique_blocks
    _check_exact(trace, range(1, unique + 3))


def test_curve_is_monotone_and_reaches_the_infinite_cache_ceiling():
    trace = compile_trace(make_workload("tool_agent", seed=1, num_requests=100))
    curve = lru_curve(trace)
    totals = trace_totals(trace)
    assert curve.unique_blocks == totals.unique_blocks
    assert (np.diff(curve.hit_blocks) >= 0).all() and (np.diff(curve.hit_tokens) >= 0).all()
    big = totals.unique_blocks + 1
    assert curve.hits(big) == (totals.ceiling_hit_blocks, totals.ceiling_hit_tokens)
    assert curve.hits(10**9) == curve.hits(big)
    blocks, tokens, unique = distance_counts(CompactTrace(trace))
    assert unique == totals.unique_blocks and len(blocks) == len(tokens) == unique + 1
    assert blocks.sum() == totals.block_accesses and (blocks >= 0).all() and (tokens >= 0).all()
    assert tokens.sum() == sum(sum(rb.tokens) for rb in trace)  # misses at distance 0


def test_sample_is_deterministic_and_keeps_whole_requests():
    trace = compile_trace(make_workload("multi_turn_chat", seed=2, num_requests=300))
    a = sample_trace(trace, 0.3, seed=5, min_units=0)
    b = sample_trace(trace, 0.3, seed=5, min_units=0)
    c = sample_trace(trace, 0.3, seed=6, min_units=0)
    assert [r.keys for r in a.trace] == [r.keys for r in b.trace]
    assert [r.keys for r in a.trace] != [r.keys for r in c.trace]
    originals = {tuple(r.keys) for r in trace}
    assert all(tuple(r.keys) in originals for r in a.trace)  # whole requests, chains intact
    assert [r.index for r in a.trace] == list(range(len(a.trace)))
    assert 0 < len(a.trace) < len(trace)
    blocks = sample_trace(trace, 0.3, seed=5, unit="block")
    assert [r.keys for r in blocks.trace] == [
        r.keys for r in sample_trace(trace, 0.3, seed=5, unit="block").trace
    ]


def test_per_key_verdicts_hit_the_rate_and_depend_on_the_key_and_seed_alone():
    n = 400_000
    spread = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # wraps
    for keys in (np.arange(n, dtype=np.uint64), spread):  # sequential ids too
        for rate in (0.5, 0.1, 0.01):
            share = key_sampled(keys, rate, 0).mean()
            assert abs(share - rate) < 5 * math.sqrt(rate * (1 - rate) / n), (rate, share)
        a, b = key_sampled(keys, 0.1, 0), key_sampled(keys, 0.1, 1)
        assert np.array_equal(key_sampled(keys[::-1], 0.1, 0)[::-1], a)  # order plays no part
        both = (a & b).mean()  # seeds draw independent samples: overlap ~ rate**2
        assert abs(both - 0.01) < 5 * math.sqrt(0.01 / n)
    assert key_sampled(spread, 1.0, 3).all()
    # the verdicts define every per-key sample: pinned, so a change is a deliberate one
    probe = np.array([0, 1, 2, 12345, 2**63, 2**64 - 1], dtype=np.uint64)
    assert key_sampled(probe, 0.5, 0).tolist() == PINNED_VERDICTS
    with pytest.raises(ValueError, match="sample rate"):
        key_sampled(probe, 0.0, 0)


def test_a_per_key_sample_scales_the_cache_by_its_share_of_the_keys():
    """The share is what the sample holds: its distinct keys over the trace's."""
    trace = compile_trace(make_workload("multi_turn_chat", seed=2, num_requests=300))
    unique = len({k for rb in trace for k in rb.keys})
    for rate, seed in ((0.3, 1), (0.05, 2), (0.05, 3)):
        s = sample_trace(trace, rate, seed=seed, unit="block")
        held = len({k for rb in s.trace for k in rb.keys})
        assert s.key_share == pytest.approx(held / unique) and s.scale == s.key_share
        assert s.key_share != rate  # a finite sample: not exactly the rate
        assert scaled_capacity(1000, s) == round(held / unique * 1000)
    whole = sample_trace(trace, 0.3, seed=1, min_units=0)  # whole sessions: their own share
    assert whole.unit == "session" and whole.scale == whole.key_share != 0.3


def test_a_trace_a_belady_replay_annotated_samples_as_before():
    """Belady annotates next uses on the list in place; a per-key sample ignores them."""
    trace = compile_trace(make_workload("multi_turn_chat", seed=2, num_requests=120))
    before = sample_trace(trace, 0.3, seed=1, unit="block")
    replay_one(trace, "belady", 50, progress=False)
    assert trace[0].next_use is not None
    assert list(sample_trace(trace, 0.3, seed=1, unit="block").trace) == list(before.trace)


def test_a_per_key_sample_is_stored_compactly_and_replays_as_its_list():
    """A per-key sample is a CompactTrace (memory per stored key): every policy, belady
    included (it gets the list), estimates the same from it as from its requests listed."""
    from skv.compact_trace import CompactTrace
    from skv.mrc import shards_curve

    trace = compile_trace(make_workload("multi_turn_chat", seed=2, num_requests=300))
    sample = sample_trace(trace, 0.2, seed=3, unit="block")
    assert isinstance(sample.trace, CompactTrace)
    listed = replace(sample, trace=list(sample.trace))
    for policy in ("lru", "vllm", "lfu", "belady"):
        got = shards_curve(trace, policy, [20, 80], 0.2, sample=sample)
        assert got == shards_curve(trace, policy, [20, 80], 0.2, sample=listed)


def test_an_empty_per_key_share_is_a_share_of_zero():
    from skv.mrc import Sample

    assert Sample([], 0.5, "block", 0, 0, key_share=0.0).scale == 0.0
    assert Sample([], 0.5, "session", 0, 0).scale == 0.5


def test_per_key_sample_of_a_list_equals_that_of_its_compact_trace():
    from skv.compact_trace import CompactTrace

    trace = compile_trace(make_workload("multi_turn_chat", seed=2, num_requests=300))
    for rate in (0.3, 0.05):
        a = sample_trace(trace, rate, seed=4, unit="block")
        b = sample_trace(CompactTrace(trace), rate, seed=4, unit="block")
        assert list(a.trace) == list(b.trace) and a.trace
        kept = sum(len(r.keys) for r in a.trace) / sum(len(r.keys) for r in trace)
        assert 0.3 * rate < kept < 3 * rate


def _upto_sessions(trace: list[RequestBlocks], n: int) -> int:
    """The length of ``trace``'s shortest prefix that holds ``n`` distinct sessions."""
    seen: set = set()
    for i, rb in enumerate(trace):
        seen.add(rb.session)
        if len(seen) == n:
            return i + 1
    raise AssertionError(f"fewer than {n} sessions")


def test_auto_samples_per_key_when_too_few_units_would_come_in():
    """Whole units need enough of them in the sample: ``rate * units >= min_units``."""
    trace = compile_trace(make_workload("multi_turn_chat", seed=2, num_requests=300))
    sessions = len({rb.session for rb in trace})
    rate = 0.3
    assert sample_trace(trace, rate, seed=5).unit == "block"  # the default 100 > 0.3 * units
    at_edge = math.ceil(rate * sessions)
    assert sample_trace(trace, rate, seed=5, min_units=at_edge + 1).unit == "block"
    whole = sample_trace(trace, rate, seed=5, min_units=at_edge - 1)
    assert whole.unit == "session" and whole.key_share is not None
    even = sessions - sessions % 2  # rate 0.5 of an even count: exactly at the threshold
    assert sample_trace(trace[: _upto_sessions(trace, even)], 0.5, seed=5,
                        min_units=even // 2).unit == "session"  # fmt: skip
    assert sample_trace(trace[: _upto_sessions(trace, even)], 0.5, seed=5,
                        min_units=even // 2 + 1).unit == "block"  # fmt: skip
    assert sample_trace(trace, 1.0, seed=5).unit == "session"  # rate 1: everything, whole
    flat = compile_trace(_hash_id_trace(1, n=200))  # no sessions: prefix trees at depth 2
    assert sample_trace(flat, 0.25, seed=0).unit == "block"
    assert sample_trace(flat, 0.25, seed=0, min_units=1).unit == "auto"


@pytest.mark.parametrize("unit", ["auto", "root", "session", "block"])
@pytest.mark.parametrize("policy", ["lru", "vllm", "adaptive_semantic"])
def test_rate_one_equals_the_full_replay_exactly(policy, unit):
    trace = compile_trace(make_workload("rag", seed=4, num_requests=60))
    unique = trace_totals(trace).unique_blocks
    caps = [2, 37, unique // 3, unique]
    rows = shards_curve(trace, policy, caps, 1.0, unit=unit)
    for cap, row in zip(caps, rows, strict=True):
        full = replay_one(trace, policy, cap, progress=False)
        assert row["sample_capacity_blocks"] == cap
        assert row["block_hit_rate"] == full["block_hit_rate"]
        assert row["token_hit_rate"] == full["token_hit_rate"]


def test_scaled_capacity_keeps_the_shared_trunk_whole():
    trace = compile_trace(_hash_id_trace(1, n=200))
    s = sample_trace(trace, 0.25, seed=0, min_units=0)
    assert s.depth == 2  # blocks 1, 2 are one system prompt for everyone: the trunk
    assert s.shared_blocks == 2
    assert scaled_capacity(102, s) == round(s.key_share * 100) + 2
    # the sample's own share of the non-trunk keys (the trunk: the keys above the depth)
    trunk = {k for rb in trace for k in rb.keys[: s.depth]}
    every = {k for rb in trace for k in rb.keys} - trunk
    mine = {k for rb in s.trace for k in rb.keys} - trunk
    assert s.key_share == pytest.approx(len(mine) / len(every)) and s.key_share != 0.25
    assert scaled_capacity(1, s) == 1


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, math.nan, math.inf, "0.1"])
def test_bad_rates_are_value_errors(rate):
    trace = compile_trace(make_workload("rag", seed=0, num_requests=5))
    with pytest.raises(ValueError, match="sample rate must be in"):
        sample_trace(trace, rate)


def test_empty_traces_and_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="empty trace"):
        lru_curve([])
    with pytest.raises(ValueError, match="empty trace"):
        sample_trace([], 0.5)
    trace = compile_trace(make_workload("rag", seed=0, num_requests=5))
    with pytest.raises(ValueError, match="unit must be"):
        sample_trace(trace, 0.5, unit="tenant")
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        lru_curve(trace).hits(0)
    with pytest.raises(ValueError, match="kept no request"):
        shards_curve(trace, "lru", [10], 1e-12)


def test_cli_writes_the_curve_with_both_methods_and_belady(tmp_path, capsys):
    out = tmp_path / "curve"
    argv = ["replay", str(MOONCAKE), "--capacity-curve", "--sample-rate", "1", "0.5"]
    argv += ["--policies", "lru", "vllm", "--belady-points", "2", "--output", str(out)]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "capacity_curve.csv").open()))
    methods = {r["method"] for r in rows}
    assert methods == {"exact_lru", "shards", "belady"}
    assert {r["policy"] for r in rows if r["method"] == "shards"} <= {"lru", "vllm"}
    exact = {int(r["capacity_blocks"]): r for r in rows if r["method"] == "exact_lru"}
    for r in rows:  # SHARDS at rate 1 is the full lru replay, i.e. the exact curve
        if r["method"] == "shards" and r["policy"] == "lru" and float(r["sample_rate"]) == 1:
            assert r["token_hit_rate"] == exact[int(r["capacity_blocks"])]["token_hit_rate"]
    units = {(r["method"], r["sample_rate"], r["sample_unit"]) for r in rows}
    assert {u for m, _r, u in units if m != "shards"} == {""}  # not sampled
    # a tiny trace has too few units for whole ones at 0.5: per key; at rate 1, whole ones
    assert {u for m, r, u in units if m == "shards" and float(r) == 0.5} == {"block"}
    assert {u for m, r, u in units if m == "shards" and float(r) == 1}.pop().startswith("depth ")
    assert (out / "capacity_curve.png").stat().st_size > 0
    meta = json.loads((out / "capacity_curve.json").read_text())["meta"]
    assert meta["sample_rates"] == [1.0, 0.5]
    assert "capacity_curve.csv" in capsys.readouterr().out


def test_cli_rejects_a_bad_rate_before_loading(tmp_path, capsys):
    missing = tmp_path / "never.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(missing), "--capacity-curve", "--sample-rate", "2"])
    assert exc.value.code == 2
    assert "sample rate must be in (0, 1]" in capsys.readouterr().err


def test_a_block_with_the_first_stamp_then_a_new_block():
    """Stamp 0 (the first request's last block) followed by an unseen block: the unseen block
    must not join the run of consecutive stamps (it once did and looped forever)."""

    def rb(i: int, keys: list[int]) -> RequestBlocks:
        parents = [None, *keys[:-1]]
        n = len(keys)
        return RequestBlocks(
            i, float(i), keys, parents, [4] * n, [0] * n, [4] * n, None, 0, False, 4
        )

    trace = [rb(0, [7]), rb(1, [7, 8]), rb(2, [7, 8, 9]), rb(3, [5]), rb(4, [7, 8, 9, 10])]
    _check_exact(trace, range(1, 7))


@pytest.mark.parametrize("small", [0, 10**9])
def test_a_new_chain_twice_in_one_request_hits_the_second_time(small, monkeypatch):
    """Segment keying can repeat a new document in one request: the repeat hits (it is
    pinned) at any capacity holding its first-occurrence rank."""
    monkeypatch.setattr(skv.mrc, "SMALL", small)
    keys = [11, 12, 11, 12]
    first = RequestBlocks(
        0, 0.0, keys, [None, 11, None, 11], [4] * 4, [0] * 4, [4] * 4, None, 0, False, 4
    )
    again = RequestBlocks(
        1, 1.0, [11, 12, 13], [None, 11, 12], [4] * 3, [0] * 3, [4] * 3, None, 0, False, 4
    )
    _check_exact([first, again], range(1, 5))
    assert lru_curve([first]).hits(2) == (2, 8)


@pytest.mark.parametrize("mode", ["prefix", "segment"])
def test_session_sampling_keeps_the_cross_session_trunk_whole(mode):
    trace = compile_trace(make_workload("multi_turn_chat", seed=5, num_requests=200), mode=mode)
    users: dict[int, set] = {}
    for rb in trace:
        for key in rb.keys:
            users.setdefault(key, set()).add(rb.session)
    shared = {k for k, s in users.items() if len(s) > 1}
    assert shared and skv.mrc._cross_session_keys(trace) == shared
    s = sample_trace(trace, 0.4, seed=1, min_units=0)
    assert s.unit == "session" and 0 < len(s.trace) < len(trace)
    assert s.shared_blocks == len(shared & {k for rb in s.trace for k in rb.keys})
    kept = {rb.session for rb in s.trace}
    assert len([rb for rb in trace if rb.session in kept]) == len(s.trace)  # sessions whole


@pytest.mark.parametrize("unit", ["auto", "block", "session"])
def test_the_curve_of_a_compact_trace_equals_that_of_its_list(unit):
    """``skv replay --capacity-curve`` loads a CompactTrace (memory per unique block): every
    row, exact, sampled (whole units and per key) and Belady's, is what the list gives."""
    trace = compile_trace(make_workload("multi_turn_chat", seed=4, num_requests=120))
    kwargs = dict(policies=["lru", "vllm"], rates=[0.5, 0.2], points=12, sample_points=4,
                  belady_points=2, unit=unit)  # fmt: skip
    rows = skv.mrc.capacity_curve(CompactTrace(trace), **kwargs)
    assert rows == skv.mrc.capacity_curve(trace, **kwargs)
    assert {r["method"] for r in rows} == {"exact_lru", "shards", "belady"}


def test_past_the_limit_belady_comes_from_the_largest_sample_within_it(monkeypatch):
    trace = CompactTrace(compile_trace(make_workload("tool_agent", seed=2, num_requests=120)))
    sampler = skv.mrc.Sampler(trace, "block")
    sizes = {r: sampler.sample(r, 0).trace.block_accesses for r in (0.5, 0.2)}
    # the full trace is over the limit, and so is the rate-0.5 sample; 0.2 and 0.1 are within
    monkeypatch.setattr(skv.mrc, "BELADY_MAX_ACCESSES", sizes[0.2])
    assert sizes[0.5] > sizes[0.2] and trace.block_accesses > sizes[0.2]
    rows = skv.mrc.capacity_curve(trace, rates=[0.1, 0.5, 0.2], points=4, sample_points=2,
                                  belady_points=2, unit="block")  # fmt: skip
    belady = [r for r in rows if r["method"] == "belady"]
    assert len(belady) == 2 and {(r["sample_rate"], r["sample_unit"]) for r in belady} == {
        (0.2, "block")
    }
    sample = skv.mrc.sample_trace(trace, 0.2, unit="block")
    expect = shards_curve(trace, "belady", [r["capacity_blocks"] for r in belady], 0.2,
                          sample=sample)  # fmt: skip
    assert [r["token_hit_rate"] for r in belady] == [r["token_hit_rate"] for r in expect]
    monkeypatch.setattr(skv.mrc, "BELADY_MAX_ACCESSES", 1)  # nothing small enough: no rows
    rows = skv.mrc.capacity_curve(trace, rates=[0.5], points=4, sample_points=2,
                                  belady_points=2, unit="block")  # fmt: skip
    assert not [r for r in rows if r["method"] == "belady"]


def test_the_one_pass_shows_progress_when_asked_and_is_silent_otherwise(capsys):
    trace = compile_trace(make_workload("rag", seed=0, num_requests=20))
    lru_curve(trace, progress=True)
    assert "lru curve, one pass" in capsys.readouterr().err
    lru_curve(trace, progress=False)
    assert capsys.readouterr().err == ""


def test_belady_rows_are_at_distinct_capacities_on_a_tiny_trace():
    trace = compile_trace(_hash_id_trace(0, n=3))  # a handful of unique blocks
    rows = skv.mrc.capacity_curve(trace, rates=[1.0], points=4, sample_points=2, belady_points=5)
    caps = [r["capacity_blocks"] for r in rows if r["method"] == "belady"]
    assert caps and len(caps) == len(set(caps))
