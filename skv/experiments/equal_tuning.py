"""Equal tuning: does a paper's verdict survive when the method and every baseline are tuned alike?

A method tuned by its authors against baselines run with their defaults wins partly by tuning.
Here every policy (or router) with parameters gets the same budget: ``budget`` settings, its
default counting as one (``[default, *grids[policy]]``; a policy without parameters has only
its default). Each setting runs on the *tuning* traces, which the evaluation never sees (the
config refuses a tuning trace that shares a setting and a seed with an evaluation trace), and
each policy keeps its setting with the best geometric mean of ``metric`` there (ties: the
earlier, so a grid that does not help leaves the default). Then every policy runs on the
*evaluation* traces twice, with its default and with its tuned setting, and the method's ratio
to each baseline is reported both ways, default against default and tuned against tuned: per
seed the geometric mean over the evaluation settings of ``baseline / method`` (``lower`` is
better, as TTFT) or ``method / baseline`` (``higher``, as max QPS), Student t over seeds. Above
1 the method is better. "Best tuned baseline" is picked on the evaluation means, which favours
the baselines.

A study supplies the cell: ``cell(cfg, setting, seed, variants) -> {variant.key: {metric:
value}}``, every variant simulated on the same trace (one per setting and seed), so the ratios
are paired. This module holds the rule, the runs' bookkeeping, the claims' values and the figure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.plotstyle import Comparison, figure, paper_style, wrap_title
from skv.experiments.stats import interval
from skv.experiments.sweep import run_sweep

#: the most settings a policy may try (the default included)
MAX_BUDGET = 8
VERSIONS = ("default", "tuned")


def _unique(values: Sequence[Any], what: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{what}: {v!r} is given twice")
        seen.add(v)


class Traces(BaseModel):
    """Which traces a phase runs: every study setting (its name) at every seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    settings: list[str] = Field(min_length=1, max_length=32)
    seeds: list[int] = Field(min_length=1, max_length=10)

    @model_validator(mode="after")
    def _distinct(self) -> Traces:
        _unique(self.settings, "settings")
        _unique(self.seeds, "seeds")
        return self

    def cells(self) -> list[tuple[str, int]]:
        return [(s, seed) for s in self.settings for seed in self.seeds]


