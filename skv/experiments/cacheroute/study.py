"""CacheRoute: configs, the QPS-at-SLO sweep, the load sweep, figures, table and claim values.

A config (``experiments/cacheroute/*.yaml``, :class:`CacheRouteConfig`) names one or more
workloads (:mod:`skv.experiments.cacheroute.workloads`), the cluster
(:class:`~skv.experiments.cacheroute.cluster.ClusterSpec`), the routers (each a registry name,
its parameters, the router's view of the replicas and a label), the seeds, the TTFT SLO and
either a search bracket (``kind: qps``: max QPS at the SLO per workload, router and seed) or a
list of offered rates (``kind: load``: every router at every rate). Every (workload, router,
seed) search, or (workload, router, seed, rate) point, is one independent task of the sweep
executor (:mod:`skv.experiments.sweep`), so results do not depend on the number of processes.

Baselines. A router is *cache-blind* when its choice ignores the request's content
(:data:`CACHE_BLIND`: round_robin, random, least_loaded, power_of_two) and *cache-aware*
otherwise (it reads a cache view, or hashes the prefix); ``cacheroute`` is the candidate; every
other router is a baseline. "Best baseline" is the baseline with the highest mean QPS over
seeds, picked per workload.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.cacheroute.cluster import (
    ClusterSpec,
    compile_point,
    retime_point,
    simulate_point,
)
from skv.experiments.cacheroute.workloads import (
    RATE_SCALED,
    WORKLOADS,
    at_rate,
    generate,
    needs_traces,
)
from skv.experiments.plotstyle import (
    GREY_LINE,
    Comparison,
    figure,
    paper_style,
    plain_ticks,
    wrap_title,
)
from skv.experiments.slo_search import max_qps
from skv.experiments.stats import interval
from skv.experiments.sweep import run_sweep
from skv.routing import make_router
from skv.sim import CompiledRun

CANDIDATE = "cacheroute"
#: tokens per hash block of every cluster workload (the Mooncake trace's, and the generated ones')
BLOCK_TOKENS = 512
#: routers whose choice ignores the request's content (its prefix) and every cache
CACHE_BLIND = ("round_robin", "random", "least_loaded", "power_of_two")


class WorkloadEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    label: str = ""

    @property
    def key(self) -> str:
        return self.label or self.name


class RouterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    #: the router's view of the replicas (skv.sim.routers): a deployed router's own
    #: approximate cache, or the exact cache (KV events, or an idealised router)
    view: Literal["exact", "approximate"] = "approximate"
    label: str = ""

    @property
    def key(self) -> str:
        return self.label or self.name

    @property
    def cache_aware(self) -> bool:
        """Routes by what the request shares (its prefix, or a cache's view of it)."""
        return self.name not in CACHE_BLIND


class SearchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    lo: float = Field(default=20.0, gt=0)
    hi: float = Field(default=160.0, gt=0)
    rel_tol: float = Field(default=0.02, gt=0, lt=1)
    max_doublings: int = Field(default=3, ge=0, le=10)


class CacheRouteConfig(BaseModel):
    """``experiments/cacheroute/*.yaml``; ``quick:`` overrides top-level fields (workload
    ``params`` are merged into every workload's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    kind: Literal["qps", "load"] = "qps"
    workloads: list[WorkloadEntry] = Field(min_length=1, max_length=8)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    routers: list[RouterEntry] = Field(min_length=1, max_length=16)
    seeds: list[int] = Field(min_length=1, max_length=20)
    slo_ms: float = Field(default=3500.0, gt=0)
    #: the TTFT percentile the SLO bounds (99: the paper's; a trace whose longest prompts take
    #: longer than the SLO to prefill even alone needs a lower one, and says why)
    slo_percentile: float = Field(default=99.0, gt=0, le=100)
    #: every point: ``ceil(rate * warmup_s)`` warm-up requests, then ``measured_requests``
    warmup_s: float = Field(default=60.0, ge=0, le=3600)
    measured_requests: int = Field(default=8000, ge=100, le=1_000_000)
    search: SearchSpec = Field(default_factory=SearchSpec)
    rates: list[float] = Field(default_factory=list, max_length=40)

    @model_validator(mode="after")
    def _check(self) -> CacheRouteConfig:
        for w in self.workloads:
            if w.name not in WORKLOADS:
                raise ValueError(f"unknown workload {w.name!r}; known: {', '.join(WORKLOADS)}")
            if "num_requests" in w.params:
                raise ValueError(
                    f"workload {w.key}: num_requests is set per point (warmup_s x rate + "
                    "measured_requests); remove it"
                )
            WORKLOADS[w.name][0](**w.params)  # validate its parameters
        for r in self.routers:
            make_router(r.name, **r.params)  # validates name and parameters
        keys = [r.key for r in self.routers]
        if len(set(keys)) != len(keys):
            raise ValueError(f"router labels must be unique, got {keys}")
        if self.kind == "load" and not self.rates:
            raise ValueError("kind load needs rates")
        if any(r <= 0 for r in self.rates):
            raise ValueError(f"rates must be > 0, got {self.rates}")
        if self.search.lo >= self.search.hi:
            raise ValueError(f"search: need lo < hi, got {self.search.lo}, {self.search.hi}")
        return self

    def traces(self) -> tuple[str, ...]:
        return tuple(t for w in self.workloads for t in needs_traces(w.name, w.params))


def load_config(path: str | Path, *, quick: bool) -> CacheRouteConfig:
    """Read and validate a cacheroute config; errors are ``ConfigError`` naming file and field."""
    from skv.experiments.config import ConfigError, _flatten, read_yaml

    data = read_yaml(path, "cacheroute config")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level")
    over = data.pop("quick", None) or {}
    if not isinstance(over, dict) or "quick" in over:
        raise ConfigError(f"{path}: quick: expected a mapping of overrides")
    if quick:
        params = over.pop("workload_params", None) or {}
        kept = over.pop("routers_kept", None)
        data = {**data, **over}
        if kept is not None:
            data["routers"] = _routers_kept(path, data.get("routers"), kept)
        if params:
            workloads = data.get("workloads") or []
            ok = isinstance(params, dict) and isinstance(workloads, list)
            ok = ok and all(
                isinstance(w, dict) and isinstance(w.get("params") or {}, dict) for w in workloads
            )
            if not ok:
                raise ConfigError(f"{path}: workloads and quick.workload_params: expected mappings")
            data["workloads"] = [
                {**w, "params": {**(w.get("params") or {}), **params}} for w in workloads
            ]
    try:
        return CacheRouteConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _routers_kept(path: str | Path, routers: Any, kept: Any) -> list[Any]:
    """``quick.routers_kept``: the config's own router entries whose key (label, else name) is
    listed, in the config's order, so a quick run never restates a router's parameters."""
    from skv.experiments.config import ConfigError

    ok = isinstance(kept, list) and all(isinstance(k, str) for k in kept)
    ok = ok and isinstance(routers, list) and all(isinstance(r, dict) for r in routers)
    if not ok:
        raise ConfigError(f"{path}: quick.routers_kept: expected a list of router keys")
    keys = [r.get("label") or r.get("name") for r in routers]
    unknown = [k for k in kept if k not in keys]
    if unknown:
        raise ConfigError(
            f"{path}: quick.routers_kept: no router {unknown[0]!r} ({', '.join(keys)})"
        )
    return [r for r, k in zip(routers, keys, strict=True) if k in kept]


# ----------------------------------------------------------------------------------------
# the sweeps (one task = one search or one point; module-level functions so they pickle)


def num_requests(cfg: CacheRouteConfig, rate: float) -> int:
    """Requests of one point at ``rate``: the warm-up's, then the measured ones."""
    return math.ceil(rate * cfg.warmup_s) + cfg.measured_requests


#: unit-rate runs of the :data:`RATE_SCALED` workloads, the last 4 used: (name, parameters
#: without num_requests, seed) -> (the compiled run, its arrival times)
_UNIT_RUNS: dict[tuple[str, str, int], tuple[CompiledRun, np.ndarray]] = {}


def unit_run(name: str, params_json: str, seed: int, n: int) -> tuple[CompiledRun, np.ndarray]:
    """The workload's requests at rate 1.0, at least ``n`` of them, generated and compiled once
    per (workload, seed) in this process (again, longer, when a rate needs more): every rate's
    requests are their first ones, retimed (:func:`point_requests`)."""
    key = (name, params_json, seed)
    got = _UNIT_RUNS.pop(key, None)
    if got is None or len(got[1]) < n:
        params = {**json.loads(params_json), "num_requests": n}
        run = compile_point(generate(name, params, 1.0, seed))
        got = (run, np.array([r.arrival_s for r in run.requests], dtype=np.float64))
    _UNIT_RUNS[key] = got
    while len(_UNIT_RUNS) > 4:
        del _UNIT_RUNS[next(iter(_UNIT_RUNS))]
    return got


@functools.lru_cache(maxsize=12)
def point_requests(
    name: str, params_json: str, rate: float, seed: int, unit_requests: int = 0
) -> CompiledRun:
    """One point's requests, made once for every router that probes the same (workload, seed,
    rate) in this process: with common random numbers the routers' searches share their first
    rates (the bracket's ends and early midpoints). Kept: the last 12 (about 30 MB each at the
    full run's sizes). A :data:`RATE_SCALED` workload's are the first ones of its unit-rate run
    (:func:`unit_run`, made with at least ``unit_requests``: the config's highest rate's count)
    at this rate's times (:func:`at_rate`, :func:`retime_point`): the same requests, blocks and
    floats as generating and compiling them at this rate (a test checks)."""
    params = json.loads(params_json)
    if name not in RATE_SCALED:
        return compile_point(generate(name, params, rate, seed))
    n = params.pop("num_requests")
    unit, times = unit_run(name, json.dumps(params, sort_keys=True), seed, max(n, unit_requests))
    return retime_point(unit, at_rate(times, n, rate))


def point_at(cfg: CacheRouteConfig, wi: int, ri: int, seed: int, rate: float) -> dict[str, Any]:
    """One simulated point of router ``ri`` on workload ``wi``: what :func:`search` bisects on."""
    w, r = cfg.workloads[wi], cfg.routers[ri]
    params = {**w.params, "num_requests": num_requests(cfg, rate)}
    top = max(cfg.rates) if cfg.kind == "load" else cfg.search.hi  # the rate most points stay under
    requests = point_requests(
        w.name, json.dumps(params, sort_keys=True), rate, seed, num_requests(cfg, top)
    )
    return simulate_point(
        requests,
        cfg.cluster,
        r.name,
        r.params,
        warmup_s=cfg.warmup_s,
        router_view=r.view,
        slo_percentile=cfg.slo_percentile,
    )


def search(
    cfg: CacheRouteConfig, wi: int, ri: int, seed: int,
    point: Callable[[CacheRouteConfig, int, int, int, float], dict[str, Any]] = point_at,
) -> dict[str, Any]:  # fmt: skip
    """Max QPS at the SLO of router ``ri`` on workload ``wi`` and ``seed``: the bisection of
    :func:`skv.experiments.slo_search.max_qps` on the config's SLO percentile of TTFT, each
    rate measured by ``point`` (default: simulated)."""
    s = cfg.search
    return max_qps(
        lambda rate: point(cfg, wi, ri, seed, rate),
        cfg.slo_ms,
        lo=s.lo,
        hi=s.hi,
        rel_tol=s.rel_tol,
        max_doublings=s.max_doublings,
        key="ttft_ms_slo",
    )


def _search_task(task: tuple[CacheRouteConfig, int, tuple[int, ...], int]) -> list[dict[str, Any]]:
    """Several routers' searches on one (workload, seed): one process, so their shared rates
    are made once (:func:`point_requests`)."""
    cfg, wi, ris, seed = task
    w = cfg.workloads[wi]
    return [
        {"workload": w.key, "router": cfg.routers[ri].key, "seed": seed,
         **search(cfg, wi, ri, seed)}
        for ri in ris
    ]  # fmt: skip


def _router_groups(n: int, groups: int = 2) -> list[tuple[int, ...]]:
    """Router indices in ``groups`` runs of consecutive ones (a task each: enough tasks per
    seed to keep two workers busy, routers enough per task to share points)."""
    size = max(1, math.ceil(n / groups))
    return [tuple(range(i, min(n, i + size))) for i in range(0, n, size)]


def _load_task(task: tuple[CacheRouteConfig, int, int, int, float]) -> dict[str, Any]:
    cfg, wi, ri, seed, rate = task
    w, r = cfg.workloads[wi], cfg.routers[ri]
    return {"workload": w.key, "router": r.key, "seed": seed, "rate": rate,
            **point_at(cfg, wi, ri, seed, rate)}  # fmt: skip


def run_qps(cfg: CacheRouteConfig, *, jobs: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Max QPS at the SLO for every (workload, router, seed): one row each (``qps``, the
    metrics at that rate, flags), and every evaluated point (``points``)."""
    tasks = [
        (cfg, wi, ris, seed)
        for wi in range(len(cfg.workloads))
        for seed in cfg.seeds
        for ris in _router_groups(len(cfg.routers))
    ]
    done = run_sweep(_search_task, tasks, jobs=jobs, label=f"{cfg.id} QPS search")
    by = {(r["workload"], r["router"], r["seed"]): r for part in done for r in part}
    out = [
        by[w.key, r.key, seed] for w in cfg.workloads for r in cfg.routers for seed in cfg.seeds
    ]  # the table's order: workload, router, seed
    rows, points = [], []
    for res in out:
        base = {k: res[k] for k in ("workload", "router", "seed")}
        at = res["at"]
        rows.append({
            **base,
            "qps": res["qps"],
            "hit_rate": at["hit_rate"],
            "ttft_ms_slo": at["ttft_ms_slo"],
            "ttft_ms_p99": at["ttft_ms_p99"],
            "ttft_ms_mean": at["ttft_ms_mean"],
            "throughput_rps": at["throughput_rps"],
            "max_replica_share": at["max_replica_share"],
            "below_lo": res["below_lo"],
            "above_hi": res["above_hi"],
            "points": len(res["points"]),
        })  # fmt: skip
        for i, p in enumerate(res["points"]):
            points.append({**base, "step": i, **p})
    return pd.DataFrame(rows), pd.DataFrame(points)


def run_load(cfg: CacheRouteConfig, *, jobs: int | None = None) -> pd.DataFrame:
    """Every router at every offered rate: one row per (workload, router, seed, rate)."""
    tasks = [
        (cfg, wi, ri, seed, rate)
        for wi in range(len(cfg.workloads))
        for ri in range(len(cfg.routers))
        for seed in cfg.seeds
        for rate in cfg.rates
    ]
    return pd.DataFrame(run_sweep(_load_task, tasks, jobs=jobs, label=f"{cfg.id} load sweep"))


# ----------------------------------------------------------------------------------------
# summaries and claim values


def baselines(cfg: CacheRouteConfig) -> list[str]:
    return [r.key for r in cfg.routers if r.name != CANDIDATE]


def cache_blind(cfg: CacheRouteConfig) -> list[str]:
    return [r.key for r in cfg.routers if not r.cache_aware]


def best_baseline(qps: pd.DataFrame, cfg: CacheRouteConfig, workload: str, among=None) -> str:
    """The baseline (or one of ``among``) with the highest mean QPS on ``workload``."""
    names = among if among is not None else baselines(cfg)
    sub = qps[(qps.workload == workload) & qps.router.isin(names)]
    means = sub.groupby("router", sort=True)["qps"].mean()
    return str(means.sort_values(ascending=False, kind="stable").index[0])


def summary_table(qps: pd.DataFrame, cfg: CacheRouteConfig) -> pd.DataFrame:
    """Per workload and router: QPS at the SLO and the served hit rate there (mean and sd over
    seeds), and QPS relative to the workload's best baseline (mean of per-seed ratios)."""
    rows = []
    for w in cfg.workloads:
        sub = qps[qps.workload == w.key]
        best = best_baseline(qps, cfg, w.key) if baselines(cfg) else None
        ref = sub[sub.router == best].set_index("seed")["qps"] if best else None
        for r in cfg.routers:
            q = sub[sub.router == r.key].set_index("seed")
            ratio = (q["qps"] / ref).replace([np.inf], np.nan) if ref is not None else None
            rows.append({
                "workload": w.key,
                "router": r.key,
                "kind": "candidate" if r.name == CANDIDATE else
                        ("cache-aware" if r.cache_aware else "cache-blind"),
                "qps_mean": q["qps"].mean(),
                "qps_sd": q["qps"].std(ddof=1) if len(q) > 1 else float("nan"),
                "vs_best_baseline": ratio.mean() if ratio is not None else float("nan"),
                "hit_rate_pct_mean": 100 * q["hit_rate"].mean(),
                "hit_rate_pct_sd": 100 * q["hit_rate"].std(ddof=1) if len(q) > 1
                                   else float("nan"),
                "slo_ttft_ms_at_qps": q["ttft_ms_slo"].mean(),
                "best_baseline": best or "",
                "seeds": len(q),
            })  # fmt: skip
    return pd.DataFrame(rows)


def _per_seed(qps: pd.DataFrame, workload: str, router: str, col: str) -> pd.Series:
    return qps[(qps.workload == workload) & (qps.router == router)].set_index("seed")[col]


def setting_values(cfg: CacheRouteConfig) -> dict[str, Any]:
    """What the paper's prose quotes about a run's setting (never typed by hand)."""
    c = cfg.cluster
    out: dict[str, Any] = {
        "replicas": c.replicas,
        "model": c.model,
        "gpu": c.gpu,
        "tp": c.tp,
        "gpus": c.replicas * c.tp,
        "capacity_blocks": c.kv_capacity_blocks(BLOCK_TOKENS),
        "capacity_mtokens": round(c.kv_capacity_blocks(BLOCK_TOKENS) * BLOCK_TOKENS / 1e6, 2),
        "block_tokens": BLOCK_TOKENS,
        "slo_s": cfg.slo_ms / 1000,
        "slo_metric": f"p{cfg.slo_percentile:g} TTFT",
        "warmup_s": cfg.warmup_s,
        "measured_requests": cfg.measured_requests,
        "seeds": len(cfg.seeds),
        "routers": len(cfg.routers),
    }
    cand = next((r for r in cfg.routers if r.key == CANDIDATE), None)
    if cand is not None:
        full = make_router(cand.name, **cand.params)
        out["cacheroute_admit_rate"] = full.admit_rate  # type: ignore[attr-defined]
        out["cacheroute_evict_rate"] = full.evict_rate  # type: ignore[attr-defined]
        out["cacheroute_period_s"] = full.period_s  # type: ignore[attr-defined]
    for w in cfg.workloads:
        params = WORKLOADS[w.name][0](**w.params)
        for k in ("keys", "key_zipf", "dominant_share", "shift_every_s"):
            if k in w.params or (k in ("keys", "key_zipf") and w.name != "mooncake"):
                out[f"{w.key}_{k}"] = getattr(params, k)
    return out


def claim_values(cfg: CacheRouteConfig, qps: pd.DataFrame) -> dict[str, Any]:
    """The setting (:func:`setting_values`) and per workload ``W`` (its key) and router ``R``
    (its label): ``W_R_qps`` and ``W_R_hit_pct`` (levels over seeds, bootstrap intervals),
    ``W_cacheroute_vs_R`` (cacheroute's QPS / R's, per-seed ratio, t interval),
    ``W_R_vs_B`` for every cache-blind router ``B`` (the same ratio), and the names
    ``W_best_baseline`` and ``W_best_cache_blind`` of this run's best routers (claims compare
    with a named router, fixed when the claims were set, not re-picked by each run)."""
    out: dict[str, Any] = setting_values(cfg)
    blind = cache_blind(cfg)
    has_candidate = any(r.key == CANDIDATE for r in cfg.routers)
    # QPS ratios: cacheroute against every other router, every other router against each
    # cache-blind one
    pairs = [(CANDIDATE, r.key) for r in cfg.routers if has_candidate and r.key != CANDIDATE]
    pairs += [(r.key, b) for b in blind for r in cfg.routers if r.key not in (b, CANDIDATE)]
    for w in cfg.workloads:
        k = w.key
        for r in cfg.routers:
            out[f"{k}_{r.key}_qps"] = interval(
                list(_per_seed(qps, k, r.key, "qps")), method="bootstrap"
            )
            hit = 100 * _per_seed(qps, k, r.key, "hit_rate")
            out[f"{k}_{r.key}_hit_pct"] = interval(list(hit), method="bootstrap")
        if baselines(cfg):
            out[f"{k}_best_baseline"] = best_baseline(qps, cfg, k)
        if blind:
            out[f"{k}_best_cache_blind"] = best_baseline(qps, cfg, k, blind)
        for a, b in pairs:
            got, ref = _per_seed(qps, k, a, "qps"), _per_seed(qps, k, b, "qps")
            ratio = [x / y for x, y in zip(got, ref, strict=True) if y > 0]
            if ratio:
                out[f"{k}_{a}_vs_{b}"] = interval(ratio)
    return out


def load_claim_values(cfg: CacheRouteConfig, load: pd.DataFrame) -> dict[str, Any]:
    """Per workload ``W``, offered rate ``R`` and every other router ``X``:
    ``W_cacheroute_minus_X_p99_s_at_R``, cacheroute's p99 TTFT minus X's in seconds, paired
    over seeds (t interval)."""
    out: dict[str, Any] = {}
    if not any(r.key == CANDIDATE for r in cfg.routers):
        return out
    for w in cfg.workloads:
        sub = load[load.workload == w.key]
        for rate in cfg.rates:
            at = sub[sub.rate == rate]
            cand = at[at.router == CANDIDATE].set_index("seed")["ttft_ms_p99"]
            for r in cfg.routers:
                if r.key == CANDIDATE:
                    continue
                other = at[at.router == r.key].set_index("seed")["ttft_ms_p99"]
                diffs = [(cand[s] - other[s]) / 1e3 for s in cfg.seeds]
                out[f"{w.key}_cacheroute_minus_{r.key}_p99_s_at_{rate:g}"] = interval(diffs)
    return out


# ----------------------------------------------------------------------------------------
# figures


def _comparison(cfg: CacheRouteConfig) -> Comparison:
    """The figures' style rule: the candidate (every router entry named cacheroute, its
    variants included) in colour, first and on top; every other router a grey baseline."""
    return Comparison(tuple(r.key for r in cfg.routers if r.name == CANDIDATE) or (CANDIDATE,))


def _style(cfg: CacheRouteConfig, cmp: Comparison, key: str, kind: str) -> dict:
    entry = next(r for r in cfg.routers if r.key == key)
    return cmp.style(key, name=entry.name, kind=kind)


def qps_figure(qps: pd.DataFrame, cfg: CacheRouteConfig, title: str) -> Figure:
    """Per workload: (left) max QPS at the p99 TTFT SLO per router, (right) the served hit
    rate at that QPS; bars = mean over seeds, whiskers = sd, dots = seeds. Coloured: the
    candidate, the best baseline and the best cache-blind router."""
    nw = len(cfg.workloads)
    cmp = _comparison(cfg)
    with paper_style():
        fig = figure("text", 2.3 * nw + 0.4)
        axes = fig.subplots(nw, 2, squeeze=False)
        for (ax_q, ax_h), w in zip(axes, cfg.workloads, strict=True):
            sub = qps[qps.workload == w.key]
            keys = cmp.legend_order([r.key for r in cfg.routers])
            x = np.arange(len(keys))
            for ax, col, scale in ((ax_q, "qps", 1.0), (ax_h, "hit_rate", 100.0)):
                for i, key in enumerate(keys):
                    vals = scale * sub[sub.router == key][col].to_numpy()
                    sd = vals.std(ddof=1) if len(vals) > 1 else 0.0
                    ax.bar(i, vals.mean(), 0.7, yerr=sd, capsize=2,
                           error_kw={"linewidth": 0.6},
                           **_style(cfg, cmp, key, "bar"))  # fmt: skip
                    ax.plot(np.full(len(vals), i), vals, linestyle="none", marker=".",
                            markersize=2.5, color="0.15", zorder=4)  # fmt: skip
                ax.set_xticks(x, [k.replace("_", " ") for k in keys], rotation=35, ha="right")
                for tick, key in zip(ax.get_xticklabels(), keys, strict=True):
                    if cmp.role(key) != "method":
                        tick.set_color("0.4")
                ax.set_xlabel("router")
            ax_q.set_ylabel(
                f"max QPS at p{cfg.slo_percentile:g} TTFT\n<= {cfg.slo_ms / 1000:g} s (req/s)"
            )
            ax_h.set_ylabel("served token hit rate (%)")
            ax_h.set_ylim(0, 100)
            ax_q.set_title(wrap_title(f"{w.key.replace('_', ' ')}: QPS at SLO", 50), fontsize=7)
            ax_h.set_title("hit rate at that QPS", fontsize=7)
        fig.suptitle(wrap_title(title, 110), fontsize=7.5)
        cmp.declare(fig)  # no legend: the routers are named under the bars
    return fig


def load_figure(load: pd.DataFrame, cfg: CacheRouteConfig, title: str) -> Figure:
    """p99 TTFT vs offered load per router (mean over seeds; band: the seeds' range), the SLO
    dotted; log y. The candidate (cacheroute) coloured, on top and first in the legend; every
    other router grey (told apart by marker). The title says the latencies are simulated."""
    nw = len(cfg.workloads)
    cmp = _comparison(cfg)
    with paper_style():
        fig = figure("text", 2.6 * nw + 0.3)
        axes = fig.subplots(nw, 1, squeeze=False)[:, 0]
        for ax, w in zip(axes, cfg.workloads, strict=True):
            sub = load[load.workload == w.key]
            handles = []
            for r in cmp.draw_order(cfg.routers, lambda r: (r.key, r.name)):
                g = sub[sub.router == r.key].groupby("rate")["ttft_ms_p99"]
                mean, lo, hi = g.mean(), g.min(), g.max()
                st = _style(cfg, cmp, r.key, "line")
                (line,) = ax.plot(mean.index, mean.to_numpy() / 1e3,
                                  label=r.key.replace("_", " "), **st)  # fmt: skip
                handles.append(line)
                ax.fill_between(mean.index, lo.to_numpy() / 1e3, hi.to_numpy() / 1e3,
                                color=st["color"], alpha=0.15, linewidth=0)  # fmt: skip
            handles.append(ax.axhline(cfg.slo_ms / 1e3, color=GREY_LINE, linestyle=":",
                                      linewidth=0.8, label="SLO"))  # fmt: skip
            ax.set_yscale("log")
            plain_ticks(ax.yaxis, log=True)
            ax.set_xlabel("offered load (requests/s)")
            ax.set_ylabel("p99 TTFT (s)")
            where = f"{title}: {w.key.replace('_', ' ')} (simulated; roofline latency model)"
            ax.set_title(wrap_title(where, 100), fontsize=7)
            cmp.legend(ax, handles, [h.get_label() for h in handles],
                       frameon=False, fontsize=5.5, ncol=3, loc="upper left")  # fmt: skip
    return fig


def seeds_note(cfg: CacheRouteConfig) -> str:
    return (
        f"{len(cfg.seeds)} seeds; per point {cfg.warmup_s:g} s of warm-up, then "
        f"{cfg.measured_requests:,} measured requests; roofline latency (SIMULATED)"
    )
