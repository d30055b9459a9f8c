"""How far a SHARDS-sampled hit rate is from the full replay's, per policy, trace and rate.

:func:`skv.mrc.shards_curve` estimates a policy's hit rate at a capacity by replaying a spatial
sample of the trace (rate R) through a cache scaled to match (:func:`skv.mrc.scaled_capacity`).
This sweep measures the estimate against the full replay at every capacity of the config, for
every policy, rate and seed (which keys the sample holds), and keeps the error's sign: a policy
whose error has one sign across seeds is biased by sampling, not just noisy. Where to expect
bias: per-key samples cut requests to ~R of their blocks, so a policy that reads request sizes
or positions sees different requests (``vllm`` caps a request's hits at its blocks minus one,
and a short sampled request loses a larger share), and a learning policy sees ~R of the events
it learns from, at the same pace in time.

Hit rates are SIMULATED (cache-only replay). Speed is not measured here: timings are not
byte-identical from run to run, so they belong to ``benchmarks/mrc_speed.py`` (README).

One sweep task per (trace, policy) on :func:`skv.experiments.sweep.run_sweep`: the task loads
and compiles its trace, replays it in full at every capacity, then samples it at every rate and
seed (a per-key sample cuts one ``CompactTrace`` built once per task). A task's rows depend on
the task alone, so the table is identical in every sweep mode.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skv.experiments.stats import interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

#: entries of each of a sweep's lists (the sweep replays their product)
MAX_SWEEP_LIST = 100
#: the error every estimate is read against, in points (the bar of issue 15 and the upper end of
#: what SHARDS reports for LRU at R = 0.01-0.1; ../shared/REFERENCE.md section 5)
ERROR_BAR_PTS = 1.0
METRICS = ("token_hit_rate", "block_hit_rate")


class TraceSpec(BaseModel):
    """One trace of the sweep: ``label`` (its name in tables and figures), ``trace`` (a name
    :func:`skv.traces.find_trace` resolves) and the reader's ``format_options``."""

    model_config = ConfigDict(extra="forbid")
    label: str = Field(min_length=1, max_length=64)
    trace: str = Field(min_length=1)
    format_options: dict[str, Any] = Field(default_factory=dict)


class SamplingConfig(BaseModel):
    """``experiments/replay/sampling_accuracy.yaml``; its ``quick:`` mapping overrides fields in
    quick runs. ``capacities`` are shares of each trace's unique blocks (``"1%"``); ``rates`` in
    (0, 1); ``unit`` as :func:`skv.mrc.sample_trace`'s."""

    model_config = ConfigDict(extra="forbid")
    id: str
    title: str
    description: str = ""
    traces: list[TraceSpec] = Field(min_length=1, max_length=8)
    policies: list[str] = Field(min_length=1, max_length=MAX_SWEEP_LIST)
    capacities: list[str] = Field(min_length=1, max_length=MAX_SWEEP_LIST)
    rates: list[Annotated[float, Field(gt=0, lt=1)]] = Field(min_length=1, max_length=16)
    seeds: list[Annotated[int, Field(ge=0)]] = Field(min_length=1, max_length=MAX_SWEEP_LIST)
    unit: str = "auto"
    metric: str = "token_hit_rate"
    quick: dict[str, Any] = Field(default_factory=dict)


