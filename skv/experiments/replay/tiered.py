"""Claude Code sessions over a tiered KV store: how big a CPU tier, with which policy per tier.

The question an operator of an agentic service asks: GPU memory holds a small share of the
sessions' KV; how much TTFT does a host-DRAM tier of a given size buy, and which eviction
policy should each tier run? The 40 kv-cache-tester sessions are placed on the seeded Poisson
timeline every Claude Code study uses (``session_gap_s``, 30 s: an assumption,
fig_claude_code_session_gap shows what it moves) and served by the simulator
(:func:`skv.sim.simulate`) with one replica, the roofline latency model of ``model`` on
``gpu``, and the GPU tier of ``gpu_tier`` over each ``cpu_tiers`` entry (:mod:`skv.tiers`:
write-through, copy on load, synchronous loads over PCIe 5, each lower-tier run loaded or
recomputed by cost).

Two sweeps per seed: the CPU tier's size with ``lru`` in both tiers, and every (GPU policy, CPU
policy) pair of ``gpu_policies`` x ``cpu_policies`` at ``pair_tier``. Everything is simulated:
the link is a preset (docs/tiers.md), the hardware a roofline.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, model_validator

from skv.experiments.stats import interval

log = logging.getLogger(__name__)

NONE = "none"  # the cpu_tiers entry for no lower tier


class TieredAgentConfig(BaseModel):
    """``experiments/replay/claude_code_tiered.yaml``; ``quick:`` overrides fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str
    description: str = ""
    trace: str = "weka_cc"
    max_sessions: int | None = Field(default=None, ge=1)
    session_gap_s: float = Field(default=30.0, gt=0, le=86_400)
    seeds: list[Annotated[int, Field(ge=0)]] = Field(min_length=1, max_length=10)
    model: str = "qwen2.5-1.5b"
    gpu: str = "H100"
    #: GPU memory for KV, any capacity (bytes of ``model``'s KV or a share of unique blocks)
    gpu_tier: str
    #: CPU tier sizes swept with lru in both tiers (``none``: GPU only), each a capacity
    cpu_tiers: list[str] = Field(min_length=1, max_length=10)
    #: the CPU tier's link (``skv.tiers.LINKS``)
    link: str = "pcie5"
    gpu_policies: list[str] = Field(min_length=1, max_length=8)
    cpu_policies: list[str] = Field(min_length=1, max_length=8)
    #: the CPU tier size of the policy-pair sweep (one of ``cpu_tiers``)
    pair_tier: str
    #: the CPU tier size the size claims are made at (one of ``cpu_tiers``)
    claim_tier: str
    quick: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> TieredAgentConfig:
        from skv.sizing import Capacity, get_model
        from skv.tiers import LINKS, check_tier_policy

        get_model(self.model)
        Capacity.parse(self.gpu_tier)
        for cap in self.cpu_tiers:
            if cap != NONE:
                Capacity.parse(cap)
        for name in (self.pair_tier, self.claim_tier):
            if name not in self.cpu_tiers or name == NONE:
                raise ValueError(f"{name!r}: must be one of cpu_tiers, not {NONE!r}")
        if NONE not in self.cpu_tiers:
            raise ValueError(f"cpu_tiers: include {NONE!r} (the GPU-only reference)")
        if self.link not in LINKS:
            raise ValueError(f"link {self.link!r}: one of {', '.join(LINKS)}")
        for name in (*self.gpu_policies, *self.cpu_policies):
            check_tier_policy(name)
        if "lru" not in self.gpu_policies or "lru" not in self.cpu_policies:
            raise ValueError("gpu_policies and cpu_policies: include lru (the reference pair)")
        return self

    def cells(self) -> list[tuple[str, str, str]]:
        """(cpu tier size, GPU policy, CPU policy) of both sweeps, without repeats."""
        out = [(cap, "lru", "lru") for cap in self.cpu_tiers]
        out += [
            (self.pair_tier, g, c)
            for g in self.gpu_policies
            for c in self.cpu_policies
            if (g, c) != ("lru", "lru")
        ]
        return out


def load(path: str | Path, *, quick: bool) -> TieredAgentConfig:
    """Read and validate the config; errors are ``ConfigError`` naming file and field."""
    from skv.experiments.config import read_model_quick

    return read_model_quick(path, TieredAgentConfig, "tiered agentic config", quick=quick)


