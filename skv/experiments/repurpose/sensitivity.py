"""KV-Repurpose sensitivity: prefix vs segment keying as one workload parameter moves.

The capacity study (:mod:`.study`) holds the ``zipf_rag`` workload at its defaults; the gap it
finds (segment keying ~40 points over prefix keying at 30 GB) could be an artefact of one
setting. Here each parameter of ``sweep`` (Zipf alpha, corpus size, k documents per request,
the fixed-prefix share) takes each of its values with every other parameter at the config's
workload, per seed: one workload per (setting, seed), compiled once per keying mode and
replayed once at the one ``capacity`` with :func:`.study.replay_stats` (the capacity study's
replay, :func:`.study.chain_hits`, without its per-chain split: the default setting reproduces
its numbers exactly). Per (setting, seed) a row
holds each mode's token hit rate at the capacity, each mode's infinite-cache ceiling (exact,
from the compiled trace: :func:`skv.replay.trace_totals`) and the analytic prefix ceiling
(:func:`skv.workloads.zipf_rag.prefix_ceiling`, whose truncations this checks away from the
defaults). The default setting recurs in every parameter's list and is simulated once.

Settings run in parallel on the sweep executor (:func:`skv.experiments.sweep.run_sweep`); each
run seeds itself, so tables are identical whatever the number of processes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.plotstyle import figure, paper_style, wrap_title
from skv.experiments.repurpose import study as S
from skv.experiments.stats import interval
from skv.experiments.sweep import run_sweep
from skv.replay import compile_trace, trace_totals
from skv.runtime import no_cyclic_gc

MODES = ("prefix", "segment")
#: axis label and whether the values are spaced geometrically (a log axis) per parameter
PARAM_AXES: dict[str, tuple[str, bool]] = {
    "zipf_alpha": ("Zipf alpha", False),
    "corpus_size": ("corpus size (documents)", True),
    "docs_per_request": ("documents per request (k)", True),
    "fixed_prefix_fraction": ("fixed-prefix share", False),
}
#: workload fields a sweep may not vary: the seed is the sweep's own axis, the rest are not
#: numbers
_NOT_SWEPT = ("seed", "keep_text", "tokenizer")


def _workload_fields() -> dict[str, Any]:
    from skv.workloads.zipf_rag import ZipfRagParams

    return {
        name: f
        for name, f in ZipfRagParams.model_fields.items()
        if name not in _NOT_SWEPT and f.annotation in (int, float)
    }


class SensitivityConfig(BaseModel):
    """``experiments/repurpose/repurpose_sensitivity.yaml``; ``quick:`` overrides fields
    (``workload`` merged), as in :func:`.study.read_config_data`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    workload: dict[str, Any] = Field(default_factory=dict)
    policy: str = "lru"
    model: str = "llama-3.1-8b"
    block_size: int = Field(default=16, ge=1, le=4096)
    capacity: str = "30GB"
    seeds: list[int] = Field(min_length=1, max_length=10)
    #: workload field -> its values, increasing (2 to 8 of them; 1 to 6 fields)
    sweep: dict[str, list[int | float]] = Field(min_length=1, max_length=6)

    def workload_params(self, seed: int, **overrides: Any) -> Any:
        from skv.workloads.zipf_rag import ZipfRagParams

        return ZipfRagParams(**{**self.workload, **overrides, "seed": seed})

    @model_validator(mode="after")
    def _check(self) -> SensitivityConfig:
        """Every swept value must make a valid workload with the rest of ``workload``: a bad
        one is named ``sweep.<field>[i]`` here, not found by a run minutes later."""
        from skv.experiments.config import _flatten
        from skv.policies.registry import OFFLINE, POLICIES
        from skv.sizing import get_model

        online = [name for name in POLICIES if name not in OFFLINE]
        if self.policy not in online:  # the replay has no future to show an offline policy
            raise ValueError(f"policy: {self.policy!r} is not one of {', '.join(online)}")
        try:
            get_model(self.model)
            self.workload_params(0)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            what = "workload" if isinstance(exc, ValidationError) else "model"
            msg = _flatten(exc) if isinstance(exc, ValidationError) else str(exc)
            raise ValueError(f"{what}: {msg}") from None
        try:
            S.capacity_blocks(self.capacity, block_size=self.block_size, model=self.model,
                              total_blocks=1)  # fmt: skip
        except (KeyError, ValueError) as exc:
            raise ValueError(f"capacity: {exc}") from None
        fields = _workload_fields()
        for name, values in self.sweep.items():
            if name not in fields:
                raise ValueError(
                    f"sweep.{name}: not a numeric zipf_rag parameter; known: {', '.join(fields)}"
                )
            if not 2 <= len(values) <= 8:
                raise ValueError(f"sweep.{name}: {len(values)} values; give 2 to 8")
            if any(b <= a for a, b in pairwise(values)):
                raise ValueError(f"sweep.{name}: values must increase, got {values}")
            for i, v in enumerate(values):
                try:
                    self.workload_params(0, **{name: v})
                except ValidationError as exc:
                    raise ValueError(f"sweep.{name}[{i}] = {v!r}: {_flatten(exc)}") from None
        return self

    def defaults(self) -> dict[str, float]:
        """Each swept parameter's value in ``workload`` (the setting the other panels hold)."""
        base = self.workload_params(0)
        return {name: getattr(base, name) for name in self.sweep}