def load_sampling_config(path: str | Path, *, quick: bool) -> SamplingConfig:
    """The sweep's config, read by :func:`skv.experiments.config.read_yaml` (size bounds);
    errors are ``ConfigError`` naming the file and the field (``quick.`` for an override), and
    a bad policy, unit, metric or capacity fails here, before any trace is read."""
    from skv.experiments.config import ConfigError, _flatten, read_yaml
    from skv.experiments.replay.capacity import _share
    from skv.mrc import UNITS
    from skv.policies.registry import OFFLINE, policy_class

    data = read_yaml(path, "sampling config") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
    try:
        cfg = SamplingConfig.model_validate(data)
        if quick and cfg.quick:
            where = "quick overrides: "
            cfg = SamplingConfig.model_validate({**data, **cfg.quick, "quick": {}})
    except ValidationError as exc:
        where = "quick overrides: " if quick and "cfg" in locals() else ""
        raise ConfigError(f"{path}: {where}{_flatten(exc)}") from None
    problems = []
    for name in cfg.policies:
        try:
            policy_class(name)
        except (KeyError, ValueError) as exc:
            problems.append(f"policies: {exc}")
        if name in OFFLINE:
            problems.append(f"policies: {name} is offline (a sample has no next-use oracle)")
    for spec in cfg.capacities:
        try:
            _share(spec)
        except ValueError as exc:
            problems.append(f"capacities: {exc}")
    if cfg.unit not in UNITS:
        problems.append(f"unit: {cfg.unit!r} is not one of {', '.join(UNITS)}")
    if cfg.metric not in METRICS:
        problems.append(f"metric: {cfg.metric!r} is not one of {', '.join(METRICS)}")
    if len({t.label for t in cfg.traces}) != len(cfg.traces):
        problems.append("traces: two traces share a label")
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return cfg


def run_config(cfg: SamplingConfig, *, jobs: int | None = None) -> pd.DataFrame:
    """Every (trace, policy) of ``cfg`` as one sweep task; rows in task order."""
    from skv.experiments.sweep import run_sweep

    grid = (tuple(cfg.capacities), tuple(cfg.rates), tuple(cfg.seeds), cfg.unit)
    tasks = [
        (t.label, t.trace, dict(t.format_options), p, *grid)
        for t in cfg.traces
        for p in cfg.policies
    ]
    parts = run_sweep(_task, tasks, jobs=jobs, label=f"{cfg.id} sampling sweep")
    return pd.DataFrame([row for part in parts for row in part])


def _task(task: tuple) -> list[dict[str, Any]]:
    label, name, options, policy, capacities, rates, seeds, unit = task
    from skv.experiments.replay.capacity import load_real_trace
    from skv.replay import compile_trace

    trace = compile_trace(load_real_trace(name, **options))
    return accuracy_rows(trace, label, policy, capacities, rates, seeds, unit)


def accuracy_rows(
    trace: Sequence[Any],
    label: str,
    policy: str,
    capacities: Sequence[str],
    rates: Sequence[float],
    seeds: Sequence[int],
    unit: str = "auto",
) -> list[dict[str, Any]]:
    """One row per (rate, seed, capacity): the full replay's and the sample's block and token
    hit rates of ``policy`` on ``trace`` (a compiled list), and the sample's size."""
    from skv.compact_trace import CompactTrace
    from skv.experiments.replay.capacity import _share
    from skv.mrc import sample_trace, samples_per_key, scaled_capacity
    from skv.replay import replay_one, trace_totals

    totals = trace_totals(trace)
    caps = {spec: max(2, round(_share(spec) * totals.unique_blocks)) for spec in capacities}
    full = {
        spec: replay_one(trace, policy, cap, totals=totals, progress=False)
        for spec, cap in caps.items()
    }
    compact = None
    rows: list[dict[str, Any]] = []
    for rate in rates:
        source, how = trace, unit
        if samples_per_key(trace, rate, unit):
            compact = compact or CompactTrace(trace, drop_next_use=True)
            source, how = compact, "block"
        for seed in seeds:
            sample = sample_trace(source, rate, seed=int(seed), unit=how)
            stotals = trace_totals(sample.trace) if sample.trace else None
            for spec, cap in caps.items():
                scap = scaled_capacity(cap, sample)
                est = (
                    replay_one(sample.trace, policy, scap, totals=stotals, progress=False)
                    if sample.trace
                    else {"block_hit_rate": float("nan"), "token_hit_rate": float("nan")}
                )
                rows.append(
                    {
                        "trace": label,
                        "policy": policy,
                        "rate": float(rate),
                        "seed": int(seed),
                        "unit": sample.unit,
                        "capacity": spec,
                        "capacity_blocks": cap,
                        "sample_capacity_blocks": scap,
                        "sample_requests": len(sample.trace),
                        "sample_key_share": sample.key_share,
                        "full_block_accesses": totals.block_accesses,
                        "full_prompt_tokens": totals.prompt_tokens,
                        "sample_block_accesses": stotals.block_accesses if stotals else 0,
                        "sample_prompt_tokens": stotals.prompt_tokens if stotals else 0,
                        "full_block_hit_rate": full[spec]["block_hit_rate"],
                        "full_token_hit_rate": full[spec]["token_hit_rate"],
                        "sampled_block_hit_rate": est["block_hit_rate"],
                        "sampled_token_hit_rate": est["token_hit_rate"],
                    }
                )
        log.info("%s %s: rate %g, %d seeds sampled", label, policy, rate, len(seeds))
    return rows