def _seed_task(task: tuple[TieredAgentConfig, int]) -> list[dict[str, Any]]:
    """Every cell of one seed (the sessions parsed and placed once)."""
    from skv.blocks import compile_trace
    from skv.latency import make_latency_model
    from skv.replay import trace_totals
    from skv.sim import SimConfig, compile_run, simulate
    from skv.sizing import Capacity
    from skv.traces import find_trace
    from skv.traces.claude_code import read_sessions, session_requests

    cfg, seed = task
    sessions = read_sessions(find_trace(cfg.trace), cfg.max_sessions)
    reqs = session_requests(sessions, session_interval_s=cfg.session_gap_s, seed=seed)
    trace = compile_trace(reqs)
    totals = trace_totals(trace)
    block = trace[0].block_size
    lat = make_latency_model("roofline", model=cfg.model, gpu=cfg.gpu)
    gpu_blocks = Capacity.parse(cfg.gpu_tier).to_blocks(
        block_size=block, unique_blocks=totals.unique_blocks, model=cfg.model
    )
    rows = []
    compiled = None  # the seed's requests, compiled once: every cell serves them
    for cap, gpu_policy, cpu_policy in cfg.cells():
        tiers = [] if cap == NONE else [f"cpu={cap}@{cpu_policy},link={cfg.link}"]
        config = SimConfig(
            policy=gpu_policy,
            capacity_blocks=gpu_blocks,
            block_size=block,
            tiers=tiers,
            tier_model=cfg.model,
        )
        compiled = compiled or compile_run(reqs, config)
        s = simulate(compiled, config, lat, progress=False).summary
        tier_rates = {t["tier"]: t["token_hit_rate"] for t in s.get("tiers", [])}
        rows.append(
            {
                "seed": seed,
                "cpu_tier": cap,
                "gpu_policy": gpu_policy,
                "cpu_policy": cpu_policy if cap != NONE else "",
                "ttft_ms_mean": s["ttft_ms_mean"],
                "ttft_ms_p50": s["ttft_ms_p50"],
                "ttft_ms_p90": s["ttft_ms_p90"],
                "queue_ms_mean": s["queue_ms_mean"],
                "token_hit_rate": s["token_hit_rate"],
                "gpu_token_hit_rate": tier_rates.get("gpu", _all_hits(s)),
                "cpu_token_hit_rate": tier_rates.get("cpu", 0.0),
                "load_ms_per_request": s.get("tier_load_ms", 0.0) / s["requests"],
                "recomputed_segments": s.get("tier_recomputed_segments", 0),
                "gpu_blocks": gpu_blocks,
                "unique_blocks": totals.unique_blocks,
            }
        )
        log.info("claude code tiered: seed %d, cpu %s, %s/%s done", seed, cap, gpu_policy,
                 cpu_policy)  # fmt: skip
    return rows


def _all_hits(summary: dict[str, Any]) -> float:
    """A summary's hit tokens over prompt tokens as the cache counted them, not capped at
    prompt - 1 per request: the tiers' per-tier rates count the same way."""
    tokens = summary["prompt_tokens_by_type"]
    rates = summary["hit_rate_by_type"]
    return sum(rates[t] * tokens[t] for t in rates) / sum(tokens.values())


def run(cfg: TieredAgentConfig, *, jobs: int | None = None) -> pd.DataFrame:
    """Every seed on the sweep executor; rows in (seed, cell) order."""
    from skv.experiments.sweep import run_sweep

    parts = run_sweep(_seed_task, [(cfg, s) for s in cfg.seeds], jobs=jobs, label=cfg.id)
    return pd.DataFrame([r for part in parts for r in part])


def _per_seed(rows: pd.DataFrame, cap: str, g: str, c: str, metric: str) -> np.ndarray:
    d = rows[(rows["cpu_tier"] == cap) & (rows["gpu_policy"] == g)]
    if cap != NONE:
        d = d[d["cpu_policy"] == c]
    return d.sort_values("seed")[metric].to_numpy(float)