class TuningConfig(BaseModel):
    """The fields every equal-tuning study has; a study subclasses it with its base setup."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    method: str
    baselines: list[str] = Field(min_length=1, max_length=8)
    #: the baseline the paper reports its headline against (one of ``baselines``)
    reference: str
    metric: str
    better: Literal["lower", "higher"]
    #: the paper's headline ratio, method over ``reference``
    headline: float = Field(gt=0, allow_inf_nan=False)
    budget: int = Field(ge=2, le=MAX_BUDGET)
    #: policy -> the settings it tries besides its default (parameters merged over the
    #: default's): exactly ``budget - 1`` distinct ones, so every tuned policy tries as many
    grids: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    #: policy -> why it is not tuned (it has no parameters); every policy is in ``grids`` or here
    untuned: dict[str, str] = Field(default_factory=dict)
    tuning: Traces
    evaluation: Traces

    #: metric -> the direction that is better: the metrics a study's cell records (its
    #: subclass fills it; ``metric`` must be one, ``better`` its direction)
    DIRECTIONS: ClassVar[dict[str, str]] = {}

    def field_of(self, policy: str) -> str:
        """Where ``policy`` is named in the config, for error messages."""
        return "method" if policy == self.method else f"baselines[{self.baselines.index(policy)}]"

    @model_validator(mode="after")
    def _check(self) -> TuningConfig:
        if self.method in self.baselines:
            raise ValueError(f"baselines: {self.method!r} is the method")
        _unique(self.baselines, "baselines")
        if self.reference not in self.baselines:
            raise ValueError(f"reference: {self.reference!r} is not one of the baselines")
        if self.DIRECTIONS and self.metric not in self.DIRECTIONS:
            raise ValueError(f"metric {self.metric!r}: a cell records {', '.join(self.DIRECTIONS)}")
        if self.DIRECTIONS and self.DIRECTIONS[self.metric] != self.better:
            raise ValueError(
                f"better: {self.metric} is better {self.DIRECTIONS[self.metric]}, not {self.better}"
            )
        for policy, settings in self.grids.items():
            if policy not in self.policies:
                raise ValueError(f"grids.{policy}: not the method or a baseline")
            if len(settings) != self.budget - 1:
                raise ValueError(
                    f"grids.{policy}: {len(settings)} settings; the budget of {self.budget} "
                    f"gives every tuned policy its default and {self.budget - 1} more"
                )
            keys = [json.dumps(p, sort_keys=True) for p in settings]
            for i, k in enumerate(keys):
                if k == "{}" or k in keys[:i]:
                    raise ValueError(f"grids.{policy}[{i}]: repeats the default or a setting")
        for policy in self.policies:
            if policy in self.grids and policy in self.untuned:
                raise ValueError(f"untuned.{policy}: it has a grid")
            if policy not in self.grids and not self.untuned.get(policy, "").strip():
                raise ValueError(
                    f"grids: {policy!r} has no grid; tune it or say why not in untuned.{policy}"
                )
        for policy in self.untuned:
            if policy not in self.policies:
                raise ValueError(f"untuned.{policy}: not the method or a baseline")
        shared = set(self.tuning.seeds) & set(self.evaluation.seeds)
        if shared:
            raise ValueError(
                f"tuning.seeds: {sorted(shared)[0]} is also an evaluation seed; tune on traces "
                "the evaluation never sees (settings of one seed share their draws)"
            )
        if len(self.evaluation.seeds) < 2:
            raise ValueError("evaluation.seeds: at least 2 (the intervals are over seeds)")
        return self

    @property
    def policies(self) -> list[str]:
        return [self.method, *self.baselines]


@dataclass(frozen=True)
class Variant:
    """One policy at one of its settings; ``params`` are the grid's, merged by the study over
    the policy's own configured parameters (empty: the default)."""

    policy: str
    setting: str
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.policy}@{self.setting}"


def candidates(cfg: TuningConfig) -> list[Variant]:
    """Every policy's settings in the order ties are broken: its default first."""
    out = []
    for p in cfg.policies:
        out.append(Variant(p, "default"))
        for i, params in enumerate(cfg.grids.get(p, [])):
            out.append(Variant(p, f"grid{i + 1}", dict(params)))
    return out


C = TypeVar("C", bound=TuningConfig)
Cell = Callable[[Any, str, int, Sequence[Variant]], dict[str, dict[str, float]]]


def load_config(path: str | Path, model: type[C], *, quick: bool) -> C:
    """Read a tuning config; in quick runs its ``quick:`` mapping replaces fields (``tuning``
    and ``evaluation`` key by key). Errors name the file and the field."""
    from skv.experiments.config import ConfigError, _flatten, read_with_quick

    data = read_with_quick(path, "tuning config", quick=quick, merged=("tuning", "evaluation"))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None


def run_cells(
    cfg: TuningConfig,
    cell: Cell,
    phase: Literal["tuning", "evaluation"],
    variants: Sequence[Variant],
    *,
    jobs: int | None = None,
) -> pd.DataFrame:
    """Every trace of ``phase`` through ``cell`` with ``variants``: one row per (setting, seed,
    variant) with ``policy``, ``version`` (its setting's name), ``params`` (JSON) and the
    metrics."""
    traces = getattr(cfg, phase)
    tasks = [(cell, cfg, s, seed, tuple(variants)) for s, seed in traces.cells()]
    done = run_sweep(_task, tasks, jobs=jobs, label=f"{cfg.id} {phase}")
    rows = []
    for (_, _, setting, seed, _), result in zip(tasks, done, strict=True):
        for v in variants:
            if v.key not in result:
                raise ValueError(f"{cfg.id}: the cell returned no result for {v.key}")
            got = result[v.key].get(cfg.metric)
            if got is None or not math.isfinite(got) or got <= 0:
                raise ValueError(
                    f"{cfg.id}: {v.key} on {setting} seed {seed} gave {cfg.metric} {got!r}; "
                    "expected a positive number"
                )
            rows.append({"setting": setting, "seed": seed, "policy": v.policy,
                         "version": v.setting, "params": json.dumps(v.params, sort_keys=True),
                         **result[v.key]})  # fmt: skip
    return pd.DataFrame(rows)