#: how a sampled hit rate becomes an estimate: ``scaled`` = the sample's own hit rate (its cache
#: scaled, :func:`skv.mrc.scaled_capacity`); ``adjusted`` = SHARDS-adj's reference-count
#: correction, 1 - the sample's misses / (R x the full trace's references): the full count is
#: known, so only the misses are estimated (each sampled with probability R). It needs every
#: reference sampled with probability R, so it exists for per-key samples only (NaN for whole
#: units, whose trunk is in every sample)
ESTIMATES = ("scaled", "adjusted")
_REFS = {"token_hit_rate": "prompt_tokens", "block_hit_rate": "block_accesses"}


def estimate(df: pd.DataFrame, metric: str = "token_hit_rate", how: str = "scaled") -> pd.Series:
    """The sampled rows' estimate of the full ``metric`` (see :data:`ESTIMATES`)."""
    sampled = df[f"sampled_{metric}"]
    if how == "scaled":
        return sampled
    if how != "adjusted":
        raise ValueError(f"estimate must be one of {', '.join(ESTIMATES)}, got {how!r}")
    refs = _REFS[metric]
    misses = df[f"sample_{refs}"] * (1.0 - sampled)
    adjusted = 1.0 - misses / (df["rate"] * df[f"full_{refs}"])
    return adjusted.where(df["unit"] == "block")


def with_errors(
    df: pd.DataFrame, metric: str = "token_hit_rate", how: str = "scaled"
) -> pd.DataFrame:
    """``df`` plus ``error_pts``: the estimate minus the full ``metric``, in points (signed)."""
    out = df.copy()
    out["error_pts"] = 100.0 * (estimate(df, metric, how) - out[f"full_{metric}"])
    return out


def max_errors(
    df: pd.DataFrame, metric: str = "token_hit_rate", how: str = "scaled"
) -> pd.DataFrame:
    """Per (trace, policy, rate, seed): the largest absolute error over the capacities, in
    points (how far the seed's whole estimated curve strays)."""
    e = with_errors(df, metric, how)
    e["abs_error_pts"] = e["error_pts"].abs()
    keys = ["trace", "policy", "rate", "seed"]
    return e.groupby(keys, sort=False, as_index=False)["abs_error_pts"].max()


def per_seed_max_error(
    df: pd.DataFrame,
    trace: str,
    policy: str,
    rate: float,
    metric: str = "token_hit_rate",
    how: str = "scaled",
) -> list[float]:
    m = max_errors(df, metric, how)
    d = m[(m["trace"] == trace) & (m["policy"] == policy) & (m["rate"] == float(rate))]
    return [float(x) for x in d.sort_values("seed")["abs_error_pts"]]


def mean_signed_error(
    df: pd.DataFrame,
    trace: str,
    policy: str,
    rate: float,
    metric: str = "token_hit_rate",
    how: str = "scaled",
) -> list[float]:
    """Per seed, the signed error averaged over the capacities (points): its interval over
    seeds excluding 0 means sampling biases this policy's curve, not only scatters it."""
    e = with_errors(df, metric, how)
    d = e[(e["trace"] == trace) & (e["policy"] == policy) & (e["rate"] == float(rate))]
    return [float(x) for x in d.groupby("seed", sort=True)["error_pts"].mean()]


