"""The SemanticKV suite: every experiment config in ``experiments/semantickv/``, run together.

The ``tab_aggregate_summary`` step runs the suite once (:func:`run_suite`); the suite's figure
steps read its run directories (:func:`suite_runs`, :func:`load_results`) instead of simulating
again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from skv.experiments.outputs import SUITE_DIR


def run_suite(
    out_dir: str | Path, *, quick: bool, config_dir: str | Path = SUITE_DIR
) -> dict[str, Path]:
    """Run the experiment suite of ``config_dir`` (``skv run-all``) into ``out_dir``, which is
    emptied first; returns experiment id -> run directory."""
    from skv.experiments import run_all

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    run_all(None, out, config_dir=config_dir, quick=quick)
    return suite_runs(out)


def suite_runs(suite_dir: str | Path) -> dict[str, Path]:
    """Experiment id -> run directory for the run directories under ``suite_dir`` (or under
    its ``suite/`` folder: the output directory of the tab_aggregate_summary step)."""
    root = Path(suite_dir)
    if (root / "suite").is_dir():
        root = root / "suite"
    runs = {}
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        f = d / "results.json"
        if f.is_file():
            runs[json.loads(f.read_text(encoding="utf-8"))["experiment"]] = d
    if not runs:
        raise FileNotFoundError(f"{suite_dir}: no experiment runs (run tab_aggregate_summary)")
    return runs


def load_results(suite_dir: str | Path, experiment: str) -> dict[str, Any]:
    """The ``results.json`` document of one experiment of the suite."""
    runs = suite_runs(suite_dir)
    if experiment not in runs:
        raise KeyError(f"{suite_dir}: no run of experiment {experiment!r}; have {sorted(runs)}")
    return json.loads((runs[experiment] / "results.json").read_text(encoding="utf-8"))


def aggregate_table(suite_dir: str | Path) -> pd.DataFrame:
    """The suite's ``aggregate_summary.csv`` as a DataFrame."""
    return pd.read_csv(Path(suite_dir) / "aggregate_summary.csv")
