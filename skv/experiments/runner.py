"""Run an experiment config through the serving simulator and write its outputs.

``run_experiment`` generates the workload once per seed, resolves every capacity against that
trace, simulates every policy at every capacity, and writes into
``<output_root>/<YYYYmmdd_HHMMSS>_<id>/``:

- ``results.json``: config, latency model, one record per policy x capacity x seed, across-seed
  means with 95% Student-t intervals, paired comparisons, and down-sampled time series;
- ``metrics.csv``: tidy, one row per policy x capacity x seed;
- ``metrics_summary.csv``: one row per policy x capacity, mean / std / 95% CI per metric;
- ``summary.md`` and six PNG plots (see :mod:`skv.experiments.figures`);
- ``run.log``: wall-clock timings (the only file with timings; the others are byte-identical
  for the same config).

The directory appears whole or not at all: the files are written into a hidden staging
directory (``.<name>.<host>-<pid>-<random>.partial``) in the output root, which is renamed
onto the first free run name at the end (:func:`publish_run_dir`: concurrent runs get distinct
directories). An error or Ctrl-C while writing leaves neither; a SIGKILL leaves only the
staging directory, which the next run into the same root removes (or, when it cannot tell
whether its writer still runs, names in a warning: :func:`skv.fileio.clean_stale_partials`).
A directory that holds ``results.json`` holds every output; no run leaves an empty one.

``run_all`` runs every config of a directory, in parallel through the sweep executor
(:mod:`skv.experiments.sweep`: local processes or a Dask cluster, byte-identical outputs), and
writes ``aggregate_summary.csv`` / ``.md`` next to the run directories.
"""

from __future__ import annotations

import csv
import datetime as dt
import errno
import io
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skv.experiments.config import (
    METRICS,
    ConfigError,
    ExperimentConfig,
    PolicySpec,
    load_config,
)
from skv.experiments.outputs import PLOT_FILES, SUITE_DIR
from skv.experiments.stats import mean_ci, paired_diff
from skv.fileio import atomic_dir, staging_dir
from skv.model import Request

log = logging.getLogger(__name__)

#: ``--quick``: keep this share of each workload's requests (at least QUICK_MIN)
QUICK_SCALE = 0.1
QUICK_MIN = 50
#: default ``num_requests`` of a workload whose config does not set it (WorkloadParams' default)
DEFAULT_NUM_REQUESTS = 1000
#: points kept per time series in results.json (plots only need the shape)
SERIES_POINTS = 120

#: per-run metrics copied from the simulator summary, in CSV column order
RUN_METRICS: tuple[str, ...] = (
    "requests",
    "ttft_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "tpot_ms_mean",
    "e2e_ms_mean",
    "e2e_ms_p99",
    "queue_ms_mean",
    "throughput_rps",
    "token_hit_rate",
    "block_hit_rate",
    "prompt_tokens",
    "cached_tokens",
    "computed_tokens",
    "evictions",
    "memory_utilisation_mean",
)
#: metrics that get across-seed means and intervals
SUMMARY_METRICS: tuple[str, ...] = tuple(m for m in RUN_METRICS if m != "requests")

RUN_COLUMNS: tuple[str, ...] = (
    "experiment",
    "workload",
    "latency_model",
    "policy",
    "policy_name",
    "offline",
    "capacity",
    "capacity_blocks",
    "unique_blocks",
    "seed",
    *RUN_METRICS,
)

OUTPUT_FILES: tuple[str, ...] = (
    "results.json",
    "metrics.csv",
    "metrics_summary.csv",
    "summary.md",
    *PLOT_FILES,
    "run.log",
)


# ----------------------------------------------------------------------------------------
# workload


def make_requests(name: str, params: dict[str, Any]) -> list[Request]:
    """The workload's requests (``skv.workloads.make_workload``)."""
    from skv.workloads import make_workload

    return make_workload(name, **params)


def workload_params(config: ExperimentConfig, seed: int, quick: bool) -> dict[str, Any]:
    params = dict(config.workload.params)
    params["seed"] = seed
    if quick:
        n = int(params.get("num_requests", DEFAULT_NUM_REQUESTS))
        params["num_requests"] = min(n, max(QUICK_MIN, round(n * QUICK_SCALE)))
    return params


