"""Regime maps (skv.experiments.regimes): the grid, the paired ratios, the verdicts, the
claim values and the figure, on cells whose answers are known; and SAECache's cell."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from skv.experiments import regimes as R
from skv.experiments.config import ConfigError

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "id": "toy",
    "seeds": [0, 1, 2],
    "axes": {"load": [1, 2], "mix": ["a", "b"], "think": [0.5]},
    "method": "m",
    "baselines": ["ref", "other"],
    "reference": "ref",
    "metric": "ttft",
    "better": "lower",
    "headline": 1.4,
    "paper_setup": {"mix": ["a"]},
    "rows": "mix",
    "cols": "load",
}

#: per (load, mix): the method's TTFT factor against ref (ref / m), and other's TTFT
#: relative to ref; seed s adds a spread of +-5% around the factor
FACTORS = {(1, "a"): 2.0, (1, "b"): 1.0, (2, "a"): 1.39, (2, "b"): 0.5}


def toy_cell(cfg: R.RegimeConfig, setting: dict, seed: int) -> dict:
    ref = 100.0 * setting["load"]
    factor = FACTORS[(setting["load"], setting["mix"])] * (1 + 0.01 * (seed - 1))
    other = ref * (0.9 if setting["mix"] == "b" else 1.5)  # the best baseline when mix is b
    return {
        "ref": {"ttft": ref, "hit": 0.5},
        "other": {"ttft": other, "hit": 0.6 if setting["mix"] == "a" else 0.4},
        "m": {"ttft": ref / factor, "hit": 0.55},
    }


def toy(**changes) -> R.RegimeConfig:
    return R.RegimeConfig.model_validate({**BASE, **changes})


@pytest.fixture(scope="module")
def grid() -> tuple[R.RegimeConfig, pd.DataFrame, pd.DataFrame]:
    cfg = toy(secondary={"hit": "higher"})
    rows = R.run_grid(cfg, toy_cell, jobs=1)
    return cfg, rows, R.summary(cfg, rows)


def test_grid_is_the_product_of_the_axes_with_every_policy_and_seed(grid):
    cfg, rows, table = grid
    assert len(cfg.settings()) == 4
    assert cfg.settings()[0] == {"load": 1, "mix": "a", "think": 0.5}
    assert cfg.settings()[1] == {"load": 1, "mix": "b", "think": 0.5}  # last axis fastest
    assert len(rows) == 4 * 3 * 3
    assert set(rows["policy"]) == {"m", "ref", "other"}
    assert list(table["mix"].astype(str)) == ["a", "b", "a", "b"]


class SharedLoad(R.RegimeConfig):
    shared_axes = ("load",)


#: (mix, think, seed, load) of each toy_cell call, in order, in the one process of jobs=1
CALLS: list[tuple] = []


def counting_cell(cfg: R.RegimeConfig, setting: dict, seed: int) -> dict:
    CALLS.append((setting["mix"], setting["think"], seed, setting["load"]))
    return toy_cell(cfg, setting, seed)


def test_shared_axes_put_their_settings_in_one_task_and_change_no_row(grid):
    """Settings that differ only in a shared axis run one after another (so a cell can keep
    its workload), and the rows are those of the ungrouped grid, in the grid's order."""
    _cfg, rows, _ = grid
    shared = SharedLoad.model_validate({**BASE, "secondary": {"hit": "higher"}})
    CALLS.clear()
    got = R.run_grid(shared, counting_cell, jobs=1)
    assert len(CALLS) == 4 * 3  # in this process (an SKV_DASK cluster would leave it empty)
    pd.testing.assert_frame_equal(got, rows)
    # each (mix, think, seed) is called for load 1 then load 2, back to back
    assert [c[:3] for c in CALLS[::2]] == [c[:3] for c in CALLS[1::2]]
    assert [c[3] for c in CALLS] == [1, 2] * (len(CALLS) // 2)


class OneTask(R.RegimeConfig):
    """Every setting in one task, run load by load (``run_key``)."""

    def task_key(self, setting: dict) -> None:
        return None

    def run_key(self, setting: dict) -> int:
        return setting["load"]


def test_run_key_orders_a_task_and_changes_no_row(grid):
    """Within a task, settings of one ``run_key`` run back to back (grid order inside each),
    and the rows are those of the ungrouped grid, in the grid's order."""
    _cfg, rows, _ = grid
    one = OneTask.model_validate({**BASE, "secondary": {"hit": "higher"}})
    CALLS.clear()
    got = R.run_grid(one, counting_cell, jobs=1)
    assert len(CALLS) == 4 * 3
    pd.testing.assert_frame_equal(got, rows)
    # the grid's order is load-major already: swap it, so the grouping shows
    swapped = OneTask.model_validate(
        {**BASE, "axes": {"mix": ["a", "b"], "load": [1, 2], "think": [0.5]},
         "secondary": {"hit": "higher"}}
    )  # fmt: skip
    CALLS.clear()
    R.run_grid(swapped, counting_cell, jobs=1)
    per_seed = [c for c in CALLS if c[2] == 0]
    assert [(c[0], c[3]) for c in per_seed] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def test_ratio_is_baseline_over_method_paired_per_seed(grid):
    _, _, table = grid
    row = table[(table["load"] == "1") & (table["mix"] == "a")].iloc[0]
    # per seed 2.0 * (0.99, 1.00, 1.01): mean 2.0, a Student-t interval around it
    assert row["ratio_ref"] == pytest.approx(2.0)
    half = 2.0 * 0.01 * 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert row["ratio_ref_low"] == pytest.approx(2.0 - half)
    assert row["ratio_ref_high"] == pytest.approx(2.0 + half)
    assert row["headline_vs_ref"] == "holds"
    assert row["best_baseline"] == "ref"  # other is 1.5x slower there


def test_best_baseline_is_picked_per_setting_by_its_mean(grid):
    _, _, table = grid
    row = table[(table["load"] == "2") & (table["mix"] == "b")].iloc[0]
    assert row["best_baseline"] == "other"  # 0.9 x ref's TTFT
    assert row["ratio_best"] == pytest.approx(0.9 * 0.5)
    assert row["vs_best"] == "loses"
    assert row["headline_vs_best"] == "below"


def test_verdicts_name_an_interval_that_contains_the_threshold_unresolved(grid):
    _, _, table = grid
    near = table[(table["load"] == "2") & (table["mix"] == "a")].iloc[0]  # 1.39 +- 0.06
    assert near["headline_vs_ref"] == "unresolved"
    assert near["vs_best"] == "wins"
    equal = table[(table["load"] == "1") & (table["mix"] == "b")].iloc[0]  # 1.0 +- 0.04 vs ref
    assert equal["ratio_ref_low"] < 1 < equal["ratio_ref_high"]
    assert equal["vs_best"] == "loses"  # other is best there, 0.9 x ref's TTFT
    assert R._verdict([1.0, 1.0], 1.0, ("wins", "tie", "loses")) == "tie"
    assert R._verdict([1.4, 1.5], 1.4, R.VERDICTS) == "holds"


def test_paper_setup_marks_only_the_stated_values(grid):
    _, _, table = grid
    assert list(table["paper_setup"]) == [True, False, True, False]


def test_secondary_metric_is_method_minus_best_baseline_by_that_metric(grid):
    _, _, table = grid
    a = table[table["mix"] == "a"].iloc[0]
    b = table[table["mix"] == "b"].iloc[0]
    assert a["best_by_hit"] == "other" and a["hit_diff"] == pytest.approx(0.55 - 0.6)
    assert b["best_by_hit"] == "ref" and b["hit_diff"] == pytest.approx(0.55 - 0.5)


def test_claim_values_count_verdicts_and_pool_ratios_over_settings(grid):
    cfg, rows, table = grid
    v = R.claim_values(cfg, rows, table)
    assert (v["settings"], v["paper_settings"]) == (4, 2)
    assert (v["all_ref_holds"], v["all_ref_unresolved"], v["all_ref_below"]) == (1, 1, 2)
    assert (v["paper_ref_holds"], v["paper_ref_unresolved"]) == (1, 1)
    assert v["all_max_ratio_ref"]["value"] == pytest.approx(2.0)
    assert v["all_max_ratio_ref_at"] == "load 1, mix a, think 0.5"
    # seed 1 has factor exactly 2.0, 1.0, 1.39, 0.5 in the four settings
    gm = math.exp(np.mean(np.log([2.0, 1.0, 1.39, 0.5])))
    assert v["all_geomean_ratio_ref"]["value"] == pytest.approx(gm, rel=1e-3)
    assert v["paper_geomean_ratio_ref"]["value"] == pytest.approx(math.sqrt(2.0 * 1.39), rel=1e-3)
    assert v["all_hit_diff"]["value"] == pytest.approx(0.0)  # -0.05 twice, +0.05 twice


def test_verdict_table_rows(grid):
    cfg, _, table = grid
    t = R.verdict_table(cfg, table)
    assert list(t["settings"]) == ["all settings", "all settings", "paper's setup", "paper's setup"]
    first = t.iloc[0]
    assert (first["n"], first["headline 1.4x holds"], first["below"]) == (4, 1, 2)
    assert first["max ratio"] == pytest.approx(2.0)


def test_figure_draws_one_panel_per_other_axis_combination(grid):
    from skv.experiments.plotstyle import check_figure

    cfg, _, table = grid
    fig = R.regime_figure(cfg, table, "toy map")
    check_figure(fig, "fig_toy")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert len(panels) == 1  # think has one value, load and mix are rows/cols
    boxes = [p for p in panels[0].patches if not p.get_fill()]
    assert len(boxes) == 1  # only (load 1, mix a) holds the headline


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rows": "nope"}, "rows: 'nope' is not an axis"),
        ({"cols": "mix"}, "rows and cols name the same axis"),
        ({"reference": "x"}, "not one of the baselines"),
        ({"baselines": ["ref", "m"]}, "is the method"),
        ({"paper_setup": {"mix": ["z"]}}, "paper_setup.mix: 'z'"),
        ({"paper_setup": {"nope": [1]}}, "paper_setup.nope: not an axis"),
        ({"axes": {"load": [1, 1], "mix": ["a"]}}, "given twice"),
        ({"axes": {"load": list(range(8)), "mix": list(range(8)), "t": list(range(8))}}, "at most"),
        ({"seeds": [0]}, "seeds"),
    ],
)
def test_bad_configs_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        toy(**changes)


