"""SAECache under equal tuning (``experiments/saecache/saecache_tuning.yaml``).

A setting is one config of the 14-setting grid (``experiments/saecache/grid/<name>.yaml``: its
workload, arrivals, capacity share, latency model and batch limits); a trace is that setting's
workload at one seed. saecache and every baseline with parameters try the same number of
settings on the tuning traces (the grid's settings at seeds the evaluation never uses), then
run on the evaluation traces (the grid's own seeds) with their default and their tuned
setting; the rule and the report are :mod:`skv.experiments.equal_tuning`'s. A variant's
parameters are merged over those the grid config gives its policy. Every TTFT is simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import Field, model_validator

from skv.experiments import equal_tuning as ET
from skv.experiments.config import ExperimentConfig, PolicySpec, load_config
from skv.experiments.saecache.regimes import METRICS, simulate_policies
from skv.experiments.saecache.study import GRID_DIR, replace_fields


class SaeTuningConfig(ET.TuningConfig):
    """The equal-tuning config of the SAECache study; settings name grid configs."""

    grid_dir: str = GRID_DIR
    #: requests per trace (None: the grid config's own)
    num_requests: int | None = Field(default=None, ge=100, le=100_000)

    @model_validator(mode="after")
    def _check_settings(self) -> SaeTuningConfig:
        if self.metric not in METRICS:
            raise ValueError(f"metric {self.metric!r}: a cell records {', '.join(METRICS)}")
        for s in {*self.tuning.settings, *self.evaluation.settings}:
            if not (Path(self.grid_dir) / f"{s}.yaml").is_file():
                raise ValueError(f"setting {s!r}: no {self.grid_dir}/{s}.yaml")
        for policy in self.policies:
            PolicySpec(name=policy)  # an unknown name fails here
        for policy, settings in self.grids.items():
            for params in settings:  # a bad parameter fails here, not mid-sweep
                PolicySpec(name=policy, params=params)
        return self


def setting_config(cfg: SaeTuningConfig, setting: str) -> ExperimentConfig:
    base = load_config(Path(cfg.grid_dir) / f"{setting}.yaml")
    if cfg.num_requests is None:
        return base
    params = {**base.workload.params, "num_requests": cfg.num_requests}
    return replace_fields(base, workload={"name": base.workload.name, "params": params})


def cell(
    cfg: SaeTuningConfig, setting: str, seed: int, variants: Sequence[ET.Variant]
) -> dict[str, dict[str, float]]:
    """Every variant on the setting's trace at ``seed`` (one trace, so paired)."""
    base = setting_config(cfg, setting)
    own = {p.name: dict(p.params) for p in base.policies}
    policies = [
        {"name": v.policy, "params": {**own.get(v.policy, {}), **v.params}, "label": v.key}
        for v in variants
    ]
    return simulate_policies(replace_fields(base, policies=policies), seed)


def load(path: str | Path, *, quick: bool) -> SaeTuningConfig:
    return ET.load_config(path, SaeTuningConfig, quick=quick)