def unique_prompt_blocks(requests: Sequence[Request], config: ExperimentConfig) -> int:
    """Distinct prompt blocks of the trace under the config's block size and keying: the base
    that a ``"10%"`` capacity is a share of."""
    from skv.replay import compile_trace, trace_totals

    trace = compile_trace(
        requests, config.block_size, config.keying, salt_by_tenant=config.salt_by_tenant
    )
    return trace_totals(trace).unique_blocks


# ----------------------------------------------------------------------------------------
# running


def _trace_facts(seed: int, requests: Sequence[Request], unique: int) -> dict[str, Any]:
    """What the results document records about one seed's workload trace."""
    return {
        "seed": seed,
        "requests": len(requests),
        "prompt_tokens": sum(r.prompt_tokens for r in requests),
        "unique_blocks": unique,
        "span_s": max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests),
    }


def sim_config(config: ExperimentConfig, policy: PolicySpec, blocks: int) -> Any:
    """The simulator settings of one (policy, capacity) cell of the experiment (the runner's
    and every study's single source for this mapping)."""
    from skv.sim import SimConfig

    return SimConfig(
        policy=policy.name,
        policy_params=dict(policy.params),
        capacity_blocks=blocks,
        block_size=config.block_size,
        mode=config.keying,
        salt_by_tenant=config.salt_by_tenant,
        replicas=config.replicas.count,
        router=config.replicas.router,
        router_params=dict(config.replicas.router_params),
        max_batch_tokens=config.batch.max_batch_tokens,
        max_running=config.batch.max_running,
        include_output_blocks=config.include_output_blocks,
        sample_every_s=config.sample_every_s,
        policy_metrics_every=config.policy_metrics_every,
        router_view=config.replicas.view,
        router_cache_blocks=config.replicas.cache_blocks,
        **_tier_settings(config),
    )


def _tier_settings(config: ExperimentConfig) -> dict[str, Any]:
    """``SimConfig``'s tier fields from the experiment's ``tiers`` (none: one cache level)."""
    t = config.tiers
    if t is None:
        return {}
    return {
        "tiers": list(t.lower),
        "tier_write": t.write,
        "tier_load": t.load,
        "tier_overlap": t.overlap,
        "tier_choice": t.choice,
        "tier_model": config.model,
    }


def _run_row(
    config: ExperimentConfig,
    desc: dict[str, Any],
    policy: PolicySpec,
    cap: Any,
    blocks: int,
    unique: int,
    seed: int,
    res: Any,
) -> dict[str, Any]:
    """One row of ``runs``: the cell's identity, its headline metrics and per-type tables."""
    s = res.summary
    run = {
        "experiment": config.id,
        "workload": config.workload.name,
        "latency_model": desc.get("model", config.latency.name),
        "policy": policy.key,
        "policy_name": policy.name,
        "offline": policy.offline,
        "capacity": str(cap),
        "capacity_blocks": blocks,
        "unique_blocks": unique,
        "seed": seed,
        **{m: s[m] for m in RUN_METRICS},
        "hit_rate_by_type": dict(sorted(s["hit_rate_by_type"].items())),
        "block_hit_rate_by_type": dict(sorted(s["block_hit_rate_by_type"].items())),
        "prompt_tokens_by_type": dict(sorted(s["prompt_tokens_by_type"].items())),
        "evictions_by_type": dict(sorted(s["evictions_by_type"].items())),
    }
    if "tiers" in s:  # hits per tier and the load-or-recompute choices (docs/tiers.md)
        run["tiers"] = s["tiers"]
        run["tier_load_ms"] = s["tier_load_ms"]
    run.update(_learned_weights(policy.name, dict(policy.params), res.policy_series, run))
    return run


def _add_series(
    series: dict[str, list[dict[str, Any]]],
    policy: PolicySpec,
    cap: Any,
    blocks: int,
    res: Any,
    run: dict[str, Any],
) -> None:
    """Time series (memory; learned weights when the policy logs them) of the first seed."""
    where = {"policy": policy.key, "capacity": str(cap)}
    series["memory"].append({**where, **_memory_series(res.memory, blocks)})
    if res.policy_series:
        series["weights"].append({**where, **_weight_series(res.policy_series, run)})


