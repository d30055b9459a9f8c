"""Where two policies' defaults come from: lhd's ``features`` and kvflow's ``age_out`` are the
best mean block hit rate of a few candidates on the leaderboard's TUNING workloads (none of them
ranked), at its tuning capacities. Neither paper gives a value for these knobs.

Run: ``python -m skv.experiments.leaderboard.derive_defaults [--out FILE]`` (writes the scores;
the committed record is ``experiments/leaderboard/derived_defaults.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from skv.experiments.leaderboard import study
from skv.experiments.leaderboard.config import load_config

CONFIG = "experiments/leaderboard/policy_leaderboard.yaml"
#: the knobs and their candidates (inf: kvflow never ages a session out)
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "lhd": [
        {"features": f} for f in ("hits", "reuse", "hits+stype", "reuse+stype", "hits+session")
    ],
    "kvflow": [{"age_out": a} for a in (1.0, 1.5, 2.0, 4.0, float("inf"))],
}


def derive(config_path: str = CONFIG, *, jobs: int | None = None) -> dict[str, Any]:
    """policy -> {"scores": [[params, mean block hit rate, runs], ...] best first, "best": the
    first params}; replayed by the study's own cells (its tuning traces and capacities)."""
    cfg = load_config(config_path)
    settings = {p: {str(i): c for i, c in enumerate(cs)} for p, cs in CANDIDATES.items()}
    todo = study.cells(cfg, cfg.tuning.traces, settings, cfg.tuning.capacities, ttft=False)
    runs = study.run_cells(todo, jobs=jobs, label="derive defaults")
    out = {}
    for policy, cands in CANDIDATES.items():
        hit = runs[runs["policy"] == policy].groupby("setting")["block_hit_rate"]
        means, counts = hit.mean(), hit.size()
        order = sorted(range(len(cands)), key=lambda i: -means[str(i)])  # ties: list order
        out[policy] = {
            "scores": [[cands[i], round(means[str(i)], 6), int(counts[str(i)])] for i in order],
            "best": cands[order[0]],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--out", type=Path, help="write the scores here (JSON)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    res = derive(args.config)
    text = json.dumps(res, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
