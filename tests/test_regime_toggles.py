"""The deviation ledger's toggles (skv.experiments.regimes: Toggles, with_paths, run_toggles,
toggle_table): one setting run as it is and with one change at a time, on cells whose answers
are known; and each study's cell applying a toggle's config paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_regimes import BASE as REGIME_BASE

from skv.experiments import regimes as R

REPO = Path(__file__).resolve().parents[1]

#: test_regimes' toy map on two axes, with toggles
BASE = {
    **REGIME_BASE,
    "axes": {"load": [1, 2], "mix": ["a", "b"]},
    "toggles": {
        "at": {"load": 1, "mix": "a"},
        "changes": {"heavier": {"load": 2}, "boost": {"boost": 1.4}},
    },
}


def toy_cell(cfg: R.RegimeConfig, setting: dict, seed: int) -> dict:
    """ref's TTFT is 100 x load; the method's is ref's / (load x boost x (1 + 0.01 seed))."""
    ref = 100.0 * setting["load"]
    factor = setting["load"] * setting.get("boost", 1.0) * (1 + 0.01 * seed)
    censored = float(setting["load"] == 2 and seed == 0)  # a bound, as a capped search gives
    out = {"ref": {"ttft": ref, "censored": censored}, "m": {"ttft": ref / factor, "censored": 0}}
    if "other" in cfg.policies:  # the toggles run the method and the reference only
        out["other"] = {"ttft": ref, "censored": 0}
    return out


def toy(**changes) -> R.RegimeConfig:
    return R.RegimeConfig.model_validate({**BASE, **changes})


def test_toggles_run_the_at_setting_and_each_change_with_method_and_reference_only():
    cfg = toy()
    rows = R.run_toggles(cfg, toy_cell, jobs=1)
    assert list(dict.fromkeys(rows["toggle"])) == ["none", "heavier", "boost"]
    assert set(rows["policy"]) == {"m", "ref"}
    assert len(rows) == 3 * 3 * 2
    table = R.toggle_table(cfg, rows).set_index("toggle")
    seeds = np.array([1.0, 1.01, 1.02])
    for name, factor in (("none", 1.0), ("heavier", 2.0), ("boost", 1.4)):
        assert table.loc[name, "ratio_ref"] == pytest.approx(np.mean(factor * seeds))
        # the change from the untoggled setting, paired per seed
        assert table.loc[name, "delta"] == pytest.approx(np.mean((factor - 1) * seeds))
    assert table.loc["none", "delta_low"] == table.loc["none", "delta_high"] == 0
    assert table.loc["heavier", "headline_vs_ref"] == "holds"  # 2.0x beats the 1.4x headline
    assert table.loc["boost", "headline_vs_ref"] == "unresolved"  # 1.4x, spread over seeds
    assert table.loc["none", "headline_vs_ref"] == "below"
    assert table.loc["heavier", "change"] == "load = 2"
    assert table.loc["boost", "change"] == "boost = 1.4"
    values = R.toggle_claim_values(cfg, table.reset_index())
    assert values["toggles"] == 2 and values["toggles_holds"] == 1
    assert values["toggles_at"] == "load 1, mix a"
    assert values["toggles_max_ratio_ref_at"] == "heavier"
    assert values["toggles_max_ratio_ref"] == values["toggle_heavier_ratio_ref"]
    assert values["toggle_boost_delta"]["value"] == pytest.approx(0.4 * seeds.mean())
    assert values["toggle_boost_delta"]["n"] == 3
    # a censored value is counted per toggle, so a bound is never read as an answer
    assert table["censored"].to_dict() == {"none": 0, "heavier": 1, "boost": 0}
    assert values["toggles_censored"] == 1


def test_toggles_holds_counts_the_changes_not_the_untoggled_setting():
    cfg = toy(toggles={"at": {"load": 2, "mix": "a"}, "changes": {"boost": {"boost": 1.4}}})
    table = R.toggle_table(cfg, R.run_toggles(cfg, toy_cell, jobs=1))
    assert list(table["headline_vs_ref"]) == ["holds", "holds"]  # 2x and 2.8x
    values = R.toggle_claim_values(cfg, table)
    assert values["toggles"] == 1 and values["toggles_holds"] == 1


def test_a_map_without_toggles_runs_none():
    cfg = toy(toggles=None)
    rows = R.run_toggles(cfg, toy_cell, jobs=1)
    assert rows.empty and R.toggle_table(cfg, rows).empty
    assert R.toggle_claim_values(cfg, R.toggle_table(cfg, rows)) == {}


@pytest.mark.parametrize(
    ("toggles", "message"),
    [
        ({"at": {"load": 1}, "changes": {"x": {"load": 2}}}, "toggles.at: give a value for each"),
        ({"at": {"load": 1, "mix": "a"}, "changes": {"x": {}}}, "changes nothing"),
        ({"at": {"load": 1, "mix": "a"}, "changes": {"none": {"load": 2}}}, "untoggled"),
        ({"at": {"load": 1, "mix": "a"}, "changes": {}}, "changes"),
    ],
)
def test_bad_toggles_name_the_field(toggles, message):
    with pytest.raises(ValueError, match=message):
        toy(toggles=toggles)


