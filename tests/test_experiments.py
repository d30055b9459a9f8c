"""Experiment configs, runner, reports and plots (``skv run`` / ``skv run-all``)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from skv.cli import build_parser, main
from skv.experiments.config import ConfigError, config_from_dict, load_config
from skv.experiments.report import claim_verdict, standing, summary_markdown
from skv.experiments.runner import (
    OUTPUT_FILES,
    PLOT_FILES,
    QUICK_MIN,
    RUN_COLUMNS,
    aggregate_runs,
    compare_policies,
    run_all,
    run_experiment,
    simulate_experiment,
    workload_params,
)
from skv.experiments.stats import BOOTSTRAP_SEED, N_RESAMPLES, bootstrap_ci, mean_ci, paired_diff

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments" / "semantickv"
SMOKE = EXPERIMENTS / "smoke.yaml"
STRESS = [
    "low_memory_rag_stress",
    "shared_system_prompt_high_reuse",
    "tool_agent_session_reuse",
    "legal_review_long_context",
    "workload_shift_static_vs_adaptive",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def smoke_data() -> dict:
    return yaml.safe_load(SMOKE.read_text())


def write_config(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ----------------------------------------------------------------------------------------
# config validation


def test_shipped_configs_are_valid_and_the_stress_suite_is_complete():
    paths = list(EXPERIMENTS.glob("*.yaml"))
    names = {p.stem for p in paths}
    assert set(STRESS) <= names
    for path in paths:
        cfg = load_config(path)
        assert cfg.id == path.stem
        assert cfg.latency.name
    assert load_config(SMOKE).in_suite is False
    assert all(load_config(EXPERIMENTS / f"{n}.yaml").in_suite for n in STRESS)


def _error(tmp_path: Path, data: dict) -> str:
    path = write_config(tmp_path, "bad", data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg, msg  # every error names the file
    return msg


def test_unknown_keys_are_rejected_naming_file_and_field(tmp_path):
    data = smoke_data()
    data["polcies"] = data["policies"]
    msg = _error(tmp_path, data)
    assert "polcies" in msg and "unknown key" in msg

    data = smoke_data()
    data["latency"]["paramz"] = {}
    msg = _error(tmp_path, data)
    assert "latency.paramz" in msg and "unknown key" in msg

    data = smoke_data()
    data["batch"]["max_batch"] = 10
    assert "batch.max_batch" in _error(tmp_path, data)


def test_a_bad_policy_name_or_parameter_names_the_entry(tmp_path):
    data = smoke_data()
    data["policies"] = ["lru", "lruu"]
    msg = _error(tmp_path, data)
    assert "policies[1]" in msg and "lruu" in msg and "adaptive_semantic" in msg  # lists known

    data = smoke_data()
    data["policies"] = [{"name": "adaptive_semantic", "params": {"eta": 7}}]
    msg = _error(tmp_path, data)
    assert "policies[0]" in msg and "eta" in msg

    data = smoke_data()
    data["policies"] = ["lru", "lru"]
    assert "duplicate" in _error(tmp_path, data)


def test_a_bad_capacity_names_the_field_and_value(tmp_path):
    data = smoke_data()
    data["capacities"] = ["10%", "12 parsecs"]
    msg = _error(tmp_path, data)
    assert "capacities" in msg and "12 parsecs" in msg

    data = smoke_data()
    data["capacities"] = ["150%"]
    assert "150%" in _error(tmp_path, data)

    data = smoke_data()
    data["capacities"] = ["30GB"]  # bytes need a model preset
    assert "model" in _error(tmp_path, data)


def test_workload_latency_and_seed_errors_name_the_field(tmp_path):
    data = smoke_data()
    data["workload"]["params"]["num_requestz"] = 5
    msg = _error(tmp_path, data)
    assert "workload" in msg and "num_requestz" in msg

    data = smoke_data()
    data["workload"]["name"] = "no_such_workload"
    msg = _error(tmp_path, data)
    assert "workload.name" in msg and "rag" in msg

    data = smoke_data()
    data["workload"]["params"]["seed"] = 3
    assert "seeds" in _error(tmp_path, data)

    data = smoke_data()
    data["latency"] = {"name": "linear", "params": {"base_ms": 1}}
    assert "base_ms" in _error(tmp_path, data)

    data = smoke_data()
    data["seeds"] = [1, 1]
    assert "seeds" in _error(tmp_path, data)


def test_yaml_problems_give_file_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(SMOKE.read_text() + "\nseeds: [5]\n")
    with pytest.raises(
        ConfigError,
        match=r"dup\.yaml: invalid YAML \(line \d+, column \d+\): duplicate key 'seeds'",
    ):
        load_config(path)
    path.write_text("id: x\npolicies: [lru\n")
    with pytest.raises(ConfigError, match=r"invalid YAML \(line"):
        load_config(path)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")


def test_quick_scales_requests_down_with_a_floor():
    cfg = load_config(EXPERIMENTS / "low_memory_rag_stress.yaml")
    full = cfg.workload.params["num_requests"]
    params = workload_params(cfg, 7, quick=True)
    assert params["seed"] == 7
    assert QUICK_MIN <= params["num_requests"] < full
    assert workload_params(cfg, 7, quick=False)["num_requests"] == full


# ----------------------------------------------------------------------------------------
# statistics and verdicts


def test_paired_differences_keep_the_student_t_interval():
    s = paired_diff([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert s["mean"] == pytest.approx(2.0)
    # t(0.975, 2) = 4.302653; std 1; half width 4.302653 / sqrt(3)
    assert s["ci95_high"] - s["mean"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert s["mean"] - s["ci95_low"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    one = paired_diff([5.0], [1.0])
    assert one["mean"] == 4.0 and one["ci95_low"] is None and one["std"] is None
    assert mean_ci([])["mean"] is None


# a skewed, positive latency sample (ms): one slow seed, as TTFT has under queueing
SKEWED_TTFT = [120.0, 135.0, 2400.0]


def test_a_latency_interval_never_leaves_the_positive_sample():
    s = mean_ci(SKEWED_TTFT)
    # the Student-t interval of this sample starts at about -2,184 ms
    assert s["ci95_low"] >= min(SKEWED_TTFT) > 0
    assert s["ci95_high"] <= max(SKEWED_TTFT)
    assert s["ci95_low"] <= s["mean"] <= s["ci95_high"]
    wide = mean_ci([3.0, 5.0, 8.0, 13.0, 21.0, 400.0])
    assert min([3.0, 5.0, 8.0, 13.0, 21.0, 400.0]) <= wide["ci95_low"] < wide["mean"]


def test_the_level_interval_is_scipys_bootstrap_percentile_with_the_fixed_seed():
    import numpy as np
    from scipy import stats

    values = [10.0, 12.5, 11.0, 30.0, 9.5, 14.25, 8.75, 19.0, 10.5, 13.0]
    direct = stats.bootstrap(
        (np.asarray(values),),
        np.mean,
        confidence_level=0.95,
        method="percentile",
        n_resamples=N_RESAMPLES,
        vectorized=True,
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval
    s = mean_ci(values)
    assert (s["ci95_low"], s["ci95_high"]) == (float(direct.low), float(direct.high))
    # deterministic: same values, same interval on every call (tables stay byte-identical)
    assert [mean_ci(values) for _ in range(3)] == [s, s, s]
    assert bootstrap_ci(values, seed=BOOTSTRAP_SEED + 1) != (s["ci95_low"], s["ci95_high"])


def test_one_seed_or_identical_values_give_the_value_without_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = mean_ci([5.0])
        same = mean_ci([0.1, 0.1, 0.1])
        triple = bootstrap_ci([0.1, 0.1, 0.1])
        single = bootstrap_ci([5.0])  # scipy refuses one observation
    assert (one["ci95_low"], one["ci95_high"], one["std"]) == (5.0, 5.0, None)
    # exactly the value (a resampled mean of 0.1s is 0.10000000000000002)
    assert (same["mean"], same["ci95_low"], same["ci95_high"], same["std"]) == (0.1, 0.1, 0.1, 0.0)
    assert triple == (0.1, 0.1) and single == (5.0, 5.0)
    assert bootstrap_ci([]) is None


def _fake_doc(
    adaptive: list[float], lru: list[float], extra: dict[str, dict] | None = None
) -> dict:
    data = smoke_data()
    data["policies"] = ["lru", "adaptive_semantic", "belady"]
    data["seeds"] = [0, 1, 2]
    data["seed_claim"] = {"winner": "adaptive_semantic", "text": "adaptive wins"}
    cfg = config_from_dict(data)
    runs = []
    for pol, values in (("lru", lru), ("adaptive_semantic", adaptive), ("belady", [1, 1, 1])):
        for seed, v in zip(cfg.seeds, values, strict=True):
            run = {k: 0.0 for k in RUN_COLUMNS}
            run.update(
                policy=pol,
                policy_name=pol,
                offline=pol == "belady",
                capacity="50%",
                capacity_blocks=100,
                seed=seed,
                ttft_ms_mean=float(v),
                token_hit_rate=1.0 / v,
                hit_rate_by_type={},
                evictions_by_type={},
            )
            run.update((extra or {}).get(pol, {}))
            runs.append(run)
    return {
        "experiment": "fake",
        "description": "",
        "simulated": "simulated by the 'linear' latency model",
        "latency": {"model": "linear", "formula": "f", "constants": {}},
        "quick": False,
        "config": cfg.model_dump(mode="json"),
        "traces": [{"seed": s, "requests": 10, "unique_blocks": 500} for s in cfg.seeds],
        "runs": runs,
        "aggregate": aggregate_runs(runs, cfg),
        "comparisons": compare_policies(runs, cfg),
        "series": {"seed": 0, "memory": [], "weights": []},
    }


def test_a_seed_claim_that_fails_is_reported_as_not_reproduced():
    doc = _fake_doc(adaptive=[12.0, 13.0, 14.0], lru=[10.0, 11.0, 12.0])
    verdict, lines = claim_verdict(doc)
    assert verdict.startswith("NOT reproduced")
    assert "`lru` is best" in lines[0] and "+2.0" in lines[0]
    md = summary_markdown(doc)
    assert "NOT reproduced" in md and "adaptive wins" in md
    assert "`belady` *(offline reference)*" in md
    # Belady (1 ms) is never the winner, only a reference
    assert "Lowest mean TTFT (ms) (online policies): `lru`" in md


def test_a_seed_claim_that_holds_and_ties_are_reported_as_such():
    verdict, _ = claim_verdict(_fake_doc(adaptive=[9.0, 10.0, 11.5], lru=[10.0, 11.0, 12.0]))
    assert verdict == "reproduced at all 1 capacities"
    verdict, lines = claim_verdict(_fake_doc(adaptive=[10.0, 11.0, 12.0], lru=[10.0, 11.0, 12.0]))
    assert "tied" in lines[0]
    md = summary_markdown(_fake_doc(adaptive=[10.0, 11.0, 12.0], lru=[10.0, 11.0, 12.0]))
    assert "tie between" in md


ADAPTIVE_TYPES = {
    "adaptive_semantic": {
        "hit_rate_by_type": {"retrieved_context": 0.71, "system": 0.95},
        "prompt_tokens_by_type": {"retrieved_context": 10_000, "system": 2_000},
        "evictions_by_type": {"output": 40, "retrieved_context": 300, "system": 5},
        "initial_weights": {"output": 1.0, "retrieved_context": 4.0, "system": 8.0},
        "final_weights": {"output": 1.0, "retrieved_context": 5.2, "system": 6.0},
    },
    "lru": {
        "hit_rate_by_type": {"retrieved_context": 0.74, "system": 0.90},
        "prompt_tokens_by_type": {"retrieved_context": 10_000, "system": 2_000},
        "evictions_by_type": {"output": 35, "retrieved_context": 250, "system": 20},
    },
}


def test_when_adaptive_loses_the_summary_says_why_from_the_data():
    md = summary_markdown(_fake_doc([12.0, 13.0, 14.0], [10.0, 11.0, 12.0], ADAPTIVE_TYPES))
    assert "### Why `adaptive_semantic` does not win at `50%` (vs `lru`)" in md
    why = md.split("### Why")[1].split("## ")[0]
    # per-type hit rates side by side, in points, weighted by each type's share of the prompt
    assert (
        "| `retrieved_context` | 83.3% | 71.0% | 74.0% | -3.0 pts | 300 | 250 | 4.00 → 5.20 |"
        in why
    )
    assert "| `system` | 16.7% | 95.0% | 90.0% | +5.0 pts | 5 | 20 | 8.00 → 6.00 |" in why
    assert "| `output` | - | - | - | - | 40 | 35 | 1.00 → 1.00 |" in why
    # 10,000 * -3 pts + 2,000 * +5 pts: -300 on retrieved_context, +100 on system, -200 in all
    assert "hits 200 fewer prompt tokens than `lru`" in why
    assert "fewer on `retrieved_context` (-300, -3.0 pts); more on `system` (+100, +5.0 pts)" in why
    assert "`retrieved_context` +50" in why and "`system` -15" in why
    assert "the type it loses most tokens on, rose (4.00 → 5.20)" in why
    assert why.count("\n- ") <= 4  # compact: a table and at most four bullets


def test_no_why_section_where_adaptive_wins_or_ties():
    won = summary_markdown(_fake_doc([9.0, 10.0, 11.5], [10.0, 11.0, 12.0], ADAPTIVE_TYPES))
    assert "reproduced" in won and "### Why" not in won
    tied = summary_markdown(_fake_doc([10.0, 11.0, 12.0], [10.0, 11.0, 12.0], ADAPTIVE_TYPES))
    assert "### Why" not in tied


def test_a_forced_adaptive_loss_gets_a_why_section_end_to_end():
    # adaptive_semantic told to evict shared system prompts and documents first, and not to
    # learn (eta 0): it must keep fewer of them than lru
    data = smoke_data()
    data["workload"] = {
        "name": "rag",
        "params": {"num_requests": 120, "rate_rps": 1.0, "catalogue_size": 50},
    }
    inverted = {"system": 0.01, "retrieved_context": 0.01, "user_query": 100.0, "output": 100.0}
    data["policies"] = [
        "lru",
        {"name": "adaptive_semantic", "params": {"eta": 0.0, "initial_weights": inverted}},
    ]
    data.update(keying="segment", capacities=["25%"])
    doc = simulate_experiment(config_from_dict(data))
    assert standing(doc, "25%", "ttft_ms_mean", "adaptive_semantic")["status"] in (
        "worse",
        "within_noise",
    )
    md = summary_markdown(doc)
    assert "### Why `adaptive_semantic` does not win at `25%` (vs `lru`)" in md
    assert "fewer prompt tokens than `lru`" in md and "fewer on `system`" in md
    runs = [r for r in doc["runs"] if r["policy"] == "adaptive_semantic"]
    assert all(r["initial_weights"]["system"] == 0.01 for r in runs)
    assert all(r["final_weights"]["system"] == pytest.approx(0.01) for r in runs)
    for r in doc["runs"]:
        assert all(0.0 <= v <= 1.0 for v in r["block_hit_rate_by_type"].values())
        assert sum(r["prompt_tokens_by_type"].values()) == r["prompt_tokens"]


# ----------------------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    rc = main(["run", str(SMOKE), "--output-root", str(root)])
    assert rc == 0
    (first,) = root.iterdir()
    second = run_experiment(SMOKE, root)
    assert second != first
    return first, second


def test_skv_run_writes_every_output(smoke_runs):
    out, _ = smoke_runs
    assert out.name.endswith("_smoke")
    for name in OUTPUT_FILES:
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name
    for name in PLOT_FILES:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name

    doc = json.loads((out / "results.json").read_text())
    assert doc["experiment"] == "smoke"
    assert "SIMULATED" in doc["simulated"] and doc["latency"]["model"] == "linear"
    assert len(doc["runs"]) == 2 * 1 * 2  # policies x capacities x seeds
    assert {r["policy"] for r in doc["runs"]} == {"lru", "adaptive_semantic"}
    assert doc["series"]["weights"], "adaptive weights over time are recorded"

    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(RUN_COLUMNS)
    assert len(rows) == 4
    assert {(r["policy"], r["seed"]) for r in rows} == {
        (p, s) for p in ("lru", "adaptive_semantic") for s in ("0", "1")
    }
    for r in rows:
        assert r["latency_model"] == "linear"
        assert 0.0 <= float(r["token_hit_rate"]) <= 1.0
        assert float(r["ttft_ms_mean"]) > 0
        assert int(r["cached_tokens"]) + int(r["computed_tokens"]) == int(r["prompt_tokens"])

    summary = (out / "summary.md").read_text()
    assert summary.startswith("# Smoke test (experiment `smoke`)\n")
    assert "simulated" in summary.lower() and "`linear` latency model" in summary
    # the "why" section exactly where adaptive_semantic is not clearly the best
    status = standing(doc, "50%", "ttft_ms_mean", "adaptive_semantic")["status"]
    assert ("### Why `adaptive_semantic`" in summary) == (status not in ("best", "tied"))
    (adaptive,) = [r for r in doc["aggregate"] if r["policy"] == "adaptive_semantic"]
    assert set(adaptive["final_weights"]) == set(adaptive["initial_weights"]) >= {"system"}
    assert "mean [95% CI] over 2 seeds (bootstrap percentile" in summary
    log = (out / "run.log").read_text()
    assert "total" in log and " s" in log


def test_two_seeds_give_confidence_intervals(smoke_runs):
    out, _ = smoke_runs
    with (out / "metrics_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2  # policies x capacities
    for r in rows:
        assert r["n_seeds"] == "2"
        for m in ("ttft_ms_mean", "token_hit_rate", "cached_tokens"):
            lo, mean, hi = (float(r[f"{m}_{p}"]) for p in ("ci95_low", "mean", "ci95_high"))
            assert lo <= mean <= hi
    doc = json.loads((out / "results.json").read_text())
    agg = doc["aggregate"][0]["ttft_ms_mean"]
    assert agg["n"] == 2 and agg["ci95_low"] is not None


def test_the_same_config_gives_byte_identical_results(smoke_runs):
    a, b = smoke_runs
    for name in ("results.json", "metrics.csv", "metrics_summary.csv", "summary.md"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    text = (a / "results.json").read_text()
    assert a.name not in text and "started" not in text  # no paths or timestamps inside


def test_run_all_writes_the_aggregate(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    for name, policies in (("tiny_a", ["lru", "belady"]), ("tiny_b", ["fifo", "lru"])):
        data = smoke_data()
        data.update(id=name, policies=policies, seeds=[0], in_suite=True)
        data["workload"]["params"]["num_requests"] = 60
        write_config(configs, name, data)
    hidden = smoke_data()
    hidden.update(id="not_in_suite", in_suite=False)
    write_config(configs, "not_in_suite", hidden)

    out = tmp_path / "out"
    rc = main(["run-all", "--config-dir", str(configs), "--output-root", str(out)])
    assert rc == 0
    run_dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(run_dirs) == 2 and not any("not_in_suite" in d for d in run_dirs)
    with (out / "aggregate_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["experiment"] for r in rows} == {"tiny_a", "tiny_b"}
    assert len(rows) == 4
    belady = [r for r in rows if r["policy"] == "belady"]
    assert belady[0]["offline"] == "True" and belady[0]["best_online_ttft"] == "False"
    assert sum(r["best_online_ttft"] == "True" for r in rows) == 2  # one winner per experiment
    md = (out / "aggregate_summary.md").read_text()
    assert "Simulated, not measured" in md and "linear" in md
    assert "tiny_a" in md and "tiny_b" in md


def test_run_all_reads_explicit_configs_and_rejects_duplicate_ids(tmp_path):
    a = write_config(tmp_path, "a", {**smoke_data(), "id": "same"})
    b = write_config(tmp_path, "b", {**smoke_data(), "id": "same"})
    with pytest.raises(ValueError, match="same"):
        run_all([a, b], tmp_path / "out")


def test_cli_help_mentions_the_options(capsys):
    parser = build_parser()
    for cmd in ("run", "run-all"):
        with pytest.raises(SystemExit):
            parser.parse_args([cmd, "--help"])
        out = capsys.readouterr().out
        assert "--output-root" in out and "--quick" in out and "outputs/experiments" in out
    assert main(["run", str(SMOKE.with_name("missing.yaml"))]) == 2
