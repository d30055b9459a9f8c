"""Equal tuning (skv/experiments/equal_tuning.py and the two studies' cells): the budget, the
rule that picks a setting from the tuning traces only, the reported ratios, and the studies'
configs and cells."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from skv.experiments import equal_tuning as ET
from skv.experiments.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "id": "t",
    "method": "m",
    "baselines": ["a", "b"],
    "reference": "a",
    "metric": "ttft",
    "better": "lower",
    "headline": 1.4,
    "budget": 3,
    "grids": {"m": [{"k": 1}, {"k": 3}], "a": [{"k": 1}, {"k": 2}]},
    "untuned": {"b": "no parameters"},
    "tuning": {"settings": ["s"], "seeds": [100, 101]},
    "evaluation": {"settings": ["s", "u"], "seeds": [0, 1, 2]},
}


def cfg(**over) -> ET.TuningConfig:
    return ET.TuningConfig.model_validate({**BASE, **over})


#: the metric each (policy, setting) gets, on tuning seeds (>= 100) and evaluation seeds
TUNE = {"m@default": 10.0, "m@grid1": 9.0, "m@grid2": 9.5, "a@default": 20.0, "a@grid1": 12.0,
        "a@grid2": 15.0, "b@default": 30.0}  # fmt: skip
EVAL = {"m@default": 10.0, "m@grid1": 8.0, "m@grid2": 2.0, "a@default": 20.0, "a@grid1": 16.0,
        "a@grid2": 4.0, "b@default": 30.0}  # fmt: skip
#: each policy's own factor per evaluation seed (and setting u twice s): a pairing of one
#: policy's seed with another's would change every ratio
NOISE = {"m": [1.0, 1.3, 0.8], "a": [1.1, 0.7, 1.5], "b": [0.9, 1.2, 1.0]}


def fake_cell(c, setting, seed, variants):
    if seed >= 100:
        return {v.key: {"ttft": TUNE[v.key]} for v in variants}
    scale = 2.0 if setting == "u" else 1.0
    return {v.key: {"ttft": EVAL[v.key] * NOISE[v.policy][seed] * scale} for v in variants}


def run(c: ET.TuningConfig):
    tuning = ET.run_cells(c, fake_cell, "tuning", ET.candidates(c), jobs=1)
    chosen = ET.choose(c, tuning)
    rows = ET.run_cells(c, fake_cell, "evaluation", ET.evaluation_variants(c, chosen), jobs=1)
    return tuning, chosen, rows


def expected_ratio(base: str, method: str, *, higher: bool = False) -> float:
    """Per seed baseline / method (method / baseline when higher is better; the same at both
    settings), mean over seeds."""
    b, m = base.split("@")[0], method.split("@")[0]
    per_seed = [EVAL[base] * NOISE[b][i] / (EVAL[method] * NOISE[m][i]) for i in range(3)]
    return float(np.mean([1 / r if higher else r for r in per_seed]))


def test_candidates_put_the_default_first_and_every_tuned_policy_gets_the_whole_budget():
    assert [v.key for v in ET.candidates(cfg())] == [
        "m@default", "m@grid1", "m@grid2", "a@default", "a@grid1", "a@grid2", "b@default"
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"grids\.m: 1 settings; the budget of 3"):
        cfg(grids={**BASE["grids"], "m": [{"k": 1}]})
    with pytest.raises(ValueError, match=r"settings; the budget"):
        cfg(budget=2)
    with pytest.raises(ValueError, match=r"grids.a\[1\]: repeats"):
        cfg(grids={**BASE["grids"], "a": [{"k": 1}, {"k": 1}]})
    with pytest.raises(ValueError, match=r"grids.a\[0\]: repeats"):
        cfg(grids={**BASE["grids"], "a": [{}, {"k": 1}]})


def test_a_policy_is_tuned_or_says_why_not():
    with pytest.raises(ValueError, match=r"untuned\.b"):
        cfg(untuned={})
    with pytest.raises(ValueError, match="it has a grid"):
        cfg(untuned={"b": "x", "a": "y"})


def test_a_tuning_seed_that_is_also_an_evaluation_seed_is_refused():
    with pytest.raises(ValueError, match="evaluation never sees"):
        cfg(tuning={"settings": ["other"], "seeds": [2, 100]})
    cfg(tuning={"settings": ["u"], "seeds": [100]})  # the same setting at other seeds is fine


def test_repeated_baselines_settings_or_seeds_are_refused():
    with pytest.raises(ValueError, match="given twice"):
        cfg(baselines=["a", "b", "a"])
    with pytest.raises(ValueError, match="given twice"):
        cfg(evaluation={"settings": ["s"], "seeds": [0, 0, 1]})
    with pytest.raises(ValueError, match="given twice"):
        cfg(tuning={"settings": ["s", "s"], "seeds": [100]})


def test_a_grid_for_a_policy_outside_the_comparison_is_refused():
    with pytest.raises(ValueError, match=r"grids\.z"):
        cfg(grids={**BASE["grids"], "z": [{"k": 1}, {"k": 2}]})


def test_the_choice_reads_the_tuning_traces_only():
    # on the evaluation traces m@grid2 and a@grid2 are best, on the tuning traces grid1
    _, chosen, rows = run(cfg())
    assert chosen["a"].setting == "grid1" and chosen["m"].setting == "grid1"
    assert chosen["b"].setting == "default"
    assert set(rows["version"]) == {"default", "grid1"}  # grid2 never evaluated


def test_higher_is_better_picks_the_largest_and_ties_keep_the_default():
    c = cfg(better="higher")
    _, chosen, _ = run(c)
    assert chosen["a"].setting == "default" and chosen["m"].setting == "default"
    tied = {**TUNE, "m@grid1": TUNE["m@default"], "m@grid2": TUNE["m@default"]}
    rows = ET.run_cells(cfg(), lambda *a: _table_cell(tied, *a), "tuning", ET.candidates(cfg()),
                        jobs=1)  # fmt: skip
    assert ET.choose(cfg(), rows)["m"].setting == "default"


def _table_cell(table, c, setting, seed, variants):
    return {v.key: {"ttft": table[v.key]} for v in variants}


def test_ratios_pair_each_seed_and_compare_defaults_with_defaults_and_tuned_with_tuned():
    c = cfg()
    tuning, chosen, rows = run(c)
    values, table = ET.claim_values(c, rows, chosen, tuning)
    # lower is better: per seed baseline / method (geometric mean over the settings)
    assert values["default_ratio_vs_a"]["value"] == pytest.approx(
        expected_ratio("a@default", "m@default")
    )
    assert values["tuned_ratio_vs_a"]["value"] == pytest.approx(
        expected_ratio("a@grid1", "m@grid1")
    )
    assert values["tuned_ratio_vs_b"]["value"] == pytest.approx(
        expected_ratio("b@default", "m@grid1")
    )
    lo, hi = values["tuned_ratio_vs_a"]["ci95"]
    assert lo < values["tuned_ratio_vs_a"]["value"] < hi  # the seeds differ: a real interval
    assert values["tuning_gain_a"]["value"] == pytest.approx(20.0 / 16.0)
    assert values["tuning_gain_b"]["value"] == pytest.approx(1.0)
    assert values["chosen_a"] == 'grid1 {"k": 1}' and values["chosen_b"] == "default"
    assert values["budget"] == 3 and values["tuning_traces"] == 2
    assert values["tuned_ratio_vs_a"]["n"] == 3 and values["censored_runs"] == 0
    assert list(table["baseline"]) == ["a", "b"]
    # higher is better: method / baseline
    hc = cfg(better="higher")
    htuning, hchosen, hrows = run(hc)
    hv, _ = ET.claim_values(hc, hrows, hchosen, htuning)
    assert hv["default_ratio_vs_a"]["value"] == pytest.approx(
        expected_ratio("a@default", "m@default", higher=True)
    )


def test_the_best_tuned_baseline_is_picked_on_the_tuning_traces():
    # on the tuning traces b (8 ms) beats tuned a (12 ms); on the evaluation a is far better
    c = cfg()
    tuned_b = {**TUNE, "b@default": 8.0}
    tuning = ET.run_cells(c, lambda *a: _table_cell(tuned_b, *a), "tuning", ET.candidates(c),
                          jobs=1)  # fmt: skip
    chosen = ET.choose(c, tuning)
    rows = ET.run_cells(c, fake_cell, "evaluation", ET.evaluation_variants(c, chosen), jobs=1)
    values, _ = ET.claim_values(c, rows, chosen, tuning)
    assert values["best_tuned_baseline"] == "b"
    assert values["tuned_ratio_vs_best"] == values["tuned_ratio_vs_b"]


def test_a_run_without_a_positive_metric_is_refused_by_name():
    def zero(c, setting, seed, variants):
        return {v.key: {"ttft": 0.0 if v.key == "a@grid2" else 1.0} for v in variants}

    with pytest.raises(ValueError, match=r"a@grid2 on s seed 100 gave ttft 0\.0"):
        ET.run_cells(cfg(), zero, "tuning", ET.candidates(cfg()), jobs=1)


def test_ratio_is_a_geometric_mean_over_settings_per_seed():
    c = cfg()
    base = np.array([[2.0, 4.0], [8.0, 16.0]])  # settings x seeds
    method = np.ones((2, 2))
    r = ET.ratio(c, base, method)
    assert r["value"] == pytest.approx((math.sqrt(16) + math.sqrt(64)) / 2)


def test_the_figure_draws_the_tuned_comparison_in_colour(tmp_path):
    from skv.experiments.plotstyle import save_figure

    c = cfg()
    tuning, chosen, rows = run(c)
    _, table = ET.claim_values(c, rows, chosen, tuning)
    paths = save_figure(ET.tuning_figure(c, table, "t (simulated)", "TTFT ratio"), tmp_path, "f")
    assert all(p.stat().st_size > 0 for p in paths)


# ----------------------------------------------------------------------------- the studies


def test_the_shipped_configs_load_in_both_modes():
    from skv.experiments.cacheroute import tuning as CT
    from skv.experiments.saecache import tuning as ST

    for quick in (False, True):
        s = ST.load("experiments/saecache/saecache_tuning.yaml", quick=quick)
        r = CT.load("experiments/cacheroute/cacheroute_tuning.yaml", quick=quick)
        assert s.budget == r.budget == 4
        assert len(s.evaluation.seeds) == len(r.evaluation.seeds) == (2 if quick else 5)
    assert r.replicas == 4


def test_cacheroute_variants_keep_the_base_router_parameters_and_view(tmp_path):
    from skv.experiments.cacheroute import tuning as CT

    c = CT.load("experiments/cacheroute/cacheroute_tuning.yaml", quick=True)
    run_cfg = CT.run_config(c, [
        ET.Variant("cacheroute", "grid1", {"admit_rate": 0.2, "evict_rate": 0.1}),
        ET.Variant("sglang_cache_aware", "default"),
    ])  # fmt: skip
    cr, sg = run_cfg.routers
    assert cr.params == {"prefix_blocks": 2, "admit_rate": 0.2, "evict_rate": 0.1}
    assert cr.key == "cacheroute@grid1" and sg.view == "approximate"
    assert run_cfg.cluster.replicas == 4 and run_cfg.search.lo == pytest.approx(20 * 4 / 15)
    bad = tmp_path / "bad.yaml"
    text = (ROOT / "experiments/cacheroute/cacheroute_tuning.yaml").read_text()
    bad.write_text(text.replace("{load_factor: 1.1}", "{load_factor: 0.5}"))
    with pytest.raises(ConfigError, match="load_factor"):
        CT.load(bad, quick=False)
    bad.write_text(text.replace("tuning: {settings: [aggregate]", "tuning: {settings: [nowhere]"))
    with pytest.raises(ConfigError, match="setting 'nowhere'"):
        CT.load(bad, quick=False)


def test_saecache_cell_runs_every_variant_on_one_trace_and_the_default_is_the_grids_run():
    from skv.experiments.saecache import regimes as SR
    from skv.experiments.saecache import tuning as ST
    from skv.experiments.saecache.study import replace_fields

    c = ST.load("experiments/saecache/saecache_tuning.yaml", quick=True)
    c = c.model_copy(update={"num_requests": 200})
    variants = [ET.Variant("saecache", "default"), ET.Variant("saecache", "grid1", {"eta": 0.02}),
                ET.Variant("lru", "default")]  # fmt: skip
    out = ST.cell(c, "balanced_fast", 0, variants)
    assert set(out) == {v.key for v in variants}
    plain = SR.simulate_policies(
        replace_fields(ST.setting_config(c, "balanced_fast"), policies=["saecache", "lru"]), 0
    )
    assert out["saecache@default"] == plain["saecache"] and out["lru@default"] == plain["lru"]


def test_study_configs_name_the_bad_field(tmp_path):
    from skv.experiments.cacheroute import tuning as CT
    from skv.experiments.saecache import tuning as ST

    sae = (ROOT / "experiments/saecache/saecache_tuning.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    cases = [
        (ST, sae.replace("better: lower", "better: higher"), "ttft_ms_mean is better lower"),
        (ST, sae.replace("{eta: 0.3}, {update_every", "{eta: 3.0}, {update_every"),
         r"grids\.saecache\[1\]"),
        (ST, sae.replace("adaptive_semantic]", "adaptive_semantic, nosuch]").replace(
            "  gdsf: \"no parameters\"", "  gdsf: \"no parameters\"\n  nosuch: x"),
         r"baselines\[4\]"),
        (ST, sae.replace("  tuning: {settings: [balanced_fast, tool_use_fast, sharegpt_like_slow], "
                         "seeds: [100]}", "  tuning: [1]"), "quick.tuning: expected mappings"),
        (CT, (ROOT / "experiments/cacheroute/cacheroute_tuning.yaml").read_text().replace(
            "base: experiments/cacheroute/qps_aggregate.yaml", "base: nowhere.yaml"), "base: "),
    ]  # fmt: skip
    for mod, text, pattern in cases:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=pattern):
            mod.load(bad, quick=True)


def test_a_censored_search_is_marked_and_counted(monkeypatch):
    from skv.experiments.cacheroute import study as S
    from skv.experiments.cacheroute import tuning as CT

    c = CT.load(ROOT / "experiments/cacheroute/cacheroute_tuning.yaml", quick=True)
    answers = iter([{"qps": 40.0, "below_lo": False, "above_hi": True},
                    {"qps": 20.0, "below_lo": False, "above_hi": False}])  # fmt: skip

    def fake_search(run, wi, ri, seed):
        return {**next(answers), "at": {"hit_rate": 0.5, "ttft_ms_slo": 100.0}}

    monkeypatch.setattr(S, "search", fake_search)
    out = CT.cell(c, "aggregate", 0, [ET.Variant("cacheroute", "default"),
                                      ET.Variant("least_loaded", "default")])  # fmt: skip
    assert out["cacheroute@default"]["censored"] == 1.0
    assert out["least_loaded@default"]["censored"] == 0.0


def test_each_study_names_the_direction_of_every_metric_its_cell_records():
    from skv.experiments.cacheroute import tuning as CT
    from skv.experiments.saecache import regimes as SR
    from skv.experiments.saecache import tuning as ST

    assert set(ST.SaeTuningConfig.DIRECTIONS) == set(SR.METRICS)
    assert set(CT.RouteTuningConfig.DIRECTIONS) == set(CT.METRICS)
    with pytest.raises(ValueError, match="a cell records qps, hit_rate, ttft_ms_slo"):
        CT.RouteTuningConfig.model_validate(
            {**CT.load(ROOT / "experiments/cacheroute/cacheroute_tuning.yaml", quick=True)
             .model_dump(), "metric": "nope"}
        )  # fmt: skip
