"""KV-Repurpose over a tiered KV store (skv.experiments.repurpose.tiered): known answers on a
small zipf_rag trace, pairing of the ratios, claims, figure and config errors."""

from __future__ import annotations

from functools import cache

import pandas as pd
import pytest

from skv.experiments.config import ConfigError
from skv.experiments.plotstyle import save_figure
from skv.experiments.repurpose import study as S
from skv.experiments.repurpose import tiered as RT
from skv.replay import compile_trace, trace_totals
from skv.workloads import WORKLOADS

CONFIG = "experiments/repurpose/repurpose_tiered.yaml"


def small(**over) -> RT.TieredConfig:
    """The study's config on 600 requests over 400 documents, a 2 GB GPU tier."""
    cfg = RT.load(CONFIG, quick=True)
    data = cfg.model_dump()
    data.update(
        workload={"num_requests": 600, "corpus_size": 400},
        seeds=[0, 1],
        gpu="2GB",
        stacks={"gpu_only": [], "dram": ["cpu=4GB"], "ssd": ["disk=4GB"], "all": ["cpu=1TB"]},
        claim_stack="dram",
    )
    data.update(over)
    return RT.TieredConfig.model_validate(data)


@cache
def rows_of_small() -> pd.DataFrame:
    return RT.sweep(small(), jobs=1)


def test_gpu_only_is_the_capacity_studys_replay():
    cfg = small()
    rows = rows_of_small()
    reqs = WORKLOADS["zipf_rag"](cfg.workload_params(0))
    trace = compile_trace(reqs, block_size=16, mode="segment")
    cap = S.capacity_blocks("2GB", block_size=16, model=cfg.model, total_blocks=0)
    _, stats = S.chain_hits(trace, "lru", cap)
    got = rows[(rows["seed"] == 0) & (rows["mode"] == "segment") & (rows["stack"] == "gpu_only")]
    assert set(got["token_hit_rate"]) == {stats.hit_tokens / trace_totals(trace).prompt_tokens}
    assert set(got["mean_load_ms"]) == {0.0}


@pytest.mark.parametrize("mode", ["prefix", "segment"])
def test_a_lower_tier_that_holds_everything_gives_the_infinite_cache_for_free(mode):
    """Free loads from a 1 TB tier: every reusable block is found in some tier, so the hit
    rate is the capacity study's ``inf`` (a request always fits the 2 GB GPU tier)."""
    cfg = small()
    rows = rows_of_small()
    reqs = WORKLOADS["zipf_rag"](cfg.workload_params(1))
    trace = compile_trace(reqs, block_size=16, mode=mode)
    totals = trace_totals(trace)
    inf = S.capacity_blocks(
        "inf", block_size=16, model=cfg.model, total_blocks=totals.block_accesses
    )
    _, stats = S.chain_hits(trace, "lru", inf)
    d = rows[(rows["seed"] == 1) & (rows["mode"] == mode) & (rows["stack"] == "all")]
    free = d[d["cost"] == "free"]
    assert set(free["token_hit_rate"]) == {stats.hit_tokens / totals.prompt_tokens}
    paid = d[d["cost"] == "series"]
    # paying for transfers can only lose hits (recomputed runs) and add load time
    assert (paid["token_hit_rate"].to_numpy() <= free["token_hit_rate"].to_numpy()).all()
    assert (paid["mean_load_ms"] > 0).all()


def test_paid_ttft_is_free_ttft_plus_loads_in_series_and_at_least_compute_overlapped():
    rows = rows_of_small()
    assert set(rows[rows["cost"] == "free"]["mean_load_ms"]) == {0.0}  # free: no load time
    d = rows[rows["stack"] == "ssd"].set_index(["seed", "mode", "scheme", "cost"])
    hidden = []
    for key in {k[:3] for k in d.index}:
        series = d.loc[(*key, "series"), "mean_ttft_ms"]
        overlap = d.loc[(*key, "overlap"), "mean_ttft_ms"]
        assert overlap <= series
        assert series - overlap <= d.loc[(*key, "series"), "mean_load_ms"] + 1e-9
        hidden.append(series - overlap)
    assert max(hidden) > 0  # overlapping hides some load time somewhere


