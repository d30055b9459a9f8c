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
from typing import Any, ClassVar

from pydantic import Field, ValidationError, model_validator

from skv.experiments import equal_tuning as ET
from skv.experiments.config import ExperimentConfig, PolicySpec, load_config
from skv.experiments.saecache.regimes import simulate_policies
from skv.experiments.saecache.study import GRID_DIR, replace_fields


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


def cell(
    cfg: SaeTuningConfig, setting: str, seed: int, variants: Sequence[ET.Variant]
) -> dict[str, dict[str, float]]:
    """Every variant on the setting's trace at ``seed`` (one trace, so paired)."""
    base = setting_config(cfg, setting)
    own = {p.key: p for p in base.policies}  # the grid config's entry of each policy
    policies = []
    for v in variants:
        spec = own.get(v.policy)
        name, params = (spec.name, dict(spec.params)) if spec else (v.policy, {})
        policies.append({"name": name, "params": {**params, **v.params}, "label": v.key})
    return simulate_policies(replace_fields(base, policies=policies), seed)


def load(path: str | Path, *, quick: bool) -> SaeTuningConfig:
    return ET.load_config(path, SaeTuningConfig, quick=quick)
