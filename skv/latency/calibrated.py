"""A latency model fitted to measured TTFTs, so simulated TTFT matches a real engine.

Observations are ``(uncached_tokens, cached_tokens, ttft_ms)`` triples, e.g. from a trace whose
requests carry ``observed_ttft_ms`` and ``observed_cached_tokens`` (vLLM reports both). The model::

    ttft_ms = a + b * uncached_tokens + c * cached_tokens        (a, b, c >= 0)

``a`` is the fixed cost of a step, ``b`` the marginal cost of a computed prompt token, and ``c``
the cost of attending to cached context (a hit is cheap but not free). The coefficients are
fitted by bounded linear least squares (``scipy.optimize.lsq_linear``), so a noisy trace cannot
produce a negative cost; ``c`` can be fixed at 0 (``cached_term=False``) to get the seed's
two-parameter model.

The fitted model prices a whole iteration the same way, with constants that TTFT data cannot
identify::

    iteration_ms = a + b * prefill_tokens + c * sum(context_before)
                   + ms_per_prefill_attention_kpair * sum(tokens * (context_before + tokens/2))/1e3
                   + decode_ms_per_seq * decode_seqs
                   + ms_per_decode_context_token * decode_context_tokens

The attention term counts the (query, key) pairs a prefill chunk computes, causal within the
chunk: on a CPU engine a 512-token chunk after 768 cached tokens took 2.7x one after none
(measured, tiny model). ``decode_ms_per_seq`` defaults to ``b`` (a decoding request adds about
as much as one more prompt token to a batch) and the attention and decode-context costs to 0; a
lone prefill reproduces the fitted TTFT exactly. :func:`fit_iterations` fits all six constants
from measured ENGINE STEPS instead
(isolated prefills and decode batches of a profiling run, see
:mod:`skv.experiments.fidelity.load`): the way to price decode steps right.

Only no-queueing TTFTs should be fitted: a TTFT measured under load includes waiting time, which
this model does not have. :func:`fit_from_requests` therefore keeps only the requests that found
the engine idle (:func:`idle_requests`) and says how many it dropped; the residual summary in
``report()`` is the check.
"""

from __future__ import annotations

