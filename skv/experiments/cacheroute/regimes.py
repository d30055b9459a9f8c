"""CacheRoute's regime map: where cacheroute's max QPS at the SLO beats the best baseline's.

The grid (``experiments/cacheroute/cacheroute_regimes.yaml``) varies what the paper's setup
fixes: the number of replicas, each replica's KV memory (``gpu_memory_utilization``), the
key skew (``key_zipf``), the share of requests on shared prefixes (``shared_share``), the
prompt length (``prefix_blocks``: the shared prefix's range of 512-token blocks) and the TTFT
SLO (``slo_ms``). Everything else is the study config named by ``base`` (the cluster's model
and GPUs, the routers' parameters and views, warm-up, percentile, search bracket).

A cell is one (setting, seed): the max-QPS search of every router on the same seeded
workload (:func:`skv.experiments.cacheroute.study.search`), so the ratios are paired within
a seed. The search bracket scales with the replica count (``base``'s bracket is for its own
cluster size), so a small cluster's answer is not below ``lo``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from skv.experiments import regimes as R
from skv.experiments.cacheroute import study as S

#: what a cell records per router
METRICS = ("qps", "hit_rate", "ttft_ms_slo")
#: axes that set the cluster, the config, or the workload's parameters
CLUSTER_AXES = ("replicas", "gpu_memory_utilization")
CONFIG_AXES = ("slo_ms",)


class RouteRegimeConfig(R.RegimeConfig):
    """``experiments/cacheroute/cacheroute_regimes.yaml``."""

    #: the SLO only judges a simulated point: settings that differ in it share a task, and their
    #: searches the rates they both probe (:func:`shared_point`)
    shared_axes: ClassVar[tuple[str, ...]] = ("slo_ms",)
    base: str
    measured_requests: int = Field(default=3000, ge=100, le=100_000)

    @model_validator(mode="after")
    def _check_base(self) -> RouteRegimeConfig:
        """Every router named must be in ``base``, and every setting must make a valid
        config: a bad value is named here, not by a run minutes later."""
        for m in (self.metric, *self.secondary):
            if m not in METRICS:
                raise ValueError(f"metric {m!r}: a cell records {', '.join(METRICS)}")
        base = S.load_config(self.base, quick=False)
        keys = [r.key for r in base.routers]
        for p in self.policies:
            if p not in keys:
                raise ValueError(f"router {p!r} is not in {self.base} ({', '.join(keys)})")
        for where, setting in self.checked_settings():
            try:
                setting_config(self, setting, base=base)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self


def setting_config(
    cfg: RouteRegimeConfig, setting: dict[str, Any], *, base: S.CacheRouteConfig | None = None
) -> S.CacheRouteConfig:
    """``base`` with one setting's values, the map's routers, its measured requests, the
    search bracket scaled by replicas / ``base``'s replicas, then any ``config.`` paths
    (:func:`skv.experiments.regimes.with_paths`)."""
    base = base or S.load_config(cfg.base, quick=False)
    data = base.model_dump(mode="json")
    cluster, workload = dict(data["cluster"]), dict(data["workloads"][0])
    params = dict(workload.get("params") or {})
    axes, paths = R.split_setting(setting)
    for name, value in axes.items():
        if name in CLUSTER_AXES:
            cluster[name] = value
        elif name in CONFIG_AXES:
            data[name] = value
        else:
            params[name] = value
    scale = cluster["replicas"] / base.cluster.replicas
    search = dict(data["search"])
    search["lo"], search["hi"] = search["lo"] * scale, search["hi"] * scale
    data |= {
        "id": f"{cfg.id}_cell",
        "cluster": cluster,
        "workloads": [{**workload, "params": params}],
        "routers": [r for r in data["routers"] if (r["label"] or r["name"]) in cfg.policies],
        "measured_requests": cfg.measured_requests,
        "seeds": [0],
        "search": search,
    }
    return S.CacheRouteConfig.model_validate(R.with_paths(data, paths) if paths else data)


@functools.lru_cache(maxsize=256)
def _point_at(cfg_json: str, wi: int, ri: int, seed: int, rate: float) -> dict[str, Any]:
    return S.point_at(S.CacheRouteConfig.model_validate_json(cfg_json), wi, ri, seed, rate)


def shared_point(cfg: S.CacheRouteConfig, wi: int, ri: int, seed: int, rate: float) -> Any:
    """One simulated point, kept for the other SLO of the same setting: a point does not
    depend on ``slo_ms`` (only the search's verdict on it does), so the key leaves it out."""
    key = cfg.model_copy(update={"slo_ms": 1.0}).model_dump_json()
    return dict(_point_at(key, wi, ri, seed, rate))  # a copy: the search returns it as "at"


def cell(cfg: RouteRegimeConfig, setting: dict[str, Any], seed: int) -> dict[str, dict[str, float]]:
    """Every router's max QPS at the SLO on the setting's seeded workload (one search each);
    ``censored`` is 1 when the search met the SLO at its highest rate or missed it at its
    lowest (the QPS is then a bound, not the answer)."""
    run = setting_config(cfg, setting)
    out = {}
    for ri, router in enumerate(run.routers):
        res = S.search(run, 0, ri, seed, point=shared_point)
        out[router.key] = {m: float(res["qps"] if m == "qps" else res["at"][m]) for m in METRICS}
        out[router.key]["censored"] = float(res["above_hi"] or res["below_lo"])
    return out


def load(path: str | Path, *, quick: bool) -> RouteRegimeConfig:
    return R.load_config(path, RouteRegimeConfig, quick=quick)
