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
byte-identical from run to run, so they belong to ``benchmarks/mrc_speed.py``
(benchmarks/README.md).

One sweep task per (trace, policy) on :func:`skv.experiments.sweep.run_sweep`: the task loads
and compiles its trace, replays it in full at every capacity, then samples it at every rate and
seed (a per-key sample cuts one ``CompactTrace`` built once per task). A task's rows depend on
the task alone, so the table is identical in every sweep mode.
"""

from __future__ import annotations

import functools
import json
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
    #: the policies the figure draws error curves for (every policy gets a point in its summary
    #: row); each must be in ``policies``; empty: all of them
    lines: list[str] = Field(default_factory=list, max_length=16)
    unit: str = "auto"
    metric: str = "token_hit_rate"
    quick: dict[str, Any] = Field(default_factory=dict)


def load_sampling_config(path: str | Path, *, quick: bool) -> SamplingConfig:
    """The sweep's config, read by :func:`skv.experiments.config.read_yaml` (size bounds).
    The file and its ``quick:`` overrides are both checked whatever ``quick`` is (a typo in
    either fails every run); errors are ``ConfigError`` naming the file and the field, with
    ``quick.`` before an override's. A bad policy, unit, metric or capacity, or a repeated
    entry, fails here, before any trace is read."""
    from skv.experiments.config import ConfigError, _flatten, read_model

    data, cfg = read_model(path, SamplingConfig, "sampling config")
    problems = _problems(cfg, "")
    if "quick" in cfg.quick:
        problems.append("quick.quick: quick overrides cannot hold quick overrides")
    try:
        fast = SamplingConfig.model_validate({**data, **cfg.quick, "quick": {}})
    except ValidationError as exc:
        problems.append(f"quick overrides: {_flatten(exc)}")
    else:
        problems += _problems(fast, "quick.", set(cfg.quick))
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return fast if quick else cfg


def _problems(cfg: SamplingConfig, prefix: str, only: set[str] | None = None) -> list[str]:
    """What is wrong with a validated config's values (``only``: just these fields)."""
    from skv.experiments.replay.capacity import _share
    from skv.mrc import UNITS
    from skv.policies.registry import OFFLINE, policy_class

    out = []

    def bad(field: str, why: str) -> None:
        if only is None or field in only:
            out.append(f"{prefix}{field}: {why}")

    for i, name in enumerate(cfg.policies):
        try:
            policy_class(name)
        except (KeyError, ValueError) as exc:
            bad("policies", f"[{i}] {exc}")
        if name in OFFLINE:
            bad("policies", f"[{i}] {name} is offline (a sample has no next-use oracle)")
    for i, name in enumerate(cfg.lines):
        if name not in cfg.policies and (only is None or only & {"lines", "policies"}):
            out.append(f"{prefix}lines: [{i}] {name} is not one of the policies")
    for i, spec in enumerate(cfg.capacities):
        try:
            _share(spec)
        except ValueError as exc:
            bad("capacities", f"[{i}] {exc}")
    for field in ("policies", "capacities", "rates", "seeds"):
        values = getattr(cfg, field)
        if len(set(values)) != len(values):
            bad(field, "an entry is repeated")
    if cfg.unit not in UNITS:
        bad("unit", f"{cfg.unit!r} is not one of {', '.join(UNITS)}")
    if cfg.metric not in METRICS:
        bad("metric", f"{cfg.metric!r} is not one of {', '.join(METRICS)}")
    if len({t.label for t in cfg.traces}) != len(cfg.traces):
        bad("traces", "two traces share a label")
    return out


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
    trace = _compiled(name, json.dumps(options, sort_keys=True))
    return accuracy_rows(trace, label, policy, capacities, rates, seeds, unit)


