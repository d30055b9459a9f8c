"""How much the Claude Code results depend on the assumed gap between session starts.

The kv-cache-tester sessions carry no absolute start time, so the reader places them on a
seeded Poisson timeline with mean gap ``session_interval_s`` (30 s by default; an assumption,
not a measurement). The gap sets how many sessions interleave, and interleaving is what makes a
small cache miss, so every Claude Code hit rate below the ceiling depends on it. This sweep
replays the sessions at several gaps and seeds (cache-only; hit rates simulated) so a reader can
see how much, and the claims name the gap they assume.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from skv.experiments.stats import interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)


#: entries of each of a sweep's gaps, seeds and policies (the sweep replays their product)
MAX_SWEEP_LIST = 100
#: the longest mean session gap a sweep may assume: a day
MAX_GAP_S = 86_400.0


class GapConfig(BaseModel):
    """``experiments/replay/claude_code_session_gap.yaml``; its ``quick:`` mapping overrides
    fields in quick runs. Lists hold at most :data:`MAX_SWEEP_LIST` entries (the sweep replays
    gaps x seeds x policies); gaps are in (0, :data:`MAX_GAP_S`] seconds; seeds >= 0."""

    model_config = ConfigDict(extra="forbid")
    id: str
    title: str
    description: str = ""
    trace: str
    capacity: str
    gaps_s: list[Annotated[float, Field(gt=0, le=MAX_GAP_S)]] = Field(
        min_length=1, max_length=MAX_SWEEP_LIST
    )
    assumed_gap_s: float = Field(gt=0, le=MAX_GAP_S)
    seeds: list[Annotated[int, Field(ge=0)]] = Field(min_length=1, max_length=MAX_SWEEP_LIST)
    policies: list[str] = Field(min_length=1, max_length=MAX_SWEEP_LIST)
    #: replayed at the assumed gap only (an offline bound is slow and needs one point)
    bound_policy: str | None = None
    max_sessions: int | None = Field(default=None, ge=1)
    quick: dict[str, Any] = Field(default_factory=dict)


def load_gap_config(path: str | Path, *, quick: bool) -> GapConfig:
    """The sweep's config, read by :func:`skv.experiments.config.read_yaml` (size bounds);
    errors are ``ConfigError`` naming the file and the field (``quick.`` for an override)."""
    from skv.experiments.config import ConfigError, read_model_quick

    cfg = read_model_quick(path, GapConfig, "session-gap config", quick=quick)
    if cfg.assumed_gap_s not in cfg.gaps_s:
        raise ConfigError(f"{path}: assumed_gap_s {cfg.assumed_gap_s} must be one of gaps_s")
    return cfg


def run_config(cfg: GapConfig) -> pd.DataFrame:
    """The sweep of a config: its policies at every gap, the bound at the assumed gap (the
    session files are parsed once for both)."""
    from skv.traces import find_trace
    from skv.traces.claude_code import read_sessions

    sessions = read_sessions(find_trace(cfg.trace), cfg.max_sessions)
    df = gap_sweep(sessions, cfg.gaps_s, cfg.seeds, cfg.policies, cfg.capacity)
    if cfg.bound_policy:
        bound = gap_sweep(
            sessions, [cfg.assumed_gap_s], cfg.seeds, [cfg.bound_policy], cfg.capacity
        )
        df = pd.concat([df, bound], ignore_index=True)
    return df


def gap_sweep(
    sessions: Sequence[Any],
    gaps_s: Sequence[float],
    seeds: Sequence[int],
    policies: Sequence[str],
    capacity: str,
) -> pd.DataFrame:
    """One row per (gap, seed, policy): block and token hit rates at ``capacity`` (a share of
    the trace's unique blocks, which the gap does not change), plus the infinite-cache ceiling.
    ``sessions``: parsed once (:func:`skv.traces.claude_code.read_sessions`), placed on a new
    timeline per (gap, seed)."""
    from skv.replay import compile_trace, replay_trace
    from skv.traces.claude_code import session_requests

    rows: list[dict[str, Any]] = []
    for gap in gaps_s:
        for seed in seeds:
            reqs = session_requests(sessions, session_interval_s=float(gap), seed=int(seed))
            for r in replay_trace(compile_trace(reqs), policies, [capacity], progress=False):
                rows.append(
                    {
                        "gap_s": float(gap),
                        "seed": int(seed),
                        "policy": r["policy"],
                        "capacity": capacity,
                        "block_hit_rate": r["block_hit_rate"],
                        "token_hit_rate": r["token_hit_rate"],
                        "ceiling_block_hit_rate": r["ceiling_block_hit_rate"],
                    }
                )
            log.info("session gap %g s, seed %d: %d policies replayed", gap, seed, len(policies))
    return pd.DataFrame(rows)


def per_seed(df: pd.DataFrame, policy: str, gap_s: float, metric: str) -> list[float]:
    d = df[(df["policy"] == policy) & (df["gap_s"] == float(gap_s))].sort_values("seed")
    return [float(x) for x in d[metric]]


def summary(df: pd.DataFrame, metric: str = "block_hit_rate") -> pd.DataFrame:
    """Mean and 95% bootstrap interval over seeds per (gap, policy) (levels; see
    skv.experiments.stats)."""
    rows = []
    for (gap, pol), d in df.groupby(["gap_s", "policy"], sort=True):
        iv = interval(list(d.sort_values("seed")[metric]), method="bootstrap")
        rows.append(
            {
                "gap_s": gap,
                "policy": pol,
                "mean": iv["value"],
                "ci95_low": iv["ci95"][0],
                "ci95_high": iv["ci95"][1],
                "seeds": iv["n"],
            }
        )
    return pd.DataFrame(rows)


def diff_pts(df: pd.DataFrame, a: tuple[str, float], b: tuple[str, float], metric: str):
    """Paired (same seed) difference ``a - b`` in points, where each side is (policy, gap)."""
    xa, xb = per_seed(df, *a, metric), per_seed(df, *b, metric)
    return interval([100 * (x - y) for x, y in zip(xa, xb, strict=True)])


def gap_share(
    df: pd.DataFrame,
    policy: str,
    gap_s: float,
    metric: str,
    baseline: str = "lru",
    bound: str = "belady",
) -> dict:
    """Per seed, the share of the ``bound - baseline`` gap ``policy`` closes at ``gap_s``
    (``(p - baseline) / (bound - baseline)``), with its t interval over seeds."""
    p = per_seed(df, policy, gap_s, metric)
    b = per_seed(df, baseline, gap_s, metric)
    top = per_seed(df, bound, gap_s, metric)
    shares = [(x - y) / (z - y) for x, y, z in zip(p, b, top, strict=True) if z > y]
    return interval(shares)


def gap_figure(
    df: pd.DataFrame,
    title: str,
    assumed_gap_s: float,
    metric: str = "block_hit_rate",
    method: str = "saecache",
) -> Figure:
    """Hit rate vs the mean session gap (log axis), one line per policy with its 95% band over
    seeds (``method`` coloured, on top and first in the legend, the rest grey, Belady dashed);
    the gap the other Claude Code results assume is marked."""
    from skv.experiments.plotstyle import Comparison, figure, paper_style, plain_ticks, wrap_title

    cmp = Comparison(method)
    s = summary(df, metric)
    with paper_style():
        fig = figure("column", 2.5)
        ax = fig.add_subplot()
        handles = []
        for pol in cmp.draw_order(list(dict.fromkeys(df["policy"]))):
            d = s[s["policy"] == pol].sort_values("gap_s")
            style = cmp.style(pol)
            label = f"{pol} (offline)" if pol == "belady" else pol
            (line,) = ax.plot(d["gap_s"], d["mean"], label=label, **style)
            handles.append(line)
            ax.fill_between(
                d["gap_s"], d["ci95_low"], d["ci95_high"], color=style["color"], alpha=0.2, lw=0
            )
        ax.axvline(assumed_gap_s, color="0.3", linestyle=":", linewidth=0.8)
        ax.text(
            assumed_gap_s,
            0.02,
            f" assumed {assumed_gap_s:g} s",
            transform=ax.get_xaxis_transform(),
            fontsize=6,
            va="bottom",
        )
        ax.set_xscale("log")
        gaps = sorted(set(df["gap_s"]))
        ax.set_xticks(gaps, [f"{g:g}" for g in gaps])
        plain_ticks(ax.xaxis)
        ax.set_xticks(gaps)
        ax.set_ylim(0, None)
        ax.set_xlabel("mean gap between session starts (s)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(wrap_title(f"{title} (simulated replay; hit rates, no hardware)", 48),
                     fontsize=7)  # fmt: skip
        cmp.legend(ax, handles, [h.get_label() for h in handles], frameon=False,
                   loc="upper center", bbox_to_anchor=(0.5, -0.28), ncols=3)  # fmt: skip
        fig.set_layout_engine("tight")
    return fig