def _task(task: tuple[Cell, TuningConfig, str, int, tuple[Variant, ...]]) -> dict:
    cell, cfg, setting, seed, variants = task
    return cell(cfg, setting, seed, variants)


def _geomean(values: Any) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, float)))))


def tuning_score(cfg: TuningConfig, tuning_rows: pd.DataFrame, v: Variant) -> float:
    """The geometric mean of ``metric`` of variant ``v`` over the tuning traces, signed so that
    lower is better whichever way ``better`` points."""
    d = tuning_rows[(tuning_rows["policy"] == v.policy) & (tuning_rows["version"] == v.setting)]
    if d.empty:
        raise ValueError(f"{cfg.id}: no tuning run of {v.key}")
    score = _geomean(d[cfg.metric])
    return -score if cfg.better == "higher" else score


def _best(items: Sequence[Any], score: Callable[[Any], float]) -> Any:
    """The item with the lowest score; ties keep the earlier."""
    best, best_score = None, None
    for item in items:
        s = score(item)
        if best_score is None or s < best_score:
            best, best_score = item, s
    return best


def choose(cfg: TuningConfig, tuning_rows: pd.DataFrame) -> dict[str, Variant]:
    """policy -> its best setting on the tuning traces: the geometric mean of ``metric`` over
    them, lowest or highest as ``better`` says; ties keep the earlier (the default first)."""
    chosen = {}
    for p in cfg.policies:
        mine = [c for c in candidates(cfg) if c.policy == p]
        chosen[p] = _best(mine, lambda v: tuning_score(cfg, tuning_rows, v))
    return chosen


def evaluation_variants(cfg: TuningConfig, chosen: dict[str, Variant]) -> list[Variant]:
    """Each policy's default, and its tuned setting when tuning chose another."""
    out = []
    for p in cfg.policies:
        out.append(Variant(p, "default"))
        if chosen[p].setting != "default":
            out.append(chosen[p])
    return out


def per_seed(cfg: TuningConfig, rows: pd.DataFrame, policy: str, version: str,
             chosen: dict[str, Variant]) -> np.ndarray:  # fmt: skip
    """The metric of ``policy`` at ``version`` ("tuned" reads its chosen setting) on the
    evaluation traces, shaped (settings, seeds)."""
    name = chosen[policy].setting if version == "tuned" else "default"
    d = rows[(rows["policy"] == policy) & (rows["version"] == name)]
    out = np.empty((len(cfg.evaluation.settings), len(cfg.evaluation.seeds)))
    for i, s in enumerate(cfg.evaluation.settings):
        for j, seed in enumerate(cfg.evaluation.seeds):
            v = d[(d["setting"] == s) & (d["seed"] == seed)][cfg.metric]
            if len(v) != 1:
                raise ValueError(f"{cfg.id}: {len(v)} evaluation runs of {policy} {version} on "
                                 f"{s} seed {seed}; expected 1")  # fmt: skip
            out[i, j] = float(v.iloc[0])
    return out


def ratio(cfg: TuningConfig, base: np.ndarray, method: np.ndarray) -> dict[str, Any]:
    """Per seed the geometric mean over settings of the method's advantage (> 1: better)."""
    r = base / method if cfg.better == "lower" else method / base
    return interval(list(np.exp(np.mean(np.log(r), axis=0))))


