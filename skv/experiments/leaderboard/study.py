"""Every online policy x every trace x every capacity: block and token hit rate, the share of the
LRU -> Belady gap closed, and simulated TTFT at one load.

Invariants:

- ``gap_share = (hit - lru) / (belady - lru)`` per (trace, seed, capacity), block hit rates, so 0
  is LRU and 1 the offline bound; it is blank (NaN) where Belady beats LRU by under
  ``min_gap_pts`` points (nothing to close: the cache is too large or the trace has no reuse).
- Synthetic workloads run once per seed and every summary is paired over seeds: a policy's seed-s
  run is compared with LRU's and Belady's on the same seed-s trace (Student-t interval of the
  paired values, :mod:`skv.experiments.stats`). A real trace is one run (n = 1, no interval).
- ``setting`` is ``default`` (the policy's constructor defaults) or ``tuned`` (the setting
  :mod:`skv.experiments.leaderboard.tuning` chose on the tuning workloads, which never appear
  here); a policy with nothing to tune has only its default row.
- Hit rates come from the cache-only replay (:func:`skv.replay.replay_one`, no timing); TTFT from
  the serving simulator on the trace's own arrivals (simulated, the config's latency model).
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from skv.experiments.leaderboard.config import LeaderboardConfig, TraceEntry

log = logging.getLogger(__name__)

#: per-run columns of ``runs.csv``
RUN_COLUMNS = (
    "trace", "seed", "capacity", "capacity_blocks", "policy", "setting", "params",
    "block_hit_rate", "token_hit_rate", "ttft_ms_mean", "ttft_ms_p90",
)  # fmt: skip


#: the fewest policy settings per replay task (:func:`_settings_per_cell`): enough to amortise
#: loading a trace, few enough to spread one trace's work over many workers
SETTINGS_PER_CELL = 4


@dataclass(frozen=True)
class Cell:
    """One replay task: a few policy settings on one trace seed, each at every capacity, and,
    when ``ttft`` is set, one simulated run each at its capacity with arrivals scaled by
    ``time_factor`` (:func:`time_factor`). Plain data: tasks must pickle."""

    trace: str  # the TraceEntry as JSON
    seed: int
    settings: tuple[tuple[str, str, str], ...]  # (policy, setting, params as JSON)
    capacities: tuple[str, ...]
    ttft: str | None = None  # the TtftSpec as JSON; None: no TTFT run
    time_factor: float = 1.0


def trace_requests(entry: TraceEntry, seed: int) -> list:
    """The requests of one trace entry (a workload at ``seed``, or the real trace)."""
    if entry.workload is not None:
        from skv.workloads import make_workload

        return make_workload(entry.workload.name, **{**entry.workload.params, "seed": seed})
    from skv.traces import load_trace

    reqs = load_trace(entry.trace, **entry.format_options)  # type: ignore[arg-type]
    return reqs[: entry.max_requests] if entry.max_requests else reqs


@functools.lru_cache(maxsize=1)
def _compiled(trace_json: str, seed: int) -> tuple[list, list, Any]:
    """Requests, their compiled blocks (next-use annotated) and totals; cached so a worker that
    gets two cells of one trace seed in a row loads it once."""
    from skv.blocks import annotate_next_use
    from skv.replay import compile_trace, trace_totals

    entry = TraceEntry.model_validate_json(trace_json)
    reqs = trace_requests(entry, seed)
    trace = compile_trace(reqs, None if entry.trace else entry.block_size)
    annotate_next_use(trace)
    return reqs, trace, trace_totals(trace)


def run_cell(cell: Cell) -> list[dict[str, Any]]:
    """The rows of one cell (module level: sweeps pickle it)."""
    from skv.replay import replay_one, resolve_capacities

    _, trace, totals = _compiled(cell.trace, cell.seed)
    label = json.loads(cell.trace)["label"]
    caps = resolve_capacities(
        cell.capacities, block_size=trace[0].block_size, unique_blocks=totals.unique_blocks,
        model=None,
    )  # fmt: skip
    ttft = json.loads(cell.ttft) if cell.ttft is not None else None
    serve = _TtftServer(cell, ttft) if ttft is not None else None
    rows = []
    for policy, setting, params_json in cell.settings:
        params = json.loads(params_json)
        mean = p90 = math.nan
        if serve is not None:
            mean, p90 = serve(policy, params)
        for spec, blocks in caps:
            r = replay_one(trace, policy, blocks, params=params or None, totals=totals,
                           progress=False)  # fmt: skip
            at_load = ttft is not None and spec == ttft["capacity"]
            rows.append({
                "trace": label, "seed": cell.seed, "capacity": spec, "capacity_blocks": blocks,
                "policy": policy, "setting": setting, "params": params_json,
                "block_hit_rate": r["block_hit_rate"], "token_hit_rate": r["token_hit_rate"],
                "ttft_ms_mean": mean if at_load else math.nan,
                "ttft_ms_p90": p90 if at_load else math.nan,
            })  # fmt: skip
    return rows


def _sim_config(policy: str, params: dict, blocks: int, block_size: int, ttft: dict) -> Any:
    from skv.sim import SimConfig

    return SimConfig(
        policy=policy,
        policy_params=params,
        capacity_blocks=blocks,
        block_size=block_size,
        max_batch_tokens=ttft["batch"]["max_batch_tokens"],
        max_running=ttft["batch"]["max_running"],
        # no memory series: nothing here reads it (a sample only records the replica's state,
        # it changes no event), and one per iteration cost half of a short run
        sample_every_s=math.inf,
        policy_metrics_every=0,
    )


@dataclass(frozen=True)
class ScaleTask:
    """Find one trace seed's arrival scale for the TTFT load (:func:`time_factor`)."""

    trace: str
    seed: int
    ttft: str
    baseline: str


