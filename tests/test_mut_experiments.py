"""Tests that kill mutants of the study code the verdicts are made of (``./reproduce.sh mutate``,
modules ``skv/experiments/...`` in pyproject.toml): the QPS-at-SLO search, one simulated cluster
point, the CacheRoute table and claim values, the eviction verdict, and the fidelity-under-load
claim values and SLO search. Each pins a rule whose breakage the study tests did not
notice: an edge of the search's bracket, the SLO's inequality, a flag in a returned record."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from skv.experiments.cacheroute.cluster import (
    ClusterSpec,
    compile_point,
    point_config,
    retime_point,
    simulate_point,
)
from skv.experiments.cacheroute.workloads import generate
from skv.experiments.slo_search import max_qps
from skv.latency import make_latency_model
from skv.sim import simulate


def linear(scale: float):
    """A p99 that grows linearly with the rate, with every rate asked for recorded."""
    seen: list[float] = []

    def measure(rate: float) -> dict[str, float]:
        seen.append(rate)
        return {"ttft_ms_p99": scale * rate}

    return measure, seen


# ---------------------------------------------------------------------------- max_qps


def test_the_default_bracket_doubles_four_times_before_it_gives_up():
    res = max_qps(lambda r: {"ttft_ms_p99": 0.0}, 1.0, lo=1.0, hi=2.0)
    assert [p["rate"] for p in res["points"]] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert res == {**res, "qps": 32.0, "above_hi": True, "below_lo": False}


def test_a_rate_exactly_at_the_slo_meets_it():
    measure, _ = linear(10.0)
    res = max_qps(measure, 500.0, lo=50.0, hi=100.0, rel_tol=0.02)
    assert res["qps"] == 50.0 and not res["below_lo"]  # 50 req/s gives exactly 500 ms
    edge = max_qps(lambda r: {"ttft_ms_p99": 500.0}, 500.0, lo=1.0, hi=2.0, max_doublings=0)
    assert edge["above_hi"] and edge["qps"] == 2.0


def test_bisection_stops_when_the_bracket_is_exactly_rel_tol_of_its_top():
    measure, seen = linear(1000.0)  # only rates up to 1 meet an SLO of 1000 ms
    res = max_qps(measure, 1000.0, lo=1.0, hi=2.0, rel_tol=0.5)
    assert seen == [1.0, 2.0]  # 2 - 1 == 0.5 * 2: already narrow enough, nothing to bisect
    assert res["qps"] == 1.0 and not res["above_hi"] and not res["below_lo"]


def test_a_search_below_its_bracket_says_so_and_keeps_what_it_measured():
    res = max_qps(lambda r: {"ttft_ms_p99": 7e3, "hit_rate": 0.5}, 500.0, lo=10.0, hi=40.0)
    assert res["qps"] == 0.0 and res["below_lo"] is True and res["above_hi"] is False
    assert res["at"] == {"ttft_ms_p99": 7e3, "hit_rate": 0.5}
    assert res["points"] == [{"rate": 10.0, "ttft_ms_p99": 7e3, "hit_rate": 0.5}]


def test_a_search_above_its_bracket_is_not_also_below_it():
    res = max_qps(lambda r: {"ttft_ms_p99": 1.0}, 500.0, lo=10.0, hi=40.0, max_doublings=1)
    assert res["above_hi"] is True and res["below_lo"] is False and res["qps"] == 80.0


@pytest.mark.parametrize("lo", [0.5, 1e-3])
def test_any_positive_lower_end_is_a_bracket(lo):
    res = max_qps(lambda r: {"ttft_ms_p99": r}, 0.75, lo=lo, hi=1.0, rel_tol=0.1)
    assert res["qps"] >= lo and not res["below_lo"]


@pytest.mark.parametrize(
    ("lo", "hi", "rel_tol", "match"),
    [
        (0.0, 1.0, 0.02, r"need 0 < lo < hi, got lo=0.0, hi=1.0"),
        (-1.0, 1.0, 0.02, "lo < hi"),
        (1.0, 1.0, 0.02, "lo < hi"),
        (1.0, 2.0, 0.0, r"rel_tol must be in \(0, 1\), got 0.0"),
        (1.0, 2.0, 1.0, r"rel_tol must be in \(0, 1\), got 1.0"),
        (1.0, 2.0, 1.5, "rel_tol must be in"),
    ],
)
def test_a_bracket_or_tolerance_out_of_range_is_refused_by_name(lo, hi, rel_tol, match):
    with pytest.raises(ValueError, match=match):
        max_qps(lambda r: {"ttft_ms_p99": 0.0}, 1.0, lo=lo, hi=hi, rel_tol=rel_tol)


# ---------------------------------------------------------------------------- one cluster point

SMALL = ClusterSpec(replicas=3, capacity_blocks=300)


def test_the_cluster_prices_iterations_with_its_own_model_gpu_tp_and_efficiencies():
    spec = ClusterSpec(model="llama-3.1-8b", gpu="A100", tp=2, mfu=0.3, mbu=0.6)
    want = make_latency_model("roofline", model="llama-3.1-8b", gpu="A100", tp=2, mfu=0.3, mbu=0.6)
    assert spec.latency().describe() == want.describe()
    got = spec.latency().describe()["constants"]
    assert (got["llm"], got["gpu"], got["tp"], got["mfu"], got["mbu"]) == (
        "llama-3.1-8b", "A100", 2, 0.3, 0.6,
    )  # fmt: skip


def test_kv_capacity_subtracts_the_weights_in_bytes():
    # 4 x 80 GB x 0.9 - 8.03e9 params x 2 bytes = 271.94 GB; / 131,072 B per token / 512 tokens
    assert ClusterSpec(model="llama-3.1-8b").kv_capacity_blocks(512) == 4_052
    # 4 x 80 x 0.9 - 70.6 GB (fp8) = 217.4 GB: 1.33M tokens, the study's 2,591 blocks
    assert ClusterSpec().kv_capacity_blocks(512) == 2_591


def test_a_sliver_of_kv_memory_still_leaves_one_block():
    # 80 GB x 0.883 - 70.6 GB = 0.04 GB: fewer tokens than one 512-token block
    assert ClusterSpec(tp=1, gpu_memory_utilization=0.883).kv_capacity_blocks(512) == 1


def test_no_kv_memory_is_refused_with_the_weights_in_gigabytes():
    with pytest.raises(ValueError, match=r"weights \(70\.6 GB\) leave no KV memory on 1 x H100"):
        ClusterSpec(tp=1, gpu_memory_utilization=0.8).kv_capacity_blocks(512)


def test_a_point_config_mirrors_the_cluster_and_the_router():
    reqs = generate("aggregate", {"num_requests": 50, "keys": 10}, 10.0, 0)
    spec = ClusterSpec(replicas=5, policy="fifo", max_batch_tokens=4096, max_running=64,
                       capacity_blocks=77)  # fmt: skip
    params = {"prefix_blocks": 2}
    cfg = point_config(reqs, spec, "cacheroute", params, "approximate")
    assert (cfg.policy, cfg.capacity_blocks, cfg.block_size, cfg.replicas) == ("fifo", 77, 512, 5)
    assert (cfg.router, cfg.router_params, cfg.router_view) == ("cacheroute", params, "approximate")
    assert cfg.router_params is not params  # the config's own copy
    assert (cfg.max_batch_tokens, cfg.max_running) == (4096, 64)
    # no memory series and no policy metrics: a point reads neither
    assert cfg.sample_every_s == 1e9 and cfg.policy_metrics_every == 0


def test_a_point_config_of_requests_without_hash_blocks_uses_16_token_blocks():
    reqs = generate("aggregate", {"num_requests": 5, "keys": 2}, 10.0, 0)
    plain = [dataclasses.replace(r, hash_ids=None, hash_block_size=None) for r in reqs]
    assert point_config(plain, SMALL, "least_loaded", {}).block_size == 16


def test_retiming_refuses_two_times_out_of_order_and_answer_blocks_by_name():
    run = compile_point(generate("aggregate", {"num_requests": 4, "keys": 2}, 10.0, 0))
    with pytest.raises(ValueError, match=r"^retime_point: arrival times must never decrease$"):
        retime_point(run, [2.0, 1.0])
    with pytest.raises(ValueError, match=r"^retime_point: 5 times for a run of 4 requests$"):
        retime_point(run, [0.0, 1.0, 2.0, 3.0, 4.0])
    answered = dataclasses.replace(run, answers=((object(), 0),) * 4)
    with pytest.raises(ValueError, match=r"^retime_point: requests with answer blocks"):
        retime_point(answered, [0.0, 1.0])


def test_a_point_defaults_to_a_60_s_warm_up_and_the_p99():
    reqs = generate("aggregate", {"num_requests": 900, "keys": 50}, 10.0, 1)
    t0 = min(r.arrival_s for r in reqs)
    after = sum(1 for r in reqs if r.arrival_s - t0 >= 60.0)
    m = simulate_point(reqs, SMALL, "least_loaded", {})
    assert m["measured_requests"] == after
    assert m["ttft_ms_slo"] == m["ttft_ms_p99"]
    with pytest.raises(ValueError, match=r"^warmup_s must be >= 0, got -1.0$"):
        simulate_point(reqs, SMALL, "least_loaded", {}, warmup_s=-1.0)


def test_one_measured_request_is_all_of_its_replicas_share_and_its_own_throughput():
    params = {"num_requests": 40, "keys": 5, "output_median": 2, "output_max": 4}
    reqs = generate("aggregate", params, 10.0, 2)
    t0 = min(r.arrival_s for r in reqs)
    last = max(r.arrival_s for r in reqs) - t0
    m = simulate_point(reqs, SMALL, "least_loaded", {}, warmup_s=last)
    assert m["measured_requests"] == 1 and m["max_replica_share"] == 1.0
    # a short answer, served in well under a second: throughput is 1 / its own E2E
    rows = simulate(sorted(reqs, key=lambda r: r.arrival_s),
                    point_config(reqs, SMALL, "least_loaded", {}), SMALL.latency(),
                    progress=False).requests  # fmt: skip
    e2e_s = rows[-1]["e2e_ms"] / 1e3
    assert e2e_s < 1.0 and m["throughput_rps"] == pytest.approx(1.0 / e2e_s)


# ---------------------------------------------------------------------------- the eviction verdict

EV_CONFIG = (
    Path(__file__).resolve().parents[1] / "experiments" / "fidelity" / "eviction_verdict.yaml"
)


def _verdict(policy, e, s, eg, sg, *, ttft=(True, True), hit=(True, True)):
    """A verdict row by hand: (engine TTFT ratio mean, simulated), (hit gains), and for each of
    TTFT and hit (engine sign resolved, sign agrees)."""
    return {"policy": policy, "engine_ttft_ratio_mean": e, "simulated_ttft_ratio": s,
            "engine_hit_gain_pts_mean": eg, "simulated_hit_gain_pts": sg,
            "engine_ttft_sign_resolved": ttft[0], "ttft_sign_agrees": ttft[1],
            "engine_hit_sign_resolved": hit[0], "hit_sign_agrees": hit[1]}  # fmt: skip


def _variant(name, ttft, hits, sim_ttft, sim_hit, equal, preemptions=None):
    v = {
        "variant": name,
        "engine_ttft_ms": ttft,
        "engine_hit_rate": hits,
        "simulated_ttft_ms": sim_ttft,
        "simulated_hit_rate": sim_hit,
        "cached_equal_share": equal,
    }
    if preemptions is not None:
        v["engine_preemptions"] = preemptions
    return v


#: five policies, their flags set by hand (claim_values reads them; verdict_row makes them): one
#: unresolved on the engine, one agreeing and faster, one agreeing and slower, one on both claim
#: thresholds exactly (simulated ratio 1 - eps, simulated gain eps) with a resolved engine hit
#: sign the simulator does not share, one with no effect; and a control engine
RESULT = {
    "config": {"ttft_ratio_eps": 0.02, "hit_gain_eps_pts": 0.2},
    "verdicts": [
        _verdict("saecache", 1.10, 0.90, 3.0, 4.0, ttft=(False, False)),
        _verdict("adaptive_semantic", 0.80, 0.85, 7.0, 5.0),
        _verdict("lfu", 1.05, 1.04, -1.0, -0.5),
        _verdict("s3fifo", 0.97, 1 - 0.02, 0.1, 0.2, hit=(True, False)),
        # no effect on either side: its signs (0) agree, and its simulated gain is eps itself
        _verdict("sieve", 1.0, 1.0, 0.2, 0.2),
    ],
    "noise_floor": {"engine_ttft_ratio": [1.05, 0.97], "engine_hit_gain_pts": [-0.3, 0.1]},
    "variants": [
        _variant("stock", [100.0, 110.0], [0.60, 0.62], 101.0, 0.61, 0.99, [1, 2]),
        _variant("saecache", [111.0, 120.0], [0.63, 0.65], 91.0, 0.65, 0.97, [2, 4]),
        _variant("stock_control", [105.0, 107.0], [0.597, 0.621], 101.0, 0.61, 0.985),
    ],
}


def test_every_claim_value_of_the_eviction_verdict_by_hand():
    from skv.experiments.fidelity import eviction_verdict as ev

    want = {}
    for v in RESULT["verdicts"]:
        p = v["policy"]
        want |= {
            f"eviction_verdict_engine_ttft_ratio_{p}": v["engine_ttft_ratio_mean"],
            f"eviction_verdict_sim_ttft_ratio_{p}": v["simulated_ttft_ratio"],
            f"eviction_verdict_engine_hit_gain_pts_{p}": v["engine_hit_gain_pts_mean"],
            f"eviction_verdict_sim_hit_gain_pts_{p}": v["simulated_hit_gain_pts"],
            f"eviction_verdict_ttft_sign_agrees_{p}": float(v["ttft_sign_agrees"]),
            f"eviction_verdict_hit_sign_agrees_{p}": float(v["hit_sign_agrees"]),
        }
    want |= {
        "eviction_verdict_hit_signs_agreeing": 4.0,
        "eviction_verdict_ttft_signs_agreeing": 4.0,
        "eviction_verdict_ttft_signs_contradicting": 0.0,  # saecache's is unresolved
        "eviction_verdict_hit_signs_contradicting": 1.0,  # s3fifo's
        # faster on both sides beyond eps: adaptive_semantic only (s3fifo sits on 1 - eps)
        "eviction_verdict_ttft_lower_agreeing": 1.0,
        # more hits on both sides beyond eps: saecache and adaptive_semantic (the simulated
        # gain of s3fifo and sieve is eps itself)
        "eviction_verdict_hit_higher_agreeing": 2.0,
        "eviction_verdict_ttft_ratio_gap_max": 1.10 - 0.90,
        "eviction_verdict_ttft_ratio_gap_min": 0.80 - 0.85,
        "eviction_verdict_ttft_ratio_gap_abs_max": 1.10 - 0.90,
        "eviction_verdict_hit_gain_gap_max_pts": 2.0,
        "eviction_verdict_control_ttft_ratio_dev": 0.05,
        "eviction_verdict_control_hit_gain_pts": 0.3,
        "eviction_verdict_engine_preemptions": 9.0,  # a variant without the field counts 0
        "eviction_verdict_cached_equal_share_min": 0.97,
    }
    got = ev.claim_values(RESULT)
    assert got == pytest.approx(want) and set(got) == set(want)


def test_the_verdict_table_has_a_ratio_only_for_policies_and_the_control():
    from skv.experiments.fidelity import eviction_verdict as ev

    result = {**RESULT, "verdicts": [{**RESULT["verdicts"][0], "ttft_sign_agrees": False,
                                      "hit_sign_agrees": True}]}  # fmt: skip
    stock, sae, control = ev.table_rows(result)
    assert stock["variant"] == "stock" and stock["engine_ttft_ms"] == 105.0
    assert math.isnan(stock["engine_ttft_ratio"]) and math.isnan(stock["simulated_ttft_ratio"])
    assert stock["ttft_sign_agrees"] == "-" and stock["hit_sign_agrees"] == "-"
    assert stock["engine_preemptions"] == 1.5 and control["engine_preemptions"] == 0.0
    assert (stock["engine_hit_rate"], stock["simulated_hit_rate"]) == pytest.approx((0.61, 0.61))
    assert sae == pytest.approx({
        "variant": "saecache", "engine_ttft_ms": 115.5, "simulated_ttft_ms": 91.0,
        "engine_ttft_ratio": 1.10, "simulated_ttft_ratio": 0.90, "engine_hit_rate": 0.64,
        "simulated_hit_rate": 0.65, "engine_preemptions": 3.0, "ttft_sign_agrees": False,
        "hit_sign_agrees": True,
    })  # fmt: skip
    assert control["engine_ttft_ratio"] == pytest.approx(1.01)  # the noise floor's mean
    assert math.isnan(control["simulated_ttft_ratio"])


def test_an_effect_of_exactly_eps_is_no_effect_and_mixed_signs_are_unresolved():
    from skv.experiments.fidelity.eviction_verdict import verdict_row

    row = verdict_row("p", [1.0, 1.0], 1.0, [0.2, 0.2], 0.0, ttft_eps=0.02, hit_eps=0.2)
    assert row["engine_hit_sign_resolved"] and row["hit_sign_agrees"]  # 0.2 points: sign 0
    assert row["engine_hit_gain_pts"] == [0.2, 0.2] and row["simulated_hit_gain_pts"] == 0.0
    mixed = verdict_row("p", [0.9, 1.1], 0.9, [1.0, -1.0], 1.0)
    assert not mixed["engine_hit_sign_resolved"] and not mixed["hit_sign_agrees"]
    assert not mixed["engine_ttft_sign_resolved"] and not mixed["ttft_sign_agrees"]
    slower = verdict_row("p", [1.1, 1.2], 1.05, [-1.0, -2.0], -0.5)
    assert slower["engine_ttft_sign_resolved"] and slower["ttft_sign_agrees"]
    assert slower["engine_hit_sign_resolved"] and slower["hit_sign_agrees"]


def test_the_control_engine_runs_only_when_asked_and_last():
    from skv.experiments.fidelity import eviction_verdict as ev

    cfg = {"policies": ["saecache", "lru"], "control": False}
    assert ev.variants(cfg) == ["stock", "saecache", "lru"]
    assert ev.variants({**cfg, "control": True}) == ["stock", "saecache", "lru", "stock_control"]


def test_the_eviction_verdict_config_reads_its_file_its_quick_section_and_overrides(tmp_path):
    from skv.experiments.fidelity import eviction_verdict as ev

    assert ev.load_config()["requests_per_stage"] == ev.DEFAULTS["requests_per_stage"]
    full, quick = ev.load_config(EV_CONFIG), ev.load_config(EV_CONFIG, quick=True)
    assert full["control"] is True and full["num_gpu_blocks"] == 160
    assert quick["control"] is False and quick["num_gpu_blocks"] == 96
    assert ev.load_config(EV_CONFIG, requests_per_stage=44)["requests_per_stage"] == 44
    own = tmp_path / "ev.yaml"
    own.write_text("eviction_verdict:\n  requests_per_stage: 33\nquick:\n  repeats: 1\n")
    assert ev.load_config(own)["requests_per_stage"] == 33
    assert ev.load_config(own)["repeats"] == ev.DEFAULTS["repeats"]
    assert ev.load_config(own, quick=True)["repeats"] == 1


# ---------------------------------------------------------------------------- fidelity under load


@pytest.mark.parametrize(
    ("points", "want"),
    [
        # the crossing between 4 (400 ms) and 6 (600 ms): 500 ms at 5
        ([(2, 100.0), (4, 400.0), (6, 600.0), (8, 900.0)], 5.0),
        # a rate exactly at the SLO meets it, and nothing above it failed: that rate
        ([(2, 100.0), (4, 500.0)], 4.0),
        # a point exactly at the SLO is the last pass, and the crossing is at it
        ([(2, 100.0), (3, 500.0), (5, 700.0)], 3.0),
        # a failing point below the highest pass (noise) is not the bracket's top
        ([(2, 600.0), (4, 300.0), (8, 700.0)], 4.0 + 4.0 * (200.0 / 400.0)),
        ([(2, 900.0)], 0.0),
    ],
)
def test_the_slo_crossing_is_linear_between_the_last_pass_and_the_next_failure(points, want):
    from skv.experiments.fidelity.load import slo_crossing

    pts = [{"rate": float(r), "ttft_ms_p90": p} for r, p in points]
    assert slo_crossing(pts, 500.0) == pytest.approx(want)


def test_the_engine_slo_search_brackets_0_4_to_1_5_of_capacity_and_doubles_once():
    from skv.experiments.fidelity.load import search_slo

    seen = []

    def measure(rate):
        seen.append(rate)
        return {"ttft_ms_p90": 0.0}  # always meets it: the bracket's top doubles once, then stops

    res = search_slo(measure, {"slo_ttft_p90_ms": 500.0, "slo_rel_tol": 0.05}, 10.0)
    assert seen == [4.0, 15.0, 30.0] and res["above_hi"] and res["qps_interpolated"] == 30.0
    seen.clear()
    cfg = {"slo_ttft_p90_ms": 500.0, "slo_rel_tol": 0.3}
    res = search_slo(lambda r: (seen.append(r), {"ttft_ms_p90": 50.0 * r})[1], cfg, 10.0)
    # 4 ok, 15 fails, 9.5 ok, 12.25 fails: 2.75 <= 0.3 x 12.25, so it stops there
    assert seen == [4.0, 15.0, 9.5, 12.25] and res["qps"] == 9.5
    assert res["qps_interpolated"] == pytest.approx(10.0)


# ---------------------------------------------------------------------------- the CacheRoute table


def _route_cfg(routers=("least_loaded", "sglang_cache_aware", "cacheroute"), seeds=(0, 1)):
    from skv.experiments.cacheroute import study as S

    return S.CacheRouteConfig.model_validate(
        {
            "id": "t",
            "workloads": [{"name": "aggregate"}],
            "routers": [{"name": r} for r in routers],
            "seeds": list(seeds),
        }
    )


def _qps(rows):
    import pandas as pd

    cols = ("router", "seed", "qps", "hit_rate", "ttft_ms_slo")
    return pd.DataFrame(
        [{"workload": "aggregate", **dict(zip(cols, r, strict=True))} for r in rows]
    )


QPS_ROWS = [
    ("least_loaded", 0, 100.0, 0.50, 3000.0),
    ("least_loaded", 1, 120.0, 0.60, 3100.0),
    ("sglang_cache_aware", 0, 200.0, 0.80, 3300.0),
    ("sglang_cache_aware", 1, 180.0, 0.70, 3200.0),
    ("cacheroute", 0, 150.0, 0.75, 3400.0),
    ("cacheroute", 1, 90.0, 0.72, 3350.0),
]


def test_the_cacheroute_summary_table_by_hand():
    from skv.experiments.cacheroute import study as S

    t = S.summary_table(_qps(QPS_ROWS), _route_cfg())
    sd = 2**0.5 * 10.0  # the sample sd of two values 20 apart
    want = [
        {"workload": "aggregate", "router": "least_loaded", "kind": "cache-blind",
         "qps_mean": 110.0, "qps_sd": sd, "vs_best_baseline": (100 / 200 + 120 / 180) / 2,
         "hit_rate_pct_mean": 55.0, "hit_rate_pct_sd": 10 * sd / 20 * 1.0,
         "slo_ttft_ms_at_qps": 3050.0, "best_baseline": "sglang_cache_aware", "seeds": 2},
        {"workload": "aggregate", "router": "sglang_cache_aware", "kind": "cache-aware",
         "qps_mean": 190.0, "qps_sd": sd, "vs_best_baseline": 1.0,
         "hit_rate_pct_mean": 75.0, "hit_rate_pct_sd": 10 * sd / 20 * 1.0,
         "slo_ttft_ms_at_qps": 3250.0, "best_baseline": "sglang_cache_aware", "seeds": 2},
        {"workload": "aggregate", "router": "cacheroute", "kind": "candidate",
         "qps_mean": 120.0, "qps_sd": 3 * sd, "vs_best_baseline": (150 / 200 + 90 / 180) / 2,
         "hit_rate_pct_mean": 73.5, "hit_rate_pct_sd": 3 * sd / 20,
         "slo_ttft_ms_at_qps": 3375.0, "best_baseline": "sglang_cache_aware", "seeds": 2},
    ]  # fmt: skip
    got = t.to_dict("records")
    assert [set(r) for r in got] == [set(r) for r in want]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w), g["router"]


def test_the_summary_table_of_one_seed_has_no_spread_and_a_zero_reference_no_ratio():
    from skv.experiments.cacheroute import study as S

    one = S.summary_table(_qps([r for r in QPS_ROWS if r[1] == 0]), _route_cfg(seeds=(0,)))
    assert one["qps_sd"].isna().all() and one["hit_rate_pct_sd"].isna().all()
    zero = {("sglang_cache_aware", 0): 300.0, ("sglang_cache_aware", 1): 0.0}
    rows = [(*r[:2], zero.get(r[:2], r[2]), *r[3:]) for r in QPS_ROWS]
    t = S.summary_table(_qps(rows), _route_cfg()).set_index("router")
    # seed 1's reference is 0: its ratio is no number, and the mean is over seed 0 alone
    assert t.loc["cacheroute", "best_baseline"] == "sglang_cache_aware"
    assert t.loc["cacheroute", "vs_best_baseline"] == pytest.approx(150 / 300)
    alone = S.summary_table(_qps([r for r in QPS_ROWS if r[0] == "cacheroute"]),
                            _route_cfg(routers=("cacheroute",)))  # fmt: skip
    assert alone["best_baseline"].tolist() == [""] and alone["vs_best_baseline"].isna().all()


def test_equal_baselines_are_ranked_by_name_whatever_their_order():
    from skv.experiments.cacheroute import study as S

    rows = [("least_loaded", 0, 100.0, 0.5, 1.0), ("consistent_hashing", 0, 100.0, 0.6, 1.0)]
    cfg = _route_cfg(routers=("least_loaded", "consistent_hashing"), seeds=(0,))
    assert S.best_baseline(_qps(rows), cfg, "aggregate") == "consistent_hashing"


def test_cacheroute_claim_values_levels_by_bootstrap_and_ratios_only_over_a_positive_reference():
    from skv.experiments.cacheroute import study as S
    from skv.experiments.stats import interval

    rows = [*QPS_ROWS, ("cacheroute", 2, 60.0, 0.7, 3300.0), ("least_loaded", 2, 0.5, 0.4, 1.0),
            ("sglang_cache_aware", 2, 0.0, 0.5, 9e9)]  # fmt: skip
    cfg = _route_cfg(seeds=(0, 1, 2))
    v = S.claim_values(cfg, _qps(rows))
    assert v["aggregate_cacheroute_qps"] == interval([150.0, 90.0, 60.0], method="bootstrap")
    assert v["aggregate_least_loaded_hit_pct"] == interval([50.0, 60.0, 40.0], method="bootstrap")
    # a reference of 0.5 req/s is a ratio; one of 0 is none
    assert v["aggregate_cacheroute_vs_least_loaded"] == interval([1.5, 0.75, 120.0])
    assert v["aggregate_cacheroute_vs_sglang_cache_aware"] == interval([0.75, 0.5])
    assert v["aggregate_best_baseline"] == "sglang_cache_aware"
    assert v["aggregate_best_cache_blind"] == "least_loaded"


BASE_YAML = """id: t
workloads:
  - {name: aggregate, params: {keys: 50}}
  - {name: dominant_key}
