"""The CacheRoute study's parts: cluster workloads, KV capacity, the QPS search, one load point,
the config, the summary and claim values, and the sweep executor."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from skv.blocks import RequestBlocks, retimed
from skv.experiments.cacheroute import study as S
from skv.experiments.cacheroute.cluster import (
    ClusterSpec,
    compile_point,
    point_config,
    retime_point,
    simulate_point,
)
from skv.experiments.cacheroute.workloads import (
    SyntheticParams,
    _key_shares,
    generate,
)
from skv.experiments.config import ConfigError
from skv.experiments.slo_search import max_qps
from skv.experiments.sweep import default_jobs, run_sweep
from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType
from skv.sim import CompiledRun, simulate

#: the study's configs (the regime map's, read by skv.experiments.cacheroute.regimes, is
#: tested in test_regimes.py)
CONFIGS = sorted(
    p
    for p in Path("experiments/cacheroute").glob("*.yaml")
    if "regimes" not in p.stem and "tuning" not in p.stem  # equal tuning: test_equal_tuning.py
)


# ------------------------------------------------------------------------------ workloads


@pytest.mark.parametrize("name", ["aggregate", "dominant_key", "shifting_skew"])
def test_workloads_are_seeded(name):
    a = generate(name, {"num_requests": 300}, 50.0, 7)
    b = generate(name, {"num_requests": 300}, 50.0, 7)
    c = generate(name, {"num_requests": 300}, 50.0, 8)
    assert [(r.hash_ids, r.arrival_s, r.output_tokens) for r in a] == [
        (r.hash_ids, r.arrival_s, r.output_tokens) for r in b
    ]
    assert [r.hash_ids for r in a] != [r.hash_ids for r in c]


@pytest.mark.parametrize("name", ["aggregate", "dominant_key"])
def test_a_higher_rate_compresses_the_same_requests_in_time(name):
    """Common random numbers: the first requests at rate 2r are those at rate r, at half the
    times, however many requests each run draws."""
    slow = generate(name, {"num_requests": 400}, 40.0, 3)
    fast = generate(name, {"num_requests": 1000}, 80.0, 3)
    for s, f in zip(slow, fast, strict=False):
        assert (s.hash_ids, s.output_tokens, s.prompt_tokens) == (
            f.hash_ids,
            f.output_tokens,
            f.prompt_tokens,
        )
        assert f.arrival_s == pytest.approx(s.arrival_s / 2, rel=1e-12)


def test_aggregate_requests_share_their_keys_prefix_and_nothing_else():
    p = SyntheticParams(num_requests=2000, keys=50, prefix_blocks=(3, 6), block_tokens=64)
    reqs = generate("aggregate", p.model_dump(), 100.0, 1)
    by_key: dict[str, list] = {}
    suffix_ids: list[int] = []
    for r in reqs:
        by_key.setdefault(r.session_id, []).append(r)
        sys_tokens = r.segments[0].num_tokens
        assert sys_tokens % 64 == 0 and 3 <= sys_tokens // 64 <= 6
        nb = sys_tokens // 64
        assert len(r.hash_ids) == nb + math.ceil(r.segments[1].num_tokens / 64)
        suffix_ids += r.hash_ids[nb:]
    assert len(suffix_ids) == len(set(suffix_ids))  # suffixes are unique content
    for rs in by_key.values():
        nb = rs[0].segments[0].num_tokens // 64
        assert {tuple(r.hash_ids[:nb]) for r in rs} == {tuple(rs[0].hash_ids[:nb])}
    # prefixes of different keys never share a block
    firsts = [rs[0].hash_ids[0] for rs in by_key.values()]
    assert len(firsts) == len(set(firsts))


def test_aggregate_key_shares_follow_the_zipf_law():
    p = SyntheticParams(keys=100, key_zipf=1.1)
    shares = _key_shares(p)
    h = sum(1 / (i + 1) ** 1.1 for i in range(100))
    assert shares[0] == pytest.approx(1 / h) and shares[9] == pytest.approx(10**-1.1 / h)
    n = 20_000
    reqs = generate("aggregate", {"num_requests": n, "keys": 100}, 100.0, 2)
    counts = pd.Series([r.session_id for r in reqs]).value_counts()
    top = counts.iloc[0]
    sd = math.sqrt(n * shares[0] * (1 - shares[0]))
    assert abs(top - n * shares[0]) < 4 * sd  # the hottest key's count, binomial bound


def test_dominant_key_takes_its_share():
    n = 10_000
    reqs = generate("dominant_key", {"num_requests": n, "dominant_share": 0.4}, 100.0, 0)
    top = pd.Series([r.session_id for r in reqs]).value_counts().iloc[0]
    assert abs(top - 0.4 * n) < 4 * math.sqrt(n * 0.4 * 0.6)


def test_shifting_skew_changes_the_hot_key_between_phases():
    reqs = generate(
        "shifting_skew", {"num_requests": 6000, "keys": 200, "shift_every_s": 20.0}, 100.0, 0
    )
    hot = []
    for phase in range(3):
        keys = [r.session_id for r in reqs if phase * 20 <= r.arrival_s < (phase + 1) * 20]
        hot.append(pd.Series(keys).value_counts().index[0])
    assert len(set(hot)) == 3


def test_bad_workload_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="rate must be"):
        generate("aggregate", {}, 0.0, 0)
    with pytest.raises(ValueError, match="unknown cluster workload"):
        generate("nope", {}, 1.0, 0)
    with pytest.raises(ValueError, match="prefix_blocks"):
        SyntheticParams(prefix_blocks=(5, 2))


@pytest.mark.slow
def test_mooncake_windows_are_time_scaled_to_the_rate():
    from skv.traces import find_trace

    try:
        find_trace("mooncake/conversation_trace.jsonl")
    except FileNotFoundError:
        pytest.skip("needs the Mooncake trace (SKV_TRACE_DIR)")
    a = generate("mooncake", {"num_requests": 3000, "stride": 1000}, 10.0, 1)
    b = generate("mooncake", {"num_requests": 3000, "stride": 1000}, 20.0, 1)
    assert a[0].request_id.endswith(":1001") and a[0].arrival_s == 0.0
    assert [r.hash_ids for r in a] == [r.hash_ids for r in b]
    assert [2 * r.arrival_s for r in b] == pytest.approx([r.arrival_s for r in a])


# ------------------------------------------------------------------------------ cluster


def test_kv_capacity_is_the_memory_left_after_the_weights():
    # 4 x 80 GB x 0.9 - 70.6 GB = 217.4 GB = 1,326,904.3 tokens of 163,840 B
    assert ClusterSpec().kv_capacity_blocks(512) == 2591  # 2,591.6 blocks of 512
    assert ClusterSpec().kv_capacity_blocks(16) == 82_931  # 82,931.5 blocks of 16
    # 4 x 80 x 0.5 - 70.6 = 89.4 GB = 545,654 tokens = 1,065.7 blocks of 512
    assert ClusterSpec(gpu_memory_utilization=0.5).kv_capacity_blocks(512) == 1_065
    assert ClusterSpec(capacity_blocks=7).kv_capacity_blocks(512) == 7
    with pytest.raises(ValueError, match="leave no KV memory"):
        ClusterSpec(tp=1, gpu_memory_utilization=0.8).kv_capacity_blocks(512)  # 64 < 70.6 GB


def test_max_qps_bisects_to_the_slo_crossing():
    seen = []

    def measure(rate):
        seen.append(rate)
        return {"ttft_ms_p99": 10.0 * rate}

    res = max_qps(measure, 1000.0, lo=20.0, hi=160.0, rel_tol=0.02)
    # 20 ok, 160 fails, then bisection between 20 and 160 down to a 2% bracket: the bracket
    # 140 wide halves seven times; 2.1875 is still above 2% of its top (100.9375), 1.09375 not
    assert seen == [20.0, 160.0, 90.0, 125.0, 107.5, 98.75, 103.125, 100.9375, 99.84375]
    assert res["qps"] == 99.84375 and res["at"] == {"ttft_ms_p99": 998.4375}
    assert not res["below_lo"] and not res["above_hi"]
    assert len(res["points"]) == len(seen)


def test_max_qps_doubles_the_bracket_and_reports_its_ends():
    res = max_qps(lambda r: {"ttft_ms_p99": r}, 500.0, lo=10.0, hi=40.0, rel_tol=0.05)
    assert 475.0 <= res["qps"] <= 500.0  # 40 -> 80 -> 160 -> 320 -> 640 fails
    assert [p["rate"] for p in res["points"]][:6] == [10, 40, 80, 160, 320, 640]
    low = max_qps(lambda r: {"ttft_ms_p99": 1e9}, 500.0, lo=10.0, hi=40.0)
    assert low["qps"] == 0.0 and low["below_lo"] and len(low["points"]) == 1
    high = max_qps(lambda r: {"ttft_ms_p99": 0.0}, 500.0, lo=10.0, hi=40.0, max_doublings=2)
    assert high["above_hi"] and high["qps"] == 160.0
    with pytest.raises(ValueError, match="lo < hi"):
        max_qps(lambda r: {"ttft_ms_p99": 0.0}, 1.0, lo=5.0, hi=5.0)


SMALL = ClusterSpec(replicas=3, capacity_blocks=300)


def test_a_point_measures_only_requests_after_the_warm_up():
    reqs = generate("aggregate", {"num_requests": 1500, "keys": 100}, 30.0, 0)
    warm = sum(1 for r in reqs if r.arrival_s - reqs[0].arrival_s < 20.0)
    m = simulate_point(reqs, SMALL, "least_loaded", {}, warmup_s=20.0)
    assert m["measured_requests"] == len(reqs) - warm
    with pytest.raises(ValueError, match="no request arrives after"):
        simulate_point(reqs, SMALL, "least_loaded", {}, warmup_s=1e6)


def _point_from_rows(reqs, cluster, router, params, warmup_s, view, pct):
    """A point's metrics by their definition, from the simulator's full per-request rows."""
    reqs = sorted(reqs, key=lambda r: r.arrival_s)
    config = point_config(reqs, cluster, router, params, view)
    rows = simulate(reqs, config, cluster.latency(), progress=False).requests
    rows = [r for r in rows if r["arrival_s"] - rows[0]["arrival_s"] >= warmup_s]
    ttft = np.array([r["ttft_ms"] for r in rows])
    prompt = sum(r["prompt_tokens"] for r in rows)
    start = min(r["arrival_s"] for r in rows)
    end = max(r["arrival_s"] + r["e2e_ms"] / 1e3 for r in rows)
    share = np.bincount([r["replica"] for r in rows], minlength=cluster.replicas)
    return {
        "ttft_ms_slo": float(np.percentile(ttft, pct)),
        "ttft_ms_p99": float(np.percentile(ttft, 99)),
        "ttft_ms_p50": float(np.percentile(ttft, 50)),
        "ttft_ms_mean": float(ttft.mean()),
        "hit_rate": sum(r["cached_tokens"] for r in rows) / prompt,
        "throughput_rps": len(rows) / (end - start),
        "max_replica_share": float(share.max() / share.sum()),
        "measured_requests": len(rows),
    }


@pytest.mark.parametrize(
    ("router", "params", "view", "rate", "pct"),
    [("least_loaded", {}, "exact", 30.0, 99.0),
     ("sglang_cache_aware", {}, "approximate", 80.0, 90.0),  # queued: TTFT spread
     ("cacheroute", {"prefix_blocks": 2, "admit_rate": 0.02, "evict_rate": 0.01}, "exact",
      60.0, 99.0)],
)  # fmt: skip
def test_a_point_reads_the_same_numbers_as_the_rows_give(router, params, view, rate, pct):
    """simulate_point reads the simulator's columns (no row per request): the same floats, bit
    for bit, as the metrics' definition over the full rows."""
    reqs = generate("aggregate", {"num_requests": 1200, "keys": 80}, rate, 3)
    got = simulate_point(
        compile_point(reqs), SMALL, router, params, warmup_s=5.0, router_view=view,
        slo_percentile=pct,
    )  # fmt: skip
    assert got == _point_from_rows(reqs, SMALL, router, params, 5.0, view, pct)
    assert len({got["ttft_ms_p50"], got["ttft_ms_p99"]}) == 2  # not a degenerate point


