"""Timed trace replay: a recorded trace, with its arrival times, through the serving simulator.

``skv replay`` alone is cache-only (:mod:`skv.replay`: hit rates, no time). With
``--cache-token-budget N`` (or ``--timed --capacity ...``) it replays the same requests through
:func:`skv.sim.simulate` once per (capacity, policy), so every policy sees the same arrivals, and
reports simulated TTFT next to hit rates and tokens saved. ``--calibrate-from-trace`` first fits
the ``calibrated`` latency model to the trace's own ``observed_ttft_ms`` /
``observed_cached_tokens`` (:func:`skv.latency.fit_from_requests`) and reports the fit.

Every TTFT written here is SIMULATED by the named latency model; observed TTFTs, where the
trace has them, are only compared against. Outputs (in ``outputs/traces/<timestamp>_<name>/``
unless ``--output``) hold no timestamps or wall times, so the same inputs give identical files:

- ``replay_results.json``: meta (trace, capacity, latency model and its constants, calibration
  report), one result row per (capacity, policy);
- ``replay_metrics.csv``: the same rows, flat;
- ``replay_summary.md``: what was simulated by what, the fit, the result table, observed vs
  simulated, and which claims the numbers support;
- ``replay_policy_avg_ttft.png``, ``replay_tokens_saved.png``, ``replay_hit_rate.png`` and, only
  when the trace has observed TTFTs, ``observed_vs_simulated_ttft.png``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from skv.blocks import resolve_block_size
from skv.fileio import atomic_dir, atomic_write
from skv.latency import CalibratedFit, LatencyModel, make_latency_model
from skv.model import Request
from skv.replay import compile_trace, resolve_capacities, trace_totals
from skv.sizing import Capacity

log = logging.getLogger(__name__)

DEFAULT_OUT_ROOT = Path("outputs") / "traces"

PLOTS = {
    "avg_ttft": "replay_policy_avg_ttft.png",
    "tokens_saved": "replay_tokens_saved.png",
    "hit_rate": "replay_hit_rate.png",
    "observed": "observed_vs_simulated_ttft.png",
}


# --------------------------------------------------------------------------- mode


def wants_timed(
    *,
    timed: bool = False,
    cache_token_budget: int | None = None,
    calibrate: bool = False,
    latency_model: str | None = None,
) -> bool:
    """True when any option of the timed mode was given."""
    return bool(timed or cache_token_budget is not None or calibrate or latency_model is not None)


# --------------------------------------------------------------------------- the run


@dataclass
class TimedReplay:
    """Everything one timed replay produced (what the writers and plots consume)."""

    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    #: per (capacity, policy) row: simulated TTFT per request, in arrival order
    sim_ttft: list[np.ndarray]
    #: observed TTFT per request in arrival order (NaN where missing), or None if none observed
    observed_ttft: np.ndarray | None
    latency: LatencyModel
    fit: CalibratedFit | None


def build_latency(
    requests: Sequence[Request],
    name: str | None,
    params: dict[str, Any],
    *,
    calibrate: bool,
    model_preset: str | None = None,
) -> tuple[LatencyModel, CalibratedFit | None]:
    """The latency model to simulate with, and the fit when it was calibrated on the trace.

    ``calibrated`` without constants means "fit it from the trace", same as ``calibrate``.
    """
    from skv.latency import fit_from_requests

    if calibrate and name not in (None, "calibrated"):
        raise ValueError(
            f"--calibrate-from-trace fits the calibrated latency model; it conflicts with "
            f"--latency-model {name}"
        )
    name = name or ("calibrated" if calibrate else "linear")
    if name == "calibrated" and (calibrate or not (set(params) - {"decode_ms_per_seq"})):
        fit = fit_from_requests(requests)
        return fit.to_model(decode_ms_per_seq=params.get("decode_ms_per_seq")), fit
    if name == "roofline" and model_preset and "model" not in params:
        params = {**params, "model": model_preset}
    return make_latency_model(name, **params), None


def _observed(ordered: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
    """The TTFTs and cached tokens a real system recorded per request (NaN where none)."""
    obs = np.array(
        [np.nan if r.observed_ttft_ms is None else r.observed_ttft_ms for r in ordered],
        dtype=float,
    )
    obs_cached = np.array(
        [np.nan if r.observed_cached_tokens is None else r.observed_cached_tokens for r in ordered],
        dtype=float,
    )
    return obs, obs_cached


def _result_row(
    spec: str, cap: int, bs: int, replicas: int, policy: str, latency: LatencyModel, res: Any
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray]:
    """One (capacity, policy) row of the results table, and the simulated per-request TTFT,
    cached tokens and lone-prefill TTFT it was computed from."""
    s = res.summary
    ttft = np.array([r["ttft_ms"] for r in res.requests], dtype=float)
    cached = np.array([r["cached_tokens"] for r in res.requests], dtype=float)
    lone = np.array(
        [
            latency.ttft_ms(r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"])
            for r in res.requests
        ],
        dtype=float,
    )
    row: dict[str, Any] = {
        "capacity": spec,
        "capacity_blocks": cap,
        "capacity_tokens": cap * bs,
        "block_size": bs,
        "replicas": replicas,
        "policy": policy,
        "latency_model": latency.name,
        "requests": s["requests"],
        "prompt_tokens": s["prompt_tokens"],
        "tokens_saved": s["cached_tokens"],
        "computed_tokens": s["computed_tokens"],
        "token_hit_rate": s["token_hit_rate"],
        "block_hit_rate": s["block_hit_rate"],
        "sim_ttft_ms_mean": s["ttft_ms_mean"],
        "sim_ttft_ms_p50": s["ttft_ms_p50"],
        "sim_ttft_ms_p90": s["ttft_ms_p90"],
        "sim_ttft_ms_p99": s["ttft_ms_p99"],
        "sim_lone_ttft_ms_mean": float(lone.mean()),
        "sim_queue_ms_mean": s["queue_ms_mean"],
        "sim_e2e_ms_mean": s["e2e_ms_mean"],
        "sim_duration_s": s["duration_s"],
        "evictions": s["evictions"],
        "hit_rate_by_type": s["hit_rate_by_type"],
        "evictions_by_type": s["evictions_by_type"],
    }
    return row, ttft, cached, lone


def run_replay(
    requests: Sequence[Request],
    policies: Sequence[str],
    capacities: Sequence[str],
    latency: LatencyModel,
    *,
    fit: CalibratedFit | None = None,
    block_size: int | None = None,
    mode: str = "prefix",
    salt_by_tenant: bool = False,
    replicas: int = 1,
    router: str = "round_robin",
    max_batch_tokens: int = 8192,
    model_preset: str | None = None,
    meta: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> TimedReplay:
    """Simulate ``requests`` under every (capacity, policy); capacities are per replica.

    Steps: check the policy names, resolve the capacities (shares need the trace's unique
    blocks), simulate each cell in arrival order, tabulate it (:func:`_result_row`), set it
    beside the observed TTFTs where the trace has them (:func:`_vs_observed`)."""
    from skv.policies.registry import policy_class
    from skv.sim import SimConfig, simulate

    if not requests:
        raise ValueError("timed replay: the trace has no requests")
    for policy in policies:
        policy_class(policy)
    bs = resolve_block_size(block_size, requests[0])
    unique = None
    if any(Capacity.parse(c).kind == "fraction" for c in capacities):
        unique = trace_totals(compile_trace(requests, block_size, mode)).unique_blocks
    caps = resolve_capacities(capacities, block_size=bs, unique_blocks=unique, model=model_preset)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    ordered = [requests[i] for i in order]
    obs, obs_cached = _observed(ordered)
    has_obs = bool(np.isfinite(obs).any())
    rows: list[dict[str, Any]] = []
    sims: list[np.ndarray] = []
    for spec, cap in caps:
        for policy in policies:
            config = SimConfig(
                policy=policy,
                capacity_blocks=cap,
                block_size=block_size,
                mode=mode,
                salt_by_tenant=salt_by_tenant,
                replicas=replicas,
                router=router,
                max_batch_tokens=max_batch_tokens,
            )
            res = simulate(ordered, config, latency, progress=progress)
            row, ttft, cached, lone = _result_row(spec, cap, bs, replicas, policy, latency, res)
            row.update(_vs_observed(obs, obs_cached, ttft, cached, lone) if has_obs else {})
            rows.append(row)
            sims.append(ttft)
            log.info(
                "%s @ %s (%d blocks): simulated mean TTFT %.2f ms, token hit rate %.4f",
                policy,
                spec,
                cap,
                row["sim_ttft_ms_mean"],
                row["token_hit_rate"],
            )
    full_meta: dict[str, Any] = {
        **(meta or {}),
        "simulated": (
            f"TTFT is SIMULATED by the {latency.name} latency model (not measured); cache hits "
            "are simulated by skv's block cache under each policy, replaying the trace's "
            "arrival times"
        ),
        "latency": latency.describe(),
        "calibration": _fit_report(fit) if fit is not None else None,
        "requests": len(ordered),
        "trace_span_s": ordered[-1].arrival_s - ordered[0].arrival_s,
        "prompt_tokens": sum(r.prompt_tokens for r in ordered),
        "observed_requests": int(np.isfinite(obs).sum()),
        "block_size": bs,
        "mode": mode,
        "salt_by_tenant": salt_by_tenant,
        "replicas": replicas,
        "router": router,
        "max_batch_tokens": max_batch_tokens,
        "policies": list(policies),
        "capacity_note": "capacities are per replica",
    }
    return TimedReplay(full_meta, rows, sims, obs if has_obs else None, latency, fit)


def _vs_observed(
    obs: np.ndarray,
    obs_cached: np.ndarray,
    sim: np.ndarray,
    sim_cached: np.ndarray,
    lone: np.ndarray,
) -> dict[str, Any]:
    m = np.isfinite(obs)
    o, s = obs[m], sim[m]
    err = s - o
    corr = float(np.corrcoef(o, s)[0, 1]) if len(o) > 1 and o.std() > 0 and s.std() > 0 else None
    mc = np.isfinite(obs_cached)
    return {
        "observed_requests": int(m.sum()),
        "observed_ttft_ms_mean": float(o.mean()),
        "sim_ttft_ms_mean_on_observed": float(s.mean()),
        "sim_lone_ttft_ms_mean_on_observed": float(lone[m].mean()),
        "ttft_mae_ms": float(np.abs(err).mean()),
        "ttft_bias_ms": float(err.mean()),
        "ttft_corr": corr,
        "observed_cached_tokens": int(obs_cached[mc].sum()),
        "sim_cached_tokens_on_observed": int(sim_cached[mc].sum()),
    }


def _fit_report(fit: CalibratedFit) -> dict[str, Any]:
    rep = fit.report()
    rep["text"] = fit.report_text()
    return rep


# --------------------------------------------------------------------------- writers

CSV_COLUMNS = [
    "capacity",
    "capacity_blocks",
    "capacity_tokens",
    "block_size",
    "replicas",
    "policy",
    "latency_model",
    "requests",
    "prompt_tokens",
    "tokens_saved",
    "computed_tokens",
    "token_hit_rate",
    "block_hit_rate",
    "sim_ttft_ms_mean",
    "sim_ttft_ms_p50",
    "sim_ttft_ms_p90",
    "sim_ttft_ms_p99",
    "sim_lone_ttft_ms_mean",
    "sim_queue_ms_mean",
    "sim_e2e_ms_mean",
    "sim_duration_s",
    "evictions",
    "observed_requests",
    "observed_ttft_ms_mean",
    "sim_ttft_ms_mean_on_observed",
    "sim_lone_ttft_ms_mean_on_observed",
    "ttft_mae_ms",
    "ttft_bias_ms",
    "ttft_corr",
    "observed_cached_tokens",
    "sim_cached_tokens_on_observed",
]


def _clean(v: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, recursively."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    return f"{v:.6f}" if isinstance(v, float) else v


def write_outputs(result: TimedReplay, out_dir: Path) -> list[Path]:
    """Every output file; returns their paths (plots included). All or nothing: written into a
    staging directory that becomes ``out_dir`` at the end (:func:`skv.fileio.atomic_dir`; into
    an existing ``out_dir``, ``replay_results.json`` arrives last)."""
    out_dir = Path(out_dir)
    payload = _clean({"meta": result.meta, "results": result.rows})
    text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
    with atomic_dir(out_dir, last=("replay_results.json",)) as tmp:
        with atomic_write(tmp / "replay_metrics.csv") as f:
            w = csv.DictWriter(
                f, fieldnames=CSV_COLUMNS, lineterminator="\n", extrasaction="ignore"
            )
            w.writeheader()
            for r in result.rows:
                w.writerow({c: _csv_cell(_clean(r.get(c))) for c in CSV_COLUMNS})
        with atomic_write(tmp / "replay_summary.md") as f:
            f.write(format_summary(result))
        plots = [out_dir / p.relative_to(tmp) for p in write_plots(result, tmp)]
        with atomic_write(tmp / "replay_results.json") as f:
            f.write(text)
    names = ("replay_results.json", "replay_metrics.csv", "replay_summary.md")
    return [out_dir / n for n in names] + plots


def _f(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def format_summary(result: TimedReplay) -> str:
    m = result.meta
    lat = m["latency"]
    buf = io.StringIO()
    w = buf.write
    w(f"# Trace replay: {m.get('name', 'trace')}\n\n")
    w(
        f"**TTFT is simulated, not measured**: every TTFT below is computed by the "
        f"`{lat['model']}` latency model. Cache hits are simulated by skv's block cache "
        "under each eviction policy while the trace's requests arrive at their recorded "
        "times. Nothing here ran on a GPU or a real serving engine.\n\n"
    )
    w(f"- trace: `{m.get('trace')}` ({m['requests']} requests over {m['trace_span_s']:.1f} s, ")
    w(f"{m['prompt_tokens']} prompt tokens, {m['observed_requests']} with observed TTFT)\n")
    w(f"- keying: {m['mode']}, block size {m['block_size']} tokens")
    w(", tenant-salted\n" if m["salt_by_tenant"] else "\n")
    w(f"- replicas: {m['replicas']} (router {m['router']}), ")
    w(f"max {m['max_batch_tokens']} tokens per iteration; capacities are per replica\n")
    w(f"- latency model: `{lat['model']}`: {lat['formula']}\n")
    consts = ", ".join(f"{k}={_fmt_const(v)}" for k, v in lat.get("constants", {}).items())
    w(f"- constants: {consts}\n\n")
    cal = m.get("calibration")
    if cal:
        res = cal["residuals"]
        w("## Calibration (fitted from the trace's observed TTFT)\n\n")
        w(f"Fit: `{cal['formula']}` on n={cal['n']} requests, bounded least squares (>= 0).\n\n")
        w("| parameter | value |\n|---|---|\n")
        for k, v in cal["params"].items():
            w(f"| {k} | {v:.6g} |\n")
        w(f"| R^2 | {cal['r2']:.4f} |\n\n")
        w(
            f"Residuals (observed - fitted): bias {res['mean_ms']:+.3f} ms, mean |r| "
            f"{res['mean_abs_ms']:.3f} ms, median |r| {res['p50_abs_ms']:.3f} ms, p95 |r| "
            f"{res['p95_abs_ms']:.3f} ms, max |r| {res['max_abs_ms']:.3f} ms.\n\n"
        )
        if cal["r2"] < 0.8:
            w(
                "Warning: R^2 < 0.8; the linear model explains the observed TTFTs poorly "
                "(queueing in the measurements, or a non-linear engine); treat simulated TTFTs "
                "with care.\n\n"
            )
    w(f"## Results (TTFT simulated by the {lat['model']} latency model)\n\n")
    w(
        "| capacity | blocks | policy | mean TTFT ms | p50 | p90 | p99 | mean queue ms | "
        "lone-prefill TTFT ms | tokens saved | token hit rate | block hit rate | evictions |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in result.rows:
        w(
            f"| {r['capacity']} | {r['capacity_blocks']} | {r['policy']} | "
            f"{_f(r['sim_ttft_ms_mean'])} | {_f(r['sim_ttft_ms_p50'])} | "
            f"{_f(r['sim_ttft_ms_p90'])} | {_f(r['sim_ttft_ms_p99'])} | "
            f"{_f(r['sim_queue_ms_mean'])} | {_f(r['sim_lone_ttft_ms_mean'])} | "
            f"{r['tokens_saved']} | "
            f"{_f(r['token_hit_rate'], 4)} | {_f(r['block_hit_rate'], 4)} | {r['evictions']} |\n"
        )
    w(
        "\nMean TTFT includes simulated queueing and batching; lone-prefill TTFT is the latency "
        "model's no-queueing TTFT for each request's simulated hits (what a calibrated fit "
        "describes).\n\n"
    )
    if result.observed_ttft is not None:
        w("## Observed vs simulated TTFT\n\n")
        w(
            "Over the requests with an observed TTFT. The simulator replays arrivals with its "
            "own cache and batching, so differences mix model error and cache/queueing "
            "differences. Cached tokens: observed = the trace's `observed_cached_tokens`.\n\n"
        )
        w(
            "| capacity | policy | observed mean ms | simulated mean ms | lone-prefill mean ms | "
            "MAE ms | bias ms | corr | observed cached | simulated cached |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n"
        )
        for r in result.rows:
            w(
                f"| {r['capacity']} | {r['policy']} | {_f(r['observed_ttft_ms_mean'])} | "
                f"{_f(r['sim_ttft_ms_mean_on_observed'])} | "
                f"{_f(r['sim_lone_ttft_ms_mean_on_observed'])} | {_f(r['ttft_mae_ms'])} | "
                f"{_f(r['ttft_bias_ms'])} | {_f(r['ttft_corr'], 3)} | "
                f"{r['observed_cached_tokens']} | {r['sim_cached_tokens_on_observed']} |\n"
            )
        w("\n")
    w("## What these numbers support\n\n")
    for cap in dict.fromkeys(r["capacity"] for r in result.rows):
        group = [r for r in result.rows if r["capacity"] == cap]
        best = min(group, key=lambda r: (r["sim_ttft_ms_mean"], r["policy"]))
        most = max(group, key=lambda r: (r["tokens_saved"], r["policy"]))
        w(
            f"- At {cap} per replica: lowest simulated mean TTFT with `{best['policy']}` "
            f"({_f(best['sim_ttft_ms_mean'])} ms); most tokens saved with `{most['policy']}` "
            f"({most['tokens_saved']} of {most['prompt_tokens']}).\n"
        )
    w(
        f'\nValid claim: "On replay of this trace, policy X would have saved more prompt tokens '
        f"and lowered TTFT as simulated by skv's {lat['model']} latency model.\"\n"
        'Invalid claim: "policy X produced this speedup on a real GPU serving engine" (no '
        "engine ran; no real cache was controlled).\n\n"
    )
    w("## Files\n\n")
    w("- `replay_results.json`, `replay_metrics.csv`: the rows above, full precision\n")
    w(f"- `{PLOTS['avg_ttft']}`, `{PLOTS['tokens_saved']}`, `{PLOTS['hit_rate']}`\n")
    if result.observed_ttft is not None:
        w(f"- `{PLOTS['observed']}`\n")
    return buf.getvalue()


def _fmt_const(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return v.get("name", str(v))
    return str(v)


# --------------------------------------------------------------------------- plots


def write_plots(result: TimedReplay, out_dir: Path) -> list[Path]:
    """Bar charts per policy (grouped by capacity) and, with observations, a scatter."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result.rows
    model = result.latency.name
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    caps = list(dict.fromkeys(r["capacity"] for r in rows))
    value = {(r["capacity"], r["policy"]): r for r in rows}
    paths: list[Path] = []

    def save(fig: Figure, name: str) -> None:
        FigureCanvasAgg(fig)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110, metadata={"Software": None})
        paths.append(path)

    def bars(key: str, ylabel: str, title: str, name: str) -> None:
        fig = Figure(figsize=(max(5.0, 1.2 * len(policies) + 2), 3.8))
        ax = fig.add_subplot()
        width = 0.8 / len(caps)
        x = np.arange(len(policies))
        for j, cap in enumerate(caps):
            ys = [value[(cap, p)][key] for p in policies]
            ax.bar(x + (j - (len(caps) - 1) / 2) * width, ys, width, label=f"{cap}/replica")
        ax.set_xticks(x, policies, rotation=20 if len(policies) > 3 else 0)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        save(fig, name)

    bars(
        "sim_ttft_ms_mean",
        "mean TTFT (ms, simulated)",
        f"Average TTFT by policy (simulated by the {model} latency model)",
        PLOTS["avg_ttft"],
    )
    bars(
        "tokens_saved",
        "prompt tokens served from cache",
        "Tokens saved by prefix-cache hits (simulated cache)",
        PLOTS["tokens_saved"],
    )
    bars(
        "token_hit_rate",
        "token hit rate",
        "Token hit rate by policy (simulated cache)",
        PLOTS["hit_rate"],
    )
    if result.observed_ttft is not None:
        obs = result.observed_ttft
        m = np.isfinite(obs)
        fig = Figure(figsize=(5.2, 4.6))
        ax = fig.add_subplot()
        hi = float(np.nanmax(obs))
        for r, sim in zip(rows, result.sim_ttft, strict=True):
            ax.scatter(obs[m], sim[m], s=10, alpha=0.6, label=f"{r['policy']} @ {r['capacity']}")
            hi = max(hi, float(sim[m].max()))
        ax.plot([0, hi], [0, hi], color="grey", lw=1, ls="--", label="y = x")
        ax.set_xlabel("observed TTFT (ms, from the trace)")
        ax.set_ylabel(f"simulated TTFT (ms, {model} model)")
        ax.set_title(f"Observed vs simulated TTFT ({int(m.sum())} requests)", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save(fig, PLOTS["observed"])
    return paths


# --------------------------------------------------------------------------- load, run, write


def default_out_dir(name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    return DEFAULT_OUT_ROOT / f"{stamp}_{name}"


def run_timed(
    trace: str | Path,
    policies: Sequence[str],
    *,
    fmt: str | None = None,
    limit: int | None = None,
    capacities: Sequence[str] | None = None,
    cache_token_budget: int | None = None,
    latency_model: str | None = None,
    latency_params: Mapping[str, Any] | None = None,
    calibrate: bool = False,
    model: str | None = None,
    block_size: int | None = None,
    mode: str = "prefix",
    salt_by_tenant: bool = False,
    replicas: int = 1,
    router: str = "round_robin",
    max_batch_tokens: int = 8192,
    output: str | Path | None = None,
    output_name: str | None = None,
    progress: bool | None = None,
) -> tuple[TimedReplay, Path]:
    """``skv replay`` in timed mode: load, (calibrate), simulate, write; returns the result and
    its output directory (``output``, else ``outputs/traces/<timestamp>_<name>``).

    ``cache_token_budget`` (tokens per replica) replaces ``capacities`` (default ``10%``).
    """
    from skv.traces import load_trace

    try:
        requests = load_trace(trace, fmt)
    except KeyboardInterrupt as exc:
        exc.add_note(f"interrupted while reading {trace}; nothing finished, nothing written")
        raise
    if limit is not None:
        requests = requests[:limit]
    if not requests:
        raise SystemExit(f"{trace}: no requests")
    if cache_token_budget is not None:
        if cache_token_budget < 1:
            raise ValueError(f"--cache-token-budget must be >= 1, got {cache_token_budget}")
        if capacities is not None and list(capacities) != ["10%"]:
            raise ValueError("give either --cache-token-budget or --capacity, not both")
        capacities = [f"{cache_token_budget}tok"]
    else:
        capacities = list(capacities or ["10%"])
    latency, fit = build_latency(
        requests,
        latency_model,
        dict(latency_params or {}),
        calibrate=calibrate,
        model_preset=model,
    )
    name = output_name or Path(str(trace).rstrip("/")).stem
    meta = {
        "name": name,
        "trace": str(trace),
        "format": fmt,
        "limit": limit,
        "cache_token_budget": cache_token_budget,
    }
    try:
        result = run_replay(
            requests,
            policies,
            capacities,
            latency,
            fit=fit,
            block_size=block_size,
            mode=mode,
            salt_by_tenant=salt_by_tenant,
            replicas=replicas,
            router=router,
            max_batch_tokens=max_batch_tokens,
            model_preset=model,
            meta=meta,
            progress=progress,
        )
    except KeyboardInterrupt as exc:
        exc.add_note(
            "replay: interrupted during the timed replay; nothing written (results are "
            "written whole, at the end)"
        )
        raise
    out = Path(output) if output else default_out_dir(name)
    try:
        write_outputs(result, out)
    except KeyboardInterrupt as exc:
        exc.add_note(
            f"replay: every replay done, interrupted while writing; nothing written to {out}"
        )
        raise
    return result, out


__all__ = [
    "CSV_COLUMNS",
    "PLOTS",
    "TimedReplay",
    "build_latency",
    "format_summary",
    "run_replay",
    "run_timed",
    "wants_timed",
    "write_outputs",
    "write_plots",
]
