"""Cache-only replay of real traces: hit rate against capacity, and reuse by semantic type.

A replay config (``experiments/replay/*_capacity.yaml``) names a trace, the policies and the
capacities (shares of the trace's unique blocks); :func:`capacity_curve` replays every policy at
every capacity through :mod:`skv.replay` (hit rates simulated, no timing) and
:func:`hit_rate_vs_capacity` draws the curve beside the infinite-cache ceiling.
Reuse by semantic type (the Claude Code table) is :mod:`skv.experiments.type_reuse`'s, shared with
the SAECache study.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.ticker
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skv.experiments.plotstyle import (
    Comparison,
    figure,
    paper_style,
    wrap_title,
)

#: entries of a replay config's policies and capacities (each pair is one full replay)
MAX_REPLAY_LIST = 100


class Ablation(BaseModel):
    """One policy's components switched off, each variant replayed at one capacity beside the
    policy with its defaults: ``variants`` maps a label to the parameters that switch it off."""

    model_config = ConfigDict(extra="forbid")

    policy: str
    capacity: str
    variants: dict[str, dict[str, Any]] = Field(min_length=1, max_length=16)


class _ReplayFields(BaseModel):
    """The types and bounds of a replay config's fields (the file's top level, and its
    ``quick:`` overrides, which may set any of them but ``quick``)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    title: str | None = None
    description: str | None = None
    trace: str | None = None
    format_options: dict[str, Any] | None = None
    policies: list[str] | None = Field(default=None, min_length=1, max_length=MAX_REPLAY_LIST)
    capacities: list[str] | None = Field(default=None, min_length=1, max_length=MAX_REPLAY_LIST)
    max_requests: int | None = Field(default=None, ge=1)
    reuse_policy: str | None = None
    reuse_capacity: str | None = None
    ablation: Ablation | None = None
    quick: dict[str, Any] | None = None


def load_replay_config(path: str | Path, *, quick: bool) -> dict[str, Any]:
    """A replay config (``experiments/replay/*.yaml``): ``trace``, ``format_options``,
    ``policies``, ``capacities``, ``max_requests``, ``title`` (what its figure is called;
    default: the id, humanised); its ``quick:`` mapping overrides them.

    Read by :func:`skv.experiments.config.read_yaml` (size bounds); every error is a
    ``ConfigError`` naming the file and the field: an unknown key, a wrong type, more than
    :data:`MAX_REPLAY_LIST` policies or capacities, a capacity that is not a share (``10%``).
    """
    from skv.experiments.config import ConfigError, _flatten, humanise_id, read_yaml

    data = read_yaml(path, "replay config")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
    allowed = set(_ReplayFields.model_fields)
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    for where, part in (("", data), ("quick.", data.get("quick") or {})):
        try:
            if not isinstance(part, dict):
                raise ConfigError(f"{path}: quick: expected a mapping of overrides")
            _ReplayFields.model_validate(part)
        except ValidationError as exc:
            raise ConfigError(f"{path}: {_flatten(exc, where.rstrip('.'))}") from None
        for i, cap in enumerate(part.get("capacities") or []):
            try:
                _share(cap)
            except ValueError as exc:
                raise ConfigError(f"{path}: {where}capacities[{i}]: {exc}") from None
    over = data.pop("quick", None) or {}
    if "quick" in over:
        raise ConfigError(f"{path}: quick.quick: a quick mapping cannot nest another")
    if quick:
        data.update(over)
    data.setdefault("format_options", {})
    data.setdefault("max_requests", None)
    data["title"] = str(data.get("title") or "").strip() or humanise_id(
        str(data.get("id") or Path(path).stem)
    )
    return data


def load_real_trace(name: str, *, max_requests: int | None = None, **options: Any) -> list:
    """Requests of a real trace found through :func:`skv.traces.find_trace` (raises
    FileNotFoundError saying where to get it); the first ``max_requests`` in arrival order."""
    from skv.traces import find_trace, load_trace

    reqs = load_trace(find_trace(name), **options)
    return reqs[:max_requests] if max_requests else reqs


def capacity_curve(
    requests: Sequence, policies: Sequence[str], capacities: Sequence[str]
) -> pd.DataFrame:
    """Cache-only replay of every policy at every capacity: one row per (capacity, policy)
    with ``capacity_share`` (of the trace's unique blocks), hit rates and the ceiling."""
    from skv.replay import compile_trace, replay_trace

    trace = compile_trace(requests)
    rows = replay_trace(trace, policies, capacities, progress=False)
    df = pd.DataFrame(
        [{k: v for k, v in r.items() if not isinstance(v, dict | list)} for r in rows]
    )
    df["capacity_share"] = [_share(c) for c in df["capacity"]]
    return df