def test_routers_that_keep_prefixes_together_hit_more_than_cache_blind_ones():
    """What affinity exists for: on shared prefixes larger than one replica's cache, a
    prefix-keyed router's served hit rate is strictly above a cache-blind one's."""
    reqs = generate("aggregate", {"num_requests": 3000, "keys": 300}, 20.0, 0)
    blind = simulate_point(reqs, SMALL, "least_loaded", {}, warmup_s=30.0)
    for name, params, view in [
        ("consistent_hashing", {"prefix_blocks": 2}, "exact"),
        ("prefix_locality", {}, "approximate"),
        ("cacheroute", {"prefix_blocks": 2, "admit_rate": 0.02, "evict_rate": 0.01}, "exact"),
    ]:
        m = simulate_point(reqs, SMALL, name, params, warmup_s=30.0, router_view=view)
        assert m["hit_rate"] > blind["hit_rate"] + 0.05, (name, m, blind)


# A cluster whose QPS at the SLO is known by hand: one replica running one request at a time
# (max_running 1), every iteration 100 ms whatever it holds (linear latency, no per-token
# cost), identical one-output-token requests arriving evenly every 1 / rate seconds, no warm-up,
# 100 measured requests. Below 10 req/s each request finds the replica idle (TTFT = C = 100 ms);
# above it the replica is a D/D/1 queue: request k starts at k * C and its TTFT is
# C + k * (C - 1 / rate), k = 0..99, an arithmetic sequence whose percentile q (numpy's linear
# interpolation) is C + (q / 100) * 99 * (C - 1 / rate) and whose mean is its median. The SLO
# on percentile q holds up to rate* = 1 / (C - (SLO - C) / (99 q / 100)).
_C_MS = 100.0
_N = 100
_SLO_MS = 5000.0


