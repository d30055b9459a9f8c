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
        # SHARDS's own sizing, for the adjusted estimate: R x the capacity
        rcap = max(1, round(0.1 * cap))
        assert r["rate_scaled_capacity_blocks"] == rcap
        sample = mrc.sample_trace(trace, 0.1, seed=r["seed"], unit="block").trace
        by_rate = replay_one(sample, "vllm", rcap, progress=False)["token_hit_rate"]
        assert r["rate_scaled_token_hit_rate"] == by_rate
    assert rows[0]["sample_key_share"] != rows[2]["sample_key_share"]  # seeds differ


def test_a_task_cuts_one_compact_trace_for_all_its_per_key_rates(trace, monkeypatch):
    import skv.compact_trace

    built = _count_builds(monkeypatch, skv.compact_trace)
    rows = S.accuracy_rows(trace, "chat", "lru", ["5%"], [0.3, 0.1], [0, 1], unit="block")
    # the trace once; each of the 4 samples is stored as one too (cut from it, not from a list)
    assert built == ["list"] + ["cut"] * 4 and len(rows) == 4


def _count_builds(monkeypatch, module) -> list:
    built: list = []
    real = module.CompactTrace

    class Counting(real):
        def __init__(self, blocks, *a, **k):
            built.append("list" if isinstance(blocks, list) else "other")
            super().__init__(blocks, *a, **k)

        def cut(self, keep):
            built.append("cut")
            return super().cut(keep)

    monkeypatch.setattr(module, "CompactTrace", Counting)
    monkeypatch.setattr(mrc, "CompactTrace", Counting)
    return built


def _rows(errs: dict, **extra) -> pd.DataFrame:
    """Hand-made sweep rows: errs maps (seed, capacity) to the scaled estimate's error."""
    base = {"trace": "t", "policy": "lru", "rate": 0.1, "unit": "block"}
    return pd.DataFrame(
        [
            base
            | {
                "seed": seed,
                "capacity": cap,
                "sample_capacity_blocks": 100,
                "full_token_hit_rate": 0.5,
                "sampled_token_hit_rate": 0.5 + e,
                "rate_scaled_token_hit_rate": 0.5,
                "sample_prompt_tokens": 120,
                "full_prompt_tokens": 1000,
            }
            | extra
            for (seed, cap), e in errs.items()
        ]
    )


def test_summary_reads_signs_and_worst_seeds():
    """Two seeds, two capacities, known errors: the max |error| per seed, the worst seed, the
    mean signed error and the bar verdict come out as computed by hand."""
    errs = {(0, "1%"): -0.02, (0, "10%"): 0.01, (1, "1%"): -0.004, (1, "10%"): -0.006}
    df = _rows(errs)
    assert S.per_seed(df, "t", "lru", 0.1, "max_abs_pts") == pytest.approx([2.0, 0.6])
    assert S.per_seed(df, "t", "lru", 0.1, "signed_pts") == pytest.approx([-0.5, -0.5])
    table = S.summary(df).set_index("estimate")
    row = table.loc["scaled"]
    assert row["max_error_pts"] == pytest.approx(1.3)
    assert row["worst_seed_pts"] == pytest.approx(2.0)
    assert row["signed_error_pts"] == pytest.approx(-0.5)
    assert row["signed_ci95_low"] == pytest.approx(-0.5) and row["empty_seeds"] == 0
    assert not row["within_bar"]
    # adjusted: 1 - 120 x 0.5 / (0.1 x 1000) = 0.4 at every row, 10 points below the full 0.5
    adj = table.loc["adjusted"]
    assert adj["max_error_pts"] == pytest.approx(10.0)
    assert adj["signed_error_pts"] == pytest.approx(-10.0)


def test_small_sample_caches_and_empty_samples_do_not_pass_for_accuracy():
    """Rows whose sample cache is under MIN_SAMPLE_CACHE blocks are left out of the errors; a
    seed whose sample kept nothing is counted as empty and fails the bar, not skipped."""
    errs = {(0, "1%"): 0.001, (0, "10%"): 0.002, (1, "1%"): 0.0, (1, "10%"): 0.0}
    df = _rows(errs)
    df.loc[(df["seed"] == 0) & (df["capacity"] == "1%"), "sample_capacity_blocks"] = 15
    df.loc[(df["seed"] == 0) & (df["capacity"] == "1%"), "sampled_token_hit_rate"] = 0.9
    df.loc[df["seed"] == 1, "sampled_token_hit_rate"] = float("nan")
    row = S.summary(df).set_index("estimate").loc["scaled"]
    assert row["max_error_pts"] == pytest.approx(0.2)  # the 15-block row's 40 points left out
    assert row["seeds"] == 1 and row["empty_seeds"] == 1
    assert not row["within_bar"]