def _ttft_blocks(trace: list, totals: Any, ttft: dict) -> int:
    from skv.replay import resolve_capacities

    ((_, blocks),) = resolve_capacities(
        [ttft["capacity"]], block_size=trace[0].block_size, unique_blocks=totals.unique_blocks,
        model=None,
    )  # fmt: skip
    return blocks


def time_factor(task: ScaleTask) -> float:
    """The factor on arrival offsets that makes the baseline ``load`` busy (``TtftSpec``):
    serving the trace back to back (every arrival at the first) takes ``busy`` seconds, so the
    scaled span is ``busy / load``. 1.0 for a trace whose requests all arrive at once."""
    from dataclasses import replace

    from skv.latency import make_latency_model
    from skv.sim import simulate

    reqs, trace, totals = _compiled(task.trace, task.seed)
    ttft = json.loads(task.ttft)
    start = min(r.arrival_s for r in reqs)
    span = max(r.arrival_s for r in reqs) - start
    if span <= 0:
        return 1.0
    burst = [replace(r, arrival_s=start) for r in reqs]
    config = _sim_config(task.baseline, {}, _ttft_blocks(trace, totals, ttft),
                         trace[0].block_size, ttft)  # fmt: skip
    latency = make_latency_model(ttft["latency"]["name"], **ttft["latency"]["params"])
    busy = simulate(burst, config, latency, progress=False).summary["duration_s"]
    factor = busy / (ttft["load"] * span)
    log.info("%s seed %d: arrivals x %.4g for load %.2f", json.loads(task.trace)["label"],
             task.seed, factor, ttft["load"])  # fmt: skip
    return factor


@functools.lru_cache(maxsize=1)
def _ttft_run(trace_json: str, seed: int, factor: float, ttft_json: str) -> Any:
    """The trace seed's requests with arrivals scaled by ``factor``, compiled for the
    simulator once (:func:`skv.sim.compile_run`): a cell's policy settings all serve it."""
    from dataclasses import replace

    from skv.sim import compile_run

    reqs, trace, totals = _compiled(trace_json, seed)
    ttft = json.loads(ttft_json)
    start = min(r.arrival_s for r in reqs)
    scaled = [replace(r, arrival_s=start + (r.arrival_s - start) * factor) for r in reqs]
    blocks = _ttft_blocks(trace, totals, ttft)
    return compile_run(scaled, _sim_config("lru", {}, blocks, trace[0].block_size, ttft))


