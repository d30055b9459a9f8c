"""Across-seed statistics: a mean with its 95% interval, and paired differences.

One rule for every interval skv reports (summary tables, ``metrics_summary.csv``, figures):

- the **level** of a metric (its across-seed mean: TTFT, TPOT, E2E, queueing, hit rates,
  token counts) gets a **bootstrap percentile interval** of the mean
  (:func:`scipy.stats.bootstrap`, :data:`N_RESAMPLES` resamples, a numpy Generator seeded with
  :data:`BOOTSTRAP_SEED`, so the same runs always give byte-identical tables). A percentile
  interval never leaves the range of the seeds' values: no negative TTFT, no hit rate above 1,
  and no normality assumption for skewed latencies (the Student-t interval put TTFT at
  -751.6 ms with 3 seeds). With one seed, or identical values, the interval is the value;
  ``std`` is None with one seed, and readers treat ``n < 2`` as "no interval".
- a **paired difference** between two policies (same seed = same trace) keeps the
  **Student-t** interval of the mean difference: it is signed and roughly symmetric, and with
  few seeds the t interval is the wider, conservative one, so "distinguishable" (the interval
  excludes 0) is not over-claimed. With one seed it is None.

With few seeds (< 5) a percentile bootstrap is narrower than the true 95% interval; the
reports say how many seeds every interval rests on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.95
#: resamples per bootstrap interval, and the seed of the Generator that draws them
N_RESAMPLES = 9999
BOOTSTRAP_SEED = 0


def _clean(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def bootstrap_ci(
    values: Sequence[float], *, seed: int = BOOTSTRAP_SEED, n_resamples: int = N_RESAMPLES
) -> tuple[float, float] | None:
    """95% bootstrap percentile interval of the mean of ``values`` (None when empty).

    One value or identical values give ``(value, value)`` without asking scipy (which warns on
    degenerate samples). Seeded with a fresh ``numpy.random.default_rng(seed)`` per call, so the
    interval depends only on the values.
    """
    xs = _clean(values)
    if not xs:
        return None
    if len(xs) == 1 or min(xs) == max(xs):
        return xs[0], xs[0]
    import numpy as np
    from scipy import stats  # imported here: the CLI loads this module on every command

    res = stats.bootstrap(
        (np.asarray(xs),),
        np.mean,
        confidence_level=CONFIDENCE,
        method="percentile",
        n_resamples=n_resamples,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    # the mean of a resample lies within [min, max]; rounding must not step outside it
    return max(lo, min(xs)), min(hi, max(xs))


def mean_ci(
    values: Sequence[float | None], *, method: str = "bootstrap"
) -> dict[str, float | int | None]:
    """``n``, ``mean``, ``std`` (ddof 1) and the 95% interval of the mean.

    ``method`` ``"bootstrap"`` (levels; see the module doc) or ``"t"`` (Student t, used for
    paired differences; None with fewer than two values). Identical values give a zero-width
    interval either way.
    """
    if method not in ("bootstrap", "t"):
        raise ValueError(f"mean_ci: method {method!r}; use 'bootstrap' or 't'")
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95_low": None, "ci95_high": None}
    if min(xs) == max(xs):  # exactly the value: fsum / n may be an ulp off (0.1 * 3 / 3)
        return {
            "n": n,
            "mean": xs[0],
            "std": 0.0 if n > 1 else None,
            "ci95_low": xs[0] if method == "bootstrap" or n > 1 else None,
            "ci95_high": xs[0] if method == "bootstrap" or n > 1 else None,
        }
    mean = math.fsum(xs) / n
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    if method == "bootstrap":
        lo, hi = bootstrap_ci(xs)  # type: ignore[misc]
        return {"n": n, "mean": mean, "std": std, "ci95_low": lo, "ci95_high": hi}
    from scipy import stats

    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half}


def half_width(s: dict[str, float | int | None]) -> float | None:
    """Upper half-width of a symmetric (Student-t) interval; bootstrap intervals are not
    symmetric, so reports print them as ``[low, high]``."""
    if s.get("ci95_high") is None or s.get("mean") is None:
        return None
    return float(s["ci95_high"]) - float(s["mean"])  # type: ignore[arg-type]


def paired_diff(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and 95% Student-t CI of ``a[i] - b[i]`` (same seed = same workload trace, so pairing
    removes the trace-to-trace variance both policies share)."""
    return mean_ci([x - y for x, y in zip(a, b, strict=True)], method="t")


def interval(values: Sequence[float], *, method: str = "t") -> dict[str, Any]:
    """Mean over seeds with its 95% interval in the claims.json shape: Student t for paired
    differences (the default), ``method="bootstrap"`` for levels (the rule of
    this module). A single value gets a zero-width interval: one seed gives no
    spread estimate, and says so with n=1 (claims then refuse it: they need 5 seeds)."""
    s = mean_ci(values, method=method)
    lo = s["ci95_low"] if s["ci95_low"] is not None else s["mean"]
    hi = s["ci95_high"] if s["ci95_high"] is not None else s["mean"]
    return {"value": s["mean"], "ci95": [lo, hi], "n": s["n"]}
