"""KV-Repurpose over a tiered KV store: GPU memory over DRAM / SSD tiers, with transfers paid.

Why: the paper's capacities (30 GB to 1 TB) are not GPU memory. The capacity study
(:mod:`.study`) treats every hit as free; here the GPU tier is fixed (``gpu``, 30 GB: an H100's
memory after llama-3.1-8b's weights, roughly) and the rest of the store is a stack of lower
tiers (``stacks``: host DRAM over PCIe 5, an NVMe SSD; :mod:`skv.tiers`), so a hit outside GPU
memory costs its transfer.

Per (seed, keying, stack) the trace is replayed twice through a
:class:`~skv.tiers.TieredCache` (``lru`` in every tier, write-through, copy on load):

- ``free``: every usable block is loaded and loads cost nothing (the capacity study's
  accounting over the same tiers; stacks whose tiers differ only in their links share it:
  :func:`free_key`);
- paid: each lower-tier run is loaded or recomputed, whichever is cheaper
  (:class:`~skv.tiers.LoadPricer` on the study's roofline), and a request's TTFT adds its
  loads' time: ``series`` = lone prefill + loads (synchronous loads), ``overlap`` =
  max(lone prefill, loads) (layer-by-layer loading).

TTFT is the capacity study's: the latency model's lone prefill (no queueing) of the request's
uncached and recomputed tokens after its cached ones, with the segment schemes' recompute of
reused later chains (naive, EPIC-like, CacheBlend-like; :func:`.study.effective_prefill`).
Everything here is simulated: link bandwidths and latencies are the presets of docs/tiers.md,
not measurements.
"""

from __future__ import annotations

import functools
import logging
import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.plotstyle import Comparison, figure, paper_style, wrap_title
from skv.experiments.repurpose import study as S
from skv.experiments.stats import interval
from skv.runtime import no_cyclic_gc

log = logging.getLogger(__name__)

COSTS = ("free", "series", "overlap")
COST_LABELS = {
    "free": "hits free (capacity study's accounting)",
    "series": "transfers paid, synchronous",
    "overlap": "transfers paid, overlapped",
}
#: the segment schemes reported against prefix caching
SEGMENT_SCHEMES = S.SCHEMES[1:]