class _TtftServer:
    """Simulated TTFT of one cell's policy settings at the TTFT load: the scaled run, its
    capacity and the latency model are built once per cell, not once per setting."""

    def __init__(self, cell: Cell, ttft: dict) -> None:
        from skv.latency import make_latency_model

        _, trace, totals = _compiled(cell.trace, cell.seed)
        self.ttft = ttft
        self.blocks = _ttft_blocks(trace, totals, ttft)
        self.block_size = trace[0].block_size
        self.run = _ttft_run(cell.trace, cell.seed, cell.time_factor,
                             json.dumps(ttft, sort_keys=True))  # fmt: skip
        self.latency = make_latency_model(ttft["latency"]["name"], **ttft["latency"]["params"])

    def __call__(self, policy: str, params: dict) -> tuple[float, float]:
        """Mean and p90 TTFT (ms, simulated) of one policy setting: the summary's
        ``ttft_ms_mean`` and ``ttft_ms_p90``, computed here from the run's TTFT column
        (``columns=True``: the same values in the same order, without a row per request)."""
        from skv.sim import simulate
        from skv.sim.results import mean_or_nan, percentile_or_nan

        config = _sim_config(policy, params, self.blocks, self.block_size, self.ttft)
        ms = simulate(self.run, config, self.latency, progress=False, columns=True).columns
        return mean_or_nan(ms["ttft_ms"]), percentile_or_nan(ms["ttft_ms"], 90)


def _settings_per_cell(n_settings: int, jobs: int | None) -> int:
    """How many of one trace seed's settings a cell holds: the seed's settings spread over the
    workers, at least :data:`SETTINGS_PER_CELL`. Fewer, larger cells load and compile each trace
    seed fewer times (a worker runs cells in no particular order, so its one-trace cache rarely
    serves two cells); rows and their order do not depend on it."""
    from skv.experiments.sweep import default_jobs

    workers = default_jobs() if jobs is None else jobs
    return max(SETTINGS_PER_CELL, math.ceil(n_settings / workers))


def cells(
    config: LeaderboardConfig,
    traces: Sequence[TraceEntry],
    settings: dict[str, dict[str, dict[str, Any]]],
    capacities: Sequence[str],
    *,
    ttft: bool = True,
    jobs: int | None = None,
) -> list[Cell]:
    """The replay tasks: per trace seed, its policy settings (``settings``: policy -> setting ->
    params, the bound included) in groups (:func:`_settings_per_cell`). With ``ttft``, each
    trace seed's arrival scale is found first (one sweep) and travels with its cells."""
    from skv.experiments.sweep import run_sweep

    caps = tuple(dict.fromkeys([*capacities, *([config.ttft.capacity] if ttft else [])]))
    spec = config.ttft.model_dump_json() if ttft else None
    flat = [
        (policy, setting, json.dumps(params, sort_keys=True))
        for policy, by_setting in settings.items()
        for setting, params in by_setting.items()
    ]
    seeds = [(e.model_dump_json(), seed) for e in traces for seed in e.seeds]
    factors = [1.0] * len(seeds)
    if spec is not None:
        tasks = [ScaleTask(tj, seed, spec, config.baseline) for tj, seed in seeds]
        factors = run_sweep(time_factor, tasks, jobs=jobs, label="leaderboard load scale")
    n = _settings_per_cell(len(flat), jobs)
    return [
        Cell(tj, seed, tuple(flat[i : i + n]), caps, spec, f)
        for (tj, seed), f in zip(seeds, factors, strict=True)
        for i in range(0, len(flat), n)
    ]


def run_cells(cell_list: Sequence[Cell], *, jobs: int | None = None, label: str) -> pd.DataFrame:
    from skv.experiments.sweep import run_sweep

    rows = [r for part in run_sweep(run_cell, cell_list, jobs=jobs, label=label) for r in part]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def available(
    traces: Sequence[TraceEntry], required: Sequence[str] = ()
) -> tuple[list[TraceEntry], dict[str, str]]:
    """The entries whose data is here, and why each other one is left out: a real trace that is
    missing keeps its column empty rather than failing the run, unless its label is in
    ``required`` (a trace the user named): then FileNotFoundError says where to get it."""
    from pathlib import Path

    from skv.traces import find_trace

    keep, missing = [], {}
    for e in traces:
        if e.trace is not None and not Path(e.trace).exists():
            try:
                find_trace(e.trace)
            except FileNotFoundError as exc:
                if e.label in required:
                    raise
                missing[e.label] = str(exc).splitlines()[0]
                continue
        keep.append(e)
    return keep, missing


