"""What every paper notebook does besides its study: find the repository root, record the numbers
the paper states, write a table.

A notebook (``notebooks/<study>/<step>.ipynb``) is a recipe: it runs its study through
``skv.experiments.<study>``, draws with that study's figure functions, saves with
:func:`skv.experiments.plotstyle.save_figure`, and records its numbers here with
:func:`write_claims` for ``experiments/claims.yaml`` (the pipeline in :mod:`skv.artifact` checks
them). Nothing here simulates.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

#: the file a step writes its claimed numbers to, in its output directory
CLAIMS_FILE = "claims.json"


def write_claims(output_dir: str | Path, step: str, values: dict[str, float | None]) -> Path:
    """Write the numbers a notebook produces for ``experiments/claims.yaml`` to
    ``<output_dir>/claims.json`` (``{"step": ..., "values": {name: number}}``)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = {}
    for k, v in values.items():
        clean[k] = None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
    path = out / CLAIMS_FILE
    path.write_text(json.dumps({"step": step, "values": clean}, indent=2, sort_keys=True) + "\n")
    return path


def write_table(df: pd.DataFrame, out_dir: str | Path, name: str, digits: int = 3) -> list[Path]:
    """``name.csv`` and a booktabs ``name.tex`` (no jinja2 needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, tex_path = out / f"{name}.csv", out / f"{name}.tex"
    df.to_csv(csv_path, index=False, lineterminator="\n")

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "--" if not math.isfinite(v) else f"{v:.{digits}f}"
        return str(v).replace("_", r"\_").replace("%", r"\%")

    lines = [
        r"\begin{tabular}{" + "l" * len(df.columns) + "}",
        r"\toprule",
        " & ".join(cell(c) for c in df.columns) + r" \\",
        r"\midrule",
        *(" & ".join(cell(v) for v in row) + r" \\" for row in df.itertuples(index=False)),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    tex_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [csv_path, tex_path]


def at_repo_root() -> Path:
    """Change to the repository root when a notebook runs from inside ``notebooks/`` (Jupyter
    starts kernels beside the notebook; the parameters' default paths are relative to the root).
    papermill runs notebooks with ``--cwd`` at the root already, so this is then a no-op."""
    cwd = Path.cwd()
    for d in (cwd, *cwd.parents):
        if d.name == "notebooks" and (d.parent / "experiments").is_dir():
            os.chdir(d.parent)
            break
    return Path.cwd()