def summary(df: pd.DataFrame, metric: str = "token_hit_rate") -> pd.DataFrame:
    """Per (trace, policy, rate, estimate): the max absolute error over capacities (mean over
    seeds, its 95% bootstrap interval and the worst seed) and the mean signed error (Student t
    interval), in points; ``within_bar`` when the worst seed is within :data:`ERROR_BAR_PTS`."""
    rows = []
    e = pd.concat([with_errors(df, metric, how).assign(estimate=how) for how in ESTIMATES])
    keys = ["trace", "policy", "rate", "estimate"]
    for (trace, policy, rate, how), d in e.groupby(keys, sort=False):
        if d["error_pts"].isna().all():
            continue  # an estimate that does not apply to this sample's unit
        per_seed = d.groupby("seed", sort=True)
        worst = [float(x) for x in per_seed["error_pts"].agg(lambda s: s.abs().max())]
        signed = [float(x) for x in per_seed["error_pts"].mean()]
        mx = interval(worst, method="bootstrap")
        bias = interval(signed)
        rows.append(
            {
                "trace": trace,
                "policy": policy,
                "rate": rate,
                "unit": d["unit"].iloc[0],
                "estimate": how,
                "seeds": len(worst),
                "max_error_pts": mx["value"],
                "max_error_ci95_low": mx["ci95"][0],
                "max_error_ci95_high": mx["ci95"][1],
                "worst_seed_pts": max(worst),
                "signed_error_pts": bias["value"],
                "signed_ci95_low": bias["ci95"][0],
                "signed_ci95_high": bias["ci95"][1],
                "within_bar": max(worst) <= ERROR_BAR_PTS,
            }
        )
    return pd.DataFrame(rows)


def accuracy_figure(df: pd.DataFrame, title: str, metric: str = "token_hit_rate") -> Figure:
    """Signed error (sampled - full, points) against capacity (share of the trace's unique
    blocks): one panel per (trace, rate), one line per policy (mean over seeds) with the seeds'
    range shaded; the +-1 point bar grey. Every policy in colour."""
    from skv.experiments.plotstyle import figure, paper_style, plain_ticks, policy_style

    e = with_errors(df, metric)
    e["share_pct"] = [float(c.strip().rstrip("%")) for c in e["capacity"]]
    traces = list(dict.fromkeys(e["trace"]))
    rates = sorted(set(e["rate"]), reverse=True)
    with paper_style():
        fig = figure("text", 0.5 + 1.6 * len(traces))
        axes = fig.subplots(len(traces), len(rates), squeeze=False, sharex=True)
        for i, trace in enumerate(traces):
            for j, rate in enumerate(rates):
                ax = axes[i][j]
                ax.axhspan(-ERROR_BAR_PTS, ERROR_BAR_PTS, color="0.9", lw=0)
                ax.axhline(0, color="0.5", lw=0.6)
                d = e[(e["trace"] == trace) & (e["rate"] == rate)]
                for policy in dict.fromkeys(d["policy"]):
                    g = d[d["policy"] == policy].groupby("share_pct", sort=True)["error_pts"]
                    style = policy_style(policy, highlight=None)
                    x = g.mean().index.to_numpy()
                    ax.plot(x, g.mean().to_numpy(), label=policy, **style)
                    lo, hi = g.min().to_numpy(), g.max().to_numpy()
                    ax.fill_between(x, lo, hi, color=style["color"], alpha=0.12, lw=0)
                ax.set_xscale("log")
                plain_ticks(ax.xaxis, log=True)
                unit = d["unit"].iloc[0] if len(d) else ""
                ax.set_title(f"{trace}, R = {rate:g} (unit: {unit})", fontsize=7)
                if j == 0:
                    ax.set_ylabel("sampled - full (points)")
                if i == len(traces) - 1:
                    ax.set_xlabel("cache (% of the unique blocks)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, frameon=False, loc="lower center", ncols=len(labels))
        fig.suptitle(title, fontsize=8)
        fig.set_layout_engine("tight", rect=(0, 0.06, 1, 1))
    return fig
