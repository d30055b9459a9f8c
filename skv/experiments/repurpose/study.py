"""KV-Repurpose: config, the prefix-vs-segment capacity sweep, TTFT with recompute, figures.

Accounting. Token hit rate = reused prompt tokens / prompt tokens, the same ``lru`` cache for
both keyings, capacity in bytes of the ``model`` preset's KV (llama-3.1-8b: 131,072 B/token,
so 30 GB = 228,881 tokens) and ``inf`` (a cache larger than every block of the trace). Each
mode's trace is compiled once (:func:`skv.replay.compile_trace`) and replayed at every
capacity; per request the replay records the hit tokens of each chain (a chain is the prompt
prefix in ``prefix`` mode; in ``segment`` mode the prompt's first chain, system prompt and
history, then one chain per document, each restarting from the root).

TTFT with recompute (a documented estimate, not a measurement). Reused KV of the prompt's
first chain is a true prefix and needs no recompute. Reused KV of a later chain (a document
found behind a different prefix, at a different position) is reused by one of:

- ``naive``: as is, no recompute (the quality loss is not modelled here);
- ``epic``: the first ``epic_k`` tokens of each reused chain are recomputed (EPIC-like);
- ``cacheblend``: ``ceil(cacheblend_share * reused tokens)`` of them are recomputed
  (CacheBlend-like, default 15%).

A request's effective prefill = uncached tokens + recomputed tokens; its TTFT is the latency
model's lone prefill of that many tokens after ``hit - recomputed`` cached tokens
(:meth:`skv.latency.LatencyModel.ttft_ms`: no queueing, no batching), e.g. roofline with
llama-3.1-8b on an H100. ``prefix`` is prefix keying (every hit a true prefix).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skv.experiments.plotstyle import Comparison, figure, paper_style, wrap_title
from skv.experiments.stats import interval
from skv.replay import compile_trace, trace_totals
from skv.runtime import no_cyclic_gc
from skv.sizing import Capacity

SCHEMES = ("prefix", "naive", "epic", "cacheblend")
SCHEME_LABELS = {
    "prefix": "prefix caching",
    "naive": "segment, naive",
    "epic": "segment, EPIC-like",
    "cacheblend": "segment, CacheBlend-like",
}
INFINITE = "inf"
#: the figures' style rule: segment keying (every segment scheme) is the method under study,
#: prefix keying / caching the grey baseline, the analytic prefix ceiling a dashed bound
METHOD = Comparison(("segment", "naive", "epic", "cacheblend"), bounds=("prefix ceiling",))
#: the policy whose colour and marker a series borrows
SERIES_LOOK = {"segment": "adaptive_semantic", "prefix": "lru", "naive": "adaptive_semantic",
               "epic": "lfu", "cacheblend": "gdsf"}  # fmt: skip


class LatencySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Literal["roofline", "linear"] = "roofline"
    params: dict[str, Any] = Field(default_factory=lambda: {"model": "llama-3.1-8b", "gpu": "H100"})


class RecomputeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    epic_k: int = Field(default=16, ge=0, le=4096, description="tokens recomputed per segment")
    cacheblend_share: float = Field(default=0.15, ge=0, le=1, description="share recomputed")


class RepurposeConfig(BaseModel):
    """``experiments/repurpose/*.yaml``; ``quick:`` overrides fields (``workload`` merged)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    workload: dict[str, Any] = Field(default_factory=dict)
    policy: str = "lru"
    model: str = "llama-3.1-8b"
    block_size: int = Field(default=16, ge=1, le=4096)
    capacities: list[str] = Field(min_length=1, max_length=12)
    seeds: list[int] = Field(min_length=1, max_length=10)
    latency: LatencySpec = Field(default_factory=LatencySpec)
    recompute: RecomputeSpec = Field(default_factory=RecomputeSpec)
    claim_capacity: str = "30GB"
    large_capacity: str = "1TB"

    def workload_params(self, seed: int) -> Any:
        from skv.workloads.zipf_rag import ZipfRagParams

        return ZipfRagParams(**{**self.workload, "seed": seed})


def read_config_data(path: str | Path, *, quick: bool) -> dict[str, Any]:
    """A repurpose config file's data with its ``quick:`` overrides applied when ``quick``
    (``workload`` merged key by key, every other field replaced), not yet validated: shared
    by every config of the study (:mod:`.sensitivity` too)."""
    from skv.experiments.config import ConfigError, read_yaml

    data = read_yaml(path, "repurpose config")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level")
    over = data.pop("quick", None) or {}
    if not isinstance(over, dict) or "quick" in over:
        raise ConfigError(f"{path}: quick: expected a flat mapping of overrides")
    if quick:
        base, extra = data.get("workload") or {}, over.pop("workload", None) or {}
        for where, value in (("workload", base), ("quick.workload", extra)):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {where}: expected a mapping, got {value!r}")
        data = {**data, **over, "workload": {**base, **extra}}
    return data


def load_config(path: str | Path, *, quick: bool) -> RepurposeConfig:
    """Read and validate a repurpose config; errors are ``ConfigError`` naming file and field."""
    from skv.experiments.config import ConfigError, _flatten

    data = read_config_data(path, quick=quick)
    try:
        cfg = RepurposeConfig.model_validate(data)
        cfg.workload_params(0)
        for cap in cfg.capacities:
            if cap != INFINITE:
                Capacity.parse(cap)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return cfg


# ----------------------------------------------------------------------------------------
# replay with per-request chain hits


def chain_starts(trace: Sequence[Any]) -> list[list[int]]:
    """Per request, the index of each block that starts a chain (no parent)."""
    return [_none_at(rb.parents) for rb in trace]


def _none_at(items: list) -> list[int]:
    """The indices of ``items`` that are ``None``, found by ``list.index`` (a C scan)."""
    out: list[int] = []
    i = -1
    try:
        while True:
            i = items.index(None, i + 1)
            out.append(i)
    except ValueError:
        return out


def chain_hits(
    trace: Sequence[Any],
    policy: str,
    capacity_blocks: int,
    starts: list[list[int]] | None = None,
) -> tuple[list[list[int]], Any]:
    """Replay ``trace`` once; per request the hit tokens of each of its chains (a chain starts
    at a block without parent), and the cache's totals.

    Before a request is replayed, each chain's leading run of cached blocks is what it can hit
    (the cache's lookup rule). When the cache then counts fewer hit tokens (it evicted one of
    those blocks while inserting the request's misses), a block counts as hit only when the
    cache returned the very block object that was cached before, as the cache counted it.
    """
    from skv.policies.registry import make_cache

    starts = chain_starts(trace) if starts is None else starts
    cache = make_cache(policy, capacity_blocks, None)
    blocks = cache.blocks
    out: list[list[int]] = []
    with no_cyclic_gc():
        for rb, st in zip(trace, starts, strict=True):
            out.append(_request_chains(cache, blocks, rb, st, capacity_blocks))
    return out, cache.stats


def replay_stats(trace: Sequence[Any], policy: str, capacity_blocks: int) -> Any:
    """Replay ``trace`` once; the cache's totals (``hit_tokens`` and the rest).

    The same cache operations in the same order as :func:`chain_hits` (a fresh ``policy``
    cache; each request acquired and released at its arrival: ``cache.replay`` is ``access``
    per request, compiled), so its totals equal ``chain_hits(...)[1]``; for callers that
    read only the totals, it skips the per-chain split (and its capacity check)."""
    from skv.policies.registry import make_cache

    cache = make_cache(policy, capacity_blocks, None)
    with no_cyclic_gc():
        cache.replay(trace if isinstance(trace, list) else list(trace))
    return cache.stats


def _request_chains(
    cache: Any, blocks: dict, rb: Any, st: list[int], capacity_blocks: int
) -> list[int]:
    """One request through ``cache``: the hit tokens of each of its chains.

    Before the access, chain ``c`` can hit its leading run of cached blocks, ``found[st[c]:
    runs[c]]`` (the blocks are looked up at C speed, ``map(blocks.get, ...)``)."""
    keys, tokens = rb.keys, rb.tokens
    n = len(keys)
    found = list(map(blocks.get, keys))
    ends = [*st[1:], n]  # one longer than ``st`` when the request has no blocks
    runs = [_run_end(found, s, e) for s, e in zip(st, ends, strict=False)]
    chains = [sum(tokens[s:r]) for s, r in zip(st, runs, strict=True)]
    lease = cache.access(rb, rb.arrival_s)
    if lease.hit_tokens == sum(chains):
        return chains
    held = lease.blocks
    if len(held) != n:  # part of the request could not be cached
        raise RuntimeError(f"request {rb.index}: capacity {capacity_blocks} blocks cannot hold it")
    return [
        sum(tokens[i] for i in range(s, r) if held[i] is found[i])
        for s, r in zip(st, runs, strict=True)
    ]


def _run_end(found: list, start: int, end: int) -> int:
    """The first index in ``[start, end)`` with no cached block (``None``), else ``end``."""
    try:
        return found.index(None, start, end)
    except ValueError:
        return end


def recompute_tokens(chains: Sequence[int], scheme: str, epic_k: int, share: float) -> int:
    """Tokens a request recomputes among its reused ones: none in its first chain (a true
    prefix); in each later chain with hits, by ``scheme`` (module docstring)."""
    shifted = [h for h in chains[1:] if h > 0]
    if scheme in ("prefix", "naive"):
        return 0
    if scheme == "epic":
        return sum(min(epic_k, h) for h in shifted)
    if scheme == "cacheblend":
        return math.ceil(share * sum(shifted) - 1e-9)
    raise ValueError(f"unknown recompute scheme {scheme!r} (known: {', '.join(SCHEMES)})")


def effective_prefill(
    prompt_tokens: int, chains: Sequence[int], scheme: str, epic_k: int, share: float
) -> tuple[int, int]:
    """(tokens prefilled, tokens taken from the cache) of one request under ``scheme``."""
    hit = sum(chains)
    rec = recompute_tokens(chains, scheme, epic_k, share)
    return prompt_tokens - hit + rec, hit - rec


def capacity_blocks(spec: str, *, block_size: int, model: str, total_blocks: int) -> int:
    if spec == INFINITE:
        return total_blocks + 1
    return Capacity.parse(spec).to_blocks(block_size=block_size, unique_blocks=1, model=model)


def sweep_seed(cfg: RepurposeConfig, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """One seed: hit rates per (mode, capacity), mean TTFT per (scheme, capacity), and the
    analytic prefix ceiling. Each mode's trace is compiled once."""
    from skv.latency import make_latency_model
    from skv.workloads import WORKLOADS
    from skv.workloads.zipf_rag import prefix_ceiling

    params = cfg.workload_params(seed)
    requests = WORKLOADS["zipf_rag"](params)
    lat = make_latency_model(cfg.latency.name, **cfg.latency.params)
    rc = cfg.recompute
    hit_rows, ttft_rows = [], []
    for mode in ("prefix", "segment"):
        trace = compile_trace(requests, block_size=cfg.block_size, mode=mode)
        totals = trace_totals(trace)
        prompts = [rb.prompt_tokens for rb in trace]
        starts = chain_starts(trace)
        for spec in cfg.capacities:
            cap = capacity_blocks(
                spec, block_size=cfg.block_size, model=cfg.model, total_blocks=totals.block_accesses
            )
            per_req, stats = chain_hits(trace, cfg.policy, cap, starts)
            hit_tokens = sum(sum(c) for c in per_req)
            assert hit_tokens == stats.hit_tokens, (hit_tokens, stats.hit_tokens)
            hit_rows.append(
                {
                    "seed": seed,
                    "mode": mode,
                    "capacity": spec,
                    "capacity_blocks": cap,
                    "prompt_tokens": totals.prompt_tokens,
                    "hit_tokens": hit_tokens,
                    "token_hit_rate": hit_tokens / totals.prompt_tokens,
                    "shifted_hit_tokens": sum(sum(c[1:]) for c in per_req),
                }
            )
            for scheme in ("prefix",) if mode == "prefix" else SCHEMES[1:]:
                eff = [
                    effective_prefill(p, c, scheme, rc.epic_k, rc.cacheblend_share)
                    for p, c in zip(prompts, per_req, strict=True)
                ]
                ttft = [lat.ttft_ms(u, h) for u, h in eff]
                ttft_rows.append(
                    {
                        "seed": seed,
                        "scheme": scheme,
                        "capacity": spec,
                        "mean_ttft_ms": float(np.mean(ttft)),
                        "mean_prefill_tokens": float(np.mean([u for u, _ in eff])),
                    }
                )
        del trace
    nocache = float(np.mean([lat.ttft_ms(r.prompt_tokens, 0) for r in requests]))
    ceiling = prefix_ceiling(params, block_size=cfg.block_size)
    meta = {
        "seed": seed,
        "requests": len(requests),
        "prefix_ceiling": float(ceiling["prefix_ceiling"]),
        "no_cache_ttft_ms": nocache,
    }
    return pd.DataFrame(hit_rows), pd.DataFrame(ttft_rows), meta


def sweep(cfg: RepurposeConfig) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every seed of ``cfg``: (hit rates, TTFTs, per-seed meta)."""
    hits, ttfts, metas = [], [], []
    for seed in cfg.seeds:
        h, t, m = sweep_seed(cfg, seed)
        hits.append(h)
        ttfts.append(t)
        metas.append(m)
    return (
        pd.concat(hits, ignore_index=True),
        pd.concat(ttfts, ignore_index=True),
        pd.DataFrame(metas),
    )


def hit_rate(hits: pd.DataFrame, mode: str, capacity: str) -> list[float]:
    d = hits[(hits["mode"] == mode) & (hits["capacity"] == capacity)].sort_values("seed")
    return d["token_hit_rate"].tolist()


def claim_values(
    cfg: RepurposeConfig, hits: pd.DataFrame, ttfts: pd.DataFrame, meta: pd.DataFrame
) -> dict[str, Any]:
    """What the claims read: levels in percent (mean over seeds, bootstrap interval),
    differences in points (paired over seeds, Student t), plus every curve point's mean."""
    c, big = cfg.claim_capacity, cfg.large_capacity

    def pct(mode: str, cap: str) -> list[float]:
        return [100 * v for v in hit_rate(hits, mode, cap)]

    def level(v: list[float]) -> dict[str, Any] | None:
        return interval(v, method="bootstrap") if v else None

    def diff(a: list[float], b: list[float]) -> dict[str, Any] | None:
        return interval(list(np.subtract(a, b))) if a and b else None

    ceilings = [100 * v for v in meta.sort_values("seed")["prefix_ceiling"]]
    wp = cfg.workload_params(0)
    values: dict[str, Any] = {
        "seeds": len(cfg.seeds),
        "requests_per_seed": int(meta["requests"].iloc[0]),
        "model": cfg.model,
        "policy": cfg.policy,
        "claim_capacity": c.replace("GB", " GB").replace("TB", " TB"),
        "large_capacity": big.replace("GB", " GB").replace("TB", " TB"),
        "corpus_size": wp.corpus_size,
        "docs_per_request": wp.docs_per_request,
        "prefix_variants": wp.num_system_prompts * wp.num_histories,
        "fixed_prefix_pct": 100 * wp.fixed_prefix_fraction,
        "zipf_alpha": wp.zipf_alpha,
        "segment_hit_pct_claim_cap": level(pct("segment", c)),
        "prefix_hit_pct_claim_cap": level(pct("prefix", c)),
        "prefix_hit_pct_large_cap": level(pct("prefix", big)),
        "segment_minus_prefix_pts_claim_cap": diff(pct("segment", c), pct("prefix", c)),
        "prefix_large_minus_claim_pts": diff(pct("prefix", big), pct("prefix", c)),
        "prefix_inf_minus_large_pts": diff(pct("prefix", INFINITE), pct("prefix", big)),
        "segment_large_minus_prefix_large_pts": diff(pct("segment", big), pct("prefix", big)),
        "prefix_ceiling_pct": level(ceilings),
        "ceiling_vs_infinite_pts": diff(ceilings, pct("prefix", INFINITE)),
    }
    for (mode, cap), d in hits.groupby(["mode", "capacity"], sort=False):
        values[f"hit_pct_{mode}_{cap}"] = 100 * float(d["token_hit_rate"].mean())
    for (scheme, cap), d in ttfts.groupby(["scheme", "capacity"], sort=False):
        values[f"ttft_ms_{scheme}_{cap}"] = float(d["mean_ttft_ms"].mean())
    return values


def summary_table(hits: pd.DataFrame, ttfts: pd.DataFrame) -> pd.DataFrame:
    """One row per capacity: mean hit rates (%) per mode and mean TTFT (ms) per scheme."""
    caps = list(dict.fromkeys(hits["capacity"]))
    h = hits.groupby(["capacity", "mode"])["token_hit_rate"].mean().unstack() * 100
    t = ttfts.groupby(["capacity", "scheme"])["mean_ttft_ms"].mean().unstack()
    out = pd.DataFrame({"capacity": caps})
    for mode in ("prefix", "segment"):
        out[f"{mode}_hit_pct"] = [h.loc[c, mode] for c in caps]
    for scheme in SCHEMES:
        if scheme in t.columns:
            out[f"ttft_ms_{scheme}"] = [t.loc[c, scheme] for c in caps]
    return out


# ----------------------------------------------------------------------------------------
# figures


def _cap_x(caps: Sequence[str], model: str) -> tuple[list[float], list[str]]:
    """x positions (GB, log scale) of the capacities; ``inf`` one decade past the largest."""
    finite = [Capacity.parse(c).value / 1e9 for c in caps if c != INFINITE]
    top = max(finite) if finite else 1.0
    xs = [top * 10 if c == INFINITE else Capacity.parse(c).value / 1e9 for c in caps]
    labels = ["inf" if c == INFINITE else c for c in caps]
    return xs, labels


def hit_rate_figure(hits: pd.DataFrame, meta: pd.DataFrame, title: str) -> Figure:
    """Token hit rate vs KV capacity, segment keying (the method, coloured, first in the legend)
    and prefix keying (grey) (mean over seeds, error bars the seeds' range), with the analytic
    prefix ceiling dashed."""
    caps = list(dict.fromkeys(hits["capacity"]))
    xs, labels = _cap_x(caps, "")
    with paper_style():
        fig = figure("column", 2.6)
        ax = fig.add_subplot()
        handles = []
        for mode, name in (("segment", "segment keying"), ("prefix", "prefix keying")):
            g = hits[hits["mode"] == mode].groupby("capacity", sort=False)["token_hit_rate"]
            mean = [100 * g.get_group(c).mean() for c in caps]
            lo = [100 * g.get_group(c).min() for c in caps]
            hi = [100 * g.get_group(c).max() for c in caps]
            style = METHOD.style(mode, name=SERIES_LOOK[mode])
            h = ax.errorbar(
                xs,
                mean,
                yerr=[np.subtract(mean, lo), np.subtract(hi, mean)],
                label=name,
                capsize=2,
                **style,
            )
            handles.append(h)
        ceiling = 100 * float(meta["prefix_ceiling"].mean())
        handles.append(
            ax.axhline(
                ceiling,
                label="prefix ceiling (analytic)",
                **METHOD.style("prefix ceiling", kind="rule"),
            )
        )
        ax.set_xscale("log")
        ax.set_xticks(xs, labels)
        ax.minorticks_off()
        ax.set_ylim(0, 100)
        ax.set_xlabel("KV capacity (llama-3.1-8b bytes)")
        ax.set_ylabel("token hit rate (%)")
        ax.set_title(wrap_title(f"{title} (simulated replay; hit rates, no hardware)", 48),
                     fontsize=7)  # fmt: skip
        METHOD.legend(ax, handles, [h.get_label() for h in handles], loc="lower right",
                      bbox_to_anchor=(1.0, 0.27), fontsize=6)  # fmt: skip
    return fig


def latency_note(cfg: RepurposeConfig) -> str:
    """The latency model a figure names: ``roofline (llama-3.1-8b on H100)``."""
    p = cfg.latency.params
    on = f"{p['model']} on {p['gpu']}" if "model" in p and "gpu" in p else ""
    return f"{cfg.latency.name} ({on})" if on else cfg.latency.name


def ttft_figure(ttfts: pd.DataFrame, meta: pd.DataFrame, title: str, latency: str = "") -> Figure:
    """Mean simulated TTFT vs KV capacity per reuse scheme (mean over seeds), no-cache dotted;
    the segment schemes (the method) coloured and first in the legend, prefix caching grey.
    ``latency``: the latency model, named in the title."""
    caps = list(dict.fromkeys(ttfts["capacity"]))
    xs, labels = _cap_x(caps, "")
    with paper_style():
        fig = figure("column", 2.6)
        ax = fig.add_subplot()
        handles = []
        for scheme in METHOD.draw_order(list(SCHEMES)):
            d = ttfts[ttfts["scheme"] == scheme]
            if d.empty:
                continue
            g = d.groupby("capacity", sort=False)["mean_ttft_ms"].mean()
            (line,) = ax.plot(
                xs,
                [g[c] for c in caps],
                label=SCHEME_LABELS[scheme],
                **METHOD.style(scheme, name=SERIES_LOOK[scheme]),
            )
            handles.append(line)
        nocache = float(meta["no_cache_ttft_ms"].mean())
        ax.axhline(nocache, color="0.0", linestyle=":", linewidth=0.8)
        ax.text(
            0.01, nocache, "no cache", transform=ax.get_yaxis_transform(), fontsize=6, va="bottom"
        )
        ax.set_xscale("log")
        ax.set_xticks(xs, labels)
        ax.minorticks_off()
        ax.set_ylim(0, nocache * 1.15)
        ax.set_xlabel("KV capacity (llama-3.1-8b bytes)")
        ax.set_ylabel("mean TTFT (ms, simulated)")
        what = f"simulated; latency model {latency}" if latency else "simulated"
        ax.set_title(wrap_title(f"{title} ({what})", 48), fontsize=7)
        METHOD.legend(ax, handles, [h.get_label() for h in handles], loc="lower right",
                      bbox_to_anchor=(1.0, 0.27), fontsize=6)  # fmt: skip
    return fig


def ttft_values(cfg: RepurposeConfig, ttfts: pd.DataFrame, meta: pd.DataFrame) -> dict[str, Any]:
    """TTFT claims at the claim capacity: each scheme's mean TTFT (ms, bootstrap interval over
    seeds), and paired per-seed differences in ms (Student t): each recompute scheme minus
    naive, and naive segment reuse minus prefix caching."""
    c = cfg.claim_capacity
    d = ttfts[ttfts["capacity"] == c]

    def per_seed(scheme: str) -> list[float]:
        return d[d["scheme"] == scheme].sort_values("seed")["mean_ttft_ms"].tolist()

    def diff(a: str, b: str) -> dict[str, Any] | None:
        x, y = per_seed(a), per_seed(b)
        return interval(list(np.subtract(x, y))) if x and y else None

    values: dict[str, Any] = {
        f"ttft_ms_{s}_claim_cap": interval(per_seed(s), method="bootstrap")
        for s in SCHEMES
        if per_seed(s)
    }
    values |= {
        "epic_minus_naive_ms_claim_cap": diff("epic", "naive"),
        "cacheblend_minus_naive_ms_claim_cap": diff("cacheblend", "naive"),
        "naive_minus_prefix_ms_claim_cap": diff("naive", "prefix"),
        "no_cache_ttft_ms": float(meta["no_cache_ttft_ms"].mean()),
        "latency_model": cfg.latency.name,
        "gpu": str(cfg.latency.params.get("gpu", "")),
        "epic_k": cfg.recompute.epic_k,
        "cacheblend_share_pct": 100 * cfg.recompute.cacheblend_share,
    }
    return values