def with_gap_share(
    runs: pd.DataFrame, baseline: str, bound: str, min_gap_pts: float
) -> pd.DataFrame:
    """``runs`` with ``vs_<baseline>_pts``, ``gap_pts`` and ``gap_share`` per row, against the
    baseline's and the bound's default rows of the same trace, seed and capacity."""
    key = ["trace", "seed", "capacity"]
    ref = runs[runs["setting"] == "default"]
    base = ref[ref["policy"] == baseline].set_index(key)
    best = ref[ref["policy"] == bound].set_index(key)
    out = runs.copy()
    idx = pd.MultiIndex.from_frame(out[key])
    b = base["block_hit_rate"].reindex(idx).to_numpy()
    o = best["block_hit_rate"].reindex(idx).to_numpy()
    gap = o - b
    out[f"vs_{baseline}_pts"] = 100 * (out["block_hit_rate"].to_numpy() - b)
    out["gap_pts"] = 100 * gap
    gain = out["block_hit_rate"].to_numpy() - b
    out["gap_share"] = [
        d / g if g * 100 >= min_gap_pts else math.nan for d, g in zip(gain, gap, strict=True)
    ]
    t = base["ttft_ms_mean"].reindex(idx).to_numpy()
    out[f"ttft_vs_{baseline}"] = out["ttft_ms_mean"].to_numpy() / t
    return out