def simulate_experiment(
    config: ExperimentConfig,
    *,
    quick: bool = False,
    progress: bool | None = False,
    timings: list[str] | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Simulate every seed x capacity x policy; returns the results document (JSON-ready, no
    timings). Wall-clock timings, if wanted, are appended to ``timings`` as log lines.

    Steps per seed: generate the workload trace, size every capacity against its unique
    blocks, simulate each policy (:func:`sim_config`), record a row (:func:`_run_row`) and,
    for the first seed, the time series (:func:`_add_series`); then aggregate over seeds."""
    from skv.latency import make_latency_model
    from skv.sim import compile_run, simulate
    from skv.sizing import Capacity

    latency = make_latency_model(config.latency.name, **config.latency.params)
    desc = latency.describe()
    timings = timings if timings is not None else []
    runs: list[dict[str, Any]] = []
    series: dict[str, list[dict[str, Any]]] = {"memory": [], "weights": []}
    traces: list[dict[str, Any]] = []
    total = len(config.seeds) * len(config.capacities) * len(config.policies)
    for seed in config.seeds:
        t0 = time.perf_counter()
        requests = make_requests(config.workload.name, workload_params(config, seed, quick))
        if not requests:
            raise ValueError(f"{config.id}: workload {config.workload.name!r} gave no requests")
        unique = unique_prompt_blocks(requests, config)
        traces.append(_trace_facts(seed, requests, unique))
        _note(
            timings,
            f"seed {seed}: workload {len(requests)} requests, {unique} unique "
            f"blocks ({time.perf_counter() - t0:.2f} s)",
        )
        compiled = None  # the seed's requests, compiled once: every capacity and policy serve them
        for i, cap in enumerate(config.capacities):
            try:
                blocks = Capacity.parse(cap).to_blocks(
                    block_size=config.block_size, unique_blocks=unique, model=config.model
                )
            except ValueError as exc:  # a share too small for this seed's trace
                raise ConfigError(
                    f"experiment {config.id}: capacities[{i}]: {exc} (seed {seed}: "
                    f"{unique} unique blocks)"
                ) from None
            for pol in config.policies:
                t1 = time.perf_counter()
                sim = sim_config(config, pol, blocks)
                compiled = compiled or compile_run(requests, sim)
                try:
                    res = simulate(compiled, sim, latency, progress=progress)
                except RuntimeError as exc:  # e.g. a request larger than the whole cache
                    raise ValueError(
                        f"{config.id}: seed {seed}, capacity {cap} ({blocks} blocks), policy "
                        f"{pol.key}: {exc}"
                    ) from exc
                run = _run_row(config, desc, pol, cap, blocks, unique, seed, res)
                runs.append(run)
                _note(
                    timings,
                    f"[{len(runs)}/{total}] seed {seed} capacity {cap} ({blocks} blocks) "
                    f"{pol.key}: ttft {run['ttft_ms_mean']:.1f} ms, token hit "
                    f"{run['token_hit_rate']:.3f} ({time.perf_counter() - t1:.2f} s)",
                )
                if on_run is not None:
                    on_run(run)
                if seed == config.seeds[0]:
                    _add_series(series, pol, cap, blocks, res, run)
    doc = {
        "experiment": config.id,
        "description": config.description,
        "simulated": simulated_note(desc),
        "latency": desc,
        "quick": quick,
        "config": config.model_dump(mode="json"),
        "traces": traces,
        "runs": runs,
        "aggregate": aggregate_runs(runs, config),
        "comparisons": compare_policies(runs, config),
        "series": {"seed": config.seeds[0], **series},
    }
    return _json_ready(doc)


def simulated_note(desc: dict[str, Any]) -> str:
    model = desc.get("model", "?")
    formula = desc.get("formula")
    note = (
        f"All latencies (TTFT, TPOT, E2E, queueing) are SIMULATED by the '{model}' latency "
        "model, not measured on hardware"
    )
    return f"{note}: {formula}" if formula else note


def aggregate_runs(runs: list[dict[str, Any]], config: ExperimentConfig) -> list[dict[str, Any]]:
    """One record per capacity x policy (config order): mean, std and 95% CI of each metric."""
    out = []
    for cap in config.capacities:
        for pol in config.policies:
            rs = [r for r in runs if r["capacity"] == str(cap) and r["policy"] == pol.key]
            if not rs:
                continue
            rec: dict[str, Any] = {
                "policy": pol.key,
                "policy_name": pol.name,
                "offline": pol.offline,
                "capacity": str(cap),
                "capacity_blocks": mean_ci([r["capacity_blocks"] for r in rs])["mean"],
                "n_seeds": len(rs),
            }
            for m in SUMMARY_METRICS:
                rec[m] = mean_ci([r[m] for r in rs])
            types = sorted({t for r in rs for t in r["evictions_by_type"]})
            rec["evictions_by_type"] = {
                t: math.fsum(r["evictions_by_type"].get(t, 0) for r in rs) / len(rs) for t in types
            }
            for key in ("hit_rate_by_type", "block_hit_rate_by_type", "prompt_tokens_by_type"):
                rec[key] = _mean_by_type([r.get(key, {}) for r in rs])
            if all("prompt_tokens_by_type" in r for r in rs):
                rec["hit_tokens_by_type"] = _mean_by_type(
                    [
                        {
                            t: n * r["hit_rate_by_type"].get(t, 0.0)
                            for t, n in r["prompt_tokens_by_type"].items()
                        }
                        for r in rs
                    ]
                )
            if all("final_weights" in r for r in rs):
                rec["initial_weights"] = rs[0]["initial_weights"]
                rec["final_weights"] = _mean_by_type([r["final_weights"] for r in rs])
            out.append(rec)
    return out


def _mean_by_type(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per-type mean over runs (a type a run lacks counts as 0), types sorted by name."""
    types = sorted({t for r in rows for t in r})
    return {t: math.fsum(r.get(t, 0.0) for r in rows) / len(rows) for t in types}


def _learned_weights(
    name: str, params: dict[str, Any], policy_series: list[dict[str, float]], run: dict[str, Any]
) -> dict[str, Any]:
    """``initial_weights`` / ``final_weights`` of a policy that reports ``w_<type>`` metrics
    (adaptive_semantic): its configured starting weights and the last logged value of each
    replica (mean over replicas), for the semantic types this trace has. Empty otherwise."""
    last: dict[int, dict[str, float]] = {}
    for row in policy_series:
        last[int(row.get("replica", 0))] = row
    rows = list(last.values())
    present = set(run["hit_rate_by_type"]) | set(run["evictions_by_type"])
    types = sorted({k[2:] for r in rows for k in r if k.startswith("w_")} & present)
    if not types:
        return {}
    from skv.policies.registry import policy_class

    initial = policy_class(name)(**params).params().get("initial_weights")
    if not isinstance(initial, dict):
        return {}
    types = [t for t in types if t in initial and all(f"w_{t}" in r for r in rows)]
    return {
        "initial_weights": {t: float(initial[t]) for t in types},
        "final_weights": {t: math.fsum(r[f"w_{t}"] for r in rows) / len(rows) for t in types},
    }


def compare_policies(runs: list[dict[str, Any]], config: ExperimentConfig) -> list[dict[str, Any]]:
    """Per capacity and headline metric: the best online policy by across-seed mean, and every
    other policy's paired difference from it (95% CI; same seed = same trace)."""
    out = []
    online = config.online_policies
    for cap in config.capacities:
        by_policy = {
            p.key: sorted(
                (r for r in runs if r["capacity"] == str(cap) and r["policy"] == p.key),
                key=lambda r: r["seed"],
            )
            for p in config.policies
        }
        metrics = ["ttft_ms_mean", "token_hit_rate"]
        if config.seed_claim is not None and config.seed_claim.metric not in metrics:
            metrics.append(config.seed_claim.metric)
        for metric in metrics:
            better = METRICS[metric]
            means = {
                k: mean_ci([r[metric] for r in rs])["mean"] for k, rs in by_policy.items() if rs
            }
            cands = [p.key for p in online if means.get(p.key) is not None]
            if not cands:
                continue
            sign = 1.0 if better == "lower" else -1.0
            best = min(cands, key=lambda k: (sign * means[k], cands.index(k)))
            diffs = {}
            best_values = [r[metric] for r in by_policy[best]]
            for k, rs in by_policy.items():
                if k == best or not rs:
                    continue
                values = [r[metric] for r in rs]
                d = paired_diff(values, best_values)
                lo, hi = d["ci95_low"], d["ci95_high"]
                diffs[k] = {
                    **d,
                    "identical": values == best_values,
                    "distinguishable": None if lo is None else bool(lo > 0 or hi < 0),
                }
            out.append(
                {
                    "capacity": str(cap),
                    "metric": metric,
                    "better": better,
                    "best_online": best,
                    "tied_with": [k for k in cands if k in diffs and diffs[k]["identical"]],
                    "means": means,
                    "diff_vs_best": diffs,
                }
            )
    return out


def _memory_series(memory: list[dict[str, float]], capacity_blocks: int) -> dict[str, list]:
    """Mean over replicas, in ``SERIES_POINTS`` equal time bins, of the cache's utilisation
    (cached / usable blocks) and of the share of capacity pinned by running requests."""
    if not memory:
        return {"time_s": [], "utilisation": [], "pinned_share": []}
    t0 = min(m["time_s"] for m in memory)
    t1 = max(m["time_s"] for m in memory)
    width = (t1 - t0) / SERIES_POINTS or 1.0
    sums: dict[int, list[float]] = {}
    for m in memory:
        b = min(int((m["time_s"] - t0) / width), SERIES_POINTS - 1)
        acc = sums.setdefault(b, [0.0, 0.0, 0.0])
        acc[0] += m["utilisation"]
        acc[1] += m["pinned_blocks"] / capacity_blocks
        acc[2] += 1
    bins = sorted(sums)
    return {
        "time_s": [t0 + (b + 0.5) * width for b in bins],
        "utilisation": [sums[b][0] / sums[b][2] for b in bins],
        "pinned_share": [sums[b][1] / sums[b][2] for b in bins],
    }


def _weight_series(rows: list[dict[str, float]], run: dict[str, Any]) -> dict[str, Any]:
    """Replica 0's learned weights, at most ``SERIES_POINTS`` evenly spaced samples, for the
    semantic types this trace has (prompt types plus evicted types)."""
    rows = [r for r in rows if r.get("replica", 0) == 0]
    if len(rows) > SERIES_POINTS:
        step = (len(rows) - 1) / (SERIES_POINTS - 1)
        rows = [rows[round(i * step)] for i in range(SERIES_POINTS)]
    present = set(run["hit_rate_by_type"]) | set(run["evictions_by_type"])
    keys = sorted(k for k in (rows[0] if rows else {}) if k.startswith("w_") and k[2:] in present)
    return {"time_s": [r["time_s"] for r in rows], **{k: [r[k] for r in rows] for k in keys}}


def _json_ready(obj: Any) -> Any:
    """NaN / inf -> None (strict JSON), tuples -> lists, numpy scalars -> Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str | int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item"):  # numpy scalar
        return _json_ready(obj.item())
    return obj


def _note(lines: list[str], msg: str) -> None:
    lines.append(msg)
    log.info(msg)


# ----------------------------------------------------------------------------------------
# writing


def dumps_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def runs_csv(runs: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(
        buf, fieldnames=list(RUN_COLUMNS), extrasaction="ignore", lineterminator="\n"
    )
    w.writeheader()
    for r in runs:
        w.writerow({k: _cell(r.get(k)) for k in RUN_COLUMNS})
    return buf.getvalue()


def summary_columns() -> list[str]:
    cols = ["experiment", "policy", "policy_name", "offline", "capacity", "capacity_blocks"]
    cols.append("n_seeds")
    for m in SUMMARY_METRICS:
        cols += [f"{m}_mean", f"{m}_std", f"{m}_ci95_low", f"{m}_ci95_high"]
    return cols


def summary_csv(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    cols = summary_columns()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for rec in doc["aggregate"]:
        row: dict[str, Any] = {"experiment": doc["experiment"]}
        for k in ("policy", "policy_name", "offline", "capacity", "capacity_blocks", "n_seeds"):
            row[k] = _cell(rec[k])
        for m in SUMMARY_METRICS:
            for part in ("mean", "std", "ci95_low", "ci95_high"):
                row[f"{m}_{part}"] = _cell(rec[m][part])
        w.writerow(row)
    return buf.getvalue()


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return v


#: attempts of :func:`new_run_dir` at one timestamp (``_2``, ``_3``, ... suffixes)
MAX_RUN_DIR_ATTEMPTS = 10_000


def new_run_dir(output_root: Path, experiment_id: str, now: dt.datetime | None = None) -> Path:
    """Create and return a new, empty ``<output_root>/<YYYYmmdd_HHMMSS>_<id>[_<k>]``.

    Atomic: each candidate is created with ``mkdir`` (which fails when the name exists), so
    runs started at the same second, in threads or processes, all get distinct directories.
    """
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d_%H%M%S")
    base = output_root / f"{stamp}_{experiment_id}"
    output_root.mkdir(parents=True, exist_ok=True)
    for k in range(1, MAX_RUN_DIR_ATTEMPTS + 1):
        path = base if k == 1 else base.with_name(f"{base.name}_{k}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{base}: {MAX_RUN_DIR_ATTEMPTS} run directories of this second exist")


def _write_files(doc: dict[str, Any], out_dir: Path, run_log: Callable[[], str] | None) -> None:
    """The outputs into an existing (staging) directory, ``results.json`` last."""
    from skv.experiments.figures import write_plots
    from skv.experiments.report import summary_markdown

    (out_dir / "metrics.csv").write_text(runs_csv(doc["runs"]), encoding="utf-8")
    (out_dir / "metrics_summary.csv").write_text(summary_csv(doc), encoding="utf-8")
    (out_dir / "summary.md").write_text(summary_markdown(doc), encoding="utf-8")
    write_plots(doc, out_dir)
    if run_log is not None:
        (out_dir / "run.log").write_text(run_log(), encoding="utf-8")
    (out_dir / "results.json").write_text(dumps_json(doc), encoding="utf-8")


def write_outputs(doc: dict[str, Any], out_dir: Path) -> None:
    """Every deterministic output of one experiment (all but ``run.log``), all or nothing:
    written into a staging directory that becomes ``out_dir`` at the end
    (:func:`skv.fileio.atomic_dir`); ``results.json`` is the last file to appear."""
    with atomic_dir(out_dir, last=("results.json",)) as tmp:
        _write_files(doc, tmp, None)


def run_experiment(
    config: ExperimentConfig | str | Path,
    output_root: str | Path = "outputs/experiments",
    *,
    quick: bool = False,
    progress: bool | None = False,
) -> Path:
    """Run one experiment; returns its output directory, which appears only when every
    output is written (see the module docstring)."""
    source = None
    if not isinstance(config, ExperimentConfig):
        source = Path(config)
        config = load_config(source)
    doc, timings, started, t0 = _simulate_logged(config, source, quick=quick, progress=progress)
    t1 = time.perf_counter()

    def run_log() -> str:
        timings.append(f"wrote outputs ({time.perf_counter() - t1:.2f} s)")
        timings.append(f"total {time.perf_counter() - t0:.2f} s")
        return "\n".join(timings) + "\n"

    out_dir = _publish(output_root, config, started, lambda tmp: _write_files(doc, tmp, run_log))
    log.info("experiment %s done in %.1f s: %s", config.id, time.perf_counter() - t0, out_dir)
    return out_dir


def _simulate_logged(
    config: ExperimentConfig, source: Path | None, *, quick: bool, progress: bool | None
) -> tuple[dict[str, Any], list[str], dt.datetime, float]:
    """:func:`simulate_experiment` with run.log's lines; returns (document, run.log lines so
    far, start time, start ``perf_counter``). A Ctrl-C leaves with a note saying how far it
    got; a config error names ``source``."""
    total = len(config.seeds) * len(config.capacities) * len(config.policies)
    t0 = time.perf_counter()
    started = dt.datetime.now()
    timings: list[str] = [
        f"experiment {config.id}" + (f" from {source}" if source else ""),
        f"started {started.isoformat(timespec='seconds')}" + (" (quick)" if quick else ""),
    ]
    log.info(
        "experiment %s: %d seed(s) x %d capacit(ies) x %d polic(ies)%s",
        config.id,
        len(config.seeds),
        len(config.capacities),
        len(config.policies),
        " (quick)" if quick else "",
    )
    done: list[dict[str, Any]] = []
    try:
        doc = simulate_experiment(
            config, quick=quick, progress=progress, timings=timings, on_run=done.append
        )
    except KeyboardInterrupt as exc:
        exc.add_note(
            f"experiment {config.id}: interrupted after {len(done)} of {total} simulations; "
            "nothing written (an experiment's outputs are written whole, at the end)"
        )
        raise
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}") from None
    return doc, timings, started, t0


def _publish(
    output_root: str | Path,
    config: ExperimentConfig,
    started: dt.datetime,
    write: Callable[[Path], None],
) -> Path:
    """A new run directory named after ``started``, filled by ``write`` (given the staging
    directory) all at once; on any error, Ctrl-C included, nothing is left behind.

    No name is reserved in advance: the files go into a hidden staging directory, which is
    renamed onto the first free name at the end (:func:`publish_run_dir`), so even a SIGKILL
    (no cleanup runs) leaves no empty run directory, only the staging directory, which the next
    run into ``output_root`` removes (:func:`skv.fileio.clean_stale_partials`)."""
    total = len(config.seeds) * len(config.capacities) * len(config.policies)
    root = Path(output_root)
    stamp = started.strftime("%Y%m%d_%H%M%S")
    tmp = staging_dir(root / f"{stamp}_{config.id}")
    try:
        write(tmp)
        return publish_run_dir(tmp, root, config.id, started)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt):
            exc.add_note(
                f"experiment {config.id}: all {total} simulations done, interrupted while "
                "writing; nothing written (no run directory left behind)"
            )
        raise


def publish_run_dir(
    staged: Path, output_root: Path, experiment_id: str, now: dt.datetime | None = None
) -> Path:
    """Rename the filled directory ``staged`` onto the first free
    ``<output_root>/<YYYYmmdd_HHMMSS>_<id>[_<k>]`` and return it.

    Atomic: ``rename`` onto a name that holds a (non-empty) run fails, so runs finishing at the
    same second, in threads or processes, get distinct directories; an empty directory of that
    name (nothing a reader takes for a run) is replaced."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d_%H%M%S")
    base = output_root / f"{stamp}_{experiment_id}"
    for k in range(1, MAX_RUN_DIR_ATTEMPTS + 1):
        path = base if k == 1 else base.with_name(f"{base.name}_{k}")
        try:
            os.rename(staged, path)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                continue
            raise
        return path
    raise FileExistsError(f"{base}: {MAX_RUN_DIR_ATTEMPTS} run directories of this second exist")


