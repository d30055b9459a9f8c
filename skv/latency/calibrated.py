"""A latency model fitted to measured TTFTs, so simulated TTFT matches a real engine.

Observations are ``(uncached_tokens, cached_tokens, ttft_ms)`` triples, e.g. from a trace whose
requests carry ``observed_ttft_ms`` and ``observed_cached_tokens`` (vLLM reports both). The model::

    ttft_ms = a + b * uncached_tokens + c * cached_tokens        (a, b, c >= 0)

``a`` is the fixed cost of a step, ``b`` the marginal cost of a computed prompt token, and ``c``
the cost of attending to cached context (a hit is cheap but not free). The coefficients are
fitted by bounded linear least squares (``scipy.optimize.lsq_linear``), so a noisy trace cannot
produce a negative cost; ``c`` can be fixed at 0 (``cached_term=False``) to get the seed's
two-parameter model.

The fitted model prices a whole iteration the same way, with one extra constant that TTFT data
cannot identify::

    iteration_ms = a + b * prefill_tokens + c * sum(context_before)
                   + decode_ms_per_seq * decode_seqs

``decode_ms_per_seq`` defaults to ``b`` (a decoding request adds about as much as one more prompt
token to a batch); measure it from inter-token latency where that matters. A lone prefill
reproduces the fitted TTFT exactly.

Only no-queueing TTFTs should be fitted: a TTFT measured under load includes waiting time, which
this model does not have. The residual summary in ``report()`` is the check.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from skv.latency.base import Iteration, LatencyModel

log = logging.getLogger(__name__)

MIN_OBSERVATIONS = 3

FORMULA = (
    "iteration_ms = base_ms + ms_per_uncached_token * prefill_tokens"
    " + ms_per_cached_token * sum_chunks(context_before) + decode_ms_per_seq * decode_seqs;"
    " lone-request TTFT = base_ms + ms_per_uncached_token * uncached"
    " + ms_per_cached_token * cached"
)


@dataclass(frozen=True)
class CalibratedLatency(LatencyModel):
    """The fitted linear model, usable by the simulator; see the module docstring."""

    name: ClassVar[str] = "calibrated"
    formula: ClassVar[str] = FORMULA

    base_ms: float
    ms_per_uncached_token: float
    ms_per_cached_token: float = 0.0
    decode_ms_per_seq: float | None = None  # None -> ms_per_uncached_token
    #: fit statistics carried along for describe(); empty when coefficients were given by hand
    fit_info: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.decode_ms_per_seq is None:
            object.__setattr__(self, "decode_ms_per_seq", self.ms_per_uncached_token)
        for key in ("base_ms", "ms_per_uncached_token", "ms_per_cached_token", "decode_ms_per_seq"):
            value = getattr(self, key)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
                raise ValueError(f"calibrated latency: {key} must be finite and >= 0, got {value}")

    def iteration_ms(self, it: Iteration) -> float:
        prefill_tokens = 0
        context = 0
        for c in it.prefill:
            prefill_tokens += c.tokens
            context += c.context_before
        return (
            self.base_ms
            + self.ms_per_uncached_token * prefill_tokens
            + self.ms_per_cached_token * context
            + self.decode_ms_per_seq * it.decode_seqs  # type: ignore[operator]
        )

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.name,
            "formula": self.formula,
            "constants": {
                "base_ms": self.base_ms,
                "ms_per_uncached_token": self.ms_per_uncached_token,
                "ms_per_cached_token": self.ms_per_cached_token,
                "decode_ms_per_seq": self.decode_ms_per_seq,
            },
        }
        if self.fit_info:
            out["fit"] = dict(self.fit_info)
        return out


@dataclass(frozen=True)
class CalibratedFit:
    """Result of ``fit``: coefficients, goodness of fit and per-observation residuals.

    ``residuals_ms = observed - fitted``, one per observation, in input order.
    """

    base_ms: float
    ms_per_uncached_token: float
    ms_per_cached_token: float
    r2: float
    residuals_ms: np.ndarray
    n: int
    cached_term: bool

    @property
    def params(self) -> dict[str, float]:
        return {
            "base_ms": self.base_ms,
            "ms_per_uncached_token": self.ms_per_uncached_token,
            "ms_per_cached_token": self.ms_per_cached_token,
        }

    def predict_ms(self, uncached_tokens: Any, cached_tokens: Any = 0) -> Any:
        """Fitted TTFT; accepts scalars or arrays."""
        return (
            self.base_ms
            + self.ms_per_uncached_token * np.asarray(uncached_tokens, dtype=float)
            + self.ms_per_cached_token * np.asarray(cached_tokens, dtype=float)
        )

    def residual_summary(self) -> dict[str, float]:
        """Mean residual (bias) and the mean, median, p95 and max of absolute residuals (ms)."""
        r = self.residuals_ms
        a = np.abs(r)
        return {
            "mean_ms": float(r.mean()),
            "mean_abs_ms": float(a.mean()),
            "p50_abs_ms": float(np.percentile(a, 50)),
            "p95_abs_ms": float(np.percentile(a, 95)),
            "max_abs_ms": float(a.max()),
        }

    def report(self) -> dict[str, Any]:
        """JSON-serialisable summary: formula, coefficients, R^2, n and residual summary."""
        return {
            "model": CalibratedLatency.name,
            "formula": "ttft_ms = base_ms + ms_per_uncached_token * uncached"
            + (" + ms_per_cached_token * cached" if self.cached_term else " (cached term fixed 0)"),
            "params": self.params,
            "r2": self.r2,
            "n": self.n,
            "residuals": self.residual_summary(),
        }

    def report_text(self) -> str:
        """One paragraph for logs and summaries."""
        s = self.residual_summary()
        return (
            f"calibrated TTFT fit on n={self.n}: ttft_ms = {self.base_ms:.3f}"
            f" + {self.ms_per_uncached_token:.5f} * uncached"
            f" + {self.ms_per_cached_token:.6f} * cached; R^2={self.r2:.4f};"
            f" |residual| mean {s['mean_abs_ms']:.2f} ms, p50 {s['p50_abs_ms']:.2f} ms,"
            f" p95 {s['p95_abs_ms']:.2f} ms, bias {s['mean_ms']:+.2f} ms"
        )

    def to_model(self, decode_ms_per_seq: float | None = None) -> CalibratedLatency:
        """A ``LatencyModel`` whose lone-prefill TTFT equals this fit's prediction."""
        return CalibratedLatency(
            base_ms=self.base_ms,
            ms_per_uncached_token=self.ms_per_uncached_token,
            ms_per_cached_token=self.ms_per_cached_token,
            decode_ms_per_seq=decode_ms_per_seq,
            fit_info=(("r2", self.r2), ("n", float(self.n))),
        )


