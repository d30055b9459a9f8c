"""The seed's thesis per stress experiment, as numbers a claim can check.

The seed (SemanticKV) says adaptive semantic eviction beats LRU on some workloads (low-memory
RAG, workload shift) and loses to it on others (legal review, tool-agent sessions). For each
experiment this computes, at its tightest capacity, paired differences over seeds (same seed =
same trace, so pairing removes the trace-to-trace variance both policies share):

- ``hit_pts``: token hit rate of ``policy`` minus ``baseline``, in percentage points;
- ``ttft_pct``: mean TTFT of ``policy`` relative to ``baseline``, in percent (negative = faster),
  per seed ``100 (a - b) / b`` then averaged;

each as ``{"value", "ci95": [lo, hi], "n"}``, the shape ``claims.json`` carries intervals in.
The interval is the Student-t interval of the mean per-seed difference (differences are
roughly symmetric even when TTFT itself is skewed, and t is wider than a percentile bootstrap
with few seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skv.experiments.stats import mean_ci

THESIS_POLICY = "adaptive_semantic"
BASELINE = "lru"


def _tightest(doc: dict[str, Any]) -> str:
    blocks = {r["capacity"]: r["capacity_blocks"] for r in doc["aggregate"]}
    return min(blocks, key=lambda c: (blocks[c], c))


def _per_seed(doc: dict[str, Any], capacity: str, policy: str, metric: str) -> list[float]:
    runs = [r for r in doc["runs"] if r["capacity"] == capacity and r["policy"] == policy]
    return [float(r[metric]) for r in sorted(runs, key=lambda r: r["seed"])]


def interval(values: Sequence[float], *, method: str = "t") -> dict[str, Any]:
    """Mean over seeds with its 95% interval in the claims.json shape: Student t for paired
    differences (the default), ``method="bootstrap"`` for levels (the rule of
    skv.experiments.stats). A single value gets a zero-width interval: one seed gives no
    spread estimate, and says so with n=1."""
    s = mean_ci(values, method=method)
    lo = s["ci95_low"] if s["ci95_low"] is not None else s["mean"]
    hi = s["ci95_high"] if s["ci95_high"] is not None else s["mean"]
    return {"value": s["mean"], "ci95": [lo, hi], "n": s["n"]}


def best_baseline(doc: dict[str, Any], capacity: str, policy: str, metric: str) -> str:
    """The online policy other than ``policy`` with the best across-seed mean of ``metric``
    (higher hit rate; ties broken by config order)."""
    online = [r["policy"] for r in doc["aggregate"] if r["capacity"] == capacity]
    offline = {r["policy"] for r in doc["aggregate"] if r["offline"]}
    cands = [p for p in dict.fromkeys(online) if p != policy and p not in offline]
    means = {p: sum(v) / len(v) for p in cands if (v := _per_seed(doc, capacity, p, metric))}
    return max(means, key=lambda p: (means[p], -cands.index(p)))


def compare(
    doc: dict[str, Any], policy: str = THESIS_POLICY, baseline: str = BASELINE
) -> dict[str, Any]:
    """``hit_pts`` and ``ttft_pct`` of ``policy`` vs ``baseline`` at the tightest capacity."""
    cap = _tightest(doc)
    ha = _per_seed(doc, cap, policy, "token_hit_rate")
    hb = _per_seed(doc, cap, baseline, "token_hit_rate")
    ta = _per_seed(doc, cap, policy, "ttft_ms_mean")
    tb = _per_seed(doc, cap, baseline, "ttft_ms_mean")
    if not ha or len(ha) != len(hb):
        raise ValueError(f"{doc['experiment']}: {policy} and {baseline} need the same seeds")
    return {
        "capacity": cap,
        "baseline": baseline,
        "hit_pts": interval([100 * (a - b) for a, b in zip(ha, hb, strict=True)]),
        "ttft_pct": interval([100 * (a - b) / b for a, b in zip(ta, tb, strict=True)]),
    }


def thesis_values(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Claim values for every experiment: ``<exp>_adaptive_vs_lru_hit_pts``,
    ``<exp>_adaptive_vs_lru_ttft_pct``, ``<exp>_adaptive_vs_best_hit_pts`` (best = the best
    other online policy by hit rate, named in ``<exp>_best_baseline``) and Belady's headroom
    over LRU ``<exp>_belady_vs_lru_hit_pts``."""
    out: dict[str, Any] = {}
    for doc in docs:
        e = doc["experiment"]
        cap = _tightest(doc)
        vs_lru = compare(doc)
        best = best_baseline(doc, cap, THESIS_POLICY, "token_hit_rate")
        out[f"{e}_adaptive_vs_lru_hit_pts"] = vs_lru["hit_pts"]
        out[f"{e}_adaptive_vs_lru_ttft_pct"] = vs_lru["ttft_pct"]
        out[f"{e}_adaptive_vs_best_hit_pts"] = compare(doc, baseline=best)["hit_pts"]
        out[f"{e}_best_baseline"] = best
        if _per_seed(doc, cap, "belady", "token_hit_rate"):
            out[f"{e}_belady_vs_lru_hit_pts"] = compare(doc, "belady")["hit_pts"]
    return out