@dataclass(frozen=True)
class _Rendered:
    """One experiment of ``run_all``, simulated and rendered by a sweep worker: every output
    but run.log, as bytes, which the calling process writes (so workers, local or on a Dask
    cluster, need no file system shared with it)."""

    started: dt.datetime
    files: dict[str, bytes]
    timings: list[str]
    render_s: float
    total_s: float


@dataclass(frozen=True)
class _ExperimentTask:
    """One config of ``run_all``; its repr (what the sweep names when it fails) is the path."""

    path: str
    config: ExperimentConfig
    quick: bool
    progress: bool | None

    def __repr__(self) -> str:
        return self.path


def _experiment_task(task: _ExperimentTask) -> _Rendered:
    """The sweep task of ``run_all``: one config -> its outputs, rendered by the same
    :func:`_write_files` as :func:`run_experiment`, so byte-identical."""
    config = task.config
    try:
        doc, timings, started, t0 = _simulate_logged(
            config, None, quick=task.quick, progress=task.progress
        )
    except ConfigError as exc:
        raise ConfigError(f"{task.path}: {exc}") from None
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skv-render-") as tmp:
        _write_files(doc, Path(tmp), None)
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}
    t2 = time.perf_counter()
    return _Rendered(started, files, timings, t2 - t1, t2 - t0)


