"""Regime maps: where a method beats its baselines, over a grid of workload and system axes.

A paper's headline is one number from one setup. A regime map asks in which settings that
number holds: every combination of a few axes (capacity pressure, arrival rate, workload mix,
...), each simulated over the same seeds for the method and each baseline, and per setting the
per-seed ratio ``best baseline / method`` (for a metric where lower is better, as TTFT; the
other way round for one where higher is better, as max QPS) with its 95% Student-t interval
over seeds (paired: one workload per seed serves every policy).

Which baseline is "best" is picked per setting by its mean over the same seeds. That choice is
made on the data it is compared with, so it favours the baselines: a method whose interval
still lies above the headline beats every baseline there (conservative for the method).

A setting's verdict against the paper's headline ratio (``headline``):

* ``holds``: the interval's low end is at or above the headline;
* ``below``: its high end is under the headline;
* ``unresolved``: the interval contains the headline.

and against parity (ratio 1): ``wins`` (low end above 1), ``loses`` (high end under 1),
``tie``. A setting lies in the paper's stated setup when each of its axis values is among
``paper_setup``'s for that axis (an axis the paper does not state is not restricted).

Each study supplies the cell: ``cell(cfg, setting, seed) -> {policy: {metric: value}}``
(:func:`run_grid` runs the cells on the sweep executor, one task per (setting, seed), or per
seed and group of settings that differ only in the study's ``shared_axes``; each cell seeds
itself, so tables are identical whatever the number of processes). This module
holds what the three maps share: the config fields, the grid, the summary and the figure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.plotstyle import exempt_axes, figure, paper_style, wrap_title
from skv.experiments.stats import interval
from skv.experiments.sweep import run_sweep

#: the most settings a grid may have (a full map's run time is settings x seeds x cells)
MAX_SETTINGS = 400
VERDICTS = ("holds", "unresolved", "below")


def axis_label(value: Any) -> str:
    """How a setting's value prints in tables, claims and the figure."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return "-".join(axis_label(v) for v in value)
    return str(value)


#: a setting key that changes the config a cell runs (``config.<dotted path>``), not an axis
CONFIG_PREFIX = "config."
#: the toggle table's row of the untoggled setting
UNTOGGLED = "none"


class Toggles(BaseModel):
    """The deviation ledger's measured rows (ARTIFACT.md): one setting (``at``: a value for
    every axis) run as it is and once per change, each change one difference from the paper's
    setup undone or varied, on the map's seeds and cells (method and reference only: the
    ledger's effect is on the paper's comparison). A change's key is what a setting's key can
    be (an axis, or a workload parameter the study's cell reads by name) or ``config.<dotted
    path>`` into the config the cell runs (:func:`with_paths`). A field the cell does not read
    (the seeds: the map's own) changes nothing; each study's ``setting_config`` says what its
    cell reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    at: dict[str, Any]
    changes: dict[str, dict[str, Any]] = Field(min_length=1, max_length=16)

    @model_validator(mode="after")
    def _check(self) -> Toggles:
        for name, change in self.changes.items():
            if not change:
                raise ValueError(f"toggles.changes.{name}: changes nothing")
            if name == UNTOGGLED:
                raise ValueError(f"toggles.changes: {UNTOGGLED!r} names the untoggled setting")
        return self


def split_setting(setting: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A setting's axis (and workload) values, and its config paths without the prefix."""
    axes = {k: v for k, v in setting.items() if not k.startswith(CONFIG_PREFIX)}
    paths = {k[len(CONFIG_PREFIX) :]: v for k, v in setting.items() if k.startswith(CONFIG_PREFIX)}
    return axes, paths