def summarize(runs: pd.DataFrame, baseline: str = "lru") -> pd.DataFrame:
    """One row per (trace, capacity, policy, setting): means over seeds and the 95% Student-t
    interval of the paired gap share (n = 1 for a real trace: no interval)."""
    from skv.experiments.stats import mean_ci

    rows = []
    for (trace, cap, pol, setting), d in runs.groupby(
        ["trace", "capacity", "policy", "setting"], sort=False
    ):
        g = mean_ci(list(d["gap_share"]), method="t")
        rows.append({
            "trace": trace, "capacity": cap, "policy": pol, "setting": setting,
            "seeds": len(d), "params": d["params"].iloc[0],
            "block_hit_rate": d["block_hit_rate"].mean(),
            "token_hit_rate": d["token_hit_rate"].mean(),
            f"vs_{baseline}_pts": d[f"vs_{baseline}_pts"].mean(),
            "gap_pts": d["gap_pts"].mean(),
            "gap_share": _nan(g["mean"]),
            "gap_share_ci95_low": _nan(g["ci95_low"]),
            "gap_share_ci95_high": _nan(g["ci95_high"]),
            "ttft_ms_mean": d["ttft_ms_mean"].mean(),
            f"ttft_vs_{baseline}": d[f"ttft_vs_{baseline}"].mean(),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _nan(v: Any) -> float:
    return math.nan if v is None else float(v)


def ranking(summary: pd.DataFrame, capacities: Sequence[str], bound: str) -> pd.DataFrame:
    """Policies (best setting each: tuned where it exists) ranked by their mean gap share over
    every trace at ``capacities``; one column per trace (its mean over those capacities)."""
    s = summary[(summary["policy"] != bound) & summary["capacity"].isin(list(capacities))]
    best = s[s["setting"] == "tuned"]
    s = pd.concat([best, s[~s["policy"].isin(set(best["policy"])) & (s["setting"] == "default")]])
    table = s.pivot_table(index="policy", columns="trace", values="gap_share", aggfunc="mean")
    table = table.reindex(columns=list(dict.fromkeys(summary["trace"])))
    table.insert(0, "mean", table.mean(axis=1, skipna=True))
    return table.sort_values("mean", ascending=False)


def markdown(table: pd.DataFrame, title: str) -> str:
    """The ranking as a markdown table (gap shares in percent; blank: no gap to close)."""

    def cell(v: float) -> str:
        return "" if not math.isfinite(v) else f"{100 * v:.1f}"

    cols = list(table.columns)
    lines = [
        f"# {title}",
        "",
        "Share of the LRU -> Belady gap in block hit rate closed (%), mean over the capacities "
        "and seeds; simulated replay. Blank: Belady beats LRU by too little to rank.",
        "",
        "| rank | policy | " + " | ".join(cols) + " |",
        "|---:|---|" + "---:|" * len(cols),
    ]
    for i, (pol, row) in enumerate(table.iterrows(), 1):
        lines.append(f"| {i} | `{pol}` | " + " | ".join(cell(row[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def tune(config: LeaderboardConfig, *, jobs: int | None = None) -> tuple[dict, pd.DataFrame]:
    """(policy -> chosen params, the tuning runs): every policy's candidate settings
    (:func:`skv.experiments.leaderboard.tuning.candidates`) replayed on the tuning traces, the
    best by :func:`~skv.experiments.leaderboard.tuning.choose`. With no tuning traces every
    policy keeps its default and the runs are empty."""
    from skv.experiments.leaderboard.tuning import candidates, choose

    settings = {p: s for p, s in candidates(config).items() if len(s) > 1}
    chosen: dict[str, dict[str, Any]] = {p: {} for p in config.policy_names}
    if not config.tuning.traces or not settings:
        return chosen, pd.DataFrame()
    todo = cells(
        config, config.tuning.traces, settings, config.tuning.capacities, ttft=False, jobs=jobs
    )
    runs = run_cells(todo, jobs=jobs, label="leaderboard tuning")
    chosen.update(choose(runs))
    return chosen, runs


@dataclass
class Leaderboard:
    """Everything one run produced: per-run rows (with gap shares), their summary, the
    ranking, the tuning runs and choices, and the traces left out (label -> why)."""

    runs: pd.DataFrame
    summary: pd.DataFrame
    ranking: pd.DataFrame
    tuning_runs: pd.DataFrame
    tuned: dict[str, dict[str, Any]]
    missing: dict[str, str]


def run(
    config: LeaderboardConfig,
    *,
    extra_traces: Sequence[TraceEntry] = (),
    jobs: int | None = None,
    rank_capacities: Sequence[str] | None = None,
) -> Leaderboard:
    """Tune, then evaluate every policy (default and tuned) and the bound on every available
    trace (the config's and ``extra_traces``, e.g. a user's); rank at ``rank_capacities``
    (default: all of the config's)."""
    traces, missing = available(
        [*config.traces, *extra_traces], required=[t.label for t in extra_traces]
    )
    for label, why in missing.items():
        log.warning("leaderboard: trace %s left out: %s", label, why)
    if not traces:
        raise FileNotFoundError(
            "leaderboard: none of the traces is available: " + "; ".join(missing.values())
        )
    tuned, tuning_runs = tune(config, jobs=jobs)
    settings: dict[str, dict[str, dict[str, Any]]] = {}
    for policy in config.policy_names:
        settings[policy] = {"default": {}}
        if tuned.get(policy):
            settings[policy]["tuned"] = tuned[policy]
    settings[config.bound] = {"default": {}}
    todo = cells(config, traces, settings, config.capacities, jobs=jobs)
    runs = run_cells(todo, jobs=jobs, label="leaderboard")
    runs = with_gap_share(runs, config.baseline, config.bound, config.min_gap_pts)
    summary = summarize(runs, config.baseline)
    table = ranking(summary, rank_capacities or config.capacities, config.bound)
    return Leaderboard(runs, summary, table, tuning_runs, tuned, missing)


#: the semantic policies (the seed's and SAECache's: built around segment types), against all
#: the others; some of those read types too (lhd classes blocks by type, ttl_pin spots tool
#: calls by type), so "other" means not built around them, not blind to them
SEMANTIC = frozenset({"static_semantic", "adaptive_semantic", "saecache"})
#: the capacities the issue's goal names (5-10% of unique blocks)
GOAL_CAPACITIES = ("5%", "10%")


def _per_seed(runs: pd.DataFrame, trace: str, capacities: Sequence[str]) -> pd.Series:
    """Gap share per (policy, setting, seed), mean over ``capacities`` (the bound excluded)."""
    d = runs[(runs["trace"] == trace) & runs["capacity"].isin(list(capacities))]
    return d.groupby(["policy", "setting", "seed"], sort=False)["gap_share"].mean()


def best_online(runs: pd.DataFrame, trace: str, policies: Sequence[str], capacities: Sequence[str]):
    """(policy, setting, per-seed gap shares) of the best of ``policies`` on ``trace`` by mean
    gap share over ``capacities``; None when no capacity there has a gap. Each policy competes
    with the setting the ranking uses (tuned where tuning chose one, else default): taking the
    better of the two on the evaluation runs would select on the data being reported."""
    per = _per_seed(runs, trace, capacities)
    pol, sett = (per.index.get_level_values(k) for k in ("policy", "setting"))
    ranked = (sett == "tuned") | ~pol.isin(set(pol[sett == "tuned"]))
    per = per[ranked & pol.isin(list(policies))].dropna()
    if per.empty:
        return None
    means = per.groupby(level=["policy", "setting"], sort=False).mean()
    policy, setting = means.idxmax()
    pol, sett = (per.index.get_level_values(k) for k in ("policy", "setting"))
    return policy, setting, list(per[(pol == policy) & (sett == setting)])


def claim_values(lb: Leaderboard, config: LeaderboardConfig) -> dict[str, Any]:
    """The numbers ``experiments/claims.yaml`` checks, per trace ``T`` present: the best online
    policy at 5-10% (``T_best_policy``) and its gap share (``T_best_gap_share``: over seeds for
    workloads), the LRU -> Belady gap there (``T_gap_pts``), the best semantic policy minus the
    best other one (``T_semantic_minus_other_pts``, in points of gap share, paired over seeds),
    the mean gain of tuning over defaults, and the capacities run. A trace left out (not
    found) gets its name and gap as text saying so, which the paper prints; its claims are
    skipped (``needs_traces``)."""
    from skv.experiments.stats import interval

    caps = [c for c in GOAL_CAPACITIES if c in config.capacities] or list(config.capacities)
    online = config.policy_names
    out: dict[str, Any] = {
        "policies": len(online),
        "traces": lb.runs["trace"].nunique(),
        "capacities": " and ".join(config.capacities),  # the paper names them
    }
    for trace in lb.missing:
        out[f"{trace}_best_policy"] = out[f"{trace}_gap_pts"] = "not run (trace not found)"
    for trace in dict.fromkeys(lb.runs["trace"]):
        best = best_online(lb.runs, trace, online, caps)
        gap = lb.runs[(lb.runs["trace"] == trace) & lb.runs["capacity"].isin(caps)]
        out[f"{trace}_gap_pts"] = float(gap["gap_pts"].mean())
        if best is None:  # the paper still names it: a run too small to rank says so
            out[f"{trace}_best_policy"] = "none (no gap to rank)"
            continue
        out[f"{trace}_best_policy"] = best[0]
        out[f"{trace}_best_gap_share"] = interval(best[2]) if len(best[2]) > 1 else best[2][0]
        sem = best_online(lb.runs, trace, [p for p in online if p in SEMANTIC], caps)
        other = best_online(lb.runs, trace, [p for p in online if p not in SEMANTIC], caps)
        if sem and other and len(sem[2]) == len(other[2]):
            diff = [100.0 * (a - b) for a, b in zip(sem[2], other[2], strict=True)]
            key = f"{trace}_semantic_minus_other_pts"
            out[key] = interval(diff) if len(diff) > 1 else diff[0]
    key = ["trace", "capacity", "policy"]
    tuned = lb.summary[lb.summary["setting"] == "tuned"].set_index(key)
    default = lb.summary[lb.summary["setting"] == "default"].set_index(key)
    gain = (tuned["gap_share"] - default["gap_share"].reindex(tuned.index)).dropna()
    out["tuned_minus_default_mean"] = float(gain.mean()) if len(gain) else None
    out["tuned_policies"] = sum(1 for p in lb.tuned.values() if p)
    return out