def test_quick_overrides_merge_axes(tmp_path):
    import yaml

    data = {**BASE, "quick": {"seeds": [0, 1], "axes": {"load": [1]}}}
    path = tmp_path / "map.yaml"
    path.write_text(yaml.safe_dump(data))
    full = R.load_config(path, R.RegimeConfig, quick=False)
    quick = R.load_config(path, R.RegimeConfig, quick=True)
    assert full.axes["load"] == [1, 2] and full.seeds == [0, 1, 2]
    assert quick.axes == {"load": [1], "mix": ["a", "b"], "think": [0.5]}
    assert quick.seeds == [0, 1]
    path.write_text(yaml.safe_dump({**BASE, "headline": -1}))
    with pytest.raises(ConfigError, match=r"map.yaml: headline"):
        R.load_config(path, R.RegimeConfig, quick=False)


def test_a_cell_missing_a_policy_is_an_error():
    cfg = toy()
    with pytest.raises(ValueError, match="no result for"):
        R.run_grid(cfg, lambda c, s, seed: {"m": {"ttft": 1.0}}, jobs=1)


# ---------------------------------------------------------------------------- SAECache's map

SAE_CONFIG = REPO / "experiments/saecache/saecache_regimes.yaml"


def test_saecache_setting_config_applies_each_axis():
    from skv.experiments.saecache import regimes as SR

    cfg = SR.load(SAE_CONFIG, quick=False)
    setting = {
        "capacity": "40%",
        "arrival_s": [0.05, 0.08],
        "multi_turn_share": 0.9,
        "tool_use_share": 0.5,
        "gap_mu": 0.7,
    }
    exp = SR.setting_config(cfg, setting)
    p = exp.workload.params
    assert exp.capacities == ["40%"]
    assert (p["arrival_min_s"], p["arrival_max_s"]) == (0.05, 0.08)
    assert (p["multi_turn_share"], p["tool_use_share"], p["gap_mu"]) == (0.9, 0.5, 0.7)
    assert p["num_requests"] == cfg.num_requests
    assert [q.key for q in exp.policies] == cfg.policies


