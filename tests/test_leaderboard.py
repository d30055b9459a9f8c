"""The policy leaderboard (skv.experiments.leaderboard): gap shares, equal tuning, the TTFT load,
the CLI, and its config's errors, each with an answer known by hand or by an independent replay."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from skv.experiments.config import ConfigError
from skv.experiments.leaderboard import study, tuning
from skv.experiments.leaderboard.config import LeaderboardConfig, TraceEntry, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments/leaderboard/policy_leaderboard.yaml"

AGENT = {"name": "tool_agent", "params": {"num_requests": 80}}
TINY = {
    "capacities": ["10%", "20%"],
    "policies": ["lru", "fifo", "slru"],
    "traces": [
        {"label": "agent", "workload": AGENT, "seeds": [0, 1]},
    ],
    "ttft": {"capacity": "30%", "load": 0.5},
    "tuning": {
        "budget": 3,
        "capacities": ["10%"],
        "traces": [
            {"label": "tune", "workload": AGENT, "seeds": [7]},
        ],
        "grids": {"slru": [{"protected_fraction": 0.2}, {"protected_fraction": 0.5}]},
    },
}


def tiny(**over) -> LeaderboardConfig:
    return LeaderboardConfig.model_validate({**TINY, **over})


def _runs(rows):
    cols = ["trace", "seed", "capacity", "policy", "setting", "params", "block_hit_rate",
            "token_hit_rate", "ttft_ms_mean", "ttft_ms_p90"]  # fmt: skip
    return pd.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


def test_gap_share_by_hand_and_blank_without_a_gap():
    """gap share = (p - lru) / (belady - lru), per seed and capacity; blank where Belady beats
    LRU by under min_gap_pts."""
    runs = _runs([
        ("t", 0, "5%", "lru", "default", "{}", 0.20, 0.2, 100.0, 0),
        ("t", 0, "5%", "belady", "default", "{}", 0.60, 0.6, 50.0, 0),
        ("t", 0, "5%", "x", "default", "{}", 0.30, 0.3, 80.0, 0),
        ("t", 0, "5%", "x", "tuned", "{}", 0.40, 0.4, 70.0, 0),
        ("t", 0, "9%", "lru", "default", "{}", 0.500, 0.5, 1.0, 0),
        ("t", 0, "9%", "belady", "default", "{}", 0.505, 0.5, 1.0, 0),
        ("t", 0, "9%", "x", "default", "{}", 0.502, 0.5, 1.0, 0),
    ])  # fmt: skip
    out = study.with_gap_share(runs, "lru", "belady", min_gap_pts=1.0)
    keys = zip(out.capacity, out.policy, out.setting, strict=True)
    got = dict(zip(keys, out.gap_share, strict=True))
    assert got[("5%", "x", "default")] == pytest.approx(0.25)
    assert got[("5%", "x", "tuned")] == pytest.approx(0.5)  # against the default rows of lru
    assert got[("5%", "belady", "default")] == pytest.approx(1.0)
    assert math.isnan(got[("9%", "x", "default")])  # a 0.5-point gap: nothing to rank
    row = out[(out.policy == "x") & (out.setting == "default") & (out.capacity == "5%")]
    assert float(row["vs_lru_pts"].iloc[0]) == pytest.approx(10.0)
    assert float(row["ttft_vs_lru"].iloc[0]) == pytest.approx(0.8)


def test_summary_pairs_seeds_and_ranking_prefers_the_tuned_setting():
    rows = []
    for seed, (lru, bel, x) in enumerate([(0.2, 0.6, 0.3), (0.1, 0.5, 0.3)]):
        rows += [("t", seed, "5%", "lru", "default", "{}", lru, lru, 1.0, 0),
                 ("t", seed, "5%", "belady", "default", "{}", bel, bel, 1.0, 0),
                 ("t", seed, "5%", "x", "default", "{}", x, x, 1.0, 0),
                 ("t", seed, "5%", "x", "tuned", '{"a": 1}', bel, bel, 1.0, 0)]  # fmt: skip
    runs = study.with_gap_share(_runs(rows), "lru", "belady", 1.0)
    s = study.summarize(runs)
    x = s[(s.policy == "x") & (s.setting == "default")].iloc[0]
    assert x.seeds == 2 and x.gap_share == pytest.approx((0.25 + 0.5) / 2)
    assert x.gap_share_ci95_low < x.gap_share < x.gap_share_ci95_high  # paired over 2 seeds
    table = study.ranking(s, ["5%"], "belady")
    assert list(table.index) == ["x", "lru"]  # x's tuned row (gap 1.0), not its default
    assert table.loc["x", "mean"] == pytest.approx(1.0)
    assert "| 1 | `x` | 100.0 | 100.0 |" in study.markdown(table, "T")


def test_best_online_competes_with_the_rankings_setting_not_the_better_of_two():
    """A policy whose default happens to beat its tuned setting on the evaluation runs still
    competes with its tuned setting (as in the ranking): the claim does not pick on the data."""
    rows = []
    for seed, (y_def, y_tuned) in enumerate([(0.9, 0.35), (0.8, 0.25)]):
        rows += [("t", seed, "5%", "lru", "default", "{}", 0.2, 0.2, 1.0, 0),
                 ("t", seed, "5%", "belady", "default", "{}", 0.6, 0.6, 1.0, 0),
                 ("t", seed, "5%", "x", "default", "{}", 0.4, 0.4, 1.0, 0),
                 ("t", seed, "5%", "y", "default", "{}", y_def, y_def, 1.0, 0),
                 ("t", seed, "5%", "y", "tuned", '{"a": 1}', y_tuned, y_tuned, 1.0, 0)]  # fmt: skip
    runs = study.with_gap_share(_runs(rows), "lru", "belady", 1.0)
    best = study.best_online(runs, "t", ["x", "y"], ["5%"])
    assert best == ("x", "default", [pytest.approx(0.5), pytest.approx(0.5)])
    assert study.best_online(runs, "t", ["y"], ["5%"])[:2] == ("y", "tuned")


def test_tuning_choice_is_the_best_mean_and_ties_keep_the_default():
    scores = _runs([
        ("a", 0, "5%", "p", "default", "{}", 0.3, 0, 0, 0),
        ("a", 0, "5%", "p", "grid1", '{"k": 1}', 0.5, 0, 0, 0),
        ("b", 0, "5%", "p", "default", "{}", 0.3, 0, 0, 0),
        ("b", 0, "5%", "p", "grid1", '{"k": 1}', 0.2, 0, 0, 0),  # mean 0.35 > 0.3
        ("a", 0, "5%", "q", "default", "{}", 0.4, 0, 0, 0),
        ("a", 0, "5%", "q", "grid1", '{"k": 2}', 0.4, 0, 0, 0),  # a tie
    ])  # fmt: skip
    assert tuning.choose(scores) == {"p": {"k": 1}, "q": {}}


def test_equal_budget_and_the_choice_equals_an_independent_replay():
    """Every policy tries its default plus its grid (<= budget); the chosen slru setting is the
    one an independent replay of the tuning trace ranks first, and the evaluation traces cannot
    move it."""
    from skv.replay import compile_trace, replay_one, resolve_capacities, trace_totals
    from skv.workloads import make_workload

    cfg = tiny()
    cand = tuning.candidates(cfg)
    assert list(cand["slru"]) == ["default", "grid1", "grid2"] and cand["lru"] == {"default": {}}
    chosen, runs = study.tune(cfg, jobs=1)
    assert set(runs["policy"]) == {"slru"}  # nothing else has settings to try
    trace = compile_trace(make_workload("tool_agent", num_requests=80, seed=7), 16)
    totals = trace_totals(trace)
    ((_, blocks),) = resolve_capacities(["10%"], block_size=16, unique_blocks=totals.unique_blocks,
                                       model=None)  # fmt: skip
    hits = {
        json.dumps(p): replay_one(trace, "slru", blocks, params=p or None)["block_hit_rate"]
        for p in cand["slru"].values()
    }
    best = max(hits.values())
    first_best = next(json.loads(k) for k, v in hits.items() if v == best)
    assert chosen["slru"] == first_best
    rag = {"name": "rag", "params": {"num_requests": 30}}
    other = tiny(traces=[{"label": "o", "workload": rag}])
    assert study.tune(other, jobs=1)[0] == chosen


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="shares seeds \\[7\\] with evaluation trace"):
        tiny(traces=[{"label": "e", "workload": {"name": "tool_agent"}, "seeds": [7]}])
    grid = {**TINY["tuning"], "budget": 2}
    with pytest.raises(ValueError, match="exceed the budget of 2"):
        tiny(tuning=grid)
    bad = {**TINY["tuning"], "grids": {"slru": [{"no_such": 1}]}}
    with pytest.raises(ValueError, match="no_such"):
        tiny(tuning=bad)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        tiny(policies=["nope"])
    with pytest.raises(ValueError, match="exactly one of"):
        TraceEntry(label="x")
    path = tmp_path / "c.yaml"
    path.write_text("capacities: ['5%']\ntraces: []\n")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)


def test_the_shipped_config_ranks_every_online_policy_and_quick_keeps_the_grids():
    from skv.policies.registry import OFFLINE, POLICIES

    full, quick = load_config(CONFIG), load_config(CONFIG, quick=True)
    online = {p for p in POLICIES if p not in OFFLINE}
    assert set(full.policy_names) == online - set(full.exclude)
    assert quick.tuning.grids == full.tuning.grids and quick.tuning.budget == full.tuning.budget
    # the capacities the claims and the paper read (the goal) are the ones ranked
    assert full.capacities == list(study.GOAL_CAPACITIES)
    for g in full.tuning.grids.values():  # the same number of settings for every tuned policy
        assert len(g) + 1 == full.tuning.budget


def test_ttft_load_scales_arrivals_so_the_baseline_is_that_busy():
    """With arrivals scaled by time_factor, the baseline's back-to-back service time is
    ``load`` x the scaled span (the definition), whatever the trace's own rate."""
    from skv.experiments.leaderboard.study import ScaleTask, _compiled, time_factor

    cfg = tiny()
    entry = cfg.traces[0].model_dump_json()
    f = time_factor(ScaleTask(entry, 0, cfg.ttft.model_dump_json(), "lru"))
    reqs = _compiled(entry, 0)[0]
    span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
    f2 = time_factor(ScaleTask(entry, 0, cfg.ttft.model_copy(update={"load": 0.25})
                               .model_dump_json(), "lru"))  # fmt: skip
    assert f > 0 and span > 0 and f2 == pytest.approx(2 * f)  # half the load: twice the span