def ablation_rows(requests: Sequence, spec: dict[str, Any]) -> pd.DataFrame:
    """Cache-only replay of ``spec``'s policy with its defaults and of each variant, at its
    one capacity: one row per variant (``default`` first) with its block and token hit rate.
    A variant's parameters are checked by the policy, so a typo fails, naming it."""
    from skv.replay import compile_trace, replay_one, resolve_capacities, trace_totals

    ab = Ablation.model_validate(spec)
    trace = compile_trace(requests)
    totals = trace_totals(trace)
    [(_, cap)] = resolve_capacities(
        [ab.capacity],
        block_size=trace[0].block_size,
        unique_blocks=totals.unique_blocks,
        model=None,
    )
    rows = []
    for label, params in {"default": {}, **ab.variants}.items():
        row = replay_one(trace, ab.policy, cap, params=params or None, totals=totals)
        rows.append({"variant": label, "policy": ab.policy, "capacity": ab.capacity,
                     "block_hit_rate": row["block_hit_rate"],
                     "token_hit_rate": row["token_hit_rate"]})  # fmt: skip
    return pd.DataFrame(rows)


def _share(spec: str) -> float:
    s = str(spec).strip()
    if not s.endswith("%"):
        raise ValueError(f"capacity {spec!r}: hit-rate curves need shares like '10%'")
    try:
        share = float(s[:-1]) / 100.0
    except ValueError:
        raise ValueError(f"capacity {spec!r}: expected a share like '10%'") from None
    if not 0 < share <= 1:
        raise ValueError(f"capacity {spec!r}: a share must be in (0%, 100%]")
    return share


#: the policy the replay figures are about (the paper's method)
REPLAY_METHOD = "saecache"


def hit_rate_vs_capacity(
    df: pd.DataFrame,
    title: str,
    metric: str = "block_hit_rate",
    method: str = REPLAY_METHOD,
) -> Figure:
    """One line per policy and the infinite-cache ceiling, in the :class:`Comparison` style:
    ``method`` in colour on top and first in the legend, the other policies grey, the bounds
    (Belady, offline; the ceiling) dashed. ``title``: the replay config's ``title``; the figure
    says it is a simulated replay."""
    from skv.policies.registry import OFFLINE

    cmp = Comparison(method)
    with paper_style():
        fig = figure("column", 2.9)
        ax = fig.add_subplot()
        policies = list(dict.fromkeys(df["policy"]))
        handles = {}
        for pol in cmp.draw_order(policies):
            d = df[df["policy"] == pol].sort_values("capacity_share")
            off = pol in OFFLINE
            (handles[pol],) = ax.plot(
                100 * d["capacity_share"],
                d[metric],
                label=f"{pol} (offline)" if off else pol,
                **cmp.style(pol),
            )
        ceiling = float(df[f"ceiling_{metric}"].iloc[0])
        handles["ceiling"] = ax.axhline(
            ceiling, label="infinite cache", **cmp.style("ceiling", kind="rule")
        )
        shares = sorted(set(df["capacity_share"]))
        ax.set_xscale("log")
        ax.set_xticks([100 * s for s in shares], [f"{100 * s:g}" for s in shares])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_ylim(0, None)
        ax.set_xlabel("capacity (% of unique blocks)")
        ax.set_ylabel(metric.replace("_", " "))
        what = f"{title}: {method} vs baselines (simulated replay; hit rates, no hardware)"
        ax.set_title(wrap_title(what, 48), fontsize=7)
        order = cmp.legend_order([*policies, "ceiling"])
        cmp.legend(
            ax,
            [handles[p] for p in order],
            [handles[p].get_label() for p in order],
            frameon=False,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.25),
            ncols=3,
            columnspacing=1.0,
            handlelength=1.8,
        )
    return fig


def curve_value(df: pd.DataFrame, policy: str, capacity: str, metric: str = "block_hit_rate"):
    """One cell of a capacity curve (None when that row was not run)."""
    d = df[(df["policy"] == policy) & (df["capacity"] == capacity)]
    return None if d.empty else float(d[metric].iloc[0])


def gap_closed(
    df: pd.DataFrame,
    *,
    baseline: str = "lru",
    bound: str = "belady",
    metric: str = "block_hit_rate",
) -> pd.DataFrame:
    """Per capacity and online policy: its hit rate minus ``baseline``'s in points, and the
    share of the ``bound - baseline`` gap it closes (``(p - baseline) / (bound - baseline)``:
    1 = as good as the offline bound, 0 = no better than the baseline, negative = worse; None
    where the bound does not beat the baseline). Rows for capacities that ran both."""
    rows = []
    for cap in dict.fromkeys(df["capacity"]):
        base, best = curve_value(df, baseline, cap, metric), curve_value(df, bound, cap, metric)
        if base is None or best is None:
            continue
        gap = best - base
        for pol in dict.fromkeys(df["policy"]):
            if pol in (baseline, bound):
                continue
            v = curve_value(df, pol, cap, metric)
            rows.append({
                "capacity": cap,
                "policy": pol,
                f"vs_{baseline}_pts": 100 * (v - base),
                f"{bound}_minus_{baseline}_pts": 100 * gap,
                "gap_share": (v - base) / gap if gap > 0 else None,
            })  # fmt: skip
    return pd.DataFrame(rows)


def hit_rate_by_type(requests: Sequence, policy: str, capacity: str) -> dict[str, float]:
    """Token hit rate per semantic type of one policy at one capacity (cache-only replay)."""
    from skv.replay import compile_trace, replay_trace

    rows = replay_trace(compile_trace(requests), [policy], [capacity], progress=False)
    return dict(rows[0]["hit_rate_by_type"])
