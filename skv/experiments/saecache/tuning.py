"""SAECache under equal tuning (``experiments/saecache/saecache_tuning.yaml``).

A setting is one config of the 14-setting grid (``experiments/saecache/grid/<name>.yaml``: its
workload, arrivals, capacity share, latency model and batch limits); a trace is that setting's
workload at one seed. saecache and every baseline with parameters try the same number of
settings on the tuning traces (the grid's settings at seeds the evaluation never uses), then
run on the evaluation traces (the grid's own seeds) with their default and their tuned
setting; the rule and the report are :mod:`skv.experiments.equal_tuning`'s. A variant's
parameters are merged over those the grid config gives its policy. Every TTFT is simulated,
here or by ``tab_saecache_grid``: the evaluation reads the runs that step stored with the
identical config (every default run; :func:`grid_runs`) instead of simulating them again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError, model_validator

from skv.experiments import equal_tuning as ET
from skv.experiments.config import ExperimentConfig, PolicySpec, load_config
from skv.experiments.saecache.regimes import METRICS, simulate_policies
from skv.experiments.saecache.study import GRID_DIR, load_runs, replace_fields

log = logging.getLogger(__name__)


class SaeTuningConfig(ET.TuningConfig):
    """The equal-tuning config of the SAECache study; settings name grid configs."""

    grid_dir: str = GRID_DIR
    #: requests per trace (None: the grid config's own)
    num_requests: int | None = Field(default=None, ge=100, le=100_000)

    #: the cell's metrics (skv.experiments.saecache.regimes.METRICS) and their directions
    DIRECTIONS: ClassVar[dict[str, str]] = {
        "ttft_ms_mean": "lower", "ttft_ms_p99": "lower", "token_hit_rate": "higher"
    }  # fmt: skip

    @model_validator(mode="after")
    def _check_settings(self) -> SaeTuningConfig:
        for s in {*self.tuning.settings, *self.evaluation.settings}:
            if not (Path(self.grid_dir) / f"{s}.yaml").is_file():
                raise ValueError(f"setting {s!r}: no {self.grid_dir}/{s}.yaml")
        for policy in self.policies:  # an unknown name or a bad parameter fails here
            _spec(policy, {}, self.field_of(policy))
            for i, params in enumerate(self.grids.get(policy, [])):
                _spec(policy, params, f"grids.{policy}[{i}]")
        return self


def _spec(policy: str, params: dict[str, Any], where: str) -> PolicySpec:
    try:
        return PolicySpec(name=policy, params=params)
    except ValidationError as exc:
        raise ValueError(f"{where}: {exc.errors()[0]['msg']}") from None


def setting_config(cfg: SaeTuningConfig, setting: str) -> ExperimentConfig:
    base = load_config(Path(cfg.grid_dir) / f"{setting}.yaml")
    if cfg.num_requests is None:
        return base
    params = {**base.workload.params, "num_requests": cfg.num_requests}
    return replace_fields(base, workload={"name": base.workload.name, "params": params})


def cell_config(
    cfg: SaeTuningConfig, setting: str, variants: Sequence[ET.Variant]
) -> ExperimentConfig:
    """The setting's config with one policy entry per variant, labelled with its key."""
    base = setting_config(cfg, setting)
    own = {p.key: p for p in base.policies}  # the grid config's entry of each policy
    policies = []
    for v in variants:
        spec = own.get(v.policy)
        name, params = (spec.name, dict(spec.params)) if spec else (v.policy, {})
        policies.append({"name": name, "params": {**params, **v.params}, "label": v.key})
    return replace_fields(base, policies=policies)


def run_key(config: dict[str, Any], policy: dict[str, Any], seed: int) -> str:
    """One run as canonical JSON: ``config`` (``model_dump(mode="json")``, as ``results.json``
    stores it) narrowed to its first capacity, ``seed`` and ``policy`` with no label (the label
    names results; the simulation never reads it). Every input of a run by
    :func:`~skv.experiments.saecache.regimes.simulate_policies` or by the runner (not quick) is
    in it, so runs with equal keys are the same simulation."""
    one = {**config, "capacities": config["capacities"][:1], "seeds": [seed],
           "policies": [{**policy, "label": None}]}  # fmt: skip
    return json.dumps(one, sort_keys=True)


def grid_runs(
    cfg: SaeTuningConfig, variants: Sequence[ET.Variant], runs_dir: str | Path
) -> dict[str, dict[str, float]]:
    """:func:`run_key` -> :data:`~skv.experiments.saecache.regimes.METRICS` of the evaluation
    runs that ``tab_saecache_grid`` stored under ``runs_dir`` (its ``results.json`` files).

    Invariant: a stored run is taken only for a run of ``variants`` on ``cfg.evaluation``'s
    traces with the identical config (workload and its parameters, capacity, latency, batch,
    keying, policy and its parameters, seed: the whole :func:`run_key`), from a run that was not
    quick and at its config's first capacity; so taking it changes no number. Every other run is
    simulated; a default run the grid did not store with its config, or a missing ``runs_dir``, is
    logged."""
    try:
        docs = load_runs(runs_dir)
    except FileNotFoundError as exc:
        log.warning("%s: every evaluation run is simulated", exc)
        docs = {}
    stored = {}
    for doc in docs.values():
        c = doc["config"]
        specs = {p["label"] or p["name"]: p for p in c["policies"]}
        first = str(c["capacities"][0])
        for r in doc["runs"]:
            metrics = [r[m] for m in METRICS]
            if doc.get("quick") is False and r["capacity"] == first and None not in metrics:
                key = run_key(c, specs[r["policy"]], r["seed"])
                stored[key] = {m: float(x) for m, x in zip(METRICS, metrics, strict=True)}
    found = {}
    for setting in cfg.evaluation.settings:
        c = cell_config(cfg, setting, variants).model_dump(mode="json")
        for seed in cfg.evaluation.seeds:
            for v, p in zip(variants, c["policies"], strict=True):
                key = run_key(c, p, seed)
                if key in stored:
                    found[key] = stored[key]
                elif v.setting == "default":
                    log.warning("%s on %s seed %d: no grid run with its config; simulated",
                                v.policy, setting, seed)  # fmt: skip
    return found


def cell(
    cfg: SaeTuningConfig,
    setting: str,
    seed: int,
    variants: Sequence[ET.Variant],
    stored: Mapping[str, dict[str, float]] | None = None,
) -> dict[str, dict[str, float]]:
    """Every variant on the setting's trace at ``seed`` (one trace, so paired): a run whose
    :func:`run_key` is in ``stored`` (:func:`grid_runs`) is read from there, the rest simulated."""
    config = cell_config(cfg, setting, variants)
    c = config.model_dump(mode="json")
    out, todo = {}, []
    for p in c["policies"]:
        got = stored.get(run_key(c, p, seed)) if stored else None
        if got is None:
            todo.append(p)
        else:
            out[p["label"]] = dict(got)
    if todo:
        out |= simulate_policies(replace_fields(config, policies=todo), seed)
    return out


def load(path: str | Path, *, quick: bool) -> SaeTuningConfig:
    return ET.load_config(path, SaeTuningConfig, quick=quick)