@functools.lru_cache(maxsize=1)
def _compiled(name: str, options_json: str) -> list:
    """A real trace loaded and compiled, kept for the worker's next task: the tasks of one
    trace come in a row, and a replay of an online policy leaves the compiled list as it
    was (the config admits no offline policy, which would write next uses onto it)."""
    from skv.experiments.replay.capacity import load_real_trace
    from skv.replay import compile_trace

    return compile_trace(load_real_trace(name, **json.loads(options_json)))


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
    hit rates of ``policy`` on ``trace`` (a compiled list), and the sample's size. The sample
    replays its cache as :func:`skv.mrc.scaled_capacity` sizes it (``sampled_*``); a per-key
    sample also replays a cache of R x the capacity (``rate_scaled_*``, SHARDS's own sizing,
    what the ``adjusted`` estimate corrects). An empty sample's hit rates are NaN."""
    from skv.experiments.replay.capacity import _share
    from skv.mrc import Sampler, scaled_capacity
    from skv.replay import replay_one, trace_totals

    totals = trace_totals(trace)
    caps = {spec: max(2, round(_share(spec) * totals.unique_blocks)) for spec in capacities}
    full = {
        spec: replay_one(trace, policy, cap, totals=totals, progress=False)
        for spec, cap in caps.items()
    }
    nan = {"block_hit_rate": float("nan"), "token_hit_rate": float("nan")}
    sampler = Sampler(trace, unit)
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for seed in seeds:
            sample = sampler.sample(rate, int(seed))
            stotals = trace_totals(sample.trace) if sample.trace else None
            strace = _replayable(sample.trace, policy)
            per_key = sample.unit == "block"
            for spec, cap in caps.items():
                scap = scaled_capacity(cap, sample)
                rcap = max(1, round(rate * cap))
                est, by_rate = nan, nan
                if sample.trace:
                    est = replay_one(strace, policy, scap, totals=stotals, progress=False)
                    if per_key:
                        by_rate = replay_one(strace, policy, rcap, totals=stotals, progress=False)
                rows.append(
                    {
                        "trace": label,
                        "policy": policy,
                        "rate": float(rate),
                        "seed": int(seed),
                        "unit": sample.label,
                        "capacity": spec,
                        "capacity_blocks": cap,
                        "sample_capacity_blocks": scap,
                        "rate_scaled_capacity_blocks": rcap if per_key else None,
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
                        "rate_scaled_block_hit_rate": by_rate["block_hit_rate"],
                        "rate_scaled_token_hit_rate": by_rate["token_hit_rate"],
                    }
                )
        log.info("%s %s: rate %g, %d seeds sampled", label, policy, rate, len(seeds))
    return rows


def _replayable(trace: Sequence[Any], policy: str) -> Sequence[Any]:
    """The sample as :func:`accuracy_rows` replays it, at every capacity: a
    :class:`~skv.compact_trace.CompactTrace` that ``policy`` would replay request by request
    rebuilt once into its list (each replay of the compact trace rebuilt every request again;
    the list holds the same requests, replayed in the same order), one that ``policy``
    replays a radix node at a time (:data:`skv.replay.NODE_POLICIES`) kept as it is."""
    from skv.cache.node_replay import replays as node_replays
    from skv.compact_trace import CompactTrace
    from skv.replay import NODE_POLICIES

    if not isinstance(trace, CompactTrace):
        return trace
    if policy in NODE_POLICIES and node_replays(trace, vllm=policy == "vllm"):
        return trace
    return list(trace)


#: how a sample becomes an estimate: ``scaled`` = the sample's hit rate with its cache sized by
#: :func:`skv.mrc.scaled_capacity` (what ``skv replay --capacity-curve`` reports); ``adjusted``
#: = SHARDS-adj: the sample replayed at R x the capacity, its misses counted against R x the
#: full trace's references (known exactly, so only the misses are estimated, each reference
#: sampled with probability R). ``adjusted`` needs that probability, so it exists for per-key
#: samples only (NaN for whole units, whose trunk is in every sample).
ESTIMATES = ("scaled", "adjusted")
_REFS = {"token_hit_rate": "prompt_tokens", "block_hit_rate": "block_accesses"}


def estimate(df: pd.DataFrame, metric: str = "token_hit_rate", how: str = "scaled") -> pd.Series:
    """The sampled rows' estimate of the full ``metric`` (see :data:`ESTIMATES`)."""
    if how == "scaled":
        return df[f"sampled_{metric}"]
    if how != "adjusted":
        raise ValueError(f"estimate must be one of {', '.join(ESTIMATES)}, got {how!r}")
    refs = _REFS[metric]
    misses = df[f"sample_{refs}"] * (1.0 - df[f"rate_scaled_{metric}"])
    adjusted = 1.0 - misses / (df["rate"] * df[f"full_{refs}"])
    return adjusted.where(df["unit"] == "block")


