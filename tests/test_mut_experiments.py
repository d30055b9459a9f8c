"""Tests that kill mutants of the study code the verdicts are made of (``./reproduce.sh mutate``,
modules ``skv/experiments/...`` in pyproject.toml): the QPS-at-SLO search, one simulated cluster
point, and the eviction verdict's signs. Each pins a rule whose breakage the study tests did not
notice: an edge of the search's bracket, the SLO's inequality, a flag in a returned record."""

from __future__ import annotations

import dataclasses
import math
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


def test_bisection_narrows_to_rel_tol_of_the_bracket_top_and_no_further():
    measure, seen = linear(10.0)
    res = max_qps(measure, 1000.0, lo=20.0, hi=160.0, rel_tol=0.02)
    # the bracket 140 wide halves seven times; 2.1875 is still above 2% of its top (100.9375),
    # 1.09375 is not
    assert seen == [20.0, 160.0, 90.0, 125.0, 107.5, 98.75, 103.125, 100.9375, 99.84375]
    assert res["qps"] == 99.84375 and res["at"] == {"ttft_ms_p99": 998.4375}


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


#: four policies: one unresolved on the engine, one agreeing and faster, one agreeing and slower,
#: one on both claim thresholds exactly (simulated ratio 1 - eps, simulated gain eps) with a
#: resolved engine hit sign the simulator does not share; and a control engine
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