def test_saecache_cell_serves_one_trace_to_every_policy():
    from skv.experiments.saecache import regimes as SR

    cfg = SR.load(SAE_CONFIG, quick=True).model_copy(update={"num_requests": 120})
    setting = cfg.settings()[0]
    out = SR.cell(cfg, setting, 0)
    assert set(out) == set(cfg.policies)
    assert all(set(m) == set(SR.METRICS) for m in out.values())
    assert out == SR.cell(cfg, setting, 0)  # seeded
    # a larger cache never lowers lru's hit rate on the same trace
    big = SR.cell(cfg, {**setting, "capacity": "90%"}, 0)
    assert big["lru"]["token_hit_rate"] >= out["lru"]["token_hit_rate"]


def test_saecache_cells_share_one_trace_over_capacities_and_equal_the_summary(monkeypatch):
    """The capacity is a shared axis: the cells of one setting and seed make its trace once
    (:func:`compiled_trace`), another seed anew; every cell's metrics are, to the bit, the
    simulator summary's on a trace made for that cell alone."""
    from skv.experiments import runner
    from skv.experiments.saecache import regimes as SR
    from skv.latency import make_latency_model
    from skv.replay import trace_totals
    from skv.sim import compile_run, simulate
    from skv.sizing import Capacity

    assert SR.SaeRegimeConfig.shared_axes == ("capacity",)
    cfg = SR.load(SAE_CONFIG, quick=True).model_copy(update={"num_requests": 150})
    made = []
    real = runner.make_requests
    monkeypatch.setattr(runner, "make_requests", lambda *a: made.append(a) or real(*a))
    SR._LAST_TRACE.clear()
    setting = cfg.settings()[0]
    for seed, cap in ((0, "10%"), (0, "40%"), (1, "40%")):
        config = SR.setting_config(cfg, {**setting, "capacity": cap})
        got = SR.simulate_policies(config, seed)
        requests = real(config.workload.name, runner.workload_params(config, seed, False))
        run = compile_run(requests, runner.sim_config(config, config.policies[0], 1))
        unique = trace_totals(run.trace).unique_blocks
        blocks = Capacity.parse(cap).to_blocks(
            block_size=config.block_size, unique_blocks=unique, model=config.model
        )
        lat = make_latency_model(config.latency.name, **config.latency.params)
        want = {}
        for spec in config.policies:
            summary = simulate(requests, runner.sim_config(config, spec, blocks), lat).summary
            want[spec.key] = {m: float(summary[m]) for m in SR.METRICS}
        assert repr(got) == repr(want)  # the same floats, keys in the same order
    assert len(made) == 2  # seed 0's trace once for both capacities, seed 1's anew
    SR._LAST_TRACE.clear()


