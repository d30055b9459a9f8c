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
from statistics import mean
from typing import Any

from skv.experiments.leaderboard import study
from skv.experiments.leaderboard.config import load_config

log = logging.getLogger(__name__)

CONFIG = "experiments/leaderboard/policy_leaderboard.yaml"
#: the knobs and their candidates (inf: kvflow never ages a session out)
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "lhd": [
        {"features": f} for f in ("hits", "reuse", "hits+stype", "reuse+stype", "hits+session")
    ],
    "kvflow": [{"age_out": a} for a in (1.0, 1.5, 2.0, 4.0, float("inf"))],
}


def derive(config_path: str = CONFIG) -> dict[str, Any]:
    """policy -> {"scores": [[params, mean block hit rate, runs], ...] best first, "best": the
    first params}."""
    from skv.replay import replay_one, resolve_capacities

    cfg = load_config(config_path)
    hits: dict[str, dict[str, list[float]]] = {
        p: {json.dumps(c): [] for c in cs} for p, cs in CANDIDATES.items()
    }
    for entry in cfg.tuning.traces:
        for seed in entry.seeds:
            _, trace, totals = study._compiled(entry.model_dump_json(), seed)
            caps = resolve_capacities(
                list(cfg.tuning.capacities), block_size=trace[0].block_size,
                unique_blocks=totals.unique_blocks, model=None,
            )  # fmt: skip
            for _, blocks in caps:
                for policy, cands in CANDIDATES.items():
                    for c in cands:
                        r = replay_one(trace, policy, blocks, params=c, totals=totals,
                                       progress=False)  # fmt: skip
                        hits[policy][json.dumps(c)].append(r["block_hit_rate"])
            log.info("%s seed %d done", entry.label, seed)
    out = {}
    for policy, d in hits.items():
        ranked = sorted(d.items(), key=lambda kv: -mean(kv[1]))  # stable: ties keep list order
        out[policy] = {
            "scores": [[json.loads(c), round(mean(v), 6), len(v)] for c, v in ranked],
            "best": json.loads(ranked[0][0]),
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