def test_run_end_to_end_bound_is_one_baseline_zero_and_deterministic():
    cfg = tiny()
    a = study.run(cfg, jobs=1)
    b = study.run(cfg, jobs=2)
    pd.testing.assert_frame_equal(a.runs, b.runs)  # workers do not change a number
    s = a.summary.set_index(["capacity", "policy", "setting"])
    assert s.loc[("20%", "belady", "default"), "gap_share"] == pytest.approx(1.0)
    assert s.loc[("20%", "lru", "default"), "gap_share"] == 0.0
    assert s.loc[("20%", "lru", "default"), "seeds"] == 2
    ttft = a.runs[a.runs.capacity == "30%"]["ttft_ms_mean"]  # the TTFT capacity, added
    assert ttft.notna().all() and (ttft > 0).all()
    assert a.runs[a.runs.capacity == "20%"]["ttft_ms_mean"].isna().all()
    assert ("slru" in a.tuned) and set(a.ranking.index) == {"lru", "fifo", "slru"}
    values = study.claim_values(a, cfg)
    assert values["agent_best_gap_share"]["n"] == 2 and values["policies"] == 3
    assert values["capacities"] == "10% and 20%"  # the paper names the capacities run


def test_missing_real_trace_is_left_out_but_a_users_missing_trace_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    cfg = tiny(traces=[*TINY["traces"], {"label": "moon", "trace": "mooncake/none.jsonl"}],
               tuning={"traces": []})  # fmt: skip
    keep, missing = study.available(cfg.traces)
    assert [t.label for t in keep] == ["agent"] and "moon" in missing
    with pytest.raises(FileNotFoundError):
        study.available(cfg.traces, required=["moon"])
    values = study.claim_values(study.run(cfg, jobs=1), cfg)  # the paper prints why it is absent
    assert values["moon_best_policy"] == values["moon_gap_pts"] == "not run (trace not found)"
    assert "moon_best_gap_share" not in values and "agent_best_gap_share" in values