def test_saecache_config_rejects_a_bad_axis_value(tmp_path):
    import yaml

    from skv.experiments.saecache import regimes as SR

    data = yaml.safe_load(SAE_CONFIG.read_text())
    data["axes"]["multi_turn_share"] = [0.5, 1.5]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="multi_turn_share"):
        SR.load(path, quick=False)
    data = yaml.safe_load(SAE_CONFIG.read_text())
    data["secondary"] = {"nope": "higher"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="a cell records"):
        SR.load(path, quick=False)


# --------------------------------------------------------------------------- CacheRoute's map

ROUTE_CONFIG = REPO / "experiments/cacheroute/cacheroute_regimes.yaml"


def test_cacheroute_setting_config_applies_each_axis_and_scales_the_search():
    from skv.experiments.cacheroute import regimes as CR
    from skv.experiments.cacheroute import study as S

    cfg = CR.load(ROUTE_CONFIG, quick=False)
    base = S.load_config(cfg.base, quick=False)
    setting = {
        "replicas": 4,
        "gpu_memory_utilization": 0.5,
        "key_zipf": 0.8,
        "shared_share": 0.5,
        "prefix_blocks": [2, 8],
        "slo_ms": 2000,
    }
    run = CR.setting_config(cfg, setting)
    assert (run.cluster.replicas, run.cluster.gpu_memory_utilization) == (4, 0.5)
    assert run.slo_ms == 2000
    p = run.workloads[0].params
    assert (p["key_zipf"], p["shared_share"], tuple(p["prefix_blocks"])) == (0.8, 0.5, (2, 8))
    assert run.search.lo == pytest.approx(base.search.lo * 4 / base.cluster.replicas)
    assert run.search.hi == pytest.approx(base.search.hi * 4 / base.cluster.replicas)
    assert [r.key for r in run.routers] == [r.key for r in base.routers if r.key in cfg.policies]
    assert set(cfg.policies) == {r.key for r in run.routers}
    assert run.measured_requests == cfg.measured_requests