def load_config(path: str | Path, *, quick: bool) -> SensitivityConfig:
    """Read and validate a sensitivity config; errors are ``ConfigError`` naming file and field."""
    from skv.experiments.config import ConfigError, _flatten

    data = S.read_config_data(path, quick=quick)
    try:
        return SensitivityConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None


# ----------------------------------------------------------------------------------------
# the sweep


def run_point(cfg: SensitivityConfig, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """One workload setting and seed: per mode the token hit rate at ``cfg.capacity`` and the
    infinite-cache ceiling of its trace; the analytic prefix ceiling of the same parameters."""
    from skv.workloads import WORKLOADS
    from skv.workloads.zipf_rag import prefix_ceiling

    params = cfg.workload_params(seed, **overrides)
    requests = WORKLOADS["zipf_rag"](params)
    row: dict[str, Any] = {"seed": seed, "requests": len(requests)}
    for mode in MODES:
        # the cyclic collector paused, as the generation and the replay pause it: its
        # collections walked the requests and blocks again and again while compiling (about a
        # tenth of a point's time); what compiling drops is freed by reference counting
        with no_cyclic_gc():
            trace = compile_trace(requests, block_size=cfg.block_size, mode=mode)
            totals = trace_totals(trace)
        cap = S.capacity_blocks(
            cfg.capacity, block_size=cfg.block_size, model=cfg.model,
            total_blocks=totals.block_accesses,
        )  # fmt: skip
        stats = S.replay_stats(trace, cfg.policy, cap)  # chain_hits' totals, no chains
        del trace
        # both keyings cover the same prompts: a mismatch would compare different workloads
        assert row.setdefault("prompt_tokens", totals.prompt_tokens) == totals.prompt_tokens
        row[f"{mode}_capacity_blocks"] = cap
        row[f"{mode}_hit_rate"] = stats.hit_tokens / totals.prompt_tokens
        row[f"{mode}_inf_hit_rate"] = totals.ceiling_token_hit_rate
    row["prefix_ceiling"] = prefix_ceiling(params, block_size=cfg.block_size)["prefix_ceiling"]
    return row


def _point_task(task: tuple[SensitivityConfig, dict[str, Any], int]) -> dict[str, Any]:
    cfg, overrides, seed = task
    return run_point(cfg, overrides, seed)


def settings(cfg: SensitivityConfig) -> list[tuple[str, int | float, dict[str, Any]]]:
    """(parameter, value, overrides) for every swept value, in config order."""
    return [(name, v, {name: v}) for name, values in cfg.sweep.items() for v in values]


def sweep(cfg: SensitivityConfig, *, jobs: int | None = None) -> pd.DataFrame:
    """Every setting and seed of ``cfg``: one row per (parameter, value, seed); a setting that
    equals another (the defaults recur in every list) is simulated once."""
    keys: dict[str, int] = {}
    tasks: list[tuple[SensitivityConfig, dict[str, Any], int]] = []
    index: list[tuple[str, int | float, int, int]] = []
    for name, value, over in settings(cfg):
        for seed in cfg.seeds:
            key = json.dumps(cfg.workload_params(seed, **over).model_dump(), sort_keys=True)
            if key not in keys:
                keys[key] = len(tasks)
                tasks.append((cfg, over, seed))
            index.append((name, value, seed, keys[key]))
    done = run_sweep(_point_task, tasks, jobs=jobs, label=f"{cfg.id} settings")
    rows = [{"parameter": n, "value": float(v), **done[t]} for n, v, _, t in index]
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------
# summaries


def _label(v: float) -> str:
    return f"{v:g}"


def _per_seed(d: pd.DataFrame, column: str, scale: float = 100.0) -> list[float]:
    return [scale * x for x in d.sort_values("seed")[column]]


def _groups(table: pd.DataFrame) -> list[tuple[str, float, pd.DataFrame]]:
    out = []
    for name in dict.fromkeys(table["parameter"]):
        d = table[table["parameter"] == name]
        for v in dict.fromkeys(d["value"]):
            out.append((name, float(v), d[d["value"] == v]))
    return out


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (parameter, value): mean hit rates (%), segment's lead over prefix keying
    (points, paired 95% interval over seeds) and the prefix ceiling, analytic and replayed."""
    rows = []
    for name, v, d in _groups(table):
        lead = interval(
            list(np.subtract(_per_seed(d, "segment_hit_rate"), _per_seed(d, "prefix_hit_rate")))
        )
        rows.append(
            {
                "parameter": name,
                "value": _label(v),
                "prefix_hit_pct": 100 * float(d["prefix_hit_rate"].mean()),
                "segment_hit_pct": 100 * float(d["segment_hit_rate"].mean()),
                "segment_minus_prefix_pts": lead["value"],
                "lead_ci95_low": lead["ci95"][0],
                "lead_ci95_high": lead["ci95"][1],
                "prefix_ceiling_pct": 100 * float(d["prefix_ceiling"].mean()),
                "prefix_inf_pct": 100 * float(d["prefix_inf_hit_rate"].mean()),
            }
        )
    return pd.DataFrame(rows)


def claim_values(cfg: SensitivityConfig, table: pd.DataFrame) -> dict[str, Any]:
    """What the claims read. Per setting ``<quantity>_<parameter>_<value>_<unit>``: levels in
    percent (bootstrap interval over seeds), differences in points (paired, Student t). Per
    parameter: ``min_lead_over_<p>_pts`` (each seed's smallest segment-minus-prefix lead over
    the parameter's values, Student t: > 0 means segment keying leads at every value),
    ``<mode>_span_<p>_pts`` (hit rate at the last value minus the first, paired) and
    ``max_ceiling_gap_<p>_pts`` (each seed's largest |analytic - infinite-cache replay|, a
    level: bootstrap)."""

    def level(v: list[float]) -> dict[str, Any]:
        return interval(v, method="bootstrap")

    def diff(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
        return interval(list(np.subtract(a, b)))

    wp = cfg.workload_params(0)
    values: dict[str, Any] = {
        "seeds": len(cfg.seeds),
        "requests_per_seed": wp.num_requests,
        "model": cfg.model,
        "policy": cfg.policy,
        "capacity": cfg.capacity.replace("GB", " GB").replace("TB", " TB"),
    }
    per_param: dict[str, list[tuple[float, pd.DataFrame]]] = {}
    for name, v, d in _groups(table):
        per_param.setdefault(name, []).append((v, d))
        pre, seg = _per_seed(d, "prefix_hit_rate"), _per_seed(d, "segment_hit_rate")
        ceil, inf = _per_seed(d, "prefix_ceiling"), _per_seed(d, "prefix_inf_hit_rate")
        at = f"{name}_{_label(v)}"
        values[f"prefix_hit_{at}_pct"] = level(pre)
        values[f"segment_hit_{at}_pct"] = level(seg)
        values[f"segment_minus_prefix_{at}_pts"] = diff(seg, pre)
        values[f"prefix_ceiling_{at}_pct"] = level(ceil)
        values[f"ceiling_vs_infinite_{at}_pts"] = diff(ceil, inf)
    for name, points in per_param.items():
        values[f"{name}_values"] = ", ".join(_label(v) for v, _ in points)
        leads = np.array(
            [
                np.subtract(_per_seed(d, "segment_hit_rate"), _per_seed(d, "prefix_hit_rate"))
                for _, d in points
            ]
        )
        values[f"min_lead_over_{name}_pts"] = interval(list(leads.min(axis=0)))
        gaps = np.array(
            [
                np.abs(
                    np.subtract(_per_seed(d, "prefix_ceiling"), _per_seed(d, "prefix_inf_hit_rate"))
                )
                for _, d in points
            ]
        )
        values[f"max_ceiling_gap_{name}_pts"] = level(list(gaps.max(axis=0)))
        (_, first), (_, last) = points[0], points[-1]
        for mode in MODES:
            col = f"{mode}_hit_rate"
            values[f"{mode}_span_{name}_pts"] = diff(_per_seed(last, col), _per_seed(first, col))
    return values


# ----------------------------------------------------------------------------------------
# the figure


def _tick(v: float) -> str:
    return f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"


def sensitivity_figure(
    table: pd.DataFrame, title: str, defaults: dict[str, float] | None = None
) -> Figure:
    """One panel per swept parameter: token hit rate at the capacity vs the parameter's
    value, segment keying (the method, coloured, first in the legend) and prefix keying (grey)
    (mean over seeds, 95% bootstrap intervals), the analytic
    prefix ceiling dashed and the infinite-cache prefix replay as crosses (where they part,
    the formula's truncations bite); dotted: the default the other panels hold."""
    params = list(dict.fromkeys(table["parameter"]))
    defaults = defaults or {}
    with paper_style():
        fig = figure("text", 2.3)
        axes = fig.subplots(1, len(params), squeeze=False, sharey=True)[0]
        handles: dict[str, Any] = {}
        for ax, name in zip(axes, params, strict=True):
            d = table[table["parameter"] == name]
            xs = list(dict.fromkeys(d["value"]))
            for mode, label in (("segment", "segment keying"), ("prefix", "prefix keying")):
                stats = [
                    interval(_per_seed(d[d["value"] == x], f"{mode}_hit_rate"), method="bootstrap")
                    for x in xs
                ]
                mean = [s["value"] for s in stats]
                err = [
                    [m - s["ci95"][0] for m, s in zip(mean, stats, strict=True)],
                    [s["ci95"][1] - m for m, s in zip(mean, stats, strict=True)],
                ]
                style = S.METHOD.style(mode, name=S.SERIES_LOOK[mode])
                handles[label] = ax.errorbar(xs, mean, yerr=err, label=label, capsize=2, **style)
            g = d.groupby("value", sort=False)
            (handles["prefix ceiling (analytic)"],) = ax.plot(
                xs,
                [100 * g.get_group(x)["prefix_ceiling"].mean() for x in xs],
                label="prefix ceiling (analytic)",
                **{**S.METHOD.style("prefix ceiling"), "marker": "none", "linewidth": 0.8},
            )
            (handles["prefix, infinite cache (replay)"],) = ax.plot(
                xs,
                [100 * g.get_group(x)["prefix_inf_hit_rate"].mean() for x in xs],
                color="0.0",
                linestyle="none",
                marker="x",
                markersize=3.5,
                zorder=4,
                label="prefix, infinite cache (replay)",
            )
            if name in defaults:
                handles["default"] = ax.axvline(
                    defaults[name], color="0.6", linestyle=":", linewidth=0.8, label="default"
                )
            axis_label, log = PARAM_AXES.get(name, (name, False))
            if log:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [_tick(x) for x in xs])
            ax.minorticks_off()
            ax.set_xlabel(axis_label)
            ax.set_ylim(0, 100)
        axes[0].set_ylabel("token hit rate (%)")
        fig.suptitle(wrap_title(f"{title} (simulated replay; hit rates, no hardware)", 110),
                     fontsize=7)  # fmt: skip
        S.METHOD.legend(
            fig, list(handles.values()), list(handles), loc="lower center", ncols=len(handles),
            frameon=False, fontsize=6,
        )  # fmt: skip
        fig.set_layout_engine("tight", rect=(0, 0.07, 1, 1))
    return fig
