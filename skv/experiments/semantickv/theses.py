"""The seed's thesis per stress experiment, as numbers a claim can check.

The seed (SemanticKV) says adaptive semantic eviction beats LRU on some workloads (low-memory
RAG, workload shift) and loses to it on others (legal review, tool-agent sessions). For each
experiment this computes, at its tightest capacity, paired differences over seeds (same seed =
same trace, so pairing removes the trace-to-trace variance both policies share):

- ``hit_pts``: token hit rate of ``policy`` minus ``baseline``, in percentage points;
- ``ttft_pct``: mean TTFT of ``policy`` relative to ``baseline``, in percent (negative = faster),
  per seed ``100 (a - b) / b`` then averaged;

seeds matched by number (a policy that ran other seeds is an error, not a mispairing), each
as ``{"value", "ci95": [lo, hi], "n"}``, the shape ``claims.json`` carries intervals in.
The interval is the Student-t interval of the mean per-seed difference (differences are
roughly symmetric even when TTFT itself is skewed, and t is wider than a percentile bootstrap
with few seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skv.experiments.stats import interval

THESIS_POLICY = "adaptive_semantic"
BASELINE = "lru"


def _tightest(doc: dict[str, Any]) -> str:
    blocks = {r["capacity"]: r["capacity_blocks"] for r in doc["aggregate"]}
    return min(blocks, key=lambda c: (blocks[c], c))


def _by_seed(doc: dict[str, Any], capacity: str, policy: str, metric: str) -> dict[int, float]:
    runs = [r for r in doc["runs"] if r["capacity"] == capacity and r["policy"] == policy]
    return {int(r["seed"]): float(r[metric]) for r in runs}


def paired(
    doc: dict[str, Any], capacity: str, a: str, b: str, metric: str
) -> list[tuple[float, float]]:
    """(a, b) per seed, matched by seed number; both policies must have run the same seeds."""
    xa, xb = _by_seed(doc, capacity, a, metric), _by_seed(doc, capacity, b, metric)
    for pol, x in ((a, xa), (b, xb)):
        if not x:
            raise ValueError(f"{doc['experiment']}: no runs of {pol!r} at capacity {capacity}")
    if set(xa) != set(xb):
        raise ValueError(
            f"{doc['experiment']}: {a} ran seeds {sorted(xa)}, {b} ran {sorted(xb)}: "
            "a paired difference needs the same seeds"
        )
    return [(xa[k], xb[k]) for k in sorted(xa)]


def online_policies(doc: dict[str, Any], capacity: str) -> list[str]:
    """Online policies of the experiment at ``capacity``, in config order (Belady excluded)."""
    recs = [r for r in doc["aggregate"] if r["capacity"] == capacity]
    return list(dict.fromkeys(r["policy"] for r in recs if not r["offline"]))


def best_baseline(doc: dict[str, Any], capacity: str, policy: str, metric: str) -> str:
    """The online policy other than ``policy`` with the best across-seed mean of ``metric``
    (higher hit rate, lower TTFT; ties broken by config order)."""
    cands = [p for p in online_policies(doc, capacity) if p != policy]
    if not cands:
        raise ValueError(f"{doc['experiment']}: no online policy besides {policy!r}")
    sign = -1.0 if "ttft" in metric else 1.0
    means = {}
    for p in cands:
        x = _by_seed(doc, capacity, p, metric)
        means[p] = sign * sum(x.values()) / len(x)
    return max(cands, key=lambda p: (means[p], -cands.index(p)))


def compare(
    doc: dict[str, Any], policy: str = THESIS_POLICY, baseline: str = BASELINE
) -> dict[str, Any]:
    """``hit_pts`` and ``ttft_pct`` of ``policy`` vs ``baseline`` at the tightest capacity."""
    cap = _tightest(doc)
    hit = paired(doc, cap, policy, baseline, "token_hit_rate")
    ttft = paired(doc, cap, policy, baseline, "ttft_ms_mean")
    return {
        "capacity": cap,
        "baseline": baseline,
        "hit_pts": interval([100 * (a - b) for a, b in hit]),
        "ttft_pct": interval([100 * (a - b) / b for a, b in ttft]),
    }


def thesis_values(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Claim values for every experiment ``<exp>``, at its tightest capacity:
    ``<exp>_adaptive_vs_<p>_hit_pts`` and ``<exp>_adaptive_vs_<p>_ttft_pct`` for every other
    online policy ``p`` (claims name their comparator, chosen before the check, not the
    winner of the run being checked), Belady's headroom over LRU
    ``<exp>_belady_vs_lru_hit_pts``, and, as text for the paper, the best other online policy
    of this run by hit rate and by TTFT (``<exp>_best_by_hit``, ``<exp>_best_by_ttft``)."""
    out: dict[str, Any] = {}
    for doc in docs:
        e = doc["experiment"]
        cap = _tightest(doc)
        for p in online_policies(doc, cap):
            if p == THESIS_POLICY:
                continue
            c = compare(doc, baseline=p)
            out[f"{e}_adaptive_vs_{p}_hit_pts"] = c["hit_pts"]
            out[f"{e}_adaptive_vs_{p}_ttft_pct"] = c["ttft_pct"]
        out[f"{e}_best_by_hit"] = best_baseline(doc, cap, THESIS_POLICY, "token_hit_rate")
        out[f"{e}_best_by_ttft"] = best_baseline(doc, cap, THESIS_POLICY, "ttft_ms_mean")
        if _by_seed(doc, cap, "belady", "token_hit_rate"):
            out[f"{e}_belady_vs_lru_hit_pts"] = compare(doc, "belady")["hit_pts"]
    return out