def _write_rendered(r: _Rendered, config: ExperimentConfig, output_root: Path) -> Path:
    """A rendered experiment into a new run directory (``results.json`` last, as ever)."""
    t0 = time.perf_counter()

    def write(tmp: Path) -> None:
        for name, data in r.files.items():
            if name != "results.json":
                (tmp / name).write_bytes(data)
        spent = time.perf_counter() - t0
        lines = [
            *r.timings,
            f"wrote outputs ({r.render_s + spent:.2f} s)",
            f"total {r.total_s + spent:.2f} s",
        ]
        (tmp / "run.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (tmp / "results.json").write_bytes(r.files["results.json"])

    out_dir = _publish(output_root, config, r.started, write)
    log.info("experiment %s done in %.1f s: %s", config.id, r.total_s, out_dir)
    return out_dir


def suite_configs(config_dir: str | Path = SUITE_DIR) -> list[Path]:
    """The suite: every ``*.yaml`` in ``config_dir`` whose config has ``in_suite: true``."""
    paths = sorted(Path(config_dir).glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"{config_dir}: no *.yaml experiment configs")
    return [p for p in paths if load_config(p).in_suite]


def run_all(
    configs: Sequence[str | Path] | None = None,
    output_root: str | Path = "outputs/experiments",
    *,
    config_dir: str | Path = SUITE_DIR,
    quick: bool = False,
    progress: bool | None = False,
    jobs: int | None = None,
    dask: str | None = None,
) -> tuple[list[Path], list[Path]]:
    """Run every config (the suite of ``config_dir`` when ``configs`` is None) and write the
    aggregate summary; returns (run directories, aggregate files), both in config order.

    The configs are the tasks of one sweep (:func:`skv.experiments.sweep.run_sweep`: ``jobs``
    processes, default ``SKV_JOBS`` or every CPU, or a Dask cluster by ``dask`` /
    ``SKV_DASK``). A worker simulates one config and renders its outputs; this process writes
    each run directory as its config finishes, so a Ctrl-C keeps the finished ones. Outputs
    are byte-identical to ``run_experiment`` of each config whatever the mode (run.log, with
    its timings, aside). ``progress`` bars per simulation show only when the configs run in
    this process (``jobs=1`` or one config)."""
    from skv.experiments.report import write_aggregate
    from skv.experiments.sweep import run_sweep, runs_in_this_process

    paths = [Path(c) for c in configs] if configs else suite_configs(config_dir)
    loaded = [(p, load_config(p)) for p in paths]  # every config valid before anything runs
    ids = [c.id for _, c in loaded]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"experiment ids used twice: {', '.join(dupes)}")
    out_root = Path(output_root)
    here = runs_in_this_process(len(loaded), jobs=jobs, dask=dask)
    tasks = [_ExperimentTask(str(p), c, quick, progress if here else False) for p, c in loaded]
    finished: dict[int, Path] = {}

    def write(i: int, rendered: _Rendered) -> None:
        finished[i] = _write_rendered(rendered, loaded[i][1], out_root)

    try:
        run_sweep(
            _experiment_task,
            tasks,
            jobs=jobs,
            dask=dask,
            label="run-all",
            bar=False if here and progress else None,  # not over the per-simulation bars
            on_result=write,
        )
        run_dirs = [finished[i] for i in range(len(loaded))]
        docs = [json.loads((d / "results.json").read_text(encoding="utf-8")) for d in run_dirs]
        files = write_aggregate(docs, run_dirs, out_root)
    except KeyboardInterrupt as exc:
        done = [finished[i] for i in sorted(finished)]
        listed = "".join(f"\n  finished: {d}" for d in done)
        exc.add_note(
            f"run-all: {len(done)} of {len(loaded)} experiments finished, each complete in "
            f"its directory; aggregate summary not written{listed}"
        )
        raise
    return run_dirs, files