def test_cli_writes_the_tables_and_rejects_a_missing_trace(tmp_path, capsys):
    from skv.cli import main

    cfg = tmp_path / "lb.yaml"
    cfg.write_text(json.dumps({**TINY, "tuning": {"traces": []}}))
    trace = tmp_path / "user.jsonl"
    rows = [{"timestamp": 1000 * i, "input_length": 1536, "output_length": 8,
             "hash_ids": [1, 2 + i % 10, 100 + i % 30]} for i in range(200)]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    rc = main(["leaderboard", "--config", str(cfg), "--trace", f"{trace}=mine", "--jobs", "1",
               "--output", str(out)])  # fmt: skip
    assert rc == 0
    md = (out / "leaderboard.md").read_text()
    assert "| mean | agent | mine |" in md
    summary = pd.read_csv(out / "leaderboard.csv")
    assert {"agent", "mine"} == set(summary.trace)
    assert json.loads((out / "tuned.json").read_text()) == {"lru": {}, "fifo": {}, "slru": {}}
    rc = main(["leaderboard", "--config", str(cfg), "--trace", str(tmp_path / "absent.jsonl"),
               "--output", str(tmp_path / "o2")])  # fmt: skip
    assert rc == 2 and "absent.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()  # nothing half-written


def test_derived_defaults_come_from_the_tuning_traces_only_and_name_the_best(tmp_path):
    """lhd's and kvflow's defaults are derived on the tuning traces: every candidate is scored
    on each tuning (seed, capacity) and nothing else, best first."""
    from skv.experiments.leaderboard import derive_defaults as dd

    cfg = tmp_path / "lb.yaml"
    tuning = {**TINY["tuning"], "capacities": ["10%", "20%"]}
    cfg.write_text(json.dumps({**TINY, "tuning": tuning}))
    res = dd.derive(str(cfg))
    assert set(res) == {"lhd", "kvflow"}
    for policy, out in res.items():
        scores = out["scores"]
        assert {json.dumps(s[0]) for s in scores} == {json.dumps(c) for c in dd.CANDIDATES[policy]}
        assert all(n == 2 for _, _, n in scores)  # 1 tuning seed x 2 capacities, no eval trace
        assert [s[1] for s in scores] == sorted((s[1] for s in scores), reverse=True)
        assert out["best"] == scores[0][0]
    record = json.loads((REPO / "experiments/leaderboard/derived_defaults.json").read_text())
    from skv.policies.registry import make_policy

    for policy, knob in (("lhd", "features"), ("kvflow", "age_out")):
        assert make_policy(policy).params()[knob] == record[policy]["best"][knob]