def test_the_adjusted_estimate_counts_the_full_traces_references():
    """SHARDS-adj: the sample replayed at R x the capacity; a per-key sample holding fewer
    references than R x the full count (a hot key left out) has the missing ones counted as
    hits; whole-unit samples get none."""
    df = pd.DataFrame(
        [
            {
                "rate": 0.1,
                "unit": unit,
                "sampled_token_hit_rate": 0.7,
                "rate_scaled_token_hit_rate": 0.5,
                "sample_prompt_tokens": 80,
                "full_prompt_tokens": 1000,
            }
            for unit in ("block", "session")
        ]
    )
    adjusted = S.estimate(df, "token_hit_rate", "adjusted")
    assert adjusted.iloc[0] == pytest.approx(1 - 40 / 100)
    assert math.isnan(adjusted.iloc[1])  # a whole-unit sample keeps its trunk: not R per key
    assert list(S.estimate(df, "token_hit_rate", "scaled")) == [0.7, 0.7]
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
    assert S.summary(here).to_csv(index=False) == S.summary(there).to_csv(index=False)
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
        ({"seeds": [0, 0]}, "seeds: an entry is repeated"),
        ({"capacities": ["1%", "1%"]}, "capacities: an entry is repeated"),
        ({"quick": {"seeds": [-1]}}, "quick overrides: .*seeds"),
        ({"quick": {"policies": ["belady"]}}, r"quick\.policies: \[0\] belady is offline"),
        ({"quick": {"quick": {}}}, "quick.quick"),
        ({"lines": ["fifo"]}, r"lines: \[0\] fifo is not one of the policies"),
        # a quick policy list that leaves out a drawn line is caught too
        (
            {"lines": ["adaptive_semantic"], "quick": {"policies": ["lru"]}},
            r"quick\.lines: \[0\] adaptive_semantic is not one",
        ),
    ],
)
def test_a_bad_config_names_the_field(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message) as err:
        S.load_sampling_config(_config(tmp_path, **over), quick=False)
    assert "sampling.yaml" in str(err.value)


def test_a_bad_quick_override_fails_the_full_run_too(tmp_path):
    """A typo in quick: is found before the full run reads a trace, not at the next quick run."""
    for quick in (True, False):
        with pytest.raises(ConfigError, match=r"quick overrides: .*seeds"):
            S.load_sampling_config(_config(tmp_path, quick={"seeds": []}), quick=quick)