def _rate_at_slo(q: float) -> float:
    """The rate at which the TTFT percentile ``q`` (50 = the mean here) reaches the SLO."""
    return 1000.0 / (_C_MS - (_SLO_MS - _C_MS) / (q / 100 * (_N - 1)))


def _even_requests(name, params, rate, seed):
    assert params["num_requests"] == _N  # warm-up 0 s: only the measured requests
    return [
        Request(
            f"{seed}:{i}",
            i / rate,
            [Segment(SemanticType.SYSTEM, 16)],
            output_tokens=1,
            hash_ids=[7],
            hash_block_size=16,
        )
        for i in range(params["num_requests"])
    ]


def _analytic_config(**extra):
    return S.CacheRouteConfig.model_validate({
        "id": "analytic", "workloads": [{"name": "aggregate"}],
        "cluster": {"replicas": 1, "capacity_blocks": 64, "max_running": 1,
                    "max_batch_tokens": 16},
        "routers": [{"name": "least_loaded"}], "seeds": [0], "slo_ms": _SLO_MS,
        "warmup_s": 0, "measured_requests": _N,
        "search": {"lo": 5.0, "hi": 40.0, "rel_tol": 0.01, "max_doublings": 3}, **extra,
    })  # fmt: skip


def _fresh_point_cache(monkeypatch) -> None:
    """A point cache of the test's own: ``generate`` swapped for a test must not leave its
    requests in the process-wide one (nor find another test's there)."""
    monkeypatch.setattr(S, "point_requests", functools.lru_cache(maxsize=12)(
        S.point_requests.__wrapped__))  # fmt: skip
    monkeypatch.setattr(S, "_UNIT_RUNS", {})  # nor the unit-rate runs the points derive from


