"""The latency model of the fidelity-under-load study, fitted on a profiling run and frozen.

Two kinds of measured engine steps make the rows of
:func:`skv.latency.calibrated.fit_iterations`:

- an isolated prefill (one request, nothing else in the engine): its step lasts from the engine
  core queueing the request to the first token (both engine-core timestamps: scheduling, the
  model, and reading its output back), with the request's computed and cached tokens as vLLM
  reported them;
- a step of a decode batch: consecutive steps of one profiling batch that decode the same
  number of requests and prefill nothing (the step logger's records); its length is the time
  between the frontend's records of the two steps, its decode context the batch's prompts plus
  the tokens each request had received by then.

The frontend's own time (vLLM's TTFT minus the engine step for the isolated prefills: the
request's trip to the engine core and the first token's trip back) is measured on the same
requests and added to simulated TTFT and E2E as a constant. Nothing here reads the evaluation
stages.

The machine's speed drifts (on the 2-core reference VM the same prefill took 20-50% longer for
minutes at a time), so a frozen model can be off at a stage for reasons that are not the
simulator's. :func:`speed_factor` reads a short probe of isolated requests sent right before a
stage (:func:`skv.experiments.fidelity.load_workload.speed_probe`; never a request of the stage)
and says how much slower than the model the engine ran then. It is reported beside each stage's
errors as a diagnostic, never used to correct the model: a one-second probe is as noisy as the
drift it measures (scaling the model by it overcorrected by up to 80% in a trial run).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import numpy as np

from skv.latency.calibrated import IterationFit, IterationObservation, fit_iterations


def lone_observations(requests: Iterable[dict[str, Any]]) -> list[IterationObservation]:
    """One step per isolated profiling prefill (``lone*`` ids, each the only request in the
    engine): computed tokens, cached context, and first token minus queueing, in ms."""
    out = []
    for r in requests:
        if not str(r["id"]).startswith("lone") or r.get("error"):
            continue
        if r.get("queued") is None or r.get("first_token") is None:
            continue
        cached = int(r.get("cached_tokens") or 0)
        ms = (r["first_token"] - r["queued"]) * 1000.0
        if ms > 0:
            out.append(
                IterationObservation(r["prompt_tokens"] - cached, cached, 0, 0, ms, "prefill")
            )
    return out


def batch_observations(
    requests: list[dict[str, Any]], steps: list[dict[str, Any]], batch: int
) -> list[IterationObservation]:
    """Decode steps of one profiling batch of ``batch`` requests (see the module doc): a step
    counts when it and the step before it decode exactly ``batch`` requests and prefill none,
    so the gap between their records is one decode step of the whole batch. A gap shorter than
    the step's own model time means the frontend handled two records at once: dropped.

    Order in vLLM's frontend: a step's record is made before its tokens reach the request
    streams, so the tokens each request holds when step ``s`` runs are those received by
    ``s``'s own record (the previous step's tokens arrive between the two records)."""
    times = {r["id"]: r["token_times"] for r in requests if not r.get("error")}
    prompt = {r["id"]: r["prompt_tokens"] for r in requests}
    out = []
    for prev, s in pairwise(steps):
        if s["ctx_tokens"] or prev["ctx_tokens"]:
            continue
        if s["gen_requests"] != batch or prev["gen_requests"] != batch:
            continue
        ms = (s["t"] - prev["t"]) * 1000.0
        if not ms > 0 or ms < s.get("model_ms", 0.0):
            continue
        context = sum(prompt[i] + bisect.bisect_right(ts, s["t"]) for i, ts in times.items())
        out.append(IterationObservation(0, 0, batch, context, ms, "decode"))
    return out


def frontend_ms(requests: Iterable[dict[str, Any]]) -> float:
    """Mean frontend time of the isolated prefills: vLLM's TTFT minus the engine step (arrival
    to the engine core queueing it, plus the first token's output processing)."""
    xs = [
        (r["ttft_vllm"] - (r["first_token"] - r["queued"])) * 1000.0
        for r in requests
        if str(r["id"]).startswith("lone")
        and not r.get("error")
        and r.get("ttft_vllm") is not None
        and r.get("first_token") is not None
        and r.get("queued") is not None
    ]
    if not xs:
        raise ValueError("no isolated prefill with vLLM's timings to measure the frontend on")
    return float(np.mean(xs))


def calibrate(
    lone: list[dict[str, Any]],
    batches: dict[tuple[int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
) -> tuple[IterationFit, float, list[IterationObservation]]:
    """Fit the model on the profiling run: ``lone`` request rows, and per (batch size, prompt
    tokens) the batch's ``(request rows, step rows)``. Returns the fit, the frontend constant
    (ms) and the rows."""
    rows = lone_observations(lone)
    for (b, _), (reqs, steps) in sorted(batches.items()):
        rows.extend(batch_observations(reqs, steps, b))
    fit = fit_iterations(rows)
    return fit, frontend_ms(lone), rows


def speed_factor(requests: Iterable[dict[str, Any]], model: Any) -> float:
    """How much slower than ``model`` the engine ran the speed probe: the geometric mean, over
    the probe's isolated prefills (first token minus queueing) and its decode steps (time per
    output token of the lone decoding request), of measured / priced. 1.0 = as calibrated."""
    from skv.latency.base import Iteration

    logs = []
    for r in requests:
        if r.get("error") or r.get("first_token") is None or r.get("queued") is None:
            continue
        cached = int(r.get("cached_tokens") or 0)
        step = (r["first_token"] - r["queued"]) * 1000.0
        price = model.ttft_ms(r["prompt_tokens"] - cached, cached)
        if step > 0 and price > 0:
            logs.append(np.log(step / price))
        n = int(r.get("output_tokens") or 0)
        if n >= 2 and r.get("last_token") is not None:
            tpot = (r["last_token"] - r["first_token"]) * 1000.0 / (n - 1)
            ctx = r["prompt_tokens"] + n // 2
            price = model.iteration_ms(Iteration((), 1, ctx))
            if tpot > 0 and price > 0:
                logs.append(np.log(tpot / price))
    if not logs:
        raise ValueError("speed probe: no request with the engine's timings")
    return float(np.exp(np.mean(logs)))
