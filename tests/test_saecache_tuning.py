"""SAECache under equal tuning reads the runs tab_saecache_grid stored (skv/experiments/saecache/
tuning.py: grid_runs, cell): a stored run stands in for a simulation only when its whole config
is the one the cell would simulate, and then gives the very numbers the simulation would."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest

from skv.artifact.pipeline import STEPS
from skv.experiments import equal_tuning as ET
from skv.experiments.runner import dumps_json, simulate_experiment
from skv.experiments.saecache import tuning as ST
from skv.experiments.saecache.study import replace_fields

ROOT = Path(__file__).resolve().parents[1]
SETTING = "balanced_fast"
VARIANTS = (
    ET.Variant("lru", "default"),
    ET.Variant("saecache", "default"),
    ET.Variant("saecache", "grid1", {"eta": 0.02}),
)


@pytest.fixture(scope="module")
def study():
    """A small tuning config (200 requests, one evaluation trace) and the grid's results
    document of that trace (the runner on the setting's config, lru and saecache)."""
    c = ST.load(ROOT / "experiments/saecache/saecache_tuning.yaml", quick=True)
    c = c.model_copy(
        update={"num_requests": 200, "evaluation": ET.Traces(settings=[SETTING], seeds=[0])}
    )
    grid = replace_fields(ST.setting_config(c, SETTING), seeds=[0], policies=["lru", "saecache"])
    return c, json.loads(dumps_json(simulate_experiment(grid)))


def _write(doc: dict, tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    (runs / doc["experiment"]).mkdir(parents=True, exist_ok=True)
    (runs / doc["experiment"] / "results.json").write_text(dumps_json(doc), encoding="utf-8")
    return runs


def test_the_step_reads_the_grid_step():
    assert STEPS["fig_saecache_tuning"].depends == ("tab_saecache_grid",)


def test_the_grids_default_runs_are_read_and_equal_the_simulation(study, tmp_path, monkeypatch):
    c, doc = study
    stored = ST.grid_runs(c, VARIANTS, _write(doc, tmp_path))
    assert len(stored) == 2  # lru and saecache at their defaults; the grid has no eta 0.02
    simulated = ST.cell(c, SETTING, 0, VARIANTS)
    calls = []
    real = ST.simulate_policies

    def spy(config, seed):
        calls.append([p.key for p in config.policies])
        return real(config, seed)

    monkeypatch.setattr(ST, "simulate_policies", spy)
    assert ST.cell(c, SETTING, 0, VARIANTS, stored) == simulated  # the same numbers
    assert calls == [["saecache@grid1"]]  # and only the run the grid lacks was simulated


def _quick(d):
    d["quick"] = True


def _batch(d):
    d["config"]["batch"]["max_running"] = 128


def _requests(d):
    d["config"]["workload"]["params"]["num_requests"] = 300


def _latency(d):
    d["config"]["latency"]["params"]["gpu"] = "A100"


def _capacity(d):
    d["config"]["capacities"] = ["30%"]
    for r in d["runs"]:
        r["capacity"] = "30%"


def _second_capacity(d):  # the runs at the config's second capacity, which a cell never runs
    d["config"]["capacities"] = ["20%", "30%"]
    for r in d["runs"]:
        r["capacity"] = "30%"


def _block_size(d):
    d["config"]["block_size"] = 32


def _seed(d):
    for r in d["runs"]:
        r["seed"] = 1


def _params(d):  # every policy entry given parameters its default does not have
    for p in d["config"]["policies"]:
        p["params"] = {"eta": 0.02} if p["name"] == "saecache" else {"x": 1}


@pytest.mark.parametrize(
    "change",
    [_quick, _batch, _requests, _latency, _capacity, _second_capacity, _block_size, _seed, _params],
)
def test_a_run_with_another_config_is_simulated_and_logged(study, tmp_path, caplog, change):
    c, doc = study
    doc = copy.deepcopy(doc)
    change(doc)
    for r in doc["runs"]:  # numbers no simulation gives: read, they would show
        r["ttft_ms_mean"] = 1e9
    with caplog.at_level(logging.WARNING, logger=ST.__name__):
        stored = ST.grid_runs(c, VARIANTS, _write(doc, tmp_path))
    # none is read, except that a stored saecache with eta 0.02 is saecache@grid1's very config
    assert [v["ttft_ms_mean"] for v in stored.values()] == ([1e9] if change is _params else [])
    out = ST.cell(c, SETTING, 0, VARIANTS, stored)
    assert all(out[k]["ttft_ms_mean"] < 1e9 for k in ("lru@default", "saecache@default"))
    missing = [r.getMessage() for r in caplog.records]
    assert len(missing) == 2 and all("no grid run with its config" in m for m in missing)


def test_no_grid_runs_means_every_run_is_simulated(study, tmp_path, caplog):
    c, _ = study
    with caplog.at_level(logging.WARNING, logger=ST.__name__):
        assert ST.grid_runs(c, VARIANTS, tmp_path / "nowhere") == {}
    assert "every evaluation run is simulated" in caplog.records[0].getMessage()
