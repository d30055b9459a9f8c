"""Running the SAECache study's configs: the grid, the ablation and the mismatch runs.

Every config is an ordinary :class:`~skv.experiments.config.ExperimentConfig` simulated by
:func:`skv.experiments.runner.simulate_experiment` into ``<out>/<id>/`` (the text outputs of
``skv run``: ``results.json``, ``metrics.csv``, ``metrics_summary.csv``, ``summary.md``;
not its six per-run PNGs, which cost about as much as a quick run's simulations and which no
figure here reads); :func:`run_configs` runs a folder of them in parallel processes (the
results do not depend on the order or the number of processes).

Quick runs (:func:`study_config`) keep the first :data:`QUICK_SEEDS` seeds of each config and
its first :data:`QUICK_REQUESTS` requests, written into the config itself (so a quick run's
``results.json`` says what ran), instead of the runner's quick size (10% of the requests,
here 200): at 200 requests ``saecache`` learns nothing (its first weight update needs 256
evictions, its gap fits 30 inter-turn gaps) and every variant of it runs identically.

Fixed parameters fitted elsewhere. A policy entry ``{name: saecache_fixed, label:
fit_<workload>}`` is run with the values ``saecache`` has learned at the end of one
run on ``<workload>`` (:func:`fit_fixed_params`): the same config (workload parameters,
capacity share, latency, batch, block size) with that workload's name, seed :data:`FIT_SEED`
(which no evaluation run uses), replica 0's last logged ``metrics()``: ``alpha_<queue>``,
``w_<type>``, ``mu`` and ``sigma`` of Chat and Agentic, ``gamma``. :func:`with_fits` fills
these in before the run, so ``results.json`` records the values each variant ran with.

:func:`simulate_cell` simulates one (policy, seed) cell of a config and returns the simulator's
result with the policy's whole metric series; the runner's results keep only the ``w_<type>``
series of the first seed, and the fits and the learned-parameter figure need every metric.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from skv.experiments.config import ExperimentConfig, config_from_dict, load_config
from skv.experiments.sweep import run_sweep

CONFIG_DIR = "experiments/saecache"
GRID_DIR = f"{CONFIG_DIR}/grid"
ABLATION_DIR = f"{CONFIG_DIR}/ablation"
LEARNED_CONFIG = f"{CONFIG_DIR}/learned_params.yaml"
#: seeds a quick run keeps (the first ones of each config)
QUICK_SEEDS = 2
#: requests a quick run keeps (the earliest ones; a quarter of the full runs' 2,000)
QUICK_REQUESTS = 500
#: the seed of the runs that fit ``saecache_fixed`` (outside every config's evaluation seeds)
FIT_SEED = 100
#: label prefix of a ``saecache_fixed`` entry whose parameters are fitted on another workload
FIT_PREFIX = "fit_"


def study_config(config: ExperimentConfig | str | Path, *, quick: bool) -> ExperimentConfig:
    """A config as this study runs it: in quick runs, its first :data:`QUICK_SEEDS` seeds and
    at most :data:`QUICK_REQUESTS` requests."""
    cfg = config if isinstance(config, ExperimentConfig) else load_config(config)
    if not quick:
        return cfg
    from skv.experiments.runner import DEFAULT_NUM_REQUESTS

    params = dict(cfg.workload.params)
    params["num_requests"] = min(
        int(params.get("num_requests", DEFAULT_NUM_REQUESTS)), QUICK_REQUESTS
    )
    return replace_fields(
        cfg,
        seeds=cfg.seeds[:QUICK_SEEDS],
        workload={"name": cfg.workload.name, "params": params},
    )


def replace_fields(config: ExperimentConfig, **changes: Any) -> ExperimentConfig:
    """``config`` with some fields changed, validated again."""
    data = config.model_dump(mode="json")
    data.update(changes)
    return config_from_dict(data, source=f"{config.id} (changed: {', '.join(changes)})")


def config_paths(config_dir: str | Path) -> list[Path]:
    """The ``*.yaml`` configs of a folder, sorted by name."""
    paths = sorted(Path(config_dir).glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"{config_dir}: no *.yaml experiment configs")
    return paths


# ----------------------------------------------------------------------------------------
# one cell, and the fixed-parameter fits


def simulate_cell(
    config: ExperimentConfig,
    policy: str,
    seed: int,
    *,
    metrics_every: int | None = None,
) -> Any:
    """Simulate one (policy, seed) cell of ``config`` at its first capacity as the runner
    would (same requests, capacity and simulator settings); returns the
    :class:`skv.sim.SimResult`, whose ``policy_series`` holds every logged ``metrics()`` row
    (every ``metrics_every`` finished requests; default: the config's)."""
    from skv.experiments.runner import (
        make_requests,
        sim_config,
        unique_prompt_blocks,
        workload_params,
    )
    from skv.latency import make_latency_model
    from skv.sim import simulate
    from skv.sizing import Capacity

    specs = {p.key: p for p in config.policies}
    if policy not in specs:
        raise KeyError(f"{config.id}: no policy {policy!r}; have {sorted(specs)}")
    spec = specs[policy]
    requests = make_requests(config.workload.name, workload_params(config, seed, False))
    blocks = Capacity.parse(config.capacities[0]).to_blocks(
        block_size=config.block_size,
        unique_blocks=unique_prompt_blocks(requests, config),
        model=config.model,
    )
    sim = sim_config(config, spec, blocks)
    if metrics_every:
        sim.policy_metrics_every = metrics_every
    latency = make_latency_model(config.latency.name, **config.latency.params)
    return simulate(requests, sim, latency)


def fixed_params_from_metrics(row: dict[str, float]) -> dict[str, Any]:
    """``saecache_fixed`` parameters from one ``saecache.metrics()`` row (what
    ``SAECache.fitted()`` returns for the policy in that state)."""
    from skv.model import TYPES
    from skv.policies.saecache import QUEUES

    return {
        "alpha": {q: float(row[f"alpha_{q}"]) for q in QUEUES},
        "weights": {t.value: float(row[f"w_{t.value}"]) for t in TYPES},
        "mu": {"chat": float(row["mu_chat"]), "agentic": float(row["mu_agentic"])},
        "sigma": {"chat": float(row["sigma_chat"]), "agentic": float(row["sigma_agentic"])},
        "gamma": float(row["gamma"]),
    }


def fit_config(config: ExperimentConfig, workload: str) -> ExperimentConfig:
    """The run that fits ``saecache_fixed`` for ``config`` on ``workload``: ``config`` with that
    workload (same parameters), ``saecache`` only, seed :data:`FIT_SEED`."""
    return replace_fields(
        config,
        id=f"{config.id}_fit_on_{workload}",
        workload={"name": workload, "params": dict(config.workload.params)},
        policies=["saecache"],
        seeds=[FIT_SEED],
    )


def fit_fixed_params(config: ExperimentConfig, workload: str) -> dict[str, Any]:
    """What ``saecache`` has learned at the end of :func:`fit_config`'s run (replica 0's last
    ``metrics()`` row, logged after every finished request), as ``saecache_fixed`` params."""
    res = simulate_cell(fit_config(config, workload), "saecache", FIT_SEED, metrics_every=1)
    rows = [r for r in res.policy_series if int(r.get("replica", 0)) == 0]
    if not rows:
        raise ValueError(f"{config.id}: the fit on {workload} logged no saecache metrics")
    return fixed_params_from_metrics(rows[-1])


def with_fits(config: ExperimentConfig) -> tuple[ExperimentConfig, dict[str, dict[str, Any]]]:
    """``config`` with every ``fit_<workload>`` entry's parameters fitted
    (:func:`fit_fixed_params`), and label -> fitted parameters."""
    fits: dict[str, dict[str, Any]] = {}
    policies: list[dict[str, Any]] = []
    for p in config.policies:
        entry = p.model_dump(mode="json")
        if p.label and p.label.startswith(FIT_PREFIX):
            if p.name != "saecache_fixed" or p.params:
                raise ValueError(
                    f"{config.id}: {p.label} must be saecache_fixed with no params (they are "
                    "fitted)"
                )
            fits[p.label] = fit_fixed_params(config, p.label[len(FIT_PREFIX) :])
            entry["params"] = fits[p.label]
        policies.append(entry)
    if not fits:
        return config, {}
    return replace_fields(config, policies=policies), fits


# ----------------------------------------------------------------------------------------
# running configs


def _run_one(path: str, out_dir: str, quick: bool) -> tuple[str, str]:
    """One config into ``<out_dir>/<id>/`` (a worker process): fits first, then the runner's
    simulation and its text outputs (``results.json``, ``metrics.csv``,
    ``metrics_summary.csv``, ``summary.md``, ``run.log``; ``fits.json`` when parameters were
    fitted). The six per-run PNGs of ``skv run`` are not drawn: the study draws its own
    figures (``skv run <config>`` draws them for one config)."""
    import time

    from skv.experiments.report import summary_markdown
    from skv.experiments.runner import dumps_json, runs_csv, simulate_experiment, summary_csv

    t0 = time.perf_counter()
    config, fits = with_fits(study_config(path, quick=quick))
    timings = [f"experiment {config.id} from {path}" + (" (quick)" if quick else "")]
    doc = simulate_experiment(config, timings=timings)
    run_dir = Path(out_dir) / config.id
    run_dir.mkdir(parents=True)
    files = {
        "metrics.csv": runs_csv(doc["runs"]),
        "metrics_summary.csv": summary_csv(doc),
        "summary.md": summary_markdown(doc),
        "results.json": dumps_json(doc),
    }
    if fits:
        text = json.dumps({"fit_seed": FIT_SEED, "fits": fits}, indent=2, sort_keys=True)
        files["fits.json"] = text + "\n"
    for name, text in files.items():
        (run_dir / name).write_text(text, encoding="utf-8")
    timings.append(f"total {time.perf_counter() - t0:.2f} s (fits included)")
    (run_dir / "run.log").write_text("\n".join(timings) + "\n", encoding="utf-8")
    return config.id, str(run_dir)


def run_configs(
    config_dir: str | Path, out_dir: str | Path, *, quick: bool, jobs: int | None = None
) -> dict[str, Path]:
    """Run every config of ``config_dir`` into ``out_dir`` (emptied first) through the sweep
    executor (:mod:`skv.experiments.sweep`; ``jobs`` processes, default ``SKV_JOBS`` or one
    per CPU core); returns experiment id -> run directory."""
    paths = config_paths(config_dir)
    ids = [load_config(p).id for p in paths]  # every config valid before anything runs
    if len(set(ids)) != len(ids):
        raise ValueError(f"{config_dir}: experiment ids used twice")
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tasks = [(str(p), str(out), quick) for p in paths]
    done = run_sweep(_run_task, tasks, jobs=jobs, label=f"{config_dir} configs")
    return {i: Path(d) for i, d in sorted(done)}


def _run_task(task: tuple[str, str, bool]) -> tuple[str, str]:
    return _run_one(*task)


def load_runs(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Experiment id -> ``results.json`` document for the run directories under ``out_dir``."""
    docs = {}
    for f in sorted(Path(out_dir).glob("*/results.json")):
        doc = json.loads(f.read_text(encoding="utf-8"))
        docs[doc["experiment"]] = doc
    if not docs:
        raise FileNotFoundError(f"{out_dir}: no experiment runs")
    return dict(sorted(docs.items()))


def learned_series(config: ExperimentConfig | str | Path, *, quick: bool) -> pd.DataFrame:
    """Replica 0's logged ``metrics()`` over one run of the config's first policy and seed (one
    row per log, ``time_s`` first)."""
    cfg = study_config(config, quick=quick)
    res = simulate_cell(cfg, cfg.policies[0].key, cfg.seeds[0])
    rows = [r for r in res.policy_series if int(r.get("replica", 0)) == 0]
    return pd.DataFrame(rows).drop(columns=["replica"], errors="ignore")
