"""Claude Code sessions over a tiered KV store (skv.experiments.replay.tiered): the config's
checks, the tables and claims on hand-made rows (no trace needed), and a small run on the real
sessions where the trace is present."""

from __future__ import annotations

import pandas as pd
import pytest

from skv.experiments.config import ConfigError
from skv.experiments.plotstyle import save_figure
from skv.experiments.replay import tiered as T
from skv.traces import trace_dir

CONFIG = "experiments/replay/claude_code_tiered.yaml"


def cfg_with(**over) -> T.TieredAgentConfig:
    data = T.load(CONFIG, quick=False).model_dump()
    data.update(over)
    return T.TieredAgentConfig.model_validate(data)


def small_cfg() -> T.TieredAgentConfig:
    return cfg_with(
        seeds=[0, 1, 2],
        cpu_tiers=["none", "64GB"],
        gpu_policies=["lru", "saecache"],
        cpu_policies=["lru", "sieve"],
    )


def hand_rows(cfg: T.TieredAgentConfig) -> pd.DataFrame:
    """Rows with known answers: GPU only takes 10, 12, 14 s per seed; a 64 GB tier 2 s;
    saecache/sieve 1 s (twice as fast as lru/lru), the other pairs as lru/lru."""
    rows = []
    for seed in cfg.seeds:
        for cap, g, c in cfg.cells():
            if cap == "none":
                ttft, hit, cpu = 10_000.0 + 2000 * seed, 0.60, 0.0
            elif (g, c) == ("saecache", "sieve"):
                ttft, hit, cpu = 1000.0, 0.95, 0.30
            else:
                ttft, hit, cpu = 2000.0, 0.90, 0.25
            rows.append({"seed": seed, "cpu_tier": cap, "gpu_policy": g,
                         "cpu_policy": c if cap != "none" else "", "ttft_ms_mean": ttft,
                         "ttft_ms_p90": ttft * 2, "token_hit_rate": hit,
                         "gpu_token_hit_rate": hit - cpu, "cpu_token_hit_rate": cpu})  # fmt: skip
    return pd.DataFrame(rows)


def test_cells_cover_both_sweeps_once():
    cfg = small_cfg()
    cells = cfg.cells()
    assert len(cells) == len(set(cells)) == 2 + 3  # sizes (lru/lru) + the other pairs
    assert ("64GB", "saecache", "sieve") in cells and ("none", "lru", "lru") in cells


def test_tables_and_claims_on_known_rows(tmp_path):
    cfg = small_cfg()
    rows = hand_rows(cfg)
    sizes = T.size_table(cfg, rows)
    tier = sizes[sizes["cpu_tier"] == "64GB"].iloc[0]
    assert tier["speedup_vs_gpu_only"] == pytest.approx((5 + 6 + 7) / 3)
    assert tier["cpu_token_hit_rate"] == pytest.approx(0.25)
    pairs = T.pair_table(cfg, rows)
    best = pairs.iloc[0]
    assert (best["gpu_policy"], best["cpu_policy"]) == ("saecache", "sieve")
    assert best["speedup_vs_lru_lru"] == pytest.approx(2.0)
    values = T.claim_values(cfg, rows)
    assert values["best_pair"] == "saecache/sieve"
    assert values["best_pair_speedup"]["value"] == pytest.approx(2.0)
    assert values["cpu_tier_hit_gain_pts"]["value"] == pytest.approx(30.0)
    assert values["cpu_tier_speedup"]["n"] == 3
    assert values["cpu_sieve_speedup"]["value"] == pytest.approx(1.0)  # lru/sieve = lru/lru
    assert values["cpu_sieve_hit_diff_pts"]["value"] == pytest.approx(0.0)
    fig = T.figure_tiers(cfg, sizes, pairs, "tiered (test)")
    assert save_figure(fig, tmp_path, "fig_claude_code_tiered")


@pytest.mark.parametrize(
    "over, message",
    [
        ({"cpu_tiers": ["64GB"], "pair_tier": "64GB"}, "include 'none'"),
        ({"pair_tier": "1TB"}, "'1TB': must be one of cpu_tiers"),
        ({"claim_tier": "none"}, "must be one of cpu_tiers, not 'none'"),
        ({"gpu_policies": ["sieve"]}, "include lru"),
        ({"cpu_policies": ["lru", "belady"]}, "cannot run a tier"),
        ({"link": "usb"}, "link 'usb'"),
        ({"gpu_tier": "lots"}, "capacity 'lots'"),
    ],
)
def test_bad_configs_name_the_problem(over, message):
    with pytest.raises(ValueError, match=message):
        cfg_with(**over)


def test_the_config_and_its_quick_overrides_load(tmp_path):
    full, quick = T.load(CONFIG, quick=False), T.load(CONFIG, quick=True)
    assert len(full.seeds) == 5 and quick.max_sessions is not None
    assert quick.pair_tier in quick.cpu_tiers and quick.claim_tier in quick.cpu_tiers
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\ntitle: t\nseeds: [0]\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        T.load(bad, quick=False)


@pytest.mark.slow
def test_a_cpu_tier_serves_the_real_sessions():
    """Three sessions, one seed, a GPU tier of 1% of their blocks: the CPU tier serves part of
    the prompts, raises the total hit rate, and never lowers it below GPU only."""
    root = trace_dir()
    if root is None or not (root / "weka_cc").exists():
        pytest.skip("needs the Claude Code sessions (../shared/traces/weka_cc)")
    cfg = cfg_with(max_sessions=3, seeds=[0], gpu_tier="1%", cpu_tiers=["none", "20%"],
                   pair_tier="20%", claim_tier="20%", gpu_policies=["lru"],
                   cpu_policies=["lru"])  # fmt: skip
    rows = T.run(cfg, jobs=1).set_index("cpu_tier")
    assert rows.loc["20%", "cpu_token_hit_rate"] > 0
    assert rows.loc["20%", "token_hit_rate"] > rows.loc["none", "token_hit_rate"]
    assert rows.loc["none", "cpu_token_hit_rate"] == 0
    assert rows.loc["20%", "load_ms_per_request"] > 0