class TieredConfig(BaseModel):
    """``experiments/repurpose/repurpose_tiered.yaml``; ``quick:`` overrides fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    workload: dict[str, Any] = Field(default_factory=dict)
    policy: str = "lru"
    model: str = "llama-3.1-8b"
    block_size: int = Field(default=16, ge=1, le=4096)
    seeds: list[int] = Field(min_length=1, max_length=10)
    latency: S.LatencySpec = Field(default_factory=S.LatencySpec)
    recompute: S.RecomputeSpec = Field(default_factory=S.RecomputeSpec)
    #: the GPU tier, in bytes of ``model``'s KV
    gpu: str = "30GB"
    #: name -> lower tiers top down (``NAME=SIZE[@POLICY][,link=LINK]``); ``[]``: GPU only
    stacks: dict[str, list[str]] = Field(min_length=1, max_length=8)
    #: the stack and the segment scheme the claims are made at
    claim_stack: str
    claim_scheme: str = "cacheblend"

    @model_validator(mode="after")
    def _check(self) -> TieredConfig:
        from skv.sizing import Capacity
        from skv.tiers import TierSpec

        Capacity.parse(self.gpu)
        for name, stack in self.stacks.items():
            for spec in stack:
                try:
                    TierSpec.parse(spec)
                except ValueError as exc:
                    raise ValueError(f"stacks.{name}: {exc}") from None
        if self.claim_stack not in self.stacks:
            raise ValueError(f"claim_stack {self.claim_stack!r}: not one of the stacks")
        if self.claim_scheme not in SEGMENT_SCHEMES:
            raise ValueError(f"claim_scheme {self.claim_scheme!r}: one of {SEGMENT_SCHEMES}")
        self.workload_params(0)  # the workload's own checks, before any run
        return self

    def workload_params(self, seed: int) -> Any:
        from skv.workloads.zipf_rag import ZipfRagParams

        return ZipfRagParams(**{**self.workload, "seed": seed})


def load(path: str, *, quick: bool) -> TieredConfig:
    """Read and validate the config; errors are ``ConfigError`` naming file and field."""
    from skv.experiments.config import ConfigError, _flatten

    data = S.read_config_data(path, quick=quick)
    try:
        cfg = TieredConfig.model_validate(data)
        cfg.workload_params(0)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return cfg


def _replay(trace: Any, starts: list[list[int]], cache: Any) -> tuple[list[list[int]], list[float]]:
    """Per request the hit tokens of each chain (all tiers) and its load time (ms)."""
    chains_out: list[list[int]] = []
    loads: list[float] = []
    with no_cyclic_gc():
        for rb, st in zip(trace, starts, strict=True):
            lease = cache.acquire(rb, rb.arrival_s)
            cache.release(lease, rb.arrival_s)
            if st == [0]:  # one chain: the lease's hits are its hits
                chains_out.append([lease.hit_tokens])
            else:
                ends = [*st[1:], len(rb.keys)]
                hit = [tok if w >= 0 else 0 for tok, w in zip(rb.tokens, lease.where, strict=True)]
                chains_out.append([sum(hit[a:b]) for a, b in zip(st, ends, strict=True)])
            loads.append(lease.load_ms)
    return chains_out, loads


def free_key(lower: list[tuple[Any, int]]) -> tuple[tuple[Any, ...], ...]:
    """What a free run over ``lower`` (:func:`skv.tiers.resolve_tiers`' tiers) depends on
    besides the trace, the GPU tier and the policy there: per lower tier its capacity in
    blocks, policy and policy parameters; ``()`` for GPU memory alone. Not a tier's name or
    link: under the pricer's choice ``load`` every usable segment is loaded (no choice), so
    the links change only the load times, which a free run sets to 0; the per-request hits,
    the hits per tier and the segment counts are the same."""
    return tuple((cap, spec.policy, repr(sorted(spec.params.items()))) for spec, cap in lower)


def sweep_part(cfg: TieredConfig, seed: int, mode: str) -> pd.DataFrame:
    """One seed and keying: a row per (stack, scheme, cost) with the mean TTFT and the hits
    by tier."""
    from skv.latency import make_latency_model
    from skv.replay import compile_trace, trace_totals
    from skv.sizing import Capacity, get_model
    from skv.tiers import LINKS, LoadPricer, TieredCache, TierSpec, resolve_tiers
    from skv.workloads import WORKLOADS

    requests = WORKLOADS["zipf_rag"](cfg.workload_params(seed))
    lat = make_latency_model(cfg.latency.name, **cfg.latency.params)
    per_token = get_model(cfg.model).kv_bytes_per_token
    gpu = Capacity.parse(cfg.gpu).to_blocks(
        block_size=cfg.block_size, unique_blocks=1, model=cfg.model
    )
    rc = cfg.recompute
    rows: list[dict[str, Any]] = []
    trace = compile_trace(requests, block_size=cfg.block_size, mode=mode)
    totals = trace_totals(trace)
    prompts = [rb.prompt_tokens for rb in trace]
    starts = S.chain_starts(trace)
    ttft_ms = functools.cache(lat.ttft_ms)  # a pure function of (uncached, cached) tokens
    # the runs, and per (run, scheme) each request's prefill TTFT (the costs over one run share
    # it); a free run is kept by its tiers (:func:`free_key`): stacks whose tiers differ only in
    # their links share it
    runs: dict[tuple[str, Any], tuple[list[list[int]], list[float], Any]] = {}
    compute_ms: dict[tuple[tuple[str, Any], str], list[float]] = {}
    for name, stack in cfg.stacks.items():
        specs = [TierSpec.parse(s) for s in stack]
        lower = resolve_tiers(specs, block_size=cfg.block_size, unique_blocks=1, model=cfg.model)
        free, paid = ("free", free_key(lower)), ("paid", name)
        if not specs and free not in runs:
            per_req, _ = S.chain_hits(trace, cfg.policy, gpu, starts)
            runs[free] = (per_req, [0.0] * len(trace), None)
        links = [LINKS[s.link] for s in specs]
        for choice, key in (("load", free), ("cheaper", paid)) if specs else ():
            if key in runs:
                continue
            cache = TieredCache(
                cfg.policy,
                gpu,
                lower,
                pricer=LoadPricer(lat, per_token, links, choice=choice),
            )
            per_req, loads = _replay(trace, starts, cache)
            # a run keeps its tier stats, not its cache (its blocks): all the rows read
            runs[key] = (per_req, [0.0] * len(loads) if key == free else loads, cache.tier_stats)
        for cost in COSTS:
            run = free if cost == "free" or not specs else paid
            per_req, loads, st = runs[run]
            hit = sum(sum(c) for c in per_req)
            gpu_rate = _tier_rate(st, 0, totals.prompt_tokens, hit)
            base = {
                "seed": seed,
                "mode": mode,
                "stack": name,
                "cost": cost,
                "token_hit_rate": hit / totals.prompt_tokens,
                "gpu_hit_rate": gpu_rate,
                "lower_hit_rate": hit / totals.prompt_tokens - gpu_rate,
                "mean_load_ms": float(np.mean(loads)),
                "recomputed_segments": 0 if st is None else int(sum(st.recomputed_segments)),
                "loaded_segments": 0 if st is None else int(sum(st.loaded_segments)),
            }
            for scheme in ("prefix",) if mode == "prefix" else SEGMENT_SCHEMES:
                compute = compute_ms.get((run, scheme))
                if compute is None:
                    compute = compute_ms[run, scheme] = [
                        ttft_ms(*S.effective_prefill(p, c, scheme, rc.epic_k, rc.cacheblend_share))
                        for p, c in zip(prompts, per_req, strict=True)
                    ]
                if cost == "overlap":
                    ttft = [max(c, ld) for c, ld in zip(compute, loads, strict=True)]
                else:
                    ttft = [c + ld for c, ld in zip(compute, loads, strict=True)]
                rows.append({**base, "scheme": scheme, "mean_ttft_ms": float(np.mean(ttft))})
    return pd.DataFrame(rows)


def _tier_rate(st: Any, tier: int, prompt: int, hit: int) -> float:
    """Tier ``tier``'s share of prompt tokens (``st``: a run's tier stats; None, GPU only: all
    of ``hit``)."""
    if st is None:
        return hit / prompt
    return st.hit_tokens[tier] / prompt


def _task(task: tuple[TieredConfig, int, str]) -> pd.DataFrame:
    return sweep_part(*task)


def sweep(cfg: TieredConfig, *, jobs: int | None = None) -> pd.DataFrame:
    """Every seed and keying, on the sweep executor (:mod:`skv.experiments.sweep`); rows in
    (seed, keying) order whatever ran where."""
    from skv.experiments.sweep import run_sweep

    tasks = [(cfg, seed, mode) for seed in cfg.seeds for mode in ("prefix", "segment")]
    parts = run_sweep(_task, tasks, jobs=jobs, label=f"{cfg.id} seeds x keyings")
    return pd.concat(parts, ignore_index=True)


def ratios(cfg: TieredConfig, rows: pd.DataFrame) -> pd.DataFrame:
    """Per (stack, cost, segment scheme): segment / prefix mean TTFT, paired per seed (a
    ratio below 1 is segment keying's lower TTFT), mean and 95% interval over seeds."""
    out = []
    pre = rows[rows["scheme"] == "prefix"].set_index(["stack", "cost", "seed"])["mean_ttft_ms"]
    for (stack, cost, scheme), d in rows[rows["scheme"] != "prefix"].groupby(
        ["stack", "cost", "scheme"], sort=False
    ):
        d = d.sort_values("seed")
        r = [t / pre[(stack, cost, s)] for s, t in zip(d["seed"], d["mean_ttft_ms"], strict=True)]
        iv = interval(r)
        out.append(
            {
                "stack": stack,
                "cost": cost,
                "scheme": scheme,
                "ttft_ratio": iv["value"],
                "ci95_low": iv["ci95"][0],
                "ci95_high": iv["ci95"][1],
                "seeds": iv["n"],
            }
        )
    table = pd.DataFrame(out)
    order = {s: i for i, s in enumerate(cfg.stacks)}
    return table.sort_values(
        ["stack", "cost", "scheme"],
        key=lambda c: c.map(order) if c.name == "stack" else c,
    ).reset_index(drop=True)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds of every (keying, stack, cost, scheme) row."""
    cols = ["mode", "stack", "cost", "scheme"]
    metrics = [c for c in rows.columns if c not in (*cols, "seed")]
    return rows.groupby(cols, sort=False)[metrics].mean().reset_index()


def claim_values(cfg: TieredConfig, rows: pd.DataFrame) -> dict[str, Any]:
    """At ``claim_stack`` and ``claim_scheme``: segment / prefix TTFT with hits free, with
    transfers paid in series and overlapped (paired per seed), and how much of the free
    gain survives the transfers (``kept_series``: (1 - paid) / (1 - free) per seed)."""
    from skv.tiers import TierSpec

    lower = [TierSpec.parse(t) for t in cfg.stacks[cfg.claim_stack]]
    values: dict[str, Any] = {
        "stack": cfg.claim_stack,
        "scheme": cfg.claim_scheme,
        "gpu": cfg.gpu,
        "claim_lower": " + ".join(f"{t.capacity} {t.name}" for t in lower) or "none",
    }
    pre = rows[(rows["scheme"] == "prefix") & (rows["stack"] == cfg.claim_stack)]
    seg = rows[(rows["scheme"] == cfg.claim_scheme) & (rows["stack"] == cfg.claim_stack)]
    per_cost = {}
    for cost in COSTS:
        p = pre[pre["cost"] == cost].sort_values("seed")["mean_ttft_ms"].to_numpy(float)
        s = seg[seg["cost"] == cost].sort_values("seed")["mean_ttft_ms"].to_numpy(float)
        per_cost[cost] = s / p
        values[f"ratio_{cost}"] = interval(list(per_cost[cost]))
    kept = (1 - per_cost["series"]) / (1 - per_cost["free"])
    values["kept_series"] = interval(list(kept))
    seg_paid = seg[seg["cost"] == "series"]
    values["segment_lower_hit_pct"] = interval(
        list(100 * seg_paid.sort_values("seed")["lower_hit_rate"].to_numpy(float))
    )
    return values


#: the figure's style rule: segment keying with transfers paid is the method; the same with
#: hits free is its best case (a bound, dashed); prefix caching the grey baseline at 1
FIGURE_SCHEMES = ("naive", "cacheblend")
STYLE = Comparison(FIGURE_SCHEMES, bounds=tuple(f"free:{s}" for s in FIGURE_SCHEMES))


def figure_ratios(cfg: TieredConfig, table: pd.DataFrame, title: str) -> Figure:
    """Segment / prefix mean TTFT per stack of lower tiers, paired per seed (95% band): with
    transfers paid (synchronous solid, overlapped dotted) against hits free (dashed)."""
    stacks = list(cfg.stacks)
    x = np.arange(len(stacks))
    with paper_style():
        fig = figure("column", 3.7)
        ax = fig.add_subplot()
        handles = []
        (base,) = ax.plot(
            x, np.ones(len(x)), label="prefix caching (= 1)", **STYLE.style("prefix", name="lru")
        )
        handles.append(base)
        for scheme in FIGURE_SCHEMES:
            for cost in ("free", "overlap", "series"):
                d = table[(table["scheme"] == scheme) & (table["cost"] == cost)]
                d = d.set_index("stack").reindex(stacks)
                key = f"free:{scheme}" if cost == "free" else scheme
                style = STYLE.style(key, name=S.SERIES_LOOK[scheme])
                if cost == "overlap":
                    style = {**style, "linestyle": ":"}
                label = f"{S.SCHEME_LABELS[scheme]}: {COST_LABELS[cost]}"
                (line,) = ax.plot(x, d["ttft_ratio"], label=label, **style)
                handles.append(line)
                if cost == "series":
                    ax.fill_between(x, d["ci95_low"], d["ci95_high"], color=style["color"],
                                    alpha=0.15, linewidth=0)  # fmt: skip
        ticks = ["\n".join(textwrap.wrap(s.replace("_", " "), 10)) for s in stacks]
        ax.set_xticks(x, ticks, fontsize=5)
        ax.set_ylim(0, 1.08)
        ax.set_xlabel(f"tiers under a {cfg.gpu} GPU tier")
        ax.set_ylabel("mean TTFT, segment / prefix")
        ax.set_title(wrap_title(title, 56), fontsize=7)
        STYLE.legend(ax, handles, [h.get_label() for h in handles], fontsize=5,
                     loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=1)  # fmt: skip
    return fig