def test_cacheroute_searches_of_two_slos_share_their_points_and_match_fresh_searches():
    """The SLO is a shared axis: a point's simulation leaves it out of its key, so the second
    SLO's search reuses the rates both probe, and each search equals one that simulates all."""
    from skv.experiments.cacheroute import regimes as CR
    from skv.experiments.cacheroute import study as S

    cfg = CR.load(ROUTE_CONFIG, quick=True)
    assert CR.RouteRegimeConfig.shared_axes == ("slo_ms",)
    setting = cfg.settings()[0]
    small = {"measured_requests": 150, "warmup_s": 5.0}
    runs = [
        CR.setting_config(cfg, {**setting, "slo_ms": slo}).model_copy(update=small)
        for slo in (2000, 3500)
    ]
    assert S.CacheRouteConfig.model_validate_json(runs[0].model_dump_json()) == runs[0]
    CR._point_at.cache_clear()
    shared = [S.search(run, 0, 0, 0, point=CR.shared_point) for run in runs]
    common = {p["rate"] for p in shared[0]["points"]} & {p["rate"] for p in shared[1]["points"]}
    assert len(common) >= 2  # at least the bracket's two ends
    assert CR._point_at.cache_info().hits == len(common)  # every rate both probed, simulated once
    fresh = [S.search(run, 0, 0, 0) for run in runs]
    assert shared == fresh


def test_cacheroute_map_names_a_router_missing_from_its_base(tmp_path):
    import yaml

    from skv.experiments.cacheroute import regimes as CR

    data = yaml.safe_load(ROUTE_CONFIG.read_text())
    data["baselines"] = [*data["baselines"], "nope"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="router 'nope' is not in"):
        CR.load(path, quick=False)


def test_shared_share_gives_private_prefixes_and_leaves_share_one_unchanged():
    from skv.experiments.cacheroute.workloads import SyntheticParams, aggregate

    full = aggregate(SyntheticParams(num_requests=2000), 10.0, 3)
    one = aggregate(SyntheticParams(num_requests=2000, shared_share=1.0), 10.0, 3)
    assert [r.hash_ids for r in full] == [r.hash_ids for r in one]
    half = aggregate(SyntheticParams(num_requests=2000, shared_share=0.8), 10.0, 3)
    private = [r for r in half if r.session_id.startswith("private")]
    assert 0.17 < len(private) / len(half) < 0.23
    # a private prefix's blocks are seen by no other request; its length is its key's
    seen: dict[int, int] = {}
    for r in half:
        for h in r.hash_ids:
            seen[h] = seen.get(h, 0) + 1
    assert all(seen[h] == 1 for r in private for h in r.hash_ids)
    # a shared request keeps its key's prefix: the same key blocks as in the all-shared run
    for h, f in zip(half, full, strict=True):
        keyed = [x for x in f.hash_ids if x < 1 << 40]
        if not h.session_id.startswith("private"):
            assert h.hash_ids[: len(keyed)] == keyed
    # the same arrival times and prompt lengths as the all-shared run (common random numbers)
    assert [r.arrival_s for r in half] == [r.arrival_s for r in full]
    assert [r.prompt_tokens for r in half] == [r.prompt_tokens for r in full]