def size_table(cfg: TieredAgentConfig, rows: pd.DataFrame) -> pd.DataFrame:
    """Per CPU tier size (lru in both tiers): hit rates by tier and TTFT, mean over seeds, and
    GPU-only TTFT / this TTFT paired per seed (the speedup the tier buys)."""
    base = _per_seed(rows, NONE, "lru", "lru", "ttft_ms_mean")
    out = []
    for cap in cfg.cpu_tiers:
        get = lambda m, cap=cap: _per_seed(rows, cap, "lru", "lru", m)  # noqa: E731
        speed = interval(list(base / get("ttft_ms_mean")))
        out.append(
            {
                "cpu_tier": cap,
                "gpu_token_hit_rate": float(get("gpu_token_hit_rate").mean()),
                "cpu_token_hit_rate": float(get("cpu_token_hit_rate").mean()),
                "token_hit_rate": float(get("token_hit_rate").mean()),
                "ttft_ms_mean": float(get("ttft_ms_mean").mean()),
                "ttft_ms_p90": float(get("ttft_ms_p90").mean()),
                "speedup_vs_gpu_only": speed["value"],
                "ci95_low": speed["ci95"][0],
                "ci95_high": speed["ci95"][1],
            }
        )
    return pd.DataFrame(out)


def pair_table(cfg: TieredAgentConfig, rows: pd.DataFrame) -> pd.DataFrame:
    """Per (GPU policy, CPU policy) at ``pair_tier``: lru/lru's mean TTFT over the pair's,
    paired per seed (above 1: the pair is faster), and the hit rates by tier."""
    cap = cfg.pair_tier
    ref = _per_seed(rows, cap, "lru", "lru", "ttft_ms_mean")
    out = []
    for g in cfg.gpu_policies:
        for c in cfg.cpu_policies:
            speed = interval(list(ref / _per_seed(rows, cap, g, c, "ttft_ms_mean")))
            out.append(
                {
                    "gpu_policy": g,
                    "cpu_policy": c,
                    "ttft_ms_mean": float(_per_seed(rows, cap, g, c, "ttft_ms_mean").mean()),
                    "token_hit_rate": float(_per_seed(rows, cap, g, c, "token_hit_rate").mean()),
                    "gpu_token_hit_rate": float(
                        _per_seed(rows, cap, g, c, "gpu_token_hit_rate").mean()
                    ),
                    "speedup_vs_lru_lru": speed["value"],
                    "ci95_low": speed["ci95"][0],
                    "ci95_high": speed["ci95"][1],
                }
            )
    return pd.DataFrame(out).sort_values("speedup_vs_lru_lru", ascending=False, kind="stable")


def claim_values(cfg: TieredAgentConfig, rows: pd.DataFrame) -> dict[str, Any]:
    """At ``claim_tier``: GPU-only / tiered mean TTFT and the hit-rate gain in points (paired
    per seed); at ``pair_tier``: the best pair by mean speedup over lru/lru and its speedup, and
    for each other CPU-tier policy under lru in GPU memory, lru/lru's TTFT over its own
    (``cpu_<policy>_speedup``) and its hit rate minus lru/lru's in points."""
    cap = cfg.claim_tier
    base_t = _per_seed(rows, NONE, "lru", "lru", "ttft_ms_mean")
    base_h = _per_seed(rows, NONE, "lru", "lru", "token_hit_rate")
    tier_t = _per_seed(rows, cap, "lru", "lru", "ttft_ms_mean")
    tier_h = _per_seed(rows, cap, "lru", "lru", "token_hit_rate")
    pairs = pair_table(cfg, rows)
    best = pairs.iloc[0]
    best_speed = _per_seed(rows, cfg.pair_tier, "lru", "lru", "ttft_ms_mean") / _per_seed(
        rows, cfg.pair_tier, best["gpu_policy"], best["cpu_policy"], "ttft_ms_mean"
    )
    values: dict[str, Any] = {}
    ref_t = _per_seed(rows, cfg.pair_tier, "lru", "lru", "ttft_ms_mean")
    ref_h = _per_seed(rows, cfg.pair_tier, "lru", "lru", "token_hit_rate")
    for c in cfg.cpu_policies:  # the CPU tier's policy under lru in GPU memory
        if c == "lru":
            continue
        t = _per_seed(rows, cfg.pair_tier, "lru", c, "ttft_ms_mean")
        h = _per_seed(rows, cfg.pair_tier, "lru", c, "token_hit_rate")
        values[f"cpu_{c}_speedup"] = interval(list(ref_t / t))
        values[f"cpu_{c}_hit_diff_pts"] = interval(list(100 * (h - ref_h)))
    return {
        **values,
        "model": cfg.model,
        "gpu": cfg.gpu,
        "gpu_tier": cfg.gpu_tier,
        "claim_tier": cap,
        "pair_tier": cfg.pair_tier,
        "seeds": len(cfg.seeds),
        "cpu_tier_speedup": interval(list(base_t / tier_t)),
        "cpu_tier_hit_gain_pts": interval(list(100 * (tier_h - base_h))),
        "gpu_only_hit_rate": interval(list(base_h), method="bootstrap"),
        "best_pair": f"{best['gpu_policy']}/{best['cpu_policy']}",
        "best_pair_speedup": interval(list(best_speed)),
    }