def test_routers_searching_one_workload_and_seed_share_its_points(monkeypatch):
    """run_qps groups routers per (workload, seed): a rate two routers probe is generated once,
    and every router's answer is the one its own search gives with nothing shared."""
    monkeypatch.delenv("SKV_DASK", raising=False)
    calls = []

    def counted(name, params, rate, seed):
        calls.append((rate, seed, params["num_requests"]))
        return generate(name, params, rate, seed)

    monkeypatch.setattr(S, "generate", counted)
    _fresh_point_cache(monkeypatch)
    cfg = S.CacheRouteConfig.model_validate({
        "id": "shared", "workloads": [{"name": "aggregate", "params": {"keys": 60}}],
        "cluster": {"replicas": 2, "capacity_blocks": 400},
        "routers": [{"name": "least_loaded"}, {"name": "round_robin"},
                    {"name": "consistent_hashing", "params": {"prefix_blocks": 2}}],
        "seeds": [0, 1], "slo_ms": 3500, "warmup_s": 5, "measured_requests": 300,
        "search": {"lo": 2.0, "hi": 8.0, "rel_tol": 0.1, "max_doublings": 2},
    })  # fmt: skip
    qps, points = S.run_qps(cfg, jobs=1)
    assert list(zip(qps["router"], qps["seed"], strict=True)) == [
        (r, s) for r in ("least_loaded", "round_robin", "consistent_hashing") for s in (0, 1)
    ]
    # each seed generated once at rate 1 (again, longer, only for a rate above the bracket's
    # top), every rate's requests derived from it
    assert {rate for rate, _, _ in calls} == {1.0}
    assert len(calls) == len(set(calls)) < len(points)
    assert sorted({seed for _, seed, _ in calls}) == [0, 1]
    assert min(n for _, _, n in calls) == S.num_requests(cfg, cfg.search.hi)
    for ri, seed in itertools.product(range(3), (0, 1)):
        _fresh_point_cache(monkeypatch)  # nothing shared
        alone = S.search(cfg, 0, ri, seed)
        row = qps[(qps["router"] == cfg.routers[ri].key) & (qps["seed"] == seed)].iloc[0]
        assert row["qps"] == alone["qps"] and row["hit_rate"] == alone["at"]["hit_rate"]
    assert S._router_groups(11) == [tuple(range(6)), tuple(range(6, 11))]
    assert S._router_groups(1) == [(0,)]


