"""``skv run`` and ``skv run-all``: experiment configs -> simulated results, summaries, plots."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from skv.experiments.outputs import SUITE_DIR

log = logging.getLogger("skv.experiments")

DEFAULT_OUTPUT_ROOT = "outputs/experiments"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--output-root",
        default=DEFAULT_OUTPUT_ROOT,
        help="where run directories <timestamp>_<id>/ go (default: %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: keep 10%% of each workload's requests (at least 50); outputs say so",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="show a progress bar per simulation (run-all: when its configs run in this "
        "process, SKV_JOBS=1; one log line per run is always printed)",
    )


def cmd_run(args: argparse.Namespace) -> int:
    from skv.experiments.runner import run_experiment

    out = run_experiment(
        args.config,
        args.output_root,
        quick=args.quick,
        progress=bool(args.progress),
    )
    print(f"results: {out}")
    print(f"summary: {out / 'summary.md'}")
    return 0


def cmd_run_all(args: argparse.Namespace) -> int:
    from skv.experiments.runner import run_all

    run_dirs, files = run_all(
        args.configs or None,
        args.output_root,
        config_dir=args.config_dir,
        quick=args.quick,
        progress=bool(args.progress),
        dask=args.dask,
    )
    for d in run_dirs:
        print(f"results: {d}")
    for f in files:
        print(f"aggregate: {f}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``run`` and ``run-all`` to the ``skv`` command line."""
    p = subparsers.add_parser(
        "run",
        help="run one experiment config (YAML) through the serving simulator",
        description=(
            "Simulate every seed x capacity x policy of an experiment config and write "
            "results.json, metrics.csv, metrics_summary.csv, summary.md, six PNG plots and "
            "run.log to OUTPUT_ROOT/<timestamp>_<id>/. Latencies are simulated by the "
            "config's latency model, never measured."
        ),
    )
    p.add_argument(
        "config", type=Path, help="experiment config, e.g. experiments/semantickv/smoke.yaml"
    )
    _common(p)
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser(
        "run-all",
        help="run every experiment config and write the aggregate summary",
        description=(
            "Run every config in --config-dir marked in_suite (or the configs given), in "
            "parallel through the sweep executor (SKV_JOBS processes, or a Dask cluster with "
            "--dask / SKV_DASK), and write OUTPUT_ROOT/aggregate_summary.csv and "
            "aggregate_summary.md."
        ),
    )
    p.add_argument(
        "configs",
        nargs="*",
        type=Path,
        help="configs to run (default: the suite in --config-dir)",
    )
    p.add_argument(
        "--config-dir",
        default=SUITE_DIR,
        help="directory of *.yaml configs (default: %(default)s)",
    )
    p.add_argument(
        "--dask",
        metavar="ADDR|local",
        default=None,
        help="run the configs on a Dask cluster: a scheduler address tcp://HOST:PORT, or "
        "'local' for a LocalCluster of SKV_JOBS workers (default: $SKV_DASK, else SKV_JOBS "
        "local processes); results are identical either way",
    )
    _common(p)
    p.set_defaults(func=cmd_run_all)