routers: [{name: least_loaded}]
seeds: [0, 1, 2]
"""


def test_a_quick_section_merges_workload_params_into_every_workload(tmp_path):
    from skv.experiments.cacheroute import study as S

    f = tmp_path / "c.yaml"
    f.write_text(BASE_YAML + "quick:\n  seeds: [0]\n  workload_params: {key_zipf: 0.9}\n")
    full, quick = S.load_config(f, quick=False), S.load_config(f, quick=True)
    assert full.seeds == [0, 1, 2] and [w.params for w in full.workloads] == [{"keys": 50}, {}]
    assert quick.seeds == [0]
    assert [w.params for w in quick.workloads] == [
        {"keys": 50, "key_zipf": 0.9},
        {"key_zipf": 0.9},
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("- a list\n", "expected a mapping at top level"),
        (BASE_YAML + "quick: [1]\n", "quick: expected a mapping of overrides"),
        (BASE_YAML + "quick: {quick: {seeds: [0]}}\n", "quick: expected a mapping of overrides"),
        (BASE_YAML + "quick: {workload_params: [1]}\n", "quick.workload_params: expected"),
        ("id: t\nworkloads: {a: 1}\nrouters: [{name: random}]\nseeds: [0]\n"
         "quick: {workload_params: {keys: 3}}\n", "workloads and quick.workload_params"),
        ("id: t\nworkloads: [{name: aggregate, params: [1]}]\nrouters: [{name: random}]\n"
         "seeds: [0]\nquick: {workload_params: {keys: 3}}\n", "expected mappings"),
        (BASE_YAML + "quick: {routers_kept: least_loaded}\n", "routers_kept: expected a list"),
        (BASE_YAML + "quick: {routers_kept: [random]}\n",
         "routers_kept: no router 'random' \\(least_loaded\\)"),
    ],
)  # fmt: skip
def test_a_bad_cacheroute_config_is_named_with_its_file(tmp_path, text, match):
    from skv.experiments.cacheroute import study as S
    from skv.experiments.config import ConfigError

    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{f}: .*{match}"):
        S.load_config(f, quick=True)


def test_quick_keeps_the_named_routers_as_the_config_defines_them(tmp_path):
    from skv.experiments.cacheroute import study as S

    f = tmp_path / "c.yaml"
    f.write_text(
        "id: t\nworkloads: [{name: aggregate}]\nseeds: [0]\nrouters:\n"
        "  - {name: least_loaded}\n  - {name: random}\n"
        "  - {name: cacheroute, label: cr, params: {prefix_blocks: 2}}\n"
        "quick: {routers_kept: [cr, least_loaded]}\n"
    )
    quick, full = S.load_config(f, quick=True), S.load_config(f, quick=False)
    assert [r.key for r in quick.routers] == ["least_loaded", "cr"]  # the config's order
    assert quick.routers[1] == full.routers[2]
    assert [r.key for r in full.routers] == ["least_loaded", "random", "cr"]


def test_a_cacheroute_config_error_names_the_file_then_the_field(tmp_path):
    from skv.experiments.cacheroute import study as S
    from skv.experiments.config import ConfigError

    f = tmp_path / "c.yaml"
    f.write_text(BASE_YAML + "bogus: 1\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(f))}: bogus: unknown key"):
        S.load_config(f, quick=False)
    with pytest.raises(FileNotFoundError, match=r"no such cacheroute config$"):
        S.load_config(tmp_path / "none.yaml", quick=False)


def test_the_setting_values_the_paper_quotes_by_hand():
    from skv.experiments.cacheroute import study as S

    cfg = S.CacheRouteConfig.model_validate({
        "id": "t", "seeds": [0, 1, 2], "slo_ms": 2500, "slo_percentile": 90, "warmup_s": 30,
        "measured_requests": 500,
        "cluster": {"replicas": 4, "gpu_memory_utilization": 0.5},
        "workloads": [{"name": "aggregate", "params": {"keys": 50}},
                      {"name": "dominant_key", "label": "dom", "params": {"dominant_share": 0.3}},
                      {"name": "shifting_skew", "params": {"shift_every_s": 20}},
                      # a Mooncake workload has no keys to quote (its parameters have none)
                      {"name": "mooncake", "params": {"stride": 1000}}],
        "routers": [{"name": "least_loaded"},
                    {"name": "cacheroute", "params": {"admit_rate": 0.02, "evict_rate": 0.01}}],
    })  # fmt: skip
    blocks = ClusterSpec(gpu_memory_utilization=0.5).kv_capacity_blocks(512)
    assert blocks == 1_065
    assert S.setting_values(cfg) == {
        "replicas": 4, "model": "llama-3.3-70b-fp8", "gpu": "H100", "tp": 4, "gpus": 16,
        "capacity_blocks": 1_065, "capacity_mtokens": 0.55, "block_tokens": 512,
        "slo_s": 2.5, "slo_metric": "p90 TTFT", "warmup_s": 30.0, "measured_requests": 500,
        "seeds": 3, "routers": 2,
        "cacheroute_admit_rate": 0.02, "cacheroute_evict_rate": 0.01, "cacheroute_period_s": 10.0,
        "aggregate_keys": 50, "aggregate_key_zipf": 1.1,
        "dom_keys": 2000, "dom_key_zipf": 1.1, "dom_dominant_share": 0.3,
        "shifting_skew_keys": 2000, "shifting_skew_key_zipf": 1.1,
        "shifting_skew_shift_every_s": 20.0,
    }  # fmt: skip
    # without cacheroute among the routers there are no cacheroute settings to quote
    blind = cfg.model_copy(update={"routers": cfg.routers[:1]})
    assert not any(k.startswith("cacheroute_") for k in S.setting_values(blind))


def test_a_qps_run_reports_the_metrics_at_its_answer_and_every_point_in_order():
    from skv.experiments.cacheroute import study as S

    cfg = S.CacheRouteConfig.model_validate({
        "id": "tiny", "seeds": [0], "warmup_s": 5, "measured_requests": 200,
        "cluster": {"replicas": 2, "capacity_blocks": 200},
        "workloads": [{"name": "aggregate", "params": {"keys": 20}}],
        "routers": [{"name": "least_loaded"}],
        "search": {"lo": 2, "hi": 8, "rel_tol": 0.2, "max_doublings": 1},
    })  # fmt: skip
    qps, points = S.run_qps(cfg, jobs=1)
    row = qps.iloc[0]
    res = S.search(cfg, 0, 0, 0)
    at = res["at"]
    for k in ("ttft_ms_slo", "ttft_ms_p99", "ttft_ms_mean", "throughput_rps",
              "max_replica_share", "hit_rate"):  # fmt: skip
        assert row[k] == at[k], k
    assert row["qps"] == res["qps"] and row["points"] == len(res["points"])
    assert points["step"].tolist() == list(range(len(res["points"])))
    assert points["rate"].tolist() == [p["rate"] for p in res["points"]]


def test_weights_that_fill_the_memory_exactly_leave_no_kv_memory():
    # 80 GB x 0.8825 = 70.6 GB, the fp8 weights to the byte: a budget of exactly 0
    with pytest.raises(ValueError, match="leave no KV memory"):
        ClusterSpec(tp=1, gpu_memory_utilization=0.8825).kv_capacity_blocks(512)


def test_a_budget_under_one_byte_is_still_memory_for_one_block():
    # the smallest utilisations above 0.8825 (whose budget is exactly 0, above) leave a few
    # millionths of a byte: some KV memory, so one block (the floor), not an error
    u, blocks = 0.8825, None
    for _ in range(64):
        u = math.nextafter(u, 1.0)
        with contextlib.suppress(ValueError):
            blocks = ClusterSpec(tp=1, gpu_memory_utilization=u).kv_capacity_blocks(512)
            break
    assert blocks == 1


def test_the_unit_run_memo_keeps_the_last_four_and_still_serves_a_fifth():
    from skv.experiments.cacheroute import study as S

    S._UNIT_RUNS.clear()
    for keys in (3, 4, 5, 6, 7):
        run, times = S.unit_run("aggregate", json.dumps({"keys": keys}), 0, 20)
        assert len(run.requests) == len(times) == 20
    assert [json.loads(k[1])["keys"] for k in S._UNIT_RUNS] == [4, 5, 6, 7]
    S._UNIT_RUNS.clear()


def test_claim_values_of_a_config_without_cacheroute_compare_the_baselines_only():
    from skv.experiments.cacheroute import study as S

    rows = [r for r in QPS_ROWS if r[0] != "cacheroute"]
    v = S.claim_values(_route_cfg(routers=("least_loaded", "sglang_cache_aware")), _qps(rows))
    assert v["aggregate_sglang_cache_aware_vs_least_loaded"]["n"] == 2
    assert not any(k.startswith("aggregate_cacheroute_vs") for k in v)


def test_load_claim_values_pair_cacheroute_with_every_router_after_it_too():
    import pandas as pd

    from skv.experiments.cacheroute import study as S

    routers = ("least_loaded", "cacheroute", "sglang_cache_aware", "random")
    cfg = S.CacheRouteConfig.model_validate({
        "id": "t", "kind": "load", "rates": [10.0], "seeds": [0, 1],
        "workloads": [{"name": "aggregate"}], "routers": [{"name": r} for r in routers],
    })  # fmt: skip
    p99 = {"least_loaded": 3000.0, "cacheroute": 2000.0, "sglang_cache_aware": 2500.0,
           "random": 4000.0}  # fmt: skip
    load = pd.DataFrame([
        {"workload": "aggregate", "router": r, "seed": s, "rate": 10.0,
         "ttft_ms_p99": p99[r] + 100.0 * s}
        for r in routers for s in (0, 1)
    ])  # fmt: skip
    v = S.load_claim_values(cfg, load)
    # the candidate itself is skipped, never the end of the list
    assert sorted(v) == [f"aggregate_cacheroute_minus_{r}_p99_s_at_10" for r in
                         ("least_loaded", "random", "sglang_cache_aware")]  # fmt: skip
    assert v["aggregate_cacheroute_minus_random_p99_s_at_10"]["value"] == pytest.approx(-2.0)
    blind = cfg.model_copy(update={"routers": [r for r in cfg.routers if r.name != "cacheroute"]})
    assert S.load_claim_values(blind, load) == {}


def test_a_cacheroute_search_doubles_its_bracket_as_often_as_its_config_says():
    from skv.experiments.cacheroute import study as S

    cfg = _route_cfg(routers=("least_loaded",), seeds=(0,))
    cfg = cfg.model_copy(update={"search": S.SearchSpec(lo=1, hi=2, max_doublings=2)})
    res = S.search(cfg, 0, 0, 0, point=lambda c, wi, ri, seed, rate: {"ttft_ms_slo": 0.0})
    assert [p["rate"] for p in res["points"]] == [1.0, 2.0, 4.0, 8.0] and res["above_hi"]


def test_a_point_routes_on_the_view_its_router_entry_names():
    from skv.experiments.cacheroute import study as S

    cfg = S.CacheRouteConfig.model_validate({
        "id": "t", "seeds": [0], "warmup_s": 5, "measured_requests": 300,
        "cluster": {"replicas": 3, "capacity_blocks": 40},
        "workloads": [{"name": "aggregate", "params": {"keys": 60}}],
        "routers": [{"name": "sglang_cache_aware", "view": "approximate"},
                    {"name": "sglang_cache_aware", "label": "exact", "view": "exact"}],
    })  # fmt: skip
    approx, exact = (S.point_at(cfg, 0, ri, 0, 40.0) for ri in (0, 1))
    assert approx != exact  # the two views route differently on this small, evicting cluster