def test_with_paths_sets_keys_and_list_items_and_refuses_unknown_ones():
    data = {
        "latency": {"name": "roofline", "params": {"gpu": "A40"}},
        "routers": [
            {"name": "cacheroute", "label": None, "params": {"prefix_blocks": 2}},
            {"name": "cacheroute", "label": "cacheroute_defaults", "params": {}},
            {"name": "sglang_cache_aware", "label": None, "view": "approximate"},
        ],
    }
    out = R.with_paths(
        data,
        {
            "latency.params.mfu": 0.3,  # a new key, but only in a params mapping
            "routers.sglang_cache_aware.view": "exact",  # by name
            "routers.cacheroute.params.prefix_blocks": 4,  # by name: not the labelled one
            "routers.1.params": {"x": 1},  # by index
        },
    )
    assert out["latency"]["params"] == {"gpu": "A40", "mfu": 0.3}
    assert out["routers"][2]["view"] == "exact"
    assert out["routers"][0]["params"] == {"prefix_blocks": 4}
    assert out["routers"][1]["params"] == {"x": 1}
    assert data["latency"]["params"] == {"gpu": "A40"}  # the input is not changed
    assert data["routers"][0]["params"] == {"prefix_blocks": 2}
    every = R.with_paths(data, {"routers.*.name": "lru"})
    assert [r["name"] for r in every["routers"]] == ["lru"] * 3
    for path, message in (
        ("latency.mfu", "no 'mfu'"),  # a typo outside params is refused
        ("routers.nope.view", "no list item 'nope'"),
        ("latency.name.x", "'x' is inside a value"),
    ):
        with pytest.raises(ValueError, match=f"config.{path}: {message}"):
            R.with_paths(data, {path: 1})


def test_split_setting_separates_config_paths():
    axes, paths = R.split_setting({"load": 1, "config.block_size": 32, "boost": 2})
    assert axes == {"load": 1, "boost": 2} and paths == {"block_size": 32}


# ------------------------------------------------------------------- each study's toggles


def test_saecache_toggle_paths_reach_the_simulated_config(tmp_path):
    import yaml

    from skv.experiments.saecache import regimes as SR

    path = REPO / "experiments/saecache/saecache_regimes.yaml"
    cfg = SR.load(path, quick=False)
    at = dict(cfg.toggle_settings())["none"]
    plain = SR.setting_config(cfg, at)
    changes = {"config.block_size": 32, "config.latency.params.mbu": 0.5, "num_requests": 8000}
    toggled = SR.setting_config(cfg, {**at, **changes})
    assert (plain.block_size, toggled.block_size) == (16, 32)
    assert "mbu" not in plain.latency.params and toggled.latency.params["mbu"] == 0.5
    assert toggled.workload.params["num_requests"] == 8000
    assert [p.key for p in toggled.policies] == [p.key for p in plain.policies]
    data = yaml.safe_load(path.read_text())
    data["toggles"]["changes"]["typo"] = {"config.latency.params.mfux": 0.3}
    bad = tmp_path / "map.yaml"
    bad.write_text(yaml.safe_dump(data).replace("experiments/", str(REPO / "experiments") + "/"))
    with pytest.raises(ValueError, match=r"toggles.changes.typo: .*mfux"):
        SR.load(bad, quick=False)


def test_cacheroute_toggle_paths_change_one_router_each():
    from skv.experiments.cacheroute import regimes as CR

    cfg = CR.load(REPO / "experiments/cacheroute/cacheroute_regimes.yaml", quick=False)
    named = dict(cfg.toggle_settings())
    plain = CR.setting_config(cfg, named["none"])
    view = {r.key: r.view for r in CR.setting_config(cfg, named["exact_view"]).routers}
    assert view["sglang_cache_aware"] == "exact"
    assert all(v == "approximate" for k, v in view.items() if k != "sglang_cache_aware")
    keyed = {r.key: r.params for r in CR.setting_config(cfg, named["key_4_blocks"]).routers}
    assert keyed["cacheroute"]["prefix_blocks"] == 4
    assert keyed["consistent_hashing"]["prefix_blocks"] == 2
    blocks = CR.setting_config(cfg, named["blocks_256"])
    assert blocks.workloads[0].params["block_tokens"] == 256
    assert tuple(blocks.workloads[0].params["prefix_blocks"]) == (8, 32)
    assert plain.cluster.replicas == 4 and plain.cluster.mfu == 0.5
    assert CR.setting_config(cfg, named["mfu_0.3"]).cluster.mfu == 0.3


def test_repurpose_toggle_paths_change_what_the_cell_replays():
    from skv.experiments.repurpose import regimes as RR

    cfg = RR.load(REPO / "experiments/repurpose/repurpose_regimes.yaml", quick=True)
    cfg = cfg.model_copy(update={"workload": {"num_requests": 400}})
    at = {**dict(cfg.toggle_settings())["none"], "capacity": "2GB"}  # a cache that evicts
    plain = json.dumps(RR.cell(cfg, at, 0), sort_keys=True)
    for path, value in (("policy", "s3fifo"), ("block_size", 32), ("model", "qwen2.5-7b")):
        toggled = json.dumps(RR.cell(cfg, {**at, f"config.{path}": value}, 0), sort_keys=True)
        direct = RR.cell(cfg.model_copy(update={path: value}), at, 0)
        assert toggled == json.dumps(direct, sort_keys=True) != plain, path
    # the workload parameters a toggle names reach the workload
    short = RR.cell(cfg, {**at, "system_tokens": 128, "history_tokens": 64}, 0)
    assert short["prefix"]["head_share"] < RR.cell(cfg, at, 0)["prefix"]["head_share"]
