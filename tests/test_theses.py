"""The numbers behind the claims: paired differences over seeds
(skv.experiments.semantickv.theses), the Claude Code session-gap sweep
(skv.experiments.replay.session_gap), the Mooncake oracle (skv.experiments.replay.oracles), and
the pipeline's skip reasons and paper checks."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from skv.artifact import paper, pipeline
from skv.experiments.replay import session_gap
from skv.experiments.replay.oracles import mooncake_infinite_cache_hit_rate
from skv.experiments.semantickv import theses
from skv.experiments.stats import interval

CAP = "5%"


def doc(runs: dict[str, dict[int, tuple[float, float]]], offline=("belady",)) -> dict:
    """A results document: policy -> seed -> (token hit rate, mean TTFT ms)."""
    rows = [
        {
            "capacity": CAP,
            "policy": pol,
            "seed": seed,
            "token_hit_rate": hit,
            "ttft_ms_mean": ttft,
        }
        for pol, by_seed in runs.items()
        for seed, (hit, ttft) in by_seed.items()
    ]
    agg = [
        {"capacity": CAP, "capacity_blocks": 10, "policy": p, "offline": p in offline} for p in runs
    ]
    return {"experiment": "exp", "runs": rows, "aggregate": agg}


def test_paired_difference_is_policy_minus_baseline_with_a_student_t_interval():
    d = doc(
        {
            "adaptive_semantic": {0: (0.50, 90.0), 1: (0.52, 80.0), 2: (0.55, 100.0)},
            "lru": {0: (0.48, 100.0), 1: (0.51, 100.0), 2: (0.51, 100.0)},
        }
    )
    c = theses.compare(d)
    diffs = [2.0, 1.0, 4.0]  # points, per seed
    assert c["hit_pts"]["value"] == pytest.approx(sum(diffs) / 3)
    lo, hi = stats.t.interval(0.95, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
    assert c["hit_pts"]["ci95"] == pytest.approx([lo, hi])
    assert c["hit_pts"]["n"] == 3
    # TTFT: per seed (a - b) / b in percent, then the mean: (-10 - 20 + 0) / 3
    assert c["ttft_pct"]["value"] == pytest.approx(-10.0)


def test_seeds_are_paired_by_number_not_by_position():
    d = doc(
        {
            "adaptive_semantic": {0: (0.50, 1.0), 1: (0.70, 1.0), 2: (0.40, 1.0)},
            "lru": {2: (0.40, 1.0), 1: (0.60, 1.0), 0: (0.50, 1.0)},  # listed in another order
        }
    )
    # the mean of differences ignores pairing; the interval does not: seeds give 0, 10, 0
    iv = theses.compare(d)["hit_pts"]
    lo, hi = stats.t.interval(0.95, 2, loc=10 / 3, scale=stats.sem([0.0, 10.0, 0.0]))
    assert iv["value"] == pytest.approx(10 / 3) and iv["ci95"] == pytest.approx([lo, hi])
    d = doc(
        {"adaptive_semantic": {0: (0.5, 1.0), 1: (0.6, 1.0)}, "lru": {0: (0.5, 1.0), 2: (0.6, 1.0)}}
    )
    with pytest.raises(ValueError, match="same seeds"):
        theses.compare(d)
    with pytest.raises(ValueError, match="no runs of 'lru'"):
        theses.compare(doc({"adaptive_semantic": {0: (0.5, 1.0)}, "fifo": {0: (0.4, 1.0)}}))


def test_thesis_values_name_every_comparator_and_the_best_by_each_metric():
    d = doc(
        {
            "lru": {0: (0.40, 100.0), 1: (0.41, 100.0)},
            "lfu": {0: (0.45, 120.0), 1: (0.46, 120.0)},  # best hit rate, worse TTFT
            "fifo": {0: (0.30, 90.0), 1: (0.31, 90.0)},  # best TTFT
            "adaptive_semantic": {0: (0.44, 95.0), 1: (0.44, 95.0)},
            "belady": {0: (0.60, 50.0), 1: (0.60, 50.0)},
        }
    )
    v = theses.thesis_values([d])
    assert v["exp_best_by_hit"] == "lfu" and v["exp_best_by_ttft"] == "fifo"
    assert v["exp_adaptive_vs_lfu_hit_pts"]["value"] == pytest.approx(-1.5)
    assert "exp_adaptive_vs_belady_hit_pts" not in v  # offline policies are not baselines
    assert v["exp_belady_vs_lru_hit_pts"]["value"] == pytest.approx(19.5)
    assert {k for k in v if k.endswith("_hit_pts")} == {
        "exp_adaptive_vs_lru_hit_pts",
        "exp_adaptive_vs_lfu_hit_pts",
        "exp_adaptive_vs_fifo_hit_pts",
        "exp_belady_vs_lru_hit_pts",
    }


def test_a_thesis_over_several_capacities_is_checked_at_the_tightest_one():
    """Three capacities whose labels sort otherwise than their sizes ("10%" < "25%" < "5%" as
    text; 20, 50 and 10 blocks): the thesis is at "5%", the fewest blocks. adaptive minus LRU
    per capacity: 5% +3 points and -20% TTFT, 10% +1 point, 25% -2 points; adaptive minus lfu:
    +1, +11, +8 points; lfu is the best other online policy by both metrics at 5% only (lru by
    hit rate and fifo by TTFT at the others)."""
    per_cap = {  # capacity -> (blocks, {policy: (hit, ttft)}), the same for both seeds
        "10%": (20, {"adaptive_semantic": (0.41, 90.0), "lru": (0.40, 100.0),
                     "lfu": (0.30, 100.0), "fifo": (0.35, 80.0)}),
        "25%": (50, {"adaptive_semantic": (0.58, 90.0), "lru": (0.60, 100.0),
                     "lfu": (0.50, 100.0), "fifo": (0.55, 80.0)}),
        "5%": (10, {"adaptive_semantic": (0.23, 80.0), "lru": (0.20, 100.0),
                    "lfu": (0.22, 90.0), "fifo": (0.10, 110.0)}),
    }  # fmt: skip
    runs, agg = [], []
    for cap, (blocks, by_policy) in per_cap.items():
        for pol, (hit, ttft) in by_policy.items():
            agg.append({"capacity": cap, "capacity_blocks": blocks, "policy": pol,
                        "offline": False})  # fmt: skip
            for seed in (0, 1):
                runs.append({"capacity": cap, "policy": pol, "seed": seed,
                             "token_hit_rate": hit, "ttft_ms_mean": ttft})  # fmt: skip
    d = {"experiment": "exp", "runs": runs, "aggregate": agg}
    c = theses.compare(d)
    assert c["capacity"] == "5%"
    assert c["hit_pts"]["value"] == pytest.approx(3.0)
    assert c["ttft_pct"]["value"] == pytest.approx(-20.0)
    v = theses.thesis_values([d])
    assert v["exp_adaptive_vs_lru_hit_pts"]["value"] == pytest.approx(3.0)
    assert v["exp_adaptive_vs_lfu_hit_pts"]["value"] == pytest.approx(1.0)
    assert v["exp_best_by_hit"] == "lfu" and v["exp_best_by_ttft"] == "lfu"


def test_one_seed_gives_a_zero_width_interval_that_says_n_1():
    iv = interval([3.0])
    assert iv == {"value": 3.0, "ci95": [3.0, 3.0], "n": 1}


# ---- session gap ---------------------------------------------------------------------------


def sweep() -> pd.DataFrame:
    rows = []
    for gap, base in ((5.0, 0.30), (300.0, 0.50)):
        for seed, jitter in ((0, 0.0), (1, 0.01), (2, 0.02)):
            rows.append(
                {"gap_s": gap, "seed": seed, "policy": "lru", "block_hit_rate": base + jitter}
            )
            rows.append(
                {
                    "gap_s": gap,
                    "seed": seed,
                    "policy": "adaptive_semantic",
                    "block_hit_rate": base + jitter + 0.01 * (seed + 1),
                }
            )
    return pd.DataFrame(rows)


def test_gap_differences_are_paired_by_seed_and_signed_later_minus_earlier():
    df = sweep()
    d = session_gap.diff_pts(df, ("lru", 300.0), ("lru", 5.0), "block_hit_rate")
    assert d["value"] == pytest.approx(20.0) and d["n"] == 3
    d = session_gap.diff_pts(df, ("adaptive_semantic", 5.0), ("lru", 5.0), "block_hit_rate")
    assert d["value"] == pytest.approx(2.0)  # seeds give +1, +2, +3 points
    s = session_gap.summary(df)
    row = s[(s.policy == "lru") & (s.gap_s == 5.0)].iloc[0]
    assert row["ci95_low"] >= 0.30 and row["ci95_high"] <= 0.32  # bootstrap stays in range


def test_gap_config_rejects_unknown_keys_and_an_assumed_gap_outside_the_sweep(tmp_path):
    base = (
        Path(__file__).resolve().parents[1]
        / "experiments"
        / "replay"
        / "claude_code_session_gap.yaml"
    ).read_text()
    f = tmp_path / "c.yaml"
    f.write_text(base + "surprise: 1\n")
    with pytest.raises(ValueError, match="surprise"):
        session_gap.load_gap_config(f, quick=False)
    f.write_text(base.replace("assumed_gap_s: 30", "assumed_gap_s: 31"))
    with pytest.raises(ValueError, match="assumed_gap_s"):
        session_gap.load_gap_config(f, quick=False)
    cfg = session_gap.load_gap_config(_shipped(), quick=True)
    assert cfg.assumed_gap_s in cfg.gaps_s and len(cfg.seeds) >= 2


def _shipped() -> Path:
    return (
        Path(__file__).resolve().parents[1]
        / "experiments"
        / "replay"
        / "claude_code_session_gap.yaml"
    )


# ---- the Mooncake oracle -------------------------------------------------------------------


def test_oracle_counts_blocks_seen_in_an_earlier_request_in_timestamp_order(tmp_path):
    f = tmp_path / "t.jsonl"
    recs = [
        {"timestamp": 10, "hash_ids": [1, 2, 3]},  # listed first, arrives second
        {"timestamp": 0, "hash_ids": [1, 2]},
        {"timestamp": 20, "hash_ids": [1, 4, 4]},  # a repeat within a request is no hit
    ]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    # arrival order: [1,2] (0 hits), [1,2,3] (2 hits), [1,4,4] (1 hit) -> 3 of 8
    assert mooncake_infinite_cache_hit_rate(f) == pytest.approx(3 / 8)


def test_oracle_agrees_with_skv_replay_on_a_synthetic_trace(tmp_path):
    from skv.replay import compile_trace, trace_totals
    from skv.traces import load_trace

    f = tmp_path / "t.jsonl"
    lines = []
    for i in range(50):
        ids = [0, 1 + i % 3] + [100 + i * 10 + k for k in range(i % 4)]
        lines.append(
            json.dumps(
                {
                    "timestamp": i,
                    "input_length": 512 * len(ids) - 5,
                    "output_length": 1,
                    "hash_ids": ids,
                }
            )
        )
    f.write_text("\n".join(lines) + "\n")
    totals = trace_totals(compile_trace(load_trace(f, fmt="mooncake")))
    assert totals.ceiling_block_hit_rate == pytest.approx(mooncake_infinite_cache_hit_rate(f))


# ---- pipeline: skip reasons through dependencies; the paper's checks ----------------------


def test_a_step_is_skipped_when_a_step_it_needs_cannot_run(monkeypatch):
    base = pipeline.STEPS["fig_hit_rate_mooncake"]
    child = pipeline.Step(
        "fig_child", "replay", "experiments/replay", ("figures/x.pdf",), depends=(base.name,)
    )
    monkeypatch.setitem(pipeline.STEPS, "fig_child", child)
    monkeypatch.setattr(
        pipeline, "missing_traces", lambda s: "no trace" if s.name == base.name else None
    )
    why = pipeline.skip_reason("fig_child", quick=True)
    assert why == f"needs {base.name}: no trace; then ./reproduce.sh --quick fig_child"
    assert pipeline.skip_reason(base.name) == "no trace; then ./reproduce.sh fig_hit_rate_mooncake"


def test_undefined_values_flags_only_keys_of_steps_that_ran():
    tex = r"""\newcommand{\x}{\val{pre/amble}}
\begin{document}
\val{a/one} \ci{claim_a} \verdict{claim_a} \val{b/two} % \val{a/commented}
\end{document}"""
    values = r"\skvdefine{a/one}{1}" "\n" r"\skvdefine{claim_a.ci}{x}" "\n"
    out = paper.undefined_values(tex, values, ["a"], {"claim_a": "a"})
    assert out == ["claim_a.verdict"]  # b did not run; the preamble and comments are not text
    assert paper.undefined_values(tex, values, [], {"claim_a": "a"}) == []


def test_figures_in_pdf_reads_what_skvfig_included_not_what_it_probed(tmp_path):
    (tmp_path / "main.log").write_text(
        "(/x/figures/fig_a.pdf)\nskv-figure: fig_b\nLaTeX Warning: x\nskv-figure: fig_c\n"
    )
    assert paper.figures_in_pdf(tmp_path) == {"fig_b", "fig_c"}
    with pytest.raises(FileNotFoundError):
        paper.figures_in_pdf(tmp_path / "nowhere")