import dataclasses
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
    " + ms_per_cached_token * sum_chunks(context_before)"
    " + ms_per_prefill_attention_kpair * sum_chunks(tokens * (context_before + tokens / 2)) / 1000"
    " + decode_ms_per_seq * decode_seqs"
    " + ms_per_decode_context_token * decode_context_tokens;"
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
    #: attention over the decoding requests' KV, per context token (0: not modelled)
    ms_per_decode_context_token: float = 0.0
    #: prefill attention, per thousand (query, key) token pairs (0: not modelled)
    ms_per_prefill_attention_kpair: float = 0.0
    #: fit statistics carried along for describe(); empty when coefficients were given by hand
    fit_info: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.decode_ms_per_seq is None:
            object.__setattr__(self, "decode_ms_per_seq", self.ms_per_uncached_token)
        for key in (
            "base_ms",
            "ms_per_uncached_token",
            "ms_per_cached_token",
            "decode_ms_per_seq",
            "ms_per_decode_context_token",
            "ms_per_prefill_attention_kpair",
        ):
            value = getattr(self, key)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
                raise ValueError(f"calibrated latency: {key} must be finite and >= 0, got {value}")

    def iteration_ms(self, it: Iteration) -> float:
        prefill_tokens = 0
        context = 0
        pairs = 0.0
        for c in it.prefill:
            prefill_tokens += c.tokens
            context += c.context_before
            pairs += c.tokens * (c.context_before + c.tokens / 2)
        return (
            self.base_ms
            + self.ms_per_uncached_token * prefill_tokens
            + self.ms_per_cached_token * context
            + self.ms_per_prefill_attention_kpair * pairs / 1000.0
            + self.decode_ms_per_seq * it.decode_seqs  # type: ignore[operator]
            + self.ms_per_decode_context_token * it.decode_context_tokens
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
                "ms_per_decode_context_token": self.ms_per_decode_context_token,
                "ms_per_prefill_attention_kpair": self.ms_per_prefill_attention_kpair,
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
    #: requests left out because they arrived while an earlier one was in the engine
    excluded_busy: int = 0

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
            "excluded_busy": self.excluded_busy,
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


def idle_requests(requests: Sequence[Any]) -> tuple[list[Any], int]:
    """The requests that found the engine idle, and how many did not.

    A request starts when it was sent (``extra["sent_s"]``, which ``skv vllm replay-trace``
    records: a sequential replay sends later than the trace's times) or else at ``arrival_s``.
    It found the engine idle when it started after every earlier request had finished: at its
    start plus ``extra["observed_e2e_ms"]`` where recorded, else plus ``observed_ttft_ms``, a
    lower bound (the request was in the engine at least until its first token). One without
    any observation leaves no busy time behind (nothing says how long it ran).
    """

    def start(req: Any) -> float:
        sent = (req.extra or {}).get("sent_s")
        return float(sent) if isinstance(sent, int | float) else req.arrival_s

    busy_until = -math.inf
    kept: list[Any] = []
    dropped = 0
    for req in sorted(requests, key=start):
        t = start(req)
        if t >= busy_until:
            kept.append(req)
        else:
            dropped += 1
        e2e = (req.extra or {}).get("observed_e2e_ms")
        span = e2e if isinstance(e2e, int | float) else req.observed_ttft_ms
        if span is not None:
            busy_until = max(busy_until, t + float(span) / 1000.0)
    return kept, dropped


def fit_from_requests(
    requests: Iterable[Any], *, cached_term: bool = True, idle_only: bool = True
) -> CalibratedFit:
    """Fit from ``skv.model.Request`` objects that carry observed TTFT and cached tokens.

    Requests without ``observed_ttft_ms`` or ``observed_cached_tokens`` are skipped (a TTFT
    without its hit count cannot be split into the uncached and cached terms). With
    ``idle_only`` (the default) only the requests that found the engine idle are fitted
    (:func:`idle_requests`): a TTFT measured behind other requests includes their time, which a
    per-iteration cost must not absorb. Too few idle requests is an error that says so.
    """
    requests = list(requests)
    excluded = 0
    if idle_only:
        requests, excluded = idle_requests(requests)
        if excluded:
            log.warning(
                "calibrated fit: %d request(s) arrived while an earlier one was still in the "
                "engine; fitting only the %d that found it idle",
                excluded,
                len(requests),
            )
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
        queued = (
            f"; {excluded} more arrived while an earlier request was in the engine, and a TTFT "
            "measured under load holds queueing a per-iteration cost must not absorb: calibrate "
            "from a sequential run (skv vllm replay-trace --concurrency 1) or a profiling run"
            if excluded
            else ""
        )
        raise ValueError(
            f"calibrated fit: only {len(rows)} request(s) carry both observed_ttft_ms and "
            f"observed_cached_tokens and found the engine idle ({skipped} without "
            f"observations){queued}; need at least {MIN_OBSERVATIONS}"
        )
    if skipped:
        log.info("calibrated fit: skipped %d request(s) without observations", skipped)
    out = fit(rows, cached_term=cached_term)
    return dataclasses.replace(out, excluded_busy=excluded)


# ---------------------------------------------------------------------- engine steps

#: the features of :func:`fit_iterations`, in the order of its design matrix
ITERATION_FEATURES = (
    "base_ms",
    "ms_per_uncached_token",
    "ms_per_cached_token",
    "ms_per_prefill_attention_kpair",
    "decode_ms_per_seq",
    "ms_per_decode_context_token",
)


@dataclass(frozen=True)
class IterationObservation:
    """One measured engine step: what it computed and how long it took (ms).

    ``prefill_tokens`` are computed this step, ``prefill_context`` the KV tokens those chunks
    attend to before them (cache hits and earlier chunks), ``decode_seqs`` the requests decoding
    one token and ``decode_context`` the KV tokens they attend to, summed."""

    prefill_tokens: int
    prefill_context: int
    decode_seqs: int
    decode_context: int
    ms: float
    kind: str = ""

    @property
    def features(self) -> list[float]:
        """The row of :func:`fit_iterations`' design matrix (:data:`ITERATION_FEATURES`)."""
        u, c = self.prefill_tokens, self.prefill_context
        return [1.0, u, c, u * (c + u / 2) / 1000.0, self.decode_seqs, self.decode_context]


@dataclass(frozen=True)
class IterationFit:
    """:func:`fit_iterations`' result: the constants, how well they fit, the residuals."""

    params: dict[str, float]
    r2: float
    mape_pct: float
    n: int
    residuals_ms: np.ndarray

    def to_model(self) -> CalibratedLatency:
        return CalibratedLatency(
            **self.params,
            fit_info=(("r2", self.r2), ("n", float(self.n)), ("mape_pct", self.mape_pct)),
        )

    def report(self) -> dict[str, Any]:
        return {
            "model": CalibratedLatency.name,
            "formula": FORMULA,
            "fitted_on": "engine steps of a profiling run (isolated prefills, decode batches)",
            "weights": "1 / sqrt(step ms): between equal relative errors and equal ms",
            "params": dict(self.params),
            "r2": self.r2,
            "mape_pct": self.mape_pct,
            "n": self.n,
        }


def fit_iterations(observations: Sequence[IterationObservation]) -> IterationFit:
    """Fit :data:`ITERATION_FEATURES` (all >= 0) to measured steps by bounded least squares,
    each row weighted by ``1 / sqrt(ms)``: between equal relative errors (a 5 ms decode step
    would count as much as an 80 ms prefill, and the prefills' total time comes out low) and
    equal absolute errors (the many short steps would be fitted loosely). A step's noise grows
    with its length, so plain least squares would chase the long ones. Needs at least one
    observation per feature, and prefill and decode rows both (else the base cost and the
    per-token costs are not separable)."""
    from scipy.optimize import lsq_linear

    obs = list(observations)
    k = len(ITERATION_FEATURES)
    if len(obs) < k:
        raise ValueError(f"iteration fit: need at least {k} steps, got {len(obs)}")
    if not any(o.prefill_tokens for o in obs) or not any(o.decode_seqs for o in obs):
        raise ValueError("iteration fit: needs steps with prefill tokens and steps with decodes")
    x = np.array([o.features for o in obs], dtype=float)
    y = np.array([o.ms for o in obs], dtype=float)
    if not np.isfinite(x).all() or not np.isfinite(y).all() or (y <= 0).any() or (x < 0).any():
        raise ValueError("iteration fit: steps need finite, non-negative counts and times > 0")
    w = 1.0 / np.sqrt(y)
    design = x * w[:, None]
    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    res = lsq_linear(design / scale, y * w, bounds=(0.0, np.inf), method="bvls")
    coef = res.x / scale
    fitted = x @ coef
    residuals = y - fitted
    centred = y - y.mean()
    ss_tot = float(centred @ centred)
    r2 = 1.0 - float(residuals @ residuals) / ss_tot if ss_tot > 0 else 1.0
    mape = float(np.mean(np.abs(residuals) / y) * 100.0)
    params = {name: float(c) for name, c in zip(ITERATION_FEATURES, coef, strict=True)}
    out = IterationFit(params, r2, mape, len(obs), residuals)
    log.info("iteration fit on %d steps: %s; R^2 %.3f, MAPE %.1f%%", len(obs), params, r2, mape)
    return out
