"""CacheRoute under equal tuning (``experiments/cacheroute/cacheroute_tuning.yaml``).

A setting names one workload of the study config ``base`` (its cluster, SLO, warm-up and search
bracket); a trace is that workload at one seed. cacheroute and every baseline router with
parameters try the same number of settings on the tuning traces (seeds the evaluation never
uses), scored by max QPS at the SLO (the bisection of :func:`skv.experiments.cacheroute.study.
search`, on the config's percentile), then run on the evaluation traces with their default
and their tuned setting; the rule and the report are :mod:`skv.experiments.equal_tuning`'s. A
variant's parameters are merged over those ``base`` gives its router, and it keeps that
router's view. Every QPS is simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from skv.experiments import equal_tuning as ET
from skv.experiments.cacheroute import study as S

#: what a cell records per router
METRICS = ("qps", "hit_rate", "ttft_ms_slo")


class RouteTuningConfig(ET.TuningConfig):
    """The equal-tuning config of the CacheRoute study; settings name ``base``'s workloads and
    policies its routers (by label, else name)."""

    base: str
    measured_requests: int = Field(default=3000, ge=100, le=100_000)
    #: replicas (None: ``base``'s); the search bracket scales with replicas / base's replicas
    replicas: int | None = Field(default=None, ge=1, le=64)

    #: the cell's metrics (:data:`METRICS`) and their directions
    DIRECTIONS: ClassVar[dict[str, str]] = {
        "qps": "higher", "hit_rate": "higher", "ttft_ms_slo": "lower"
    }  # fmt: skip

    @model_validator(mode="after")
    def _check_base(self) -> RouteTuningConfig:
        from skv.routing.registry import make_router

        try:
            base = S.load_config(self.base, quick=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"base: {exc}") from None
        workloads = [w.key for w in base.workloads]
        for s in {*self.tuning.settings, *self.evaluation.settings}:
            if s not in workloads:
                raise ValueError(f"setting {s!r} is not a workload of {self.base} ({workloads})")
        routers = {r.key: r for r in base.routers}
        for p in self.policies:
            if p not in routers:
                raise ValueError(f"{self.field_of(p)}: router {p!r} is not in {self.base} "
                                 f"({', '.join(routers)})")  # fmt: skip
            for i, params in enumerate(self.grids.get(p, [])):  # fails here, not mid-sweep
                try:
                    make_router(routers[p].name, **{**routers[p].params, **params})
                except ValueError as exc:
                    raise ValueError(f"grids.{p}[{i}]: {exc}") from None
        return self

    @property
    def replica_count(self) -> int:
        """The cluster's replicas in this run (``replicas``, else ``base``'s)."""
        return self.replicas or S.load_config(self.base, quick=False).cluster.replicas


def run_config(cfg: RouteTuningConfig, variants: Sequence[ET.Variant]) -> S.CacheRouteConfig:
    """``base`` with the variants as its routers and the study's measured requests."""
    base = S.load_config(cfg.base, quick=False)
    own = {r.key: r for r in base.routers}
    routers = [
        {"name": own[v.policy].name, "params": {**own[v.policy].params, **v.params},
         "view": own[v.policy].view, "label": v.key}
        for v in variants
    ]  # fmt: skip
    data = base.model_dump(mode="json")
    data |= {"id": f"{cfg.id}_cell", "routers": routers, "seeds": [0],
             "measured_requests": cfg.measured_requests}  # fmt: skip
    if cfg.replicas is not None:
        scale = cfg.replicas / base.cluster.replicas
        data["cluster"] = {**data["cluster"], "replicas": cfg.replicas}
        data["search"] = {**data["search"], "lo": data["search"]["lo"] * scale,
                          "hi": data["search"]["hi"] * scale}  # fmt: skip
    return S.CacheRouteConfig.model_validate(data)


def cell(
    cfg: RouteTuningConfig, setting: str, seed: int, variants: Sequence[ET.Variant]
) -> dict[str, dict[str, float]]:
    """Every variant's max QPS at the SLO on the setting's workload at ``seed``."""
    run = run_config(cfg, variants)
    wi = [w.key for w in run.workloads].index(setting)
    out = {}
    for ri, v in enumerate(variants):
        res = S.search(run, wi, ri, seed)
        out[v.key] = {m: float(res["qps"] if m == "qps" else res["at"][m]) for m in METRICS}
        # the search's answer is a bound when even its low end missed or its top still met
        out[v.key]["censored"] = float(res["below_lo"] or res["above_hi"])
    return out


def load(path: str | Path, *, quick: bool) -> RouteTuningConfig:
    return ET.load_config(path, RouteTuningConfig, quick=quick)