def fit(
    observations: Iterable[Sequence[float]] | np.ndarray, *, cached_term: bool = True
) -> CalibratedFit:
    """Fit ``ttft = a + b * uncached + c * cached`` with a, b, c >= 0.

    ``observations`` are ``(uncached_tokens, cached_tokens, ttft_ms)`` rows. ``cached_term=False``
    fixes c = 0. If no observation has cached tokens, c is not identifiable and is fixed at 0.
    """
    from scipy.optimize import lsq_linear

    if not isinstance(observations, np.ndarray):
        observations = list(observations)
    obs = np.asarray(observations, dtype=float)
    if obs.ndim != 2 or obs.shape[1] != 3:
        if obs.size == 0:
            obs = obs.reshape(0, 3)
        else:
            raise ValueError(
                f"calibrated fit: observations must be (uncached_tokens, cached_tokens, ttft_ms) "
                f"rows, got an array of shape {obs.shape}"
            )
    n = obs.shape[0]
    if n < MIN_OBSERVATIONS:
        raise ValueError(f"calibrated fit: need at least {MIN_OBSERVATIONS} observations, got {n}")
    if not np.isfinite(obs).all():
        raise ValueError("calibrated fit: observations contain NaN or infinite values")
    if (obs < 0).any():
        raise ValueError("calibrated fit: token counts and TTFTs must be >= 0")
    uncached, cached, ttft = obs[:, 0], obs[:, 1], obs[:, 2]
    if cached_term and not cached.any():
        log.info("calibrated fit: no observation has cached tokens; fixing ms_per_cached_token=0")
        cached_term = False
    columns = [np.ones(n), uncached] + ([cached] if cached_term else [])
    design = np.column_stack(columns)
    if np.linalg.matrix_rank(design) < design.shape[1]:
        log.warning(
            "calibrated fit: the observations do not vary enough to identify every coefficient "
            "(e.g. all prompts the same length); the fit is one of many equally good ones"
        )
    # scale columns so token counts (~1e3) and the intercept (1) condition alike
    scale = np.maximum(np.abs(design).max(axis=0), 1.0)
    result = lsq_linear(design / scale, ttft, bounds=(0.0, np.inf), method="bvls")
    coef = result.x / scale
    fitted = design @ coef
    residuals = ttft - fitted
    ss_res = float(residuals @ residuals)
    centred = ttft - ttft.mean()
    ss_tot = float(centred @ centred)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-12 else 0.0)
    out = CalibratedFit(
        base_ms=float(coef[0]),
        ms_per_uncached_token=float(coef[1]),
        ms_per_cached_token=float(coef[2]) if cached_term else 0.0,
        r2=r2,
        residuals_ms=residuals,
        n=n,
        cached_term=cached_term,
    )
    log.info("%s", out.report_text())
    return out


def fit_from_requests(requests: Iterable[Any], *, cached_term: bool = True) -> CalibratedFit:
    """Fit from ``skv.model.Request`` objects that carry observed TTFT and cached tokens.

    Requests without ``observed_ttft_ms`` or ``observed_cached_tokens`` are skipped (a TTFT
    without its hit count cannot be split into the uncached and cached terms).
    """
    rows: list[tuple[float, float, float]] = []
    skipped = 0
    for req in requests:
        if req.observed_ttft_ms is None or req.observed_cached_tokens is None:
            skipped += 1
            continue
        prompt = req.prompt_tokens
        cached = req.observed_cached_tokens
        if cached > prompt:
            raise ValueError(
                f"request {req.request_id}: observed_cached_tokens={cached} exceeds its "
                f"prompt_tokens={prompt}; check the trace's token counts"
            )
        rows.append((prompt - cached, cached, req.observed_ttft_ms))
    if len(rows) < MIN_OBSERVATIONS:
        raise ValueError(
            f"calibrated fit: only {len(rows)} request(s) carry both observed_ttft_ms and "
            f"observed_cached_tokens ({skipped} skipped); need at least {MIN_OBSERVATIONS}"
        )
    if skipped:
        log.info("calibrated fit: skipped %d request(s) without observations", skipped)
    return fit(rows, cached_term=cached_term)