def test_samples_per_key_follows_the_rule_it_documents(trace):
    """The rule, stated here rather than read back from sample_trace (which calls it): "block"
    is always per key; "session" and "root" never; "auto" is per key iff fewer than min_units
    whole units (sessions, as this trace has) would come in; rate 1 keeps everything whole."""
    names = sorted({rb.session for rb in trace} - {None})
    names = names[: len(names) // 2 * 2]  # an even count: rate 0.5 brings in exactly half
    trace = [rb for rb in trace if rb.session in set(names)]
    sessions = len(names)
    assert sessions >= 2
    assert mrc.samples_per_key(trace, 0.5, "block") is True
    assert mrc.samples_per_key(trace, 0.01, "session") is False
    assert mrc.samples_per_key(trace, 0.01, "root") is False
    assert mrc.samples_per_key(trace, 1.0, "auto") is False
    edge = sessions // 2  # rate 0.5 brings in exactly this many sessions: enough
    assert mrc.samples_per_key(trace, 0.5, "auto", min_units=edge) is False
    assert mrc.samples_per_key(trace, 0.5, "auto", min_units=edge + 1) is True
    assert mrc.sample_trace(trace, 0.5, unit="auto", min_units=edge).unit == "session"


def test_samples_per_key_counts_prefix_trees_when_a_trace_has_no_sessions():
    """Without sessions the units are prefix trees at auto_depth (here: every request its own
    root, so one unit per request)."""
    from skv.blocks import RequestBlocks

    def rb(i: int) -> RequestBlocks:
        keys = [10 * i + 1, 10 * i + 2]
        return RequestBlocks(i, float(i), keys, [None, keys[0]], [4, 4], [0, 0], [8, 8], None, 0,
                             False, 4)  # fmt: skip

    trace = [rb(i) for i in range(300)]
    assert mrc.auto_depth(trace) == (0, 300)
    assert mrc.samples_per_key(trace, 0.5, "auto") is False  # 150 trees >= 100
    assert mrc.samples_per_key(trace, 0.2, "auto") is True  # 60 < 100
    assert mrc.sample_trace(trace, 0.5, unit="auto").unit == "auto"


def test_a_whole_unit_sample_scales_its_cache_by_its_own_share_of_the_keys(trace):
    """Sessions differ in size, so a whole-session sample's share of the distinct keys is
    measured (not the rate), as a per-key sample's is."""
    sample = mrc.sample_trace(trace, 0.5, seed=2, unit="session")
    every = {k for r in trace for k in r.keys}
    mine = {k for r in sample.trace for k in r.keys}
    owners: dict = {}
    for r in trace:
        for k in r.keys:
            owners.setdefault(k, set()).add(r.session)
    trunk_all = {k for k, o in owners.items() if len(o) > 1}  # keys two sessions use
    trunk_mine = trunk_all & mine
    assert sample.shared_blocks == len(trunk_mine)
    expected = (len(mine) - len(trunk_mine)) / (len(every) - len(trunk_all))
    assert sample.key_share == pytest.approx(expected)
    assert sample.key_share != pytest.approx(0.5, abs=1e-6)
    assert sample.scale == sample.key_share


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
    assert built == ["list", "cut", "cut"]  # the trace once, then each rate's sample
    assert {r["sample_rate"] for r in rows if r["method"] == "shards"} == {0.2, 0.1}
    assert all(math.isfinite(r["token_hit_rate"]) for r in rows)


def test_the_figure_draws_the_chosen_lines_and_every_policy_below(trace):
    """``lines`` picks the error curves; the summary row has a point for every policy, on the
    log scale its spread needs, with the 1-point bar."""
    import pandas as pd

    rows = [
        row
        for policy in ("lru", "fifo", "vllm")
        for row in S.accuracy_rows(trace, "chat", policy, ["5%", "20%"], [0.5, 0.2], [0, 1])
    ]
    fig = S.accuracy_figure(pd.DataFrame(rows), "t", lines=["vllm", "lru"])
    *curves, every = fig.axes
    assert len(curves) == 2  # one trace x two rates
    for ax in curves:
        assert [line.get_label() for line in ax.get_lines()][-2:] == ["vllm", "lru"]
    assert [t.get_text() for t in every.get_xticklabels()] == ["lru", "fifo", "vllm"]
    assert every.get_yscale() == "log"
    assert len(every.containers) == 2  # one errorbar series per rate
    assert S.ERROR_BAR_PTS in [line.get_ydata()[0] for line in every.get_lines()]
    everything = S.accuracy_figure(pd.DataFrame(rows), "t")
    assert [ln.get_label() for ln in everything.axes[0].get_lines()][-3:] == ["lru", "fifo", "vllm"]


def test_a_sample_replayed_at_every_capacity_is_rebuilt_once_into_the_same_rows(trace, monkeypatch):
    """A per-key sample (a CompactTrace) is rebuilt into a list once for a policy that replays
    it request by request, kept compact for one that replays it by radix node (lru and vllm
    here); the rows equal those of every replay reading the compact sample itself."""
    from skv.compact_trace import CompactTrace

    caps, rates, seeds = ["1%", "5%", "20%"], [0.3, 0.1], [0, 1]
    for policy in ("adaptive_semantic", "lfu", "vllm", "lru"):
        sample = mrc.sample_trace(trace, 0.3, seed=0, unit="block").trace
        assert isinstance(sample, CompactTrace)
        kept = S._replayable(sample, policy)
        assert isinstance(kept, CompactTrace) == (policy in ("lru", "vllm"))  # node replays
        assert kept is sample or [(r.keys, r.tokens, r.stypes) for r in kept] == [
            (r.keys, r.tokens, r.stypes) for r in sample
        ]
        got = S.accuracy_rows(trace, "chat", policy, caps, rates, seeds, unit="block")
        with monkeypatch.context() as m:
            m.setattr(S, "_replayable", lambda t, p: t)  # every replay reads the sample itself
            want = S.accuracy_rows(trace, "chat", policy, caps, rates, seeds, unit="block")
        assert got == want


def test_a_worker_loads_and_compiles_a_trace_once_for_its_tasks_in_a_row(
    chats, tmp_path, monkeypatch
):
    """The tasks of one trace reuse its compiled list (the config's policies are online:
    replays leave it as it was); a task's rows equal those of a freshly compiled trace."""
    from skv.experiments.replay import capacity

    write_skv_trace(tmp_path / "chat.jsonl", chats)
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    loads = []
    real = capacity.load_real_trace

    def counting(*a, **k):
        loads.append(a)
        return real(*a, **k)

    monkeypatch.setattr(capacity, "load_real_trace", counting)
    S._compiled.cache_clear()
    grid = (("2%", "10%"), (0.1,), (0, 1), "block")
    got = [S._task(("chat", "chat.jsonl", {}, p, *grid)) for p in ("lfu", "vllm", "lfu")]
    S._compiled.cache_clear()
    assert len(loads) == 1
    fresh = compile_trace(real("chat.jsonl"))
    assert got[0] == got[2] == S.accuracy_rows(fresh, "chat", "lfu", *grid)
    assert got[1] == S.accuracy_rows(fresh, "chat", "vllm", *grid)