def claim_values(
    cfg: TuningConfig, rows: pd.DataFrame, chosen: dict[str, Variant], tuning_rows: pd.DataFrame
) -> tuple[dict[str, Any], pd.DataFrame]:
    """What the claims read, and the table: ``<version>_ratio_vs_<baseline>`` (the method's
    advantage, default against default or tuned against tuned), ``tuned_ratio_vs_best`` (tuned
    against ``best_tuned_baseline``, the tuned baseline with the best score on the *tuning*
    traces, so the pick is not made on the data it is judged on), ``tuning_gain_<policy>`` (per
    seed default / tuned metric for ``lower``, tuned / default for ``higher``: > 1 when tuning
    helped it on the evaluation traces), ``chosen_<policy>`` (the setting's parameters), the
    budget, and ``censored_runs`` (evaluation runs whose metric is a bound, not a value: a
    study's cell marks them in a ``censored`` column)."""
    values: dict[str, Any] = {"budget": cfg.budget, "tuning_traces": len(cfg.tuning.cells())}
    values["censored_runs"] = int(rows["censored"].sum()) if "censored" in rows else 0
    m = {v: per_seed(cfg, rows, cfg.method, v, chosen) for v in VERSIONS}
    table = []
    for b in cfg.baselines:
        row: dict[str, Any] = {"baseline": b}
        for v in VERSIONS:
            r = ratio(cfg, per_seed(cfg, rows, b, v, chosen), m[v])
            values[f"{v}_ratio_vs_{b}"] = r
            row |= {v: r["value"], f"{v}_low": r["ci95"][0], f"{v}_high": r["ci95"][1]}
        table.append(row)
    best = _best(cfg.baselines, lambda b: tuning_score(cfg, tuning_rows, chosen[b]))
    values["best_tuned_baseline"] = best
    values["tuned_ratio_vs_best"] = values[f"tuned_ratio_vs_{best}"]
    for p in cfg.policies:
        d, t = (per_seed(cfg, rows, p, v, chosen) for v in VERSIONS)
        values[f"tuning_gain_{p}"] = ratio(cfg, d, t)
        values[f"chosen_{p}"] = chosen[p].setting + (
            f" {json.dumps(chosen[p].params, sort_keys=True)}" if chosen[p].params else ""
        )
    return values, pd.DataFrame(table)


def tuning_figure(cfg: TuningConfig, table: pd.DataFrame, title: str, unit: str) -> Figure:
    """Per baseline, the method's advantage with both sides at their defaults (grey) and both
    tuned with the same budget (the method's colour), with 95% intervals over seeds; the dashed
    line is the paper's headline (against the reference), the thin one parity."""
    style = Comparison("tuned", bounds={"paper"})
    x = np.arange(len(table))
    w = 0.38
    with paper_style():
        fig = figure("column", 2.4)
        ax = fig.subplots()
        handles, labels = [], []
        for k, (v, label) in enumerate(
            (("default", "both at their defaults"),
             ("tuned", f"both tuned ({cfg.budget} settings each)"))
        ):  # fmt: skip
            y = table[v].to_numpy(float)
            err = np.vstack([y - table[f"{v}_low"], table[f"{v}_high"] - y])
            bars = ax.bar(x + (k - 0.5) * w, y, w, yerr=err, capsize=1.5, label=label,
                          error_kw={"linewidth": 0.6}, **style.style(v, kind="bar"))  # fmt: skip
            handles.append(bars)
            labels.append(label)
        ax.axhline(1.0, color="0.5", linewidth=0.6)
        rule = ax.axhline(cfg.headline, label=f"paper: {cfg.headline:g}x over {cfg.reference}",
                          **style.style("paper", kind="rule"))  # fmt: skip
        handles.append(rule)
        labels.append(rule.get_label())
        ax.set_xticks(x, [b.replace("_", "\n", 1) for b in table["baseline"]], fontsize=5.5)
        ax.set_ylabel(f"{cfg.method}'s advantage\n({unit}; > 1: {cfg.method} better)")
        ax.set_xlabel("baseline")
        top = max(cfg.headline, float(np.nanmax(table[["default_high", "tuned_high"]].to_numpy())))
        ax.set_ylim(0, 1.6 * top)  # room for the legend above the bars and the headline
        style.legend(ax, handles, labels, fontsize=5, loc="upper left")
        ax.set_title(wrap_title(title, 56), fontsize=6)
    return fig