def with_errors(
    df: pd.DataFrame, metric: str = "token_hit_rate", how: str = "scaled"
) -> pd.DataFrame:
    """The rows whose sample cache has at least :data:`skv.mrc.MIN_SAMPLE_CACHE` blocks (below
    that a handful of blocks decide the estimate), plus ``error_pts``: the estimate minus the
    full ``metric``, in points (signed; NaN for an empty sample)."""
    from skv.mrc import MIN_SAMPLE_CACHE

    out = df[df["sample_capacity_blocks"] >= MIN_SAMPLE_CACHE].copy()
    out["error_pts"] = 100.0 * (estimate(out, metric, how) - out[f"full_{metric}"])
    return out


def seed_errors(
    df: pd.DataFrame, metric: str = "token_hit_rate", how: str = "scaled"
) -> pd.DataFrame:
    """Per (trace, policy, rate, seed): its sample's ``unit``; ``max_abs_pts``, the largest
    absolute error over the capacities (how far the seed's whole estimated curve strays); and
    ``signed_pts``, the mean signed error (over seeds, an interval excluding 0 means sampling
    biases the curve, not only scatters it); both NaN for an empty sample."""
    e = with_errors(df, metric, how)
    e["abs_pts"] = e["error_pts"].abs()
    g = e.groupby(["trace", "policy", "rate", "seed"], sort=False)
    out = g.agg(
        max_abs_pts=("abs_pts", "max"), signed_pts=("error_pts", "mean"), unit=("unit", "first")
    )
    return out.reset_index().sort_values(["trace", "policy", "rate", "seed"], kind="stable")


def per_seed(
    df: pd.DataFrame,
    trace: str,
    policy: str,
    rate: float,
    column: str = "max_abs_pts",
    metric: str = "token_hit_rate",
    how: str = "scaled",
) -> list[float]:
    """Seed by seed (ascending), one column of :func:`seed_errors` for one (trace, policy,
    rate): ``max_abs_pts`` or ``signed_pts``."""
    per = seed_errors(df, metric, how)
    mine = per[(per["trace"] == trace) & (per["policy"] == policy) & (per["rate"] == float(rate))]
    return [float(x) for x in mine[column]]


def summary(df: pd.DataFrame, metric: str = "token_hit_rate") -> pd.DataFrame:
    """Per (trace, policy, rate, estimate): the max absolute error over capacities (mean over
    seeds, its 95% bootstrap interval and the worst seed) and the mean signed error (Student t
    interval), in points, over the seeds whose sample kept a request (``empty_seeds`` counts the
    others); ``within_bar`` when no sample was empty and the worst seed is within
    :data:`ERROR_BAR_PTS`. An estimate that does not apply to the rows' unit has no row."""
    rows = []
    keys = ["trace", "policy", "rate"]
    for how in ESTIMATES:
        per = seed_errors(df, metric, how)
        for (trace, policy, rate), d in per.groupby(keys, sort=False):
            ok = d.dropna(subset=["max_abs_pts"])
            if ok.empty:
                continue
            worst, signed = list(ok["max_abs_pts"]), list(ok["signed_pts"])
            mx, bias = interval(worst, method="bootstrap"), interval(signed)
            empty = len(d) - len(ok)
            rows.append(
                {
                    "trace": trace,
                    "policy": policy,
                    "rate": rate,
                    "unit": d["unit"].iloc[0],
                    "estimate": how,
                    "seeds": len(ok),
                    "empty_seeds": empty,
                    "max_error_pts": mx["value"],
                    "max_error_ci95_low": mx["ci95"][0],
                    "max_error_ci95_high": mx["ci95"][1],
                    "worst_seed_pts": max(worst),
                    "signed_error_pts": bias["value"],
                    "signed_ci95_low": bias["ci95"][0],
                    "signed_ci95_high": bias["ci95"][1],
                    "within_bar": empty == 0 and max(worst) <= ERROR_BAR_PTS,
                }
            )
    return pd.DataFrame(rows)