# ---------------------------------------------------------------------------- Repurpose's map

REPURPOSE_CONFIG = REPO / "experiments/repurpose/repurpose_regimes.yaml"


def _rag(**changes):
    from skv.workloads import WORKLOADS
    from skv.workloads.zipf_rag import ZipfRagParams

    return WORKLOADS["zipf_rag"](ZipfRagParams(**{"num_requests": 60, "seed": 4, **changes}))


def test_zipf_rag_doc_order_and_docs_first_change_only_the_layout():
    base, ordered, first = _rag(), _rag(doc_order="sorted"), _rag(docs_first=True)
    for b, o, f in zip(base, ordered, first, strict=True):
        assert o.extra["doc_ids"] == sorted(b.extra["doc_ids"])
        assert f.extra == b.extra and f.prompt_tokens == b.prompt_tokens
        types = [s.stype.value for s in f.segments]
        if b.extra["prefix"] == "fixed":  # the fixed prefix does not vary: it stays first
            assert [s.stype for s in f.segments] == [s.stype for s in b.segments]
        else:
            assert types[0] == "retrieved_context" and types[-1] == "user_query"
            assert "system" in types[types.index("retrieved_context") :]


def test_prefix_ceiling_refuses_a_layout_it_does_not_model():
    from skv.workloads.zipf_rag import ZipfRagParams, prefix_ceiling

    for changes in ({"doc_order": "sorted"}, {"docs_first": True}):
        with pytest.raises(ValueError, match="retrieval order"):
            prefix_ceiling(ZipfRagParams(num_requests=10, **changes))


def test_prefix_hits_split_into_head_and_documents():
    from skv.experiments.repurpose import regimes as RR
    from skv.replay import compile_trace

    cfg = RR.load(REPURPOSE_CONFIG, quick=True)
    # every request on the one fixed prefix, a cache that holds everything: the head hits
    # on every request but the first
    reqs = _rag(num_requests=200, fixed_prefix_fraction=1.0, docs_per_request=1)
    trace = compile_trace(reqs, block_size=16, mode="prefix")
    got = RR.replay(RR.keyed(trace), "lru", 10**7)
    assert got["head_hit_rate"] + got["doc_hit_rate"] == pytest.approx(got["token_hit_rate"])
    assert got["head_hit_rate"] == pytest.approx(got["head_share"] * 199 / 200, rel=0.02)
    assert got["doc_hit_rate"] > 0  # popular documents recur behind the one prefix
    # segment keying: several chains per request, no split
    seg = RR.replay(RR.keyed(compile_trace(reqs, block_size=16, mode="segment")), "lru", 10**7)
    assert math.isnan(seg["head_hit_rate"]) and seg["token_hit_rate"] >= got["token_hit_rate"]
    # a small cache cuts hit runs inside documents: the parts still add up, neither negative
    reqs = _rag(num_requests=300, docs_per_request=4, zipf_alpha=1.4)
    small = RR.replay(RR.keyed(compile_trace(reqs, block_size=16, mode="prefix")), "lru", 1500)
    assert small["doc_hit_rate"] > 0
    assert small["head_hit_rate"] >= 0
    assert small["head_hit_rate"] + small["doc_hit_rate"] == pytest.approx(small["token_hit_rate"])
    out = RR.cell(cfg, cfg.settings()[0], 0)
    assert set(out) == {"prefix", "segment"}


