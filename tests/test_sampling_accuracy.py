"""The SHARDS accuracy sweep (skv/experiments/replay/sampling.py) and the unit decision it shares
with skv.mrc: what it measures, that the table is the same in every sweep mode, and its config's
errors. Synthetic traces only (the pipeline step runs it on the real ones)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from skv import mrc
from skv.experiments.config import ConfigError
from skv.experiments.replay import sampling as S
from skv.replay import compile_trace, replay_one, trace_totals
from skv.traces.native import write_skv_trace
from skv.workloads import make_workload


@pytest.fixture(scope="module")
def chats():
    return make_workload("multi_turn_chat", seed=3, num_requests=400)


@pytest.fixture(scope="module")
def trace(chats):
    return compile_trace(chats)


def test_a_sample_at_rate_one_is_the_full_replay(trace):
    """At R = 1 every key is kept and the cache is not scaled: every error is exactly 0, for
    both estimates (a swapped column, a wrong scale or a wrong reference count shows here)."""
    rows = S.accuracy_rows(trace, "chat", "lru", ["2%", "20%"], [1.0], [0], unit="block")
    df = pd.DataFrame(rows)
    assert len(df) == 2 and set(df["unit"]) == {"block"}
    for how in S.ESTIMATES:
        assert (S.with_errors(df, "token_hit_rate", how)["error_pts"].abs() < 1e-9).all()
        assert (S.with_errors(df, "block_hit_rate", how)["error_pts"].abs() < 1e-9).all()
    assert (df["sample_capacity_blocks"] == df["capacity_blocks"]).all()


def test_rows_hold_the_full_replay_and_the_sample_of_each_seed(trace):
    """The full side is replay_one at the share of the unique blocks; the sampled side is the
    seed's own sample through shards_curve's scaled cache (so the sweep measures the library's
    estimator, not a copy of it)."""
    caps = ["1%", "10%"]
    rows = S.accuracy_rows(trace, "chat", "vllm", caps, [0.1], [0, 1], unit="block")
    assert [(r["seed"], r["capacity"]) for r in rows] == [
        (0, "1%"),
        (0, "10%"),
        (1, "1%"),
        (1, "10%"),
    ]
    u = trace_totals(trace).unique_blocks
    for r in rows:
        cap = max(2, round(float(r["capacity"][:-1]) / 100 * u))
        assert r["capacity_blocks"] == cap
        full = replay_one(trace, "vllm", cap, progress=False)
        assert r["full_token_hit_rate"] == full["token_hit_rate"]
        est = mrc.shards_curve(trace, "vllm", [cap], 0.1, seed=r["seed"], unit="block")[0]
        assert r["sampled_token_hit_rate"] == est["token_hit_rate"]
        assert r["sample_capacity_blocks"] == est["sample_capacity_blocks"]
    assert rows[0]["sample_key_share"] != rows[2]["sample_key_share"]  # seeds differ


def test_a_task_cuts_one_compact_trace_for_all_its_per_key_rates(trace, monkeypatch):
    import skv.compact_trace

    built = _count_builds(monkeypatch, skv.compact_trace)
    rows = S.accuracy_rows(trace, "chat", "lru", ["5%"], [0.3, 0.1], [0, 1], unit="block")
    assert len(built) == 1 and len(rows) == 4


def _count_builds(monkeypatch, module) -> list:
    built: list = []
    real = module.CompactTrace

    class Counting(real):
        def __init__(self, *a, **k):
            built.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(module, "CompactTrace", Counting)
    return built


def test_summary_reads_signs_and_worst_seeds():
    """Two seeds, two capacities, known errors: the max |error| per seed, the worst seed, the
    mean signed error and the bar verdict come out as computed by hand."""
    base = {"trace": "t", "policy": "lru", "rate": 0.1, "unit": "block"} | {
        "full_token_hit_rate": 0.5
    }
    errs = {(0, "1%"): -0.02, (0, "10%"): 0.01, (1, "1%"): -0.004, (1, "10%"): -0.006}
    df = pd.DataFrame(
        [
            {
                **base,
                "seed": s,
                "capacity": c,
                "sampled_token_hit_rate": 0.5 + e,
                "sample_prompt_tokens": 100,
                "full_prompt_tokens": 1000,
            }
            for (s, c), e in errs.items()
        ]
    )
    assert S.per_seed_max_error(df, "t", "lru", 0.1) == pytest.approx([2.0, 0.6])
    assert S.mean_signed_error(df, "t", "lru", 0.1) == pytest.approx([-0.5, -0.5])
    row = S.summary(df).set_index("estimate").loc["scaled"]
    assert row["max_error_pts"] == pytest.approx(1.3)
    assert row["worst_seed_pts"] == pytest.approx(2.0)
    assert row["signed_error_pts"] == pytest.approx(-0.5)
    assert not row["within_bar"]
    # adjusted: 1 - misses / (R x full refs) = 1 - 100 (1 - h) / 100 = h here (share exactly R)
    adj = S.summary(df).set_index("estimate").loc["adjusted"]
    assert adj["max_error_pts"] == pytest.approx(1.3)


def test_the_adjusted_estimate_counts_the_full_traces_references():
    """SHARDS-adj: a per-key sample holding fewer references than R x the full count (a hot key
    left out) has its missing references counted as hits; whole-unit samples get none."""
    df = pd.DataFrame(
        [
            {
                "rate": 0.1,
                "unit": unit,
                "sampled_token_hit_rate": 0.5,
                "sample_prompt_tokens": 80,
                "full_prompt_tokens": 1000,
            }
            for unit in ("block", "session")
        ]
    )
    adjusted = S.estimate(df, "token_hit_rate", "adjusted")
    assert adjusted.iloc[0] == pytest.approx(1 - 40 / 100)
    assert math.isnan(adjusted.iloc[1])  # a whole-unit sample keeps its trunk: not R per key
    assert list(S.estimate(df, "token_hit_rate", "scaled")) == [0.5, 0.5]
    with pytest.raises(ValueError, match="estimate must be one of"):
        S.estimate(df, "token_hit_rate", "raw")


def _config(tmp_path, **over):
    import yaml

    data = {
        "id": "t",
        "title": "t",
        "traces": [{"label": "chat", "trace": "chat.jsonl"}],
        "policies": ["lru", "adaptive_semantic"],
        "capacities": ["2%", "10%"],
        "rates": [0.2],
        "seeds": [0, 1],
        "unit": "block",
        "quick": {"seeds": [0]},
    } | over
    path = tmp_path / "sampling.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_table_is_the_same_in_this_process_and_in_worker_processes(
    tmp_path, monkeypatch, chats
):
    write_skv_trace(tmp_path / "chat.jsonl", chats)
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    cfg = S.load_sampling_config(_config(tmp_path), quick=False)
    here = S.run_config(cfg, jobs=1)
    there = S.run_config(cfg, jobs=2)
    assert len(here) == 2 * 2 * 2  # policies x seeds x capacities
    assert here.to_csv(index=False) == there.to_csv(index=False)
    quick = S.load_sampling_config(_config(tmp_path), quick=True)
    assert quick.seeds == [0]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"policies": ["belady"]}, "offline"),
        ({"policies": ["no_such_policy"]}, "policies"),
        ({"capacities": ["200 blocks"]}, "capacities"),
        ({"unit": "tree"}, "unit"),
        ({"metric": "hit_rate"}, "metric"),
        ({"rates": [1.0]}, "rates"),
        ({"seeds": [-1]}, "seeds"),
        ({"traces": [{"label": "a", "trace": "x"}, {"label": "a", "trace": "y"}]}, "label"),
        ({"extra_field": 1}, "extra_field"),
    ],
)
def test_a_bad_config_names_the_field(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message) as err:
        S.load_sampling_config(_config(tmp_path, **over), quick=False)
    assert "sampling.yaml" in str(err.value)


def test_a_bad_quick_override_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"quick overrides: .*seeds"):
        S.load_sampling_config(_config(tmp_path, quick={"seeds": []}), quick=True)


@pytest.mark.parametrize("rate", [1.0, 0.5, 0.2, 0.05, 0.01])
@pytest.mark.parametrize("unit", ["auto", "block", "session", "root"])
def test_samples_per_key_is_the_unit_sample_trace_uses(trace, rate, unit):
    """The decision a caller reads before building a CompactTrace is sample_trace's own."""
    sample = mrc.sample_trace(trace, rate, seed=1, unit=unit)
    assert mrc.samples_per_key(trace, rate, unit) == (sample.unit == "block")


def test_the_capacity_curve_builds_one_compact_trace_for_all_its_rates(trace, monkeypatch):
    import skv.compact_trace

    built = _count_builds(monkeypatch, skv.compact_trace)
    rows = mrc.capacity_curve(
        trace,
        policies=["lru"],
        rates=[0.2, 0.1],
        points=6,
        sample_points=3,
        belady_points=0,
        unit="block",
    )
    assert len(built) == 1
    assert {r["sample_rate"] for r in rows if r["method"] == "shards"} == {0.2, 0.1}
    assert all(math.isfinite(r["token_hit_rate"]) for r in rows)
