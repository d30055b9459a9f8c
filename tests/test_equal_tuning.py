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
    "grids": {"m": [{"k": 1}], "a": [{"k": 1}, {"k": 2}]},
    "tuning": {"settings": ["s"], "seeds": [100, 101]},
    "evaluation": {"settings": ["s", "u"], "seeds": [0, 1, 2]},
}


def cfg(**over) -> ET.TuningConfig:
    return ET.TuningConfig.model_validate({**BASE, **over})


#: the metric each (policy, setting) gets, on tuning seeds (>= 100) and evaluation seeds
TUNE = {"m@default": 10.0, "m@grid1": 9.0, "a@default": 20.0, "a@grid1": 12.0, "a@grid2": 15.0,
        "b@default": 30.0}  # fmt: skip
EVAL = {"m@default": 10.0, "m@grid1": 8.0, "a@default": 20.0, "a@grid1": 16.0, "a@grid2": 4.0,
        "b@default": 30.0}  # fmt: skip


def fake_cell(c, setting, seed, variants):
    table = TUNE if seed >= 100 else EVAL
    return {v.key: {"ttft": table[v.key] * (1 + 0.01 * seed % 3)} for v in variants}


def run(c: ET.TuningConfig):
    tuning = ET.run_cells(c, fake_cell, "tuning", ET.candidates(c), jobs=1)
    chosen = ET.choose(c, tuning)
    rows = ET.run_cells(c, fake_cell, "evaluation", ET.evaluation_variants(c, chosen), jobs=1)
    return tuning, chosen, rows


def test_candidates_put_the_default_first_and_the_budget_counts_it():
    assert [v.key for v in ET.candidates(cfg())] == [
        "m@default", "m@grid1", "a@default", "a@grid1", "a@grid2", "b@default"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="exceed the budget of 2"):
        cfg(budget=2)


def test_a_tuning_trace_that_is_also_an_evaluation_trace_is_refused():
    with pytest.raises(ValueError, match="evaluation never sees"):
        cfg(tuning={"settings": ["u"], "seeds": [2, 100]})
    cfg(tuning={"settings": ["u"], "seeds": [100]})  # the same setting at other seeds is fine


def test_a_grid_for_a_policy_outside_the_comparison_is_refused():
    with pytest.raises(ValueError, match=r"grids\.z"):
        cfg(grids={"z": [{"k": 1}]})


def test_the_choice_reads_the_tuning_traces_only():
    # on the evaluation traces a@grid2 is best (4 ms), on the tuning traces a@grid1 (12 ms)
    _, chosen, rows = run(cfg())
    assert chosen["a"].setting == "grid1" and chosen["m"].setting == "grid1"
    assert chosen["b"].setting == "default"
    assert set(rows["version"]) == {"default", "grid1"}  # grid2 never evaluated


def test_higher_is_better_picks_the_largest_and_ties_keep_the_default():
    c = cfg(better="higher")
    _, chosen, _ = run(c)
    assert chosen["a"].setting == "default" and chosen["m"].setting == "default"
    tied = {**TUNE, "m@grid1": TUNE["m@default"]}
    rows = ET.run_cells(cfg(), lambda *a: _table_cell(tied, *a), "tuning", ET.candidates(cfg()),
                        jobs=1)  # fmt: skip
    assert ET.choose(cfg(), rows)["m"].setting == "default"


def _table_cell(table, c, setting, seed, variants):
    return {v.key: {"ttft": table[v.key]} for v in variants}


def test_ratios_compare_defaults_with_defaults_and_tuned_with_tuned():
    c = cfg()
    _, chosen, rows = run(c)
    values, table = ET.claim_values(c, rows, chosen)
    # lower is better: baseline / method, per seed geometric mean over the settings
    assert values["default_ratio_vs_a"]["value"] == pytest.approx(20.0 / 10.0)
    assert values["tuned_ratio_vs_a"]["value"] == pytest.approx(16.0 / 8.0)
    assert values["tuned_ratio_vs_b"]["value"] == pytest.approx(30.0 / 8.0)
    assert values["best_tuned_baseline"] == "a"
    assert values["tuned_ratio_vs_best"] == values["tuned_ratio_vs_a"]
    assert values["tuning_gain_a"]["value"] == pytest.approx(20.0 / 16.0)
    assert values["tuning_gain_b"]["value"] == pytest.approx(1.0)
    assert values["chosen_a"] == 'grid1 {"k": 1}' and values["chosen_b"] == "default"
    assert values["budget"] == 3 and values["tuning_traces"] == 2
    assert values["tuned_ratio_vs_a"]["n"] == 3
    assert list(table["baseline"]) == ["a", "b"]
    # higher is better: method / baseline
    hc = cfg(better="higher", grids={})
    _, hchosen, hrows = run(hc)
    hv, _ = ET.claim_values(hc, hrows, hchosen)
    assert hv["default_ratio_vs_a"]["value"] == pytest.approx(10.0 / 20.0)
    assert hv["best_tuned_baseline"] == "b"


def test_ratio_is_a_geometric_mean_over_settings_per_seed():
    c = cfg()
    base = np.array([[2.0, 4.0], [8.0, 16.0]])  # settings x seeds
    method = np.ones((2, 2))
    r = ET.ratio(c, base, method)
    assert r["value"] == pytest.approx((math.sqrt(16) + math.sqrt(64)) / 2)


def test_the_figure_draws_the_tuned_comparison_in_colour(tmp_path):
    from skv.experiments.plotstyle import save_figure

    c = cfg()
    _, chosen, rows = run(c)
    _, table = ET.claim_values(c, rows, chosen)
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