def _same_run(a, b) -> None:
    """Two compiled runs hold the same requests and blocks, bit for bit (times as float64
    bytes: == would take -0.0 for 0.0)."""
    assert a.key == b.key and a.answers == b.answers
    assert len(a.requests) == len(b.requests) and len(a.trace) == len(b.trace)
    assert list(a.requests) == list(b.requests)  # every field (dataclass equality)
    assert list(a.trace) == list(b.trace)  # every field but prompt_tokens
    assert [rb.prompt_tokens for rb in a.trace] == [rb.prompt_tokens for rb in b.trace]
    for x, y in ((a.requests, b.requests), (a.trace, b.trace)):
        assert (
            np.array([r.arrival_s for r in x]).tobytes()
            == np.array([r.arrival_s for r in y]).tobytes()
        )


@pytest.mark.parametrize("name", sorted(S.RATE_SCALED))
def test_a_point_derived_from_the_unit_rate_run_is_the_freshly_generated_one(monkeypatch, name):
    """point_requests derives each rate's requests from one unit-rate run (first n requests,
    times retimed): bit for bit what generating and compiling at that rate gives, at rates
    whose 1/rate is inexact, for a unit run longer than the point and one grown on demand."""
    _fresh_point_cache(monkeypatch)
    params = {"keys": 50, "shared_share": 0.7, "dominant_share": 0.3}
    for n, rate, unit in [(400, 3.7, 900), (900, 113.3, 900), (250, 0.3, 0), (1200, 47.9, 900),
                          (700, 29.17, 1200), (1, 1.0, 0)]:  # fmt: skip
        as_json = json.dumps({**params, "num_requests": n}, sort_keys=True)
        derived = S.point_requests(name, as_json, rate, 5, unit)
        fresh = compile_point(generate(name, {**params, "num_requests": n}, rate, 5))
        _same_run(derived, fresh)
    assert len(S._UNIT_RUNS) == 1 and len(S._UNIT_RUNS[next(iter(S._UNIT_RUNS))][1]) == 1200
    with pytest.raises(ValueError, match="rate"):
        S.point_requests(name, json.dumps({"num_requests": 10}), 0.0, 5)


