"""Equal tuning: every policy gets the same number of parameter settings (the config's
``tuning.budget``, its default counting as one), tried on tuning workloads the leaderboard never
evaluates on, and keeps the one with the best mean block hit rate there.

The runs themselves are :func:`skv.experiments.leaderboard.study.tune`'s; this module is the
rule (which settings, which one wins). Invariants: a policy's candidates are
``[default, *grids[policy]]`` in that order, and a tie keeps the earlier one (so a grid that does
not help leaves the default); a policy without parameters (``lru``, ``fifo``, ``sieve``, ...)
has one candidate and nothing to tune. The choice depends only on the tuning traces: the
evaluation's rows cannot move it.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from skv.experiments.leaderboard.config import LeaderboardConfig


def candidates(config: LeaderboardConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """policy -> {"default": {}, "grid1": {...}, ...}: the settings each policy may try."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for policy in config.policy_names:
        grid = config.tuning.grids.get(policy, [])
        out[policy] = {"default": {}, **{f"grid{i + 1}": dict(p) for i, p in enumerate(grid)}}
    return out


def choose(scores: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """policy -> the params of its best setting by mean block hit rate (ties: the earlier
    setting in ``scores``' order, the default first)."""
    chosen = {}
    for policy, d in scores.groupby("policy", sort=False):
        means = d.groupby("setting", sort=False)["block_hit_rate"].mean()
        best = means.idxmax()  # first of equal maxima
        chosen[policy] = json.loads(d[d["setting"] == best]["params"].iloc[0])
    return chosen