def test_repurpose_cells_of_one_workload_build_it_once_and_match_a_fresh_build():
    """The capacity is a shared axis: the second capacity's cell reuses the compiled traces,
    and its numbers equal those of a cell that built them anew."""
    from skv.experiments.repurpose import regimes as RR

    cfg = RR.load(REPURPOSE_CONFIG, quick=True)
    assert RR.RepurposeRegimeConfig.shared_axes == ("capacity",)
    small, big = ({**cfg.settings()[0], "capacity": c} for c in ("30GB", "1TB"))
    params = RR.workload_params(cfg, small, 0)
    assert type(params).model_validate_json(params.model_dump_json()) == params
    RR.keyed_traces.cache_clear()
    first = RR.cell(cfg, small, 0)
    second = RR.cell(cfg, big, 0)
    assert RR.keyed_traces.cache_info().hits == 1  # built once for both capacities
    RR.keyed_traces.cache_clear()
    assert repr(RR.cell(cfg, big, 0)) == repr(second)  # repr: NaN equals NaN
    assert repr(RR.cell(cfg, small, 0)) == repr(first)
    assert second["prefix"]["token_hit_rate"] >= first["prefix"]["token_hit_rate"]


def test_repurpose_map_config_checks():
    import yaml

    from skv.experiments.repurpose import regimes as RR

    cfg = RR.load(REPURPOSE_CONFIG, quick=False)
    assert RR.workload_params(cfg, {"docs_first": True, "capacity": "1TB"}, 3).docs_first
    data = yaml.safe_load(REPURPOSE_CONFIG.read_text())
    data["axes"]["docs_per_request"] = [1, 20000]
    with pytest.raises(ValueError, match="docs_per_request"):
        RR.RepurposeRegimeConfig.model_validate({k: v for k, v in data.items() if k != "quick"})
    data = yaml.safe_load(REPURPOSE_CONFIG.read_text())
    data["baselines"] = ["segment"]
    data["method"] = "prefix"
    data["reference"] = "segment"
    RR.RepurposeRegimeConfig.model_validate({k: v for k, v in data.items() if k != "quick"})
    data["baselines"], data["reference"] = ["lru"], "lru"
    with pytest.raises(ValueError, match="two keyings"):
        RR.RepurposeRegimeConfig.model_validate({k: v for k, v in data.items() if k != "quick"})


# ------------------------------------------------------- saecache's ablation in a cache replay


def test_saecache_ablation_replays_each_variant_and_all_off_is_lru(tmp_path):
    from skv.experiments.replay import capacity as C
    from skv.replay import compile_trace, replay_one, resolve_capacities, trace_totals
    from skv.workloads import make_workload

    reqs = make_workload("sharegpt_like", num_requests=400, seed=2)
    off = {"queue_weights": False, "type_weights": False, "lognormal_timing": False,
           "position_decay": False}  # fmt: skip
    spec = {"policy": "saecache", "capacity": "10%",
            "variants": {"no_timing": {"lognormal_timing": False}, "all_off": off}}  # fmt: skip
    rows = C.ablation_rows(reqs, spec)
    assert list(rows["variant"]) == ["default", "no_timing", "all_off"]
    trace = compile_trace(reqs)
    tot = trace_totals(trace)
    [(_, cap)] = resolve_capacities(["10%"], block_size=trace[0].block_size,
                                    unique_blocks=tot.unique_blocks, model=None)  # fmt: skip
    lru = replay_one(trace, "lru", cap, totals=tot)["block_hit_rate"]
    got = dict(zip(rows["variant"], rows["block_hit_rate"], strict=True))
    assert got["all_off"] == lru  # the priority is 1 / time since last access
    assert got["default"] == replay_one(trace, "saecache", cap, totals=tot)["block_hit_rate"]
    assert got["no_timing"] != got["default"]
    bad = {**spec, "variants": {"typo": {"lognormal_timin": False}}}
    with pytest.raises(ValueError, match="lognormal_timin"):
        C.ablation_rows(reqs, bad)
    cfg = tmp_path / "r.yaml"
    cfg.write_text("id: r\ntrace: x.jsonl\npolicies: [lru]\ncapacities: ['1%']\n"
                   "ablation: {policy: saecache, capacity: '10%', variants: {}}\n")  # fmt: skip
    from skv.experiments.config import ConfigError

    with pytest.raises(ConfigError, match=r"ablation\.variants"):
        C.load_replay_config(cfg, quick=False)