def accuracy_figure(
    df: pd.DataFrame,
    title: str,
    metric: str = "token_hit_rate",
    lines: Sequence[str] = (),
) -> Figure:
    """Top: signed error (sampled - full, points) against capacity (share of the trace's unique
    blocks), one panel per (trace, rate), one line per policy of ``lines`` (default: every
    policy; mean over seeds) with the seeds' range shaded, the +-1 point bar grey. Bottom: every
    policy's max absolute error over the capacities (mean over seeds; bars: the seeds' range),
    one marker per (trace, rate), on a log scale with the bar drawn."""
    from skv.experiments.plotstyle import figure, paper_style, plain_ticks, policy_style

    e = with_errors(df, metric)
    e["share_pct"] = [float(c.strip().rstrip("%")) for c in e["capacity"]]
    traces = list(dict.fromkeys(e["trace"]))
    rates = sorted(set(e["rate"]), reverse=True)
    drawn = list(lines) or list(dict.fromkeys(e["policy"]))
    with paper_style():
        fig = figure("text", 0.5 + 1.6 * len(traces) + 1.5)
        grid = fig.add_gridspec(len(traces) + 1, len(rates))
        axes = [
            [fig.add_subplot(grid[i, j]) for j in range(len(rates))] for i in range(len(traces))
        ]
        for i, trace in enumerate(traces):
            for j, rate in enumerate(rates):
                ax = axes[i][j]
                ax.axhspan(-ERROR_BAR_PTS, ERROR_BAR_PTS, color="0.9", lw=0)
                ax.axhline(0, color="0.5", lw=0.6)
                d = e[(e["trace"] == trace) & (e["rate"] == rate)]
                for policy in drawn:
                    g = d[d["policy"] == policy].groupby("share_pct", sort=True)["error_pts"]
                    if not len(g):
                        continue
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
                ax.set_xlabel("cache (% of the unique blocks)", fontsize=6)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, frameon=False, loc="upper center", ncols=len(labels),
                   bbox_to_anchor=(0.5, 0.955))  # fmt: skip
        _every_policy_panel(
            fig.add_subplot(grid[len(traces), :]),
            seed_errors(df, metric),
            list(dict.fromkeys(df["policy"])),
        )
        fig.suptitle(title, fontsize=8)
        fig.set_layout_engine("tight", rect=(0, 0, 1, 0.95))
    return fig


def _every_policy_panel(ax: Any, per: pd.DataFrame, policies: list[str]) -> None:
    """Each policy's max absolute error (mean over seeds, seeds' range as a bar), one marker
    per (trace, rate), side by side, policies in the order given."""
    import numpy as np

    per = per.dropna(subset=["max_abs_pts"])
    policies = [p for p in policies if p in set(per["policy"])]
    traces = list(dict.fromkeys(per["trace"]))
    series = sorted(
        set(zip(per["trace"], per["rate"], strict=True)),
        key=lambda tr: (traces.index(tr[0]), -tr[1]),
    )  # as the panels above: trace by trace, the higher rate first
    markers = "osD^v<>"
    width = 0.7 / max(1, len(series))
    for k, (trace, rate) in enumerate(series):
        d = per[(per["trace"] == trace) & (per["rate"] == rate)].groupby("policy")["max_abs_pts"]
        mean, lo, hi = d.mean(), d.min(), d.max()
        x = np.array([policies.index(p) for p in mean.index]) + (k - (len(series) - 1) / 2) * width
        ax.errorbar(x, mean.to_numpy(), yerr=[(mean - lo).to_numpy(), (hi - mean).to_numpy()],
                    fmt=markers[k % len(markers)], ms=3, lw=0.6, capsize=1.2,
                    label=f"{trace}, R = {rate:g}")  # fmt: skip
    ax.axhline(ERROR_BAR_PTS, color="0.5", lw=0.6, ls="--")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 30)  # room for the legend above the points
    ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right", fontsize=6)
    ax.set_ylabel("max |error| (points)")
    ax.set_xlabel("policy", fontsize=6)
    ax.set_title("every policy: the largest error over the capacities (seeds' range)", fontsize=7)
    ax.legend(frameon=False, fontsize=5.5, ncols=len(series), loc="upper left")