def figure_tiers(cfg: TieredAgentConfig, sizes: pd.DataFrame, pairs: pd.DataFrame, title: str
                 ) -> Figure:  # fmt: skip
    """Left: token hit rate by tier (stacked) and mean TTFT against the CPU tier's size (lru
    in both tiers). Right: each policy pair's speedup over lru/lru at ``pair_tier`` (95%
    interval over seeds); lru/lru is the grey reference at 1."""
    from skv.experiments.plotstyle import (
        Comparison,
        figure,
        paper_style,
        plain_ticks,
        wrap_title,
    )

    names = [f"{g}/{c}" for g, c in zip(pairs["gpu_policy"], pairs["cpu_policy"], strict=True)]
    cmp = Comparison(tuple(n for n in names if n != "lru/lru"))
    with paper_style():
        fig = figure("text", 2.8)
        ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
        x = np.arange(len(sizes))
        gpu_h, cpu_h = sizes["gpu_token_hit_rate"], sizes["cpu_token_hit_rate"]
        b1 = ax.bar(x, gpu_h, color="0.55", label="served from GPU memory")
        b2 = ax.bar(x, cpu_h, bottom=gpu_h, color="#d55e00", label="loaded from the CPU tier")
        ax.set_xticks(x, [c if c != NONE else "GPU only" for c in sizes["cpu_tier"]], fontsize=6)
        ax.set_xlabel(f"CPU tier (GPU tier {cfg.gpu_tier}, lru in both)")
        ax.set_ylabel("token hit rate")
        ax.set_ylim(0, 1.05)
        tx = ax.twinx()
        (line,) = tx.plot(x, sizes["ttft_ms_mean"] / 1000, color="0.0", marker="o", ms=3, lw=1,
                          label="_ttft")  # fmt: skip
        ax.legend([b1, b2, line], [b1.get_label(), b2.get_label(), "mean TTFT (right axis)"],
                  fontsize=5, loc="center right", bbox_to_anchor=(1.0, 0.55))  # fmt: skip
        tx.set_yscale("log")
        plain_ticks(tx.yaxis, log=True)
        tx.set_ylabel("mean TTFT (s, log)")
        ax.set_title("hit rate by tier, and TTFT", fontsize=7)
        labels = [f"{g}/{c}" for g, c in zip(pairs["gpu_policy"], pairs["cpu_policy"],
                                              strict=True)]  # fmt: skip
        y = np.arange(len(pairs))[::-1]
        handles = []
        for yi, lab, (_, r) in zip(y, labels, pairs.iterrows(), strict=True):
            key = lab if lab != "lru/lru" else "lru"
            style = cmp.style(key, name=str(r["gpu_policy"]))
            err = [
                [r["speedup_vs_lru_lru"] - r["ci95_low"]],
                [r["ci95_high"] - r["speedup_vs_lru_lru"]],
            ]
            h = bx.errorbar([r["speedup_vs_lru_lru"]], [yi], xerr=err, label=f"_{lab}", capsize=2,
                            **{k: v for k, v in style.items() if k != "linestyle"})  # fmt: skip
            handles.append(h)
        bx.axvline(1.0, color="0.5", lw=0.8)
        bx.set_yticks(y, labels, fontsize=6)
        bx.set_xlabel(f"TTFT speedup over lru/lru (CPU {cfg.pair_tier})")
        bx.set_ylabel("GPU / CPU policy")
        bx.set_title("policy per tier", fontsize=7)
        fig.suptitle(wrap_title(title, 110), fontsize=8)
    return fig
