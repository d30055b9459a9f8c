"""The SAECache study: its configs load, its paired numbers are computed as stated (hand-checked
on tiny synthetic runs), the fixed-parameter fits are filled in, and its figures pass the
figure check."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from skv.experiments.config import load_config
from skv.experiments.plotstyle import check_figure, save_figure
from skv.experiments.saecache import figures as F
from skv.experiments.saecache import numbers as N
from skv.experiments.saecache import reuse as R
from skv.experiments.saecache import study as S

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "saecache"
SEEDS = (0, 1, 2)
T975 = float(stats.t.ppf(0.975, len(SEEDS) - 1))


# ----------------------------------------------------------------------------------------
# configs


def test_every_config_loads_with_a_title_and_five_seeds():
    # the regime map's config is read by skv.experiments.saecache.regimes (test_regimes.py)
    # the regime map's and the equal-tuning configs are read by their own modules
    # (tests/test_regimes.py, tests/test_equal_tuning.py)
    other = {"saecache_regimes.yaml", "saecache_tuning.yaml"}
    paths = sorted(p for p in CONFIGS.rglob("*.yaml") if p.name not in other)
    assert len(paths) == 14 + 5 + 1
    for p in paths:
        cfg = load_config(p)
        assert cfg.title and len(cfg.title) <= 36, p.name  # the run plots' titles must fit
        assert cfg.latency.name == "roofline", p.name
        assert cfg.latency.params == {"model": "qwen2.5-1.5b", "gpu": "A40"}, p.name
        assert cfg.capacities == ["20%"], p.name
        if p.name != "learned_params.yaml":
            assert cfg.seeds == [0, 1, 2, 3, 4], p.name
        assert "capacity" in cfg.description.lower() or "20%" in cfg.description, p.name


def test_the_grid_is_every_workload_at_both_halves_of_the_papers_interval():
    grid = [load_config(p) for p in S.config_paths(S.GRID_DIR)]
    settings = {
        (
            c.workload.name,
            c.workload.params["arrival_min_s"],
            c.workload.params["arrival_max_s"],
        )
        for c in grid
    }
    workloads = {w for w, _, _ in settings}
    assert workloads == set(N.WORKLOAD_TITLES)
    assert settings == {(w, a, b) for w in workloads for a, b in ((0.02, 0.05), (0.05, 0.08))}
    baselines = {"vllm", "lru", "sglang_lru", "lfu", "gdsf", "static_semantic"}
    for c in grid:
        keys = [p.key for p in c.policies]
        assert baselines | {"adaptive_semantic", "saecache", "belady"} == set(keys), c.id


def test_the_ablation_switches_one_component_off_per_variant():
    cfg = load_config(CONFIGS / "ablation" / "ablation_balanced.yaml")
    variants = {p.key: p.params for p in cfg.policies if p.key in N.ABLATIONS}
    assert set(variants) == set(N.ABLATIONS)
    switches = {"queue_weights", "type_weights", "lognormal_timing", "position_decay"}
    for params in variants.values():
        assert len(params) == 1 and set(params) <= switches and not any(params.values())
    assert {next(iter(p)) for p in variants.values()} == switches


def test_quick_keeps_two_seeds_and_fewer_requests_in_the_config_itself():
    path = S.config_paths(S.GRID_DIR)[0]
    full, quick = S.study_config(path, quick=False), S.study_config(path, quick=True)
    assert full.seeds == [0, 1, 2, 3, 4] and quick.seeds == [0, 1]
    assert quick.workload.params["num_requests"] == S.QUICK_REQUESTS < 2000
    assert quick.workload.params["arrival_min_s"] == full.workload.params["arrival_min_s"]


# ----------------------------------------------------------------------------------------
# fixed-parameter fits


def _metrics_row() -> dict[str, float]:
    from skv.model import TYPES
    from skv.policies.saecache import QUEUES

    row = {f"alpha_{q}": 0.5 + i for i, q in enumerate(QUEUES)}
    row |= {f"w_{t.value}": 1.0 + i / 10 for i, t in enumerate(TYPES)}
    row |= {"mu_chat": 1.5, "mu_agentic": 1.7, "sigma_chat": 0.9, "sigma_agentic": 1.1}
    return row | {"gamma": 0.4, "time_s": 3.0, "replica": 0}


def test_fixed_params_come_from_the_metrics_row_and_build_saecache_fixed():
    from skv.policies.registry import make_cache

    params = S.fixed_params_from_metrics(_metrics_row())
    assert params["alpha"] == {"evict_first": 0.5, "chat": 1.5, "agentic": 2.5, "structural": 3.5}
    assert params["mu"] == {"chat": 1.5, "agentic": 1.7}
    assert params["sigma"] == {"chat": 0.9, "agentic": 1.1}
    assert params["gamma"] == 0.4 and params["weights"]["system"] == 1.0
    policy = make_cache("saecache_fixed", 8, params).policy
    assert policy.fitted() == params


def test_fit_entries_get_fitted_params_and_others_stay(monkeypatch):
    seen = []

    def fake_fit(config, workload):
        seen.append(workload)
        return S.fixed_params_from_metrics(_metrics_row())

    monkeypatch.setattr(S, "fit_fixed_params", fake_fit)
    cfg = load_config(CONFIGS / "ablation" / "mismatch_tool_use.yaml")
    filled, fits = S.with_fits(cfg)
    assert sorted(seen) == ["sharegpt_like", "tool_use"]
    assert set(fits) == {"fit_tool_use", "fit_sharegpt_like"}
    by_key = {p.key: p for p in filled.policies}
    assert by_key["fit_sharegpt_like"].params == fits["fit_sharegpt_like"]
    assert by_key["saecache"].params == {}


def test_a_fit_is_a_real_saecache_run_on_the_other_workload_at_the_fit_seed():
    cfg = S.replace_fields(
        S.study_config(CONFIGS / "ablation" / "mismatch_tool_use.yaml", quick=True),
        workload={"name": "tool_use", "params": {"num_requests": 120}},
    )
    fit_cfg = S.fit_config(cfg, "sharegpt_like")
    assert fit_cfg.workload.name == "sharegpt_like" and fit_cfg.seeds == [S.FIT_SEED]
    assert S.FIT_SEED not in cfg.seeds
    params = S.fit_fixed_params(cfg, "sharegpt_like")
    assert params == S.fit_fixed_params(cfg, "sharegpt_like")  # deterministic
    assert set(params) == {"alpha", "weights", "mu", "sigma", "gamma"}


# ----------------------------------------------------------------------------------------
# the numbers, on tiny synthetic runs


def _doc(exp: str, workload: str, values: dict[str, list[tuple[float, ...]]]) -> dict:
    """A results document: ``values[policy]`` = per seed (mean TTFT, p99 TTFT, hit rate)."""
    runs = []
    for pol, per_seed in values.items():
        for seed, (mean, p99, hit) in zip(SEEDS, per_seed, strict=True):
            runs.append(
                {
                    "experiment": exp,
                    "policy": pol,
                    "policy_name": pol,
                    "offline": pol == "belady",
                    "capacity": "20%",
                    "seed": seed,
                    "ttft_ms_mean": mean,
                    "ttft_ms_p99": p99,
                    "token_hit_rate": hit,
                }
            )
    return {
        "experiment": exp,
        "config": {
            "workload": {
                "name": workload,
                "params": {"arrival_min_s": 0.02, "arrival_max_s": 0.05},
            },
            "latency": {"params": {"model": "qwen2.5-1.5b", "gpu": "A40"}},
        },
        "runs": runs,
        "traces": [{"seed": s, "requests": 100} for s in SEEDS],
    }


@pytest.fixture
def grid() -> list[dict]:
    a = _doc(
        "saecache_balanced_fast",
        "balanced",
        {
            "vllm": [(100, 400, 0.3), (200, 400, 0.3), (300, 400, 0.3)],
            "lru": [(100, 400, 0.4), (200, 400, 0.4), (300, 400, 0.4)],
            "lfu": [(90, 400, 0.45), (190, 400, 0.55), (290, 400, 0.65)],
            "saecache": [(50, 200, 0.5), (100, 200, 0.6), (150, 200, 0.7)],
            "belady": [(25, 100, 0.9), (50, 100, 0.9), (75, 100, 0.9)],
        },
    )
    b = _doc(
        "saecache_tool_use_fast",
        "tool_use",
        {
            "vllm": [(100, 100, 0.3), (100, 100, 0.3), (100, 100, 0.3)],
            "lru": [(80, 100, 0.6), (80, 100, 0.6), (80, 100, 0.6)],
            "lfu": [(100, 100, 0.5), (100, 100, 0.5), (100, 100, 0.5)],
            "saecache": [(100, 100, 0.5), (50, 100, 0.6), (25, 100, 0.7)],
            "belady": [(20, 50, 0.8), (20, 50, 0.8), (20, 50, 0.8)],
        },
    )
    return [a, b]


def _t(per_seed: list[float]) -> tuple[float, float, float]:
    """Mean and Student-t 95% interval, by hand."""
    n = len(per_seed)
    m = sum(per_seed) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in per_seed) / (n - 1))
    return m, m - T975 * sd / math.sqrt(n), m + T975 * sd / math.sqrt(n)


def _close(got: dict, per_seed: list[float]) -> None:
    m, lo, hi = _t(per_seed)
    assert got["n"] == len(per_seed)
    assert got["value"] == pytest.approx(m)
    assert got["ci95"] == pytest.approx([lo, hi])


def test_speedup_is_vllm_over_policy_paired_per_seed(grid):
    a, b = grid
    _close(N.speedup(a, "saecache"), [2.0, 2.0, 2.0])
    _close(N.speedup(b, "saecache"), [1.0, 2.0, 4.0])
    _close(N.speedup(a, "saecache", "ttft_ms_p99"), [2.0, 2.0, 2.0])


def test_geomean_speedup_takes_the_geometric_mean_over_settings_per_seed(grid):
    got = N.geomean_speedup(grid, "saecache")
    _close(got, [math.sqrt(2 * 1), math.sqrt(2 * 2), math.sqrt(2 * 4)])


def test_hit_points_are_paired_differences_averaged_over_settings(grid):
    a, b = grid
    _close(N.hit_pts(a, "saecache", "lfu"), [5.0, 5.0, 5.0])
    _close(N.hit_pts(b, "saecache", "lru"), [-10.0, 0.0, 10.0])
    _close(N.mean_hit_pts(grid, "saecache", "lru"), [(10 - 10) / 2, (20 + 0) / 2, (30 + 10) / 2])
    # mean hit over both settings: lru (0.4 + 0.6) / 2 = 0.5, lfu (0.55 + 0.5) / 2 = 0.525
    assert N.strongest_overall(grid) == "lfu"
    assert N.best_by(b, "token_hit_rate") == "lru"
    assert N.best_by(a, "ttft_ms_mean", exclude=("saecache", "vllm")) == "lfu"


def test_claim_values_name_every_setting_and_baseline(grid):
    ttft = N.ttft_values(grid)
    assert ttft["best_setting"] == "tool_use_fast"  # mean speedup 7/3 against 2
    hit = N.hit_values(grid)
    assert hit["strongest_baseline"] == "lfu"
    assert hit["best_baseline_balanced_fast"] == "lfu"
    _close(hit["hit_pts_vs_best_tool_use_fast"], [-10.0, 0.0, 10.0])
    _close(hit["belady_vs_saecache_hit_pts"], [(40 + 30) / 2, (30 + 20) / 2, (20 + 10) / 2])
    assert {"ttft_mean_speedup_geomean", "lru_ttft_p99_speedup_geomean"} <= set(ttft)


def test_a_paired_comparison_refuses_different_seeds(grid):
    a = grid[0]
    a["runs"] = [r for r in a["runs"] if not (r["policy"] == "lru" and r["seed"] == 2)]
    with pytest.raises(ValueError, match="same seeds"):
        N.hit_pts(a, "saecache", "lru")


def test_ablation_is_the_ttft_increase_of_each_variant_over_full_saecache():
    base = [(100, 0, 0.5)] * 3
    doc = _doc(
        "saecache_ablation_balanced",
        "balanced",
        {
            "saecache": base,
            "no_queue_weights": [(110, 0, 0.4), (120, 0, 0.45), (130, 0, 0.5)],
            "no_timing": [(90, 0, 0.5), (95, 0, 0.5), (100, 0, 0.5)],
        },
    )
    values = N.ablation_values(doc)
    _close(values["ablation_no_queue_weights_ttft_pct"], [10.0, 20.0, 30.0])
    _close(values["ablation_no_queue_weights_hit_pts"], [-10.0, -5.0, 0.0])
    _close(values["ablation_no_timing_ttft_pct"], [-10.0, -5.0, 0.0])
    assert list(N.ablation_rows(doc)["component"]) == ["queue weights", "log-normal timing"]


def test_mismatch_is_the_mismatched_fit_over_the_matched_one():
    doc = _doc(
        "saecache_mismatch_tool_use",
        "tool_use",
        {
            "saecache": [(100, 0, 0.5)] * 3,
            "fit_tool_use": [(100, 0, 0.5), (110, 0, 0.5), (120, 0, 0.5)],
            "fit_sharegpt_like": [(150, 0, 0.5), (220, 0, 0.5), (300, 0, 0.5)],
        },
    )
    values = N.mismatch_values([doc])
    _close(values["mismatch_tool_use_ttft_ratio"], [1.5, 2.0, 2.5])
    _close(values["fixed_tool_use_vs_adaptive_ttft_ratio"], [1.0, 1.1, 1.2])
    _close(values["mismatched_tool_use_vs_adaptive_ttft_ratio"], [1.5, 2.2, 3.0])
    assert values["mismatch_tool_use_fitted_on"] == "sharegpt_like"
    other = _doc(
        "saecache_mismatch_sharegpt_like",
        "sharegpt_like",
        {
            "saecache": [(100, 0, 0.5)] * 3,
            "fit_sharegpt_like": [(100, 0, 0.5)] * 3,
            "fit_tool_use": [(300, 0, 0.5), (100, 0, 0.5), (200, 0, 0.5)],
        },
    )
    worst = N.mismatch_values([doc, other])["mismatch_worst_ttft_ratio"]
    _close(worst, [max(1.5, 3.0), max(2.0, 1.0), max(2.5, 2.0)])


def test_reuse_values_and_the_system_prompt_margin():
    def run(seed, system, user, history):
        return {
            "seed": seed,
            "prompt_tokens": 100,
            "prompt_tokens_by_type": {"system": 50, "user_query": 30, "assistant_history": 20},
            "hit_rate_by_type": {
                "system": system,
                "user_query": user,
                "assistant_history": history,
            },
            "evictions": 0,
        }

    docs = [
        {
            "config": {"workload": {"name": "balanced"}},
            "runs": [run(0, 0.9, 0.3, 0.5), run(1, 0.8, 0.4, 0.2), run(2, 0.9, 0.3, 0.3)],
        },
        {
            "config": {"workload": {"name": "tool_use"}},
            "runs": [run(0, 0.95, 0.1, 0.2), run(1, 0.9, 0.2, 0.1), run(2, 0.8, 0.7, 0.1)],
        },
    ]
    values = R.reuse_values(docs)
    assert values["reuse_system_balanced"]["value"] == pytest.approx(2.6 / 3)
    # per seed, the smaller over workloads of system minus the best other paper type (points)
    _close(values["system_reuse_margin_pts"], [min(40, 75), min(40, 70), min(60, 10)])
    table = R.reuse_table(R.reuse_rows(docs))
    assert list(table["token type"][:5]) == [
        "system prompt",
        "user query",
        "model response",
        "tool output",
        "chain of thought",
    ]
    assert table.loc[0, "Balanced"] == pytest.approx(100 * 2.6 / 3)
    assert table.loc[0, "paper %"] == 92.3
    assert math.isnan(table.loc[4, "Balanced"])  # no reasoning tokens
    # no real trace: its column is there, empty
    assert table[R.REAL_TITLE].isna().all() and list(table.columns)[-1] == R.REAL_TITLE
    real = {"system": 0.98, "user_query": 0.01, "tool_schema": 0.97}
    with_real = R.reuse_table(R.reuse_rows(docs), real)
    col = dict(zip(with_real["skv type"], with_real[R.REAL_TITLE], strict=True))
    assert col["system"] == pytest.approx(98.0) and col["user_query"] == pytest.approx(1.0)
    assert col["tool_schema"] == pytest.approx(97.0)  # a type only the real trace has: a row
    assert math.isnan(col["assistant_history"])  # the trace has none of those tokens


def test_the_real_column_says_where_to_get_a_missing_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    real, why = R.real_trace_rates(quick=True)
    assert real is None and "kv-cache-tester" in why


# ----------------------------------------------------------------------------------------
# figures


def test_every_figure_passes_the_check(grid, tmp_path):
    abl = pd.DataFrame(
        {
            "variant": list(N.ABLATIONS),
            "component": list(N.ABLATIONS.values()),
            "ttft_pct": [10.0, 2.0, -3.0, 4.0],
            "ttft_ci_low": [5.0, 1.0, -6.0, 1.0],
            "ttft_ci_high": [15.0, 3.0, 0.5, 6.0],
        }
    )
    mism = pd.DataFrame(
        {
            "target": ["tool_use", "tool_use"],
            "fitted_on": ["tool_use", "sharegpt_like"],
            "variant": ["matched", "mismatched"],
            "value": [1.0, 1.2],
            "ci_low": [0.9, 1.1],
            "ci_high": [1.1, 1.3],
        }
    )
    series = pd.DataFrame(
        [{**_metrics_row(), "time_s": float(t), "gamma": 1 / (t + 1)} for t in range(20)]
    )
    figs = {
        "ttft": F.ttft_ratio_figure(N.ttft_rows(grid), "TTFT: " + N.describe(grid)),
        "hit": F.hit_vs_best_figure(N.hit_rows(grid), "Hit rate"),
        "ablation": F.ablation_figure(abl, mism, "Ablation"),
        "learned": F.learned_params_figure(series, "Learned"),
    }
    for name, fig in figs.items():
        pdf, png = save_figure(fig, tmp_path, name)
        assert pdf.stat().st_size > 1000 and png.stat().st_size > 1000
    check_figure(F.learned_params_figure(series, types=["system", "user_query"]), "types")
