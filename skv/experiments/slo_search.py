"""The highest offered rate that meets a latency SLO, by bisection on the rate.

Shared by the CacheRoute study (simulated clusters) and the fidelity-under-load study (a real
engine and the simulator, searched the same way). ``measure(rate)`` runs one load point and
returns its metrics; the SLO holds at a rate when ``measure(rate)[key] <= slo_ms``.

The bracket starts at ``[lo, hi]``; ``hi`` doubles while it still meets the SLO (at most
``max_doublings`` times); ``lo`` failing means the answer is below ``lo`` (reported as 0 with
the flag ``below_lo``). Bisection stops when the bracket is narrower than ``rel_tol`` of its
upper end. It assumes the metric grows with the rate (common random numbers, the same requests
compressed in time, make that nearly so) and reports every point it evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def max_qps(
    measure: Callable[[float], dict[str, float]],
    slo_ms: float,
    *,
    lo: float,
    hi: float,
    rel_tol: float = 0.02,
    max_doublings: int = 4,
    key: str = "ttft_ms_p99",
) -> dict[str, Any]:
    """The highest rate with ``measure(rate)[key] <= slo_ms`` (see module docstring).

    Returns ``qps`` (0 when even ``lo`` misses), ``below_lo``, ``above_hi`` (``hi`` still met
    the SLO after every doubling: the answer is at least ``qps``), the metrics at ``qps``
    (``at``) and every evaluated ``points`` (rate, p99, hit rate) in evaluation order."""
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got lo={lo}, hi={hi}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol}")
    points: list[dict[str, float]] = []

    def ok(rate: float) -> tuple[bool, dict[str, float]]:
        m = measure(rate)
        points.append({"rate": rate, **m})
        return m[key] <= slo_ms, m

    good, at = ok(lo)
    if not good:
        return {"qps": 0.0, "below_lo": True, "above_hi": False, "at": at, "points": points}
    best, best_m = lo, at
    for _ in range(max_doublings + 1):
        good, m = ok(hi)
        if not good:
            break
        best, best_m, lo, hi = hi, m, hi, hi * 2
    else:
        return {"qps": best, "below_lo": False, "above_hi": True, "at": best_m, "points": points}
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        good, m = ok(mid)
        if good:
            lo, best, best_m = mid, mid, m
        else:
            hi = mid
    return {"qps": best, "below_lo": False, "above_hi": False, "at": best_m, "points": points}