def test_the_slower_link_keeps_less_of_the_gain():
    """The same 4 GB behind an NVMe link instead of PCIe 5: more recomputed, more load time."""
    rows = rows_of_small()
    paid = rows[(rows["cost"] == "series") & (rows["mode"] == "segment")]
    by = paid.groupby("stack")[["mean_load_ms", "recomputed_segments"]].mean()
    assert by.loc["ssd", "mean_load_ms"] > by.loc["dram", "mean_load_ms"]
    assert by.loc["ssd", "recomputed_segments"] > by.loc["dram", "recomputed_segments"]


def test_ratios_pair_segment_with_prefix_within_a_seed():
    cfg = small()
    rows = rows_of_small()
    table = RT.ratios(cfg, rows)
    assert list(dict.fromkeys(table["stack"])) == list(cfg.stacks)
    row = table[(table["stack"] == "dram") & (table["cost"] == "series")
                & (table["scheme"] == "naive")].iloc[0]  # fmt: skip
    per_seed = []
    for seed in (0, 1):
        d = rows[(rows["seed"] == seed) & (rows["stack"] == "dram") & (rows["cost"] == "series")]
        seg = d[d["scheme"] == "naive"]["mean_ttft_ms"].iloc[0]
        pre = d[d["scheme"] == "prefix"]["mean_ttft_ms"].iloc[0]
        per_seed.append(seg / pre)
    assert row["ttft_ratio"] == pytest.approx(sum(per_seed) / 2)
    assert row["seeds"] == 2


def test_claim_values_and_figure(tmp_path):
    cfg = small()
    rows = rows_of_small()
    values = RT.claim_values(cfg, rows)
    for key in ("ratio_free", "ratio_series", "ratio_overlap", "kept_series"):
        assert values[key]["n"] == 2
    assert values["ratio_free"]["value"] <= values["ratio_series"]["value"]
    kept = []
    for seed in (0, 1):
        d = rows[(rows["seed"] == seed) & (rows["stack"] == "dram")].set_index(["scheme", "cost"])
        r = {c: d.loc[("cacheblend", c), "mean_ttft_ms"] / d.loc[("prefix", c), "mean_ttft_ms"]
             for c in ("free", "series")}  # fmt: skip
        kept.append((1 - r["series"]) / (1 - r["free"]))
    assert values["kept_series"]["value"] == pytest.approx(sum(kept) / 2)
    assert values["claim_lower"] == "4GB cpu" and values["gpu"] == "2GB"
    fig = RT.figure_ratios(cfg, RT.ratios(cfg, rows), "tiered (test)")
    assert save_figure(fig, tmp_path, "fig_repurpose_tiered")  # passes the style check


def test_the_sweep_is_deterministic():
    cfg = small(seeds=[0], stacks={"dram": ["cpu=4GB"]})
    a = RT.sweep(cfg, jobs=1)
    b = RT.sweep(cfg, jobs=1)
    assert a.to_csv(index=False) == b.to_csv(index=False)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"claim_stack": "nope"}, "claim_stack 'nope'"),
        ({"claim_scheme": "prefix"}, "claim_scheme"),
        ({"stacks": {"x": ["cpu"]}}, "stacks.x: tier 'cpu'"),
        ({"gpu": "lots"}, "capacity 'lots'"),
    ],
)
def test_bad_configs_say_which_field(over, message):
    with pytest.raises(ValueError, match=message):
        small(**over)


def test_the_config_file_loads_and_errors_name_the_file(tmp_path):
    cfg = RT.load(CONFIG, quick=False)
    assert cfg.claim_stack in cfg.stacks and len(cfg.seeds) == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\nseeds: [0]\nstacks: {a: []}\nclaim_stack: b\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        RT.load(str(bad), quick=False)