def test_retime_point_refuses_what_would_change_the_compile():
    run = compile_point(generate("aggregate", {"num_requests": 20}, 1.0, 0))
    with pytest.raises(ValueError, match="never decrease"):
        retime_point(run, [0.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="run of 20"):
        retime_point(run, [0.0] * 21)


def test_retime_point_builds_what_the_field_by_field_definition_builds():
    """retime_point passes Request's fields by position and copies the blocks in one compiled
    loop (skv.blocks.retimed): every field is the source's (lists shared, ``extra`` a copy) but
    the time, as ``dataclasses.replace`` and the RequestBlocks constructor build them; every
    field here differs from its default and from the others, so a field in the wrong place
    shows."""
    reqs = [
        Request(
            f"r{i}", 0.5 * i, [Segment(SemanticType.SYSTEM, 40 + i, content_hash=f"{i + 1:016x}")],
            output_tokens=5 + i, session_id=f"s{i}", tenant_id=f"t{i}", turn=3 + i,
            parent_id=f"p{i}", templated=True, hash_ids=[100 + i, 200 + i, 300 + i],
            hash_block_size=16, observed_ttft_ms=12.5 + i, observed_cached_tokens=7 + i,
            output_hash=f"h{i}", extra={"k": i},
        )
        for i in range(6)
    ]  # fmt: skip
    run = compile_point(reqs)
    for i, rb in enumerate(run.trace):  # as an offline policy's compile would hold them
        rb.next_use = [i + 10] * len(rb.keys)
    times = [0.0, 0.25, 0.25, 1.0 / 3.0, 7.1]
    got = retime_point(run, times)
    want_requests = [
        dataclasses.replace(r, arrival_s=t, extra=dict(r.extra))
        for r, t in zip(run.requests, times, strict=False)
    ]
    want_trace = [
        RequestBlocks(
            rb.index, t, rb.keys, rb.parents, rb.tokens, rb.stypes, rb.seg_tokens, rb.session,
            rb.turn, rb.templated, rb.block_size, rb.next_use, rb.prompt_tokens,
        )
        for rb, t in zip(run.trace, times, strict=False)
    ]  # fmt: skip
    _same_run(got, CompiledRun(run.key, tuple(want_requests), tuple(want_trace), run.answers[:5]))
    for new, old in zip(got.requests, run.requests, strict=False):
        assert new.extra == old.extra and new.extra is not old.extra
        assert new.segments is old.segments and new.hash_ids is old.hash_ids
    for new, old in zip(got.trace, run.trace, strict=False):
        assert new is not old and new.keys is old.keys and new.next_use is old.next_use
        assert (new.session, new.turn, new.templated) == (old.session, old.turn, True)
    assert [rb.arrival_s for rb in retimed(run.trace, [])] == []
    with pytest.raises(ValueError, match="7 times for 6"):
        retimed(run.trace, [0.0] * 7)


@pytest.mark.parametrize("q", [99.0, 90.0])
def test_the_study_search_finds_the_hand_computed_rate_of_the_percentile_the_config_names(
    monkeypatch, q
):
    """Through the study's entry point (run_qps -> max_qps -> simulate_point), on the cluster
    above: the p99 SLO of 5 s holds up to 1 / (0.1 - 4.9 / 98.01) = 19.998 req/s, a p90 one
    (``slo_percentile: 90``) up to 1 / (0.1 - 4.9 / 89.1) = 22.219 req/s; the mean (= p50) would
    allow 990 req/s (the search would report above_hi at 320). The answer is the last rate that
    met the SLO, within rel_tol (1%) below the crossing."""
    monkeypatch.delenv("SKV_DASK", raising=False)
    monkeypatch.setattr(S, "generate", _even_requests)
    _fresh_point_cache(monkeypatch)
    flat = make_latency_model("linear", base_ttft_ms=_C_MS, token_latency_ms=0.0,
                              decode_ms_per_seq=0.0)  # fmt: skip
    monkeypatch.setattr(ClusterSpec, "latency", lambda self: flat)
    cfg = _analytic_config() if q == 99.0 else _analytic_config(slo_percentile=q)
    assert cfg.slo_percentile == q
    qps, points = S.run_qps(cfg, jobs=1)
    row = qps.iloc[0]
    star = _rate_at_slo(q)
    assert _rate_at_slo(99.0) == pytest.approx(19.998, abs=1e-3)
    assert _rate_at_slo(90.0) == pytest.approx(22.219, abs=1e-3)
    assert _rate_at_slo(50.0) == pytest.approx(990.0, rel=1e-3)  # the mean's answer
    assert star * (1 - 0.01) <= row["qps"] <= star
    assert not row["below_lo"] and not row["above_hi"]
    # at that rate the named percentile is the hand-computed one, and within the SLO
    expected = _C_MS + q / 100 * (_N - 1) * (_C_MS - 1000.0 / row["qps"])
    assert row["ttft_ms_slo"] == pytest.approx(expected, rel=1e-6) and expected <= _SLO_MS
    assert row["ttft_ms_mean"] == pytest.approx(_C_MS + 49.5 * (_C_MS - 1000.0 / row["qps"]))
    # every evaluated point met the SLO exactly when its rate was at most the crossing
    for _, p in points.iterrows():
        assert (p["ttft_ms_slo"] <= _SLO_MS) == (p["rate"] <= star), p.to_dict()


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("quick", [False, True])
def test_the_pinned_configs_load(path, quick):
    cfg = S.load_config(path, quick=quick)
    assert cfg.routers and cfg.seeds
    if not quick:
        assert len(cfg.seeds) >= 3  # claims over seeds
    assert S.num_requests(cfg, 100.0) == round(100 * cfg.warmup_s) + cfg.measured_requests


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


BASE = """id: t
workloads: [{name: aggregate}]
routers: [{name: least_loaded}, {name: cacheroute}]
seeds: [0]
"""


@pytest.mark.parametrize(
    "extra,match",
    [
        ("routers: [{name: nope}]\n", "unknown router"),
        ("routers: [{name: least_loaded}, {name: least_loaded}]\n", "labels must be unique"),
        ("workloads: [{name: aggregate, params: {num_requests: 5}}]\n", "set per point"),
        ("workloads: [{name: aggregate, params: {keys: 0}}]\n", "keys"),
        ("kind: load\n", "needs rates"),
        ("search: {lo: 5, hi: 2}\n", "lo < hi"),
        ("slo_ms: -1\n", "slo_ms"),
    ],
)
def test_bad_configs_name_the_field(tmp_path, extra, match):
    lines = [ln for ln in BASE.splitlines() if ln.split(":")[0] not in extra.split(":")[0]]
    with pytest.raises(ConfigError, match=match):
        S.load_config(_write(tmp_path, "\n".join(lines) + "\n" + extra), quick=False)


def test_quick_overrides_replace_top_level_fields(tmp_path):
    p = _write(tmp_path, BASE + "quick: {seeds: [3], measured_requests: 200}\n")
    assert S.load_config(p, quick=True).seeds == [3]
    assert S.load_config(p, quick=True).measured_requests == 200
    assert S.load_config(p, quick=False).seeds == [0]


# ------------------------------------------------------------------------------ summaries


def _cfg():
    return S.CacheRouteConfig.model_validate({
        "id": "t",
        "workloads": [{"name": "aggregate"}],
        "routers": [
            {"name": "least_loaded"},
            {"name": "prefix_locality"},
            {"name": "cacheroute"},
        ],
        "seeds": [0, 1, 2],
    })  # fmt: skip


def _qps_frame():
    rows = []
    table = {"least_loaded": [100, 110, 90], "prefix_locality": [200, 180, 220],
             "cacheroute": [300, 360, 330]}  # fmt: skip
    hits = {"least_loaded": 0.5, "prefix_locality": 0.8, "cacheroute": 0.9}
    for router, values in table.items():
        for seed, q in enumerate(values):
            hit = hits[router] + 0.01 * seed
            rows.append({"workload": "aggregate", "router": router, "seed": seed, "qps": q,
                         "hit_rate": hit, "ttft_ms_slo": 3e3, "ttft_ms_p99": 3e3})  # fmt: skip
    return pd.DataFrame(rows)


def test_claim_values_compare_with_every_router_per_seed():
    cfg, qps = _cfg(), _qps_frame()
    v = S.claim_values(cfg, qps)
    assert v["aggregate_best_baseline"] == "prefix_locality"
    assert v["aggregate_best_cache_blind"] == "least_loaded"
    ratio = v["aggregate_cacheroute_vs_prefix_locality"]
    assert ratio["value"] == pytest.approx(np.mean([300 / 200, 360 / 180, 330 / 220]))
    assert ratio["n"] == 3 and ratio["ci95"][0] < ratio["value"] < ratio["ci95"][1]
    blind = v["aggregate_cacheroute_vs_least_loaded"]
    assert blind["value"] == pytest.approx(np.mean([3.0, 360 / 110, 330 / 90]))
    assert v["aggregate_cacheroute_hit_pct"]["value"] == pytest.approx(91.0)
    assert v["aggregate_least_loaded_hit_pct"]["value"] == pytest.approx(51.0)
    assert v["aggregate_prefix_locality_qps"]["value"] == pytest.approx(200.0)
    assert "aggregate_cacheroute_vs_cacheroute" not in v
    assert v["replicas"] == 15 and v["capacity_blocks"] == 2591 and v["seeds"] == 3
    # every router against every cache-blind one
    assert v["aggregate_prefix_locality_vs_least_loaded"]["value"] == pytest.approx(
        np.mean([2.0, 180 / 110, 220 / 90])
    )
    assert v["slo_metric"] == "p99 TTFT"


def test_summary_table_rows_and_ratio():
    t = S.summary_table(_qps_frame(), _cfg()).set_index("router")
    assert list(t.index) == ["least_loaded", "prefix_locality", "cacheroute"]
    assert t.loc["prefix_locality", "vs_best_baseline"] == pytest.approx(1.0)
    assert t.loc["least_loaded", "kind"] == "cache-blind"
    assert t.loc["prefix_locality", "kind"] == "cache-aware"
    assert t.loc["cacheroute", "kind"] == "candidate"
    assert t.loc["prefix_locality", "qps_sd"] == pytest.approx(20.0)


def test_load_claim_values_are_paired_differences():
    cfg = S.CacheRouteConfig.model_validate({
        "id": "t", "kind": "load", "workloads": [{"name": "aggregate"}],
        "routers": [{"name": "least_loaded"}, {"name": "cacheroute"}],
        "seeds": [0, 1], "rates": [50.0],
    })  # fmt: skip
    load = pd.DataFrame(
        [
            {"workload": "aggregate", "router": r, "seed": s, "rate": 50.0, "ttft_ms_p99": p}
            for r, s, p in [
                ("least_loaded", 0, 3000.0),
                ("least_loaded", 1, 5000.0),
                ("cacheroute", 0, 1000.0),
                ("cacheroute", 1, 2000.0),
            ]
        ]
    )
    v = S.load_claim_values(cfg, load)
    assert v["aggregate_cacheroute_minus_least_loaded_p99_s_at_50"]["value"] == pytest.approx(-2.5)


# ------------------------------------------------------------------------------ sweep executor


def test_the_sweep_keeps_task_order_whatever_the_processes():
    tasks = [(i, 7) for i in range(9)]
    assert run_sweep(pow_task, [], jobs=2) == []
    serial = run_sweep(pow_task, tasks, jobs=1)
    parallel = run_sweep(pow_task, tasks, jobs=2)
    assert serial == parallel == [pow(i, 7, 1_000_003) for i in range(9)]


def pow_task(t: tuple[int, int]) -> int:
    return pow(t[0], t[1], 1_000_003)


def test_sweep_jobs_come_from_skv_jobs(monkeypatch):
    monkeypatch.setenv("SKV_JOBS", "3")
    assert default_jobs() == 3
    for bad in ("0", "x"):
        monkeypatch.setenv("SKV_JOBS", bad)
        with pytest.raises(ValueError, match="SKV_JOBS"):
            default_jobs()
    with pytest.raises(ValueError, match="jobs must be"):
        run_sweep(pow_task, [(1, 1)], jobs=0)