def with_paths(data: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` (a config as plain dicts and lists) with each dotted path set. In a
    list, a segment picks items by index, by their ``label`` or else ``name``, or ``*`` for
    every item. Every key on the way must exist (a model's dump has every field): a typo is an
    error naming the path, never a run of the untoggled config. Only a ``params`` mapping
    (free-form keyword arguments, checked by what reads them) may get a new key."""
    import copy

    out = copy.deepcopy(data)
    for path, value in paths.items():
        nodes: list[Any] = [out]
        parts = path.split(".")
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            found: list[Any] = []
            for node in nodes:
                if isinstance(node, dict):
                    if part not in node and not (last and depth and parts[depth - 1] == "params"):
                        raise ValueError(f"config.{path}: no {part!r} (keys: {', '.join(node)})")
                    if last:
                        node[part] = copy.deepcopy(value)
                    else:
                        found.append(node[part])
                elif isinstance(node, list):
                    picked = [i for i, item in enumerate(node) if _picks(part, i, item)]
                    if not picked:
                        raise ValueError(f"config.{path}: no list item {part!r}")
                    for i in picked:
                        if last:
                            node[i] = copy.deepcopy(value)
                        else:
                            found.append(node[i])
                else:
                    raise ValueError(f"config.{path}: {part!r} is inside a value, not a mapping")
            nodes = found
    return out


def _picks(part: str, index: int, item: Any) -> bool:
    """Whether a path segment names a list item: ``*``, its index, or its label (else name)."""
    if part in ("*", str(index)):
        return True
    return isinstance(item, dict) and (item.get("label") or item.get("name")) == part


class RegimeConfig(BaseModel):
    """The fields every regime map has; a study subclasses it with its base setup. ``axes``
    maps an axis name to its values (the grid is their product, in this order); ``figure``
    names the axis drawn as rows and the one drawn as columns of each panel (the other axes
    make the panels)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    seeds: list[int] = Field(min_length=2, max_length=10)
    axes: dict[str, list[Any]] = Field(min_length=2, max_length=6)
    method: str
    baselines: list[str] = Field(min_length=1, max_length=8)
    #: the baseline the paper reports its headline against (one of ``baselines``)
    reference: str
    metric: str
    better: Literal["lower", "higher"]
    #: other metrics reported per setting as method minus the best baseline by that metric
    #: (name -> which way is better; tables and claims only, the figure shows ``metric``)
    secondary: dict[str, Literal["lower", "higher"]] = Field(default_factory=dict, max_length=4)
    #: the paper's headline ratio (the lowest it claims), method over ``reference``
    headline: float = Field(gt=0, allow_inf_nan=False)
    #: axis -> the values inside the paper's stated setup (an axis not named: not restricted)
    paper_setup: dict[str, list[Any]] = Field(default_factory=dict)
    rows: str
    cols: str
    #: short names of axes for the figure (an axis not named: its own name)
    names: dict[str, str] = Field(default_factory=dict)
    #: the deviation ledger's runs (:class:`Toggles`); None: the map has none
    toggles: Toggles | None = None
    #: axes the cell's workload does not depend on (a study sets it, not the YAML): settings
    #: that differ only in them go to one task, one call after another, so a cell that keeps
    #: its last workload (``functools.lru_cache``) builds it once for all of them
    shared_axes: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _check_grid(self) -> RegimeConfig:
        for name, values in self.axes.items():
            if not 1 <= len(values) <= 8:
                raise ValueError(f"axes.{name}: {len(values)} values; give 1 to 8")
            labels = [axis_label(v) for v in values]
            if len(set(labels)) != len(labels):
                raise ValueError(f"axes.{name}: a value is given twice ({labels})")
        n = math.prod(len(v) for v in self.axes.values())
        if n > MAX_SETTINGS:
            raise ValueError(f"axes: {n} settings; at most {MAX_SETTINGS}")
        for field in ("rows", "cols"):
            if getattr(self, field) not in self.axes:
                raise ValueError(f"{field}: {getattr(self, field)!r} is not an axis")
        if self.rows == self.cols:
            raise ValueError("rows and cols name the same axis")
        if self.toggles is not None and set(self.toggles.at) != set(self.axes):
            raise ValueError(
                f"toggles.at: give a value for each axis ({', '.join(self.axes)}), got "
                f"{', '.join(self.toggles.at) or 'none'}"
            )
        if self.reference not in self.baselines:
            raise ValueError(f"reference: {self.reference!r} is not one of the baselines")
        if self.method in self.baselines:
            raise ValueError(f"baselines: {self.method!r} is the method")
        for name, values in self.paper_setup.items():
            if name not in self.axes:
                raise ValueError(f"paper_setup.{name}: not an axis")
            known = {axis_label(v) for v in self.axes[name]}
            for v in values:
                if axis_label(v) not in known:
                    raise ValueError(f"paper_setup.{name}: {v!r} is not one of the axis' values")
        return self

    def name(self, axis: str) -> str:
        return self.names.get(axis, axis)

    @property
    def policies(self) -> list[str]:
        return [self.method, *self.baselines]

    def settings(self) -> list[dict[str, Any]]:
        """Every combination of the axes' values, the last axis varying fastest."""
        names = list(self.axes)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.axes.values())
        ]

    def toggle_settings(self) -> list[tuple[str, dict[str, Any]]]:
        """``(name, setting)`` of the untoggled ``toggles.at`` and of each change (none
        without toggles)."""
        if self.toggles is None:
            return []
        at = {k: self.toggles.at[k] for k in self.axes}
        return [(UNTOGGLED, at)] + [
            (name, {**at, **change}) for name, change in self.toggles.changes.items()
        ]

    def checked_settings(self) -> list[tuple[str, dict[str, Any]]]:
        """Every setting a run builds (the grid's and the toggles'), each with where the config
        names it: a study's validator builds each, so a bad value is named before any run."""
        return [(f"axes: setting {s}", s) for s in self.settings()] + [
            (f"toggles.{'at' if n == UNTOGGLED else 'changes.' + n}", s)
            for n, s in self.toggle_settings()
        ]

    def cell_key(self, setting: dict[str, Any]) -> Any:
        """None, or a key such that settings with equal keys give equal cell results for
        every seed (:func:`_run_settings` runs the first and gives its result to the rest):
        a study overrides it with everything its cell reads, where distinct settings can make
        the same run. None (the default): the setting runs on its own."""
        return None

    def task_key(self, setting: dict[str, Any]) -> Any:
        """Settings with equal keys share a task, run one after another (so a cell that keeps
        its last workload builds it once). Default: those differing only in
        ``shared_axes``."""
        return tuple((k, axis_label(v)) for k, v in setting.items() if k not in self.shared_axes)

    def run_key(self, setting: dict[str, Any]) -> Any:
        """Within a task, settings with equal keys run back to back (each group in the grid's
        order, the groups in the order of their first setting), so a cell that keeps only its
        last compiled trace builds it once per key. Default None: the grid's order."""
        return None

    def in_paper_setup(self, setting: dict[str, Any]) -> bool:
        return all(
            axis_label(setting[name]) in {axis_label(v) for v in values}
            for name, values in self.paper_setup.items()
        )


C = TypeVar("C", bound="RegimeConfig")


def load_config(path: str | Path, model: type[C], *, quick: bool) -> C:
    """Read a regime config; in quick runs its ``quick:`` mapping overrides fields (``axes``
    merged axis by axis, so quick can coarsen some axes and keep the others). Errors are
    ``ConfigError`` naming the file and the field."""
    from skv.experiments.config import ConfigError, _flatten, read_with_quick

    data = read_with_quick(path, "regime config", quick=quick, merged=("axes",))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None


Cell = Callable[[Any, dict[str, Any], int], dict[str, dict[str, float]]]


def run_grid(cfg: RegimeConfig, cell: Cell, *, jobs: int | None = None) -> pd.DataFrame:
    """Every (setting, seed) of ``cfg`` through ``cell``: one row per (setting, seed, policy)
    with the axis values (as labels), ``seed``, ``policy`` and the cell's metrics, in the
    grid's order. Settings differing only in ``cfg.shared_axes`` share a task."""
    settings = cfg.settings()
    by = _run_settings(cfg, cell, settings, jobs=jobs, label=f"{cfg.id} cells")
    rows = []
    for (i, setting), seed in itertools.product(enumerate(settings), cfg.seeds):
        result = by[i, seed]
        missing = [p for p in cfg.policies if p not in result]
        if missing:
            raise ValueError(f"{cfg.id}: a cell returned no result for {missing}")
        for policy in cfg.policies:
            rows.append(
                {
                    **{k: axis_label(v) for k, v in setting.items()},
                    "seed": seed,
                    "policy": policy,
                    **result[policy],
                }
            )
    return pd.DataFrame(rows)


def _run_settings(
    cfg: RegimeConfig, cell: Cell, settings: list[dict[str, Any]], *, jobs: int | None, label: str
) -> dict[tuple[int, int], dict[str, dict[str, float]]]:
    """``(setting index, seed) -> cell result`` for every setting and seed of ``cfg``; settings
    with equal ``cfg.task_key`` share a task (ordered by ``cfg.run_key``), and of settings with
    equal ``cfg.cell_key`` (not None) only the first runs: the others get its result (the same
    object)."""
    first: dict[Any, int] = {}
    runs = []  # per setting, the setting whose cell it takes
    for i, s in enumerate(settings):
        key = cfg.cell_key(s)
        runs.append(i if key is None else first.setdefault(key, i))
    groups: dict[Any, dict[Any, list[int]]] = {}
    for i in dict.fromkeys(runs):
        s = settings[i]
        groups.setdefault(cfg.task_key(s), {}).setdefault(cfg.run_key(s), []).append(i)
    tasks_of = [[i for run in by_run.values() for i in run] for by_run in groups.values()]
    index = [(members, seed) for members in tasks_of for seed in cfg.seeds]
    tasks = [(cell, cfg, [settings[i] for i in members], seed) for members, seed in index]
    done = run_sweep(_task, tasks, jobs=jobs, label=label)
    ran = {
        (i, seed): result
        for (members, seed), results in zip(index, done, strict=True)
        for i, result in zip(members, results, strict=True)
    }
    return {(i, seed): ran[r, seed] for i, r in enumerate(runs) for seed in cfg.seeds}


def run_toggles(cfg: RegimeConfig, cell: Cell, *, jobs: int | None = None) -> pd.DataFrame:
    """The deviation ledger's runs (:class:`Toggles`): one row per (toggle, seed, policy) with
    the cell's metrics, the method and ``reference`` only; empty without toggles."""
    named = cfg.toggle_settings()
    if not named:
        return pd.DataFrame(columns=["toggle", "seed", "policy"])
    pair = cfg.model_copy(update={"baselines": [cfg.reference]})  # validated as cfg was
    by = _run_settings(pair, cell, [s for _, s in named], jobs=jobs, label=f"{cfg.id} toggles")
    rows = []
    for (i, (name, _)), seed in itertools.product(enumerate(named), cfg.seeds):
        for policy in pair.policies:
            if policy not in by[i, seed]:
                raise ValueError(f"{cfg.id}: toggle {name}: a cell returned no {policy!r}")
            rows.append({"toggle": name, "seed": seed, "policy": policy, **by[i, seed][policy]})
    return pd.DataFrame(rows)


def toggle_table(cfg: RegimeConfig, rows: pd.DataFrame) -> pd.DataFrame:
    """Per toggle: what it changes, the method's ratio to ``reference`` (per seed, Student t;
    > 1: the method better) and its verdict against the headline, and the ratio's change from
    the untoggled setting (paired per seed); where cells record ``censored`` (a value that is
    only a bound), how many of the toggle's values are."""
    if cfg.toggles is None or rows.empty:
        return pd.DataFrame()

    def per_seed(name: str) -> np.ndarray:
        d = rows[rows["toggle"] == name]
        m = d[d["policy"] == cfg.method].sort_values("seed")[cfg.metric].to_numpy(float)
        r = d[d["policy"] == cfg.reference].sort_values("seed")[cfg.metric].to_numpy(float)
        return _method_ratio(cfg, m, r)

    base = per_seed(UNTOGGLED)
    out = []
    for name, setting in cfg.toggle_settings():
        ratio = per_seed(name)
        r, delta = interval(list(ratio)), interval(list(ratio - base))
        change = cfg.toggles.changes.get(name, {})  # none for the untoggled setting
        out.append({
            "toggle": name,
            "change": "; ".join(f"{k} = {axis_label(v)}" for k, v in setting.items() if k in change)
            or "as at: " + ", ".join(f"{k} {axis_label(v)}" for k, v in setting.items()),
            "ratio_ref": r["value"], "ratio_ref_low": r["ci95"][0], "ratio_ref_high": r["ci95"][1],
            "delta": delta["value"], "delta_low": delta["ci95"][0], "delta_high": delta["ci95"][1],
            "headline_vs_ref": _verdict(r["ci95"], cfg.headline, VERDICTS),
        })  # fmt: skip
        if "censored" in rows:
            out[-1]["censored"] = int(rows.loc[rows["toggle"] == name, "censored"].sum())
    return pd.DataFrame(out)


def toggle_claim_values(cfg: RegimeConfig, table: pd.DataFrame) -> dict[str, Any]:
    """``toggle_<name>_ratio_ref`` and ``toggle_<name>_delta`` (value, ci95, n) per toggle,
    ``toggles_max_ratio_ref`` the largest ratio to the reference over the toggles (the
    untoggled setting included) with its interval and ``..._at`` its toggle, and
    ``toggles_holds`` how many changes' intervals lie at or above the headline (the untoggled
    setting not counted, as in ``toggles``); ``toggles_censored`` the censored values, where
    cells record them; ``toggles_at`` the untoggled setting, in words."""
    if cfg.toggles is None or table.empty:
        return {}
    n = len(cfg.seeds)
    at = ", ".join(f"{cfg.name(k)} {axis_label(v)}" for k, v in cfg.toggles.at.items())
    values: dict[str, Any] = {"toggles": len(table) - 1, "toggles_at": at}
    for _, t in table.iterrows():
        for col in ("ratio_ref", "delta"):
            values[f"toggle_{t['toggle']}_{col}"] = {
                "value": float(t[col]), "ci95": [float(t[f"{col}_low"]), float(t[f"{col}_high"])],
                "n": n,
            }  # fmt: skip
    i = table["ratio_ref"].idxmax()
    values["toggles_max_ratio_ref"] = values[f"toggle_{table.loc[i, 'toggle']}_ratio_ref"]
    values["toggles_max_ratio_ref_at"] = str(table.loc[i, "toggle"])
    changed = table[table["toggle"] != UNTOGGLED]
    values["toggles_holds"] = int((changed["headline_vs_ref"] == "holds").sum())
    if "censored" in table:
        values["toggles_censored"] = int(table["censored"].sum())
    return values


def _task(
    task: tuple[Cell, RegimeConfig, list[dict[str, Any]], int],
) -> list[dict[str, dict[str, float]]]:
    cell, cfg, settings, seed = task
    return [cell(cfg, setting, seed) for setting in settings]


def _method_ratio(cfg: RegimeConfig, method: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Per seed, how many times better the method's metric is than a baseline's (> 1: the
    method better): ``base / method`` for a metric where lower is better, else the inverse."""
    return base / method if cfg.better == "lower" else method / base


def _verdict(ci: Sequence[float], threshold: float, words: tuple[str, str, str]) -> str:
    """``words[0]`` when the interval lies at or above ``threshold`` (strictly above for
    parity: an interval of exactly 1 is a tie), ``words[2]`` below it, else ``words[1]``."""
    low, high = ci
    if low > threshold or (low == threshold and threshold != 1.0):
        return words[0]
    if high < threshold:
        return words[2]
    return words[1]


def summary(cfg: RegimeConfig, rows: pd.DataFrame) -> pd.DataFrame:
    """One row per setting: each policy's mean metric, the best baseline (by mean), the
    ratio to it and to ``reference`` (per seed, Student-t interval; > 1: the method is
    better), the verdicts against ``headline`` and parity, and ``paper_setup``."""
    axes = list(cfg.axes)
    labels = {name: [axis_label(v) for v in values] for name, values in cfg.axes.items()}
    out = []
    for setting in cfg.settings():
        key = {k: axis_label(v) for k, v in setting.items()}
        d = rows.loc[(rows[axes] == pd.Series(key)).all(axis=1)]
        per = {
            p: d[d["policy"] == p].sort_values("seed")[cfg.metric].to_numpy(float)
            for p in cfg.policies
        }
        means = {p: float(np.mean(v)) for p, v in per.items()}
        pick = min if cfg.better == "lower" else max
        best = pick(cfg.baselines, key=lambda p: (means[p], cfg.baselines.index(p)))

        def ratio(base: str, per: dict[str, np.ndarray] = per) -> dict[str, Any]:
            return interval(list(_method_ratio(cfg, per[cfg.method], per[base])))

        r_best, r_ref = ratio(best), ratio(cfg.reference)
        extra: dict[str, Any] = {}
        for m, way in cfg.secondary.items():
            vals = {
                p: d[d["policy"] == p].sort_values("seed")[m].to_numpy(float) for p in cfg.policies
            }
            pick_m = min if way == "lower" else max
            best_m = pick_m(
                cfg.baselines, key=lambda p, v=vals: (float(np.mean(v[p])), cfg.baselines.index(p))
            )
            diff = interval(list(vals[cfg.method] - vals[best_m]))
            extra |= {
                f"best_by_{m}": best_m,
                f"{m}_diff": diff["value"],
                f"{m}_diff_low": diff["ci95"][0],
                f"{m}_diff_high": diff["ci95"][1],
            }
        if "censored" in d:  # cells that record values that are only bounds
            extra["censored"] = int(d["censored"].sum())
        out.append(
            {
                **key,
                **{f"{p}_{cfg.metric}": means[p] for p in cfg.policies},
                "best_baseline": best,
                "ratio_best": r_best["value"],
                "ratio_best_low": r_best["ci95"][0],
                "ratio_best_high": r_best["ci95"][1],
                "ratio_ref": r_ref["value"],
                "ratio_ref_low": r_ref["ci95"][0],
                "ratio_ref_high": r_ref["ci95"][1],
                "vs_best": _verdict(r_best["ci95"], 1.0, ("wins", "tie", "loses")),
                "headline_vs_ref": _verdict(r_ref["ci95"], cfg.headline, VERDICTS),
                "headline_vs_best": _verdict(r_best["ci95"], cfg.headline, VERDICTS),
                **extra,
                "paper_setup": cfg.in_paper_setup(setting),
            }
        )
    table = pd.DataFrame(out)
    for name in axes:  # keep the config's order of values, not the alphabet's
        table[name] = pd.Categorical(table[name], categories=labels[name], ordered=True)
    return table


def _seed_values(cfg: RegimeConfig, rows: pd.DataFrame, setting: pd.Series, policy: str,
                 metric: str) -> np.ndarray:  # fmt: skip
    d = rows[(rows["policy"] == policy)]
    for a in cfg.axes:
        d = d[d[a] == str(setting[a])]
    return d.sort_values("seed")[metric].to_numpy(float)


def claim_values(cfg: RegimeConfig, rows: pd.DataFrame, table: pd.DataFrame) -> dict[str, Any]:
    """What a map's claims read, per scope (``all`` settings, ``paper``: the stated setup) and
    comparison (``ref``, ``best``): ``<scope>_<versus>_<verdict>`` counts against the headline,
    ``<scope>_best_<wins|tie|loses>`` against parity; ``<scope>_max_ratio_<versus>`` the
    largest per-setting ratio with its own interval (``..._at`` names the setting; the
    maximum of many intervals is biased upward, so it is conservative for a thesis that it
    stays below the headline); ``<scope>_geomean_ratio_<versus>`` each seed's geometric mean
    of the ratio over the settings, Student t over seeds; per secondary metric
    ``<scope>_<metric>_diff`` each seed's mean over the settings of method minus the best
    baseline by that metric."""
    values: dict[str, Any] = {
        "settings": len(table),
        "paper_settings": int(table["paper_setup"].sum()),
        "seeds": len(cfg.seeds),
        "headline": f"{cfg.headline:g}",
    }
    for scope, t in (("all", table), ("paper", table[table["paper_setup"]])):
        for versus in ("ref", "best"):
            col = f"headline_vs_{versus}"
            for word in VERDICTS:
                values[f"{scope}_{versus}_{word}"] = int((t[col] == word).sum())
        for word in ("wins", "tie", "loses"):
            values[f"{scope}_best_{word}"] = int((t["vs_best"] == word).sum())
        if not len(t):
            continue
        for versus in ("ref", "best"):
            r = f"ratio_{versus}"
            i = t[r].idxmax()
            values[f"{scope}_max_ratio_{versus}"] = {
                "value": float(t.loc[i, r]),
                "ci95": [float(t.loc[i, f"{r}_low"]), float(t.loc[i, f"{r}_high"])],
                "n": len(cfg.seeds),
            }
            values[f"{scope}_max_ratio_{versus}_at"] = ", ".join(
                f"{a} {t.loc[i, a]}" for a in cfg.axes
            )
            logs = []
            for _, row in t.iterrows():
                base = cfg.reference if versus == "ref" else row["best_baseline"]
                b = _seed_values(cfg, rows, row, base, cfg.metric)
                m = _seed_values(cfg, rows, row, cfg.method, cfg.metric)
                logs.append(np.log(_method_ratio(cfg, m, b)))
            per_seed = np.exp(np.mean(logs, axis=0))
            values[f"{scope}_geomean_ratio_{versus}"] = interval(list(per_seed))
        for m in cfg.secondary:
            diffs = [
                _seed_values(cfg, rows, row, cfg.method, m)
                - _seed_values(cfg, rows, row, row[f"best_by_{m}"], m)
                for _, row in t.iterrows()
            ]
            values[f"{scope}_{m}_diff"] = interval(list(np.mean(diffs, axis=0)))
    return values


def regime_figure(cfg: RegimeConfig, table: pd.DataFrame, title: str) -> Figure:
    """One heatmap per combination of the axes other than ``rows`` and ``cols``. A cell's
    colour and upper number: the ratio to the best baseline (diverging at 1, blue: the method
    better); lower number, in parentheses: the ratio to the reference (the paper's
    comparison). A box marks a cell whose interval against the reference lies at or above
    the headline; a dot, a setting inside the paper's stated setup."""
    panel_axes = [a for a in cfg.axes if a not in (cfg.rows, cfg.cols)]
    panels = list(itertools.product(*(cfg.axes[a] for a in panel_axes))) or [()]
    finite = table["ratio_best"].to_numpy(float)
    # the colour range always reaches the headline, so a cell's shade says how far from it
    reach = 1.1 * abs(math.log2(cfg.headline)) if cfg.headline != 1 else 0.2
    span = max(reach, float(np.nanmax(np.abs(np.log2(finite)))) if finite.size else 0.0)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span)
    r_labels = [axis_label(v) for v in cfg.axes[cfg.rows]]
    c_labels = [axis_label(v) for v in cfg.axes[cfg.cols]]
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    with paper_style():
        fig = figure("text", 0.75 + nrows * (0.45 + 0.26 * len(r_labels)))
        fig.set_layout_engine("constrained")
        grid = fig.subplots(nrows, ncols, squeeze=False)
        img = None
        for k, ax in enumerate(grid.flat):
            if k >= len(panels):
                ax.set_visible(False)
                continue
            fixed = {a: axis_label(v) for a, v in zip(panel_axes, panels[k], strict=True)}
            d = table
            for a, v in fixed.items():
                d = d[d[a] == v]
            best = np.full((len(r_labels), len(c_labels)), np.nan)
            for _, r in d.iterrows():
                i, j = r_labels.index(str(r[cfg.rows])), c_labels.index(str(r[cfg.cols]))
                best[i, j] = r["ratio_best"]
                dark = abs(math.log2(r["ratio_best"])) > 0.6 * span
                ax.text(j, i, f"{r['ratio_best']:.2f}\n({r['ratio_ref']:.2f})", ha="center",
                        va="center", fontsize=4.6, linespacing=1.1,
                        color="white" if dark else "0.05")  # fmt: skip
                if r["headline_vs_ref"] == "holds":
                    ax.add_patch(_box(i, j))
                if r["paper_setup"]:
                    ax.plot(j + 0.38, i - 0.3, marker="o", markersize=1.8, color="0.1")
            img = ax.imshow(np.log2(best), cmap="RdBu", norm=norm, aspect="auto")
            ax.grid(False)
            ax.set_xticks(range(len(c_labels)), c_labels, fontsize=5)
            ax.set_yticks(range(len(r_labels)), r_labels, fontsize=5)
            ax.set_xlabel(cfg.name(cfg.cols), fontsize=5.5)
            ax.set_ylabel(cfg.name(cfg.rows), fontsize=5.5)
            heading = ", ".join(f"{cfg.name(a)} {v}" for a, v in fixed.items())
            ax.set_title(wrap_title(heading, 34), fontsize=5)
        if img is not None:
            bar = fig.colorbar(img, ax=list(grid.flat), fraction=0.02, pad=0.01)
            marks = {0.5, 1 / cfg.headline, 1.0, cfg.headline, 2.0}
            ticks = sorted(math.log2(m) for m in marks if abs(math.log2(m)) <= span + 1e-9)
            bar.set_ticks(ticks, labels=[f"{2**t:.2g}x" for t in ticks], fontsize=5)
            bar.set_label(f"{cfg.method} vs best baseline", fontsize=5.5)
            exempt_axes(bar.ax, "a colour bar")
        fig.suptitle(wrap_title(title, 120), fontsize=6.5)
        note = (
            f"colour, upper number: {cfg.method}'s ratio to the best baseline per setting; "
            f"(lower): to {cfg.reference}; box: 95% interval at or above the paper's "
            f"{cfg.headline:g}x against {cfg.reference}; dot: inside the paper's stated setup"
        )
        fig.supxlabel(wrap_title(note, 140), fontsize=5)
    return fig


def _box(i: int, j: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False, edgecolor="black", linewidth=1.0)


def verdict_table(cfg: RegimeConfig, table: pd.DataFrame) -> pd.DataFrame:
    """The map in a few rows (the paper's table): per scope (every setting, the paper's stated
    setup) and comparison (the reference, the best baseline), how many settings the headline
    holds in, is unresolved in or lies above, how many the method wins, ties or loses against
    the baseline, and the largest ratio with its interval."""
    out = []
    for scope, t in (("all settings", table), ("paper's setup", table[table["paper_setup"]])):
        for versus, name in (("ref", cfg.reference), ("best", "best baseline")):
            col = f"ratio_{versus}"
            low, high = t[f"{col}_low"], t[f"{col}_high"]
            i = t[col].idxmax() if len(t) else None
            out.append(
                {
                    "settings": scope,
                    "versus": name,
                    "n": len(t),
                    f"headline {cfg.headline:g}x holds": int(
                        (t[f"headline_vs_{versus}"] == "holds").sum()
                    ),
                    "unresolved": int((t[f"headline_vs_{versus}"] == "unresolved").sum()),
                    "below": int((t[f"headline_vs_{versus}"] == "below").sum()),
                    "method better": int((low > 1).sum()),
                    "worse": int((high < 1).sum()),
                    "max ratio": float(t.loc[i, col]) if i is not None else float("nan"),
                    "its ci95": (
                        f"[{t.loc[i, f'{col}_low']:.2f}, {t.loc[i, f'{col}_high']:.2f}]"
                        if i is not None
                        else ""
                    ),
                }
            )
    return pd.DataFrame(out)
