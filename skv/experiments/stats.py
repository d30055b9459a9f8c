"""Across-seed statistics: mean with a Student-t 95% confidence interval, paired differences."""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE = 0.95


def _clean(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_ci(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """``n``, ``mean``, ``std`` (ddof 1) and the 95% Student-t interval of the mean.

    With fewer than two values the interval (and ``std``) is ``None``: one seed gives no
    estimate of seed-to-seed spread. Identical values give a zero-width interval.
    """
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95_low": None, "ci95_high": None}
    mean = math.fsum(xs) / n
    if n < 2:
        return {"n": 1, "mean": mean, "std": None, "ci95_low": None, "ci95_high": None}
    from scipy import stats  # imported here: the CLI loads this module on every command

    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half}


def half_width(s: dict[str, float | int | None]) -> float | None:
    if s.get("ci95_high") is None or s.get("mean") is None:
        return None
    return float(s["ci95_high"]) - float(s["mean"])  # type: ignore[arg-type]


def paired_diff(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and 95% CI of ``a[i] - b[i]`` (same seed = same workload trace, so pairing removes
    the trace-to-trace variance both policies share)."""
    return mean_ci([x - y for x, y in zip(a, b, strict=True)])