def test_a_trace_too_small_to_rank_still_names_its_best_policy_as_none():
    """The paper prints each trace's best policy; a run whose gap is under the floor everywhere
    (quick's three Claude Code sessions) says so instead of leaving the value out."""
    cfg = tiny(min_gap_pts=1000.0, tuning={"traces": []})
    values = study.claim_values(study.run(cfg, jobs=1), cfg)
    assert values["agent_best_policy"] == "none (no gap to rank)"
    assert "agent_best_gap_share" not in values and "agent_gap_pts" in values


def test_a_trace_seeds_settings_are_spread_over_the_workers_in_cells_of_at_least_the_minimum():
    """Fewer workers, larger cells (each trace seed loaded fewer times); never below the
    minimum, and every setting lands in exactly one cell in order."""
    from skv.experiments.leaderboard.study import SETTINGS_PER_CELL, _settings_per_cell

    assert _settings_per_cell(33, 2) == 17
    assert _settings_per_cell(33, 1) == 33
    assert _settings_per_cell(33, 16) == SETTINGS_PER_CELL
    cfg = tiny()
    settings = {p: {"default": {}} for p in cfg.policy_names}
    flat = [(p, "default", "{}") for p in settings]
    for jobs in (1, 2, 64):
        cells = study.cells(cfg, cfg.traces, settings, cfg.capacities, ttft=False, jobs=jobs)
        per_seed = [
            c.settings for c in cells if c.seed == cells[0].seed and c.trace == cells[0].trace
        ]
        assert [s for part in per_seed for s in part] == flat


def test_a_cells_ttft_is_the_summary_of_the_run_with_every_memory_sample():
    """_TtftServer reads the TTFT column of a run without rows or memory samples; its mean and
    p90 equal the summary's of the same run simulated with a row per request and a memory
    sample every iteration (a sample only records, so the runs' TTFTs are the same floats)."""
    from dataclasses import replace

    from skv.sim import simulate

    cfg = tiny()
    entry = cfg.traces[0].model_dump_json()
    ttft = json.loads(cfg.ttft.model_dump_json())
    factor = study.time_factor(study.ScaleTask(entry, 1, json.dumps(ttft), "lru"))
    cell = study.Cell(entry, 1, (), ("30%",), json.dumps(ttft), factor)
    serve = study._TtftServer(cell, ttft)
    for policy, params in [("lru", {}), ("slru", {"protected_fraction": 0.2}), ("belady", {})]:
        config = study._sim_config(policy, params, serve.blocks, serve.block_size, ttft)
        every = replace(config, sample_every_s=0)
        s = simulate(serve.run, every, serve.latency, progress=False).summary
        assert serve(policy, params) == (s["ttft_ms_mean"], s["ttft_ms_p90"])
