"""What the fidelity-under-load study sends: a shared-prefix workload, its arrivals, and the
profiling requests the latency model is calibrated on.

- :func:`stage_trace`: :func:`skv.experiments.engine.synthetic_trace`'s Zipf-shared documents
  plus unique blocks (hash ids in engine blocks), each request decoding a length drawn from
  :data:`AZURE_CODE_OUTPUT_QUANTILES` (real decode lengths, capped at ``max_output_tokens``).
  Every stage sends the same requests; only their arrival times differ.
- :func:`arrival_times`: Poisson (exponential gaps) or bursty (Gamma gaps with a coefficient of
  variation ``cv``: shape ``1 / cv^2``), seeded, first arrival at 0.
- :func:`speed_probe`: a few isolated requests sent before every stage, whose measured steps
  against the frozen model's price say how fast the machine runs at that moment (it drifts);
- :func:`profile_plan`: isolated prefills (a grid of computed x cached tokens, each cached
  prefix warmed by a request of its own first) and decode batches (``b`` requests arriving
  together, then decoding side by side): the steps the cost model is fitted on, none of them a
  request of the evaluation stages.

The engine gets requests as :class:`skv.vllm.engine_load.EngineLoad` takes them (token ids from
:mod:`skv.vllm.hashreplay`'s fixed block-to-tokens mapping); the simulator gets the same
requests as :class:`skv.model.Request` in engine units (:func:`sim_trace`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from skv.model import Request, Segment, SemanticType

#: GeneratedTokens of the Azure LLM inference trace 2023 (code), quantiles 0, 5%, ..., 100%
#: (8,819 requests; ``numpy.quantile(..., method="inverted_cdf")`` over
#: ``azure2023/AzureLLMInferenceTrace_code.csv``). Pinned here, so the workload needs no trace file.
AZURE_CODE_OUTPUT_QUANTILES = (
    6, 6, 7, 7, 8, 9, 9, 10, 11, 12, 13, 14, 16, 18, 20, 24, 29, 39, 55, 90, 1899,
)  # fmt: skip

#: hash ids of profiling prompts: far from the workload's (documents 100000+, own 900000+)
_PROFILE_BASE = 50_000_000


def output_lengths(
    rng: np.random.Generator, n: int, quantiles: Sequence[float], cap: int
) -> list[int]:
    """``n`` decode lengths from the quantile function given at evenly spaced probabilities
    (linear between them), rounded and clamped to ``[1, cap]``."""
    q = np.asarray(quantiles, dtype=float)
    if q.ndim != 1 or len(q) < 2 or np.any(np.diff(q) < 0):
        raise ValueError("output quantiles: need at least two non-decreasing values")
    u = rng.random(n) * (len(q) - 1)
    lo = np.floor(u).astype(int)
    hi = np.minimum(lo + 1, len(q) - 1)
    x = q[lo] + (u - lo) * (q[hi] - q[lo])
    return [int(v) for v in np.clip(np.rint(x), 1, cap)]


def stage_trace(cfg: dict[str, Any]) -> list[Request]:
    """The requests every stage sends (arrival times 0; :func:`arrival_times` gives them)."""
    from skv.experiments.engine import synthetic_trace

    base = synthetic_trace({**cfg, "num_requests": int(cfg["requests_per_stage"])})
    rng = np.random.default_rng([int(cfg["seed"]), 0x0D1E])
    outs = output_lengths(rng, len(base), cfg["output_quantiles"], int(cfg["max_output_tokens"]))
    return [
        dataclasses.replace(r, arrival_s=0.0, output_tokens=o)
        for r, o in zip(base, outs, strict=True)
    ]


def arrival_times(
    kind: str, rate: float, n: int, seed: Sequence[int], cv: float = 1.0
) -> list[float]:
    """``n`` arrival times at mean ``rate`` per second, the first at 0: ``poisson`` or
    ``gamma`` (gaps with coefficient of variation ``cv``; ``cv = 1`` is Poisson)."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = np.random.default_rng(list(seed))
    if kind == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif kind == "gamma":
        if not cv > 0:
            raise ValueError(f"cv must be > 0, got {cv}")
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    else:
        raise ValueError(f"arrival kind {kind!r}: expected poisson or gamma")
    t = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else np.zeros(0)
    return [float(x) for x in t]


def engine_requests(
    plan: Any, arrivals: Sequence[float], prefix: str = "", typed: bool = False
) -> list[dict[str, Any]]:
    """The planned requests (:func:`skv.vllm.hashreplay.plan_hash_replay`) at ``arrivals``, as
    :meth:`skv.vllm.engine_load.EngineLoad.run_stage` takes them (ids ``prefix + request id``,
    unique per engine request: vLLM refuses a request id it is still serving); ``typed`` adds
    each one's ``extra_args`` for skv's eviction plugin (:func:`typed_xargs`)."""
    if len(arrivals) != len(plan.items):
        raise ValueError(f"{len(plan.items)} requests but {len(arrivals)} arrival times")
    out = [
        {
            "id": f"{prefix}{it.request.request_id}",
            "prompt_token_ids": list(it.token_ids),
            "max_tokens": it.max_tokens,
            "arrival_s": float(a),
        }
        for it, a in zip(plan.items, arrivals, strict=True)
    ]
    if typed:
        for row, x in zip(out, typed_xargs(plan.items, plan.config, arrivals), strict=True):
            row["extra_args"] = x
    return out


def sim_trace(
    items: Sequence[Any], block_size: int, arrivals: Sequence[float], config: Any = None
) -> list[Request]:
    """Planned requests (:class:`skv.vllm.hashreplay.ReplayItem`) in engine units (one hash id
    per engine block, the prompt's real token count, its decode length) arriving at
    ``arrivals``: what the simulator replays. With the plan's ``config``, each keeps its typed
    segments mapped into engine tokens and its session (what an eviction policy reads);
    without, one untyped segment."""
    from skv.vllm.hashreplay import engine_segments

    out = []
    for it, a in zip(items, arrivals, strict=True):
        r = it.request
        segments = (
            engine_segments(it, config)
            if config is not None
            else [Segment(SemanticType.USER_QUERY, it.prompt_tokens)]
        )
        out.append(
            Request(
                r.request_id,
                float(a),
                segments,
                output_tokens=it.max_tokens,
                hash_ids=list(it.hash_ids),
                hash_block_size=block_size,
                session_id=r.session_id if config is not None else None,
                turn=r.turn if config is not None else None,
            )
        )
    return out


def typed_xargs(items: Sequence[Any], config: Any, arrivals: Sequence[float]) -> list[dict]:
    """Per planned request, the ``vllm_xargs`` skv's eviction plugin reads (typed segments in
    engine tokens, session, turn, and ``skv_time`` = its arrival in this stage)."""
    from skv.vllm.eviction_plugin import semantic_xargs
    from skv.vllm.hashreplay import engine_segments

    out = []
    for it, a in zip(items, arrivals, strict=True):
        r = it.request
        sent = Request(r.request_id, float(a), engine_segments(it, config),
                       session_id=r.session_id, turn=r.turn, templated=r.templated)  # fmt: skip
        out.append(semantic_xargs(sent))
    return out


# ---------------------------------------------------------------------- profiling


@dataclasses.dataclass
class ProfilePlan:
    """Isolated prefills (sent one at a time; ``warm`` requests only fill the cache; the
    engine's own ``cached_tokens`` is what the fit reads) and decode batches (one stage each)."""

    lone: list[dict[str, Any]]
    #: (batch size, prompt tokens) -> the batch's requests
    batches: dict[tuple[int, int], list[dict[str, Any]]]


def profile_plan(cfg: dict[str, Any]) -> ProfilePlan:
    """The profiling requests (see the module doc): every ``uncached`` x ``cached`` pair of the
    config, ``profile_repeats`` times in a shuffled order (drift spreads over the grid), and one
    decode batch per ``profile_batches`` size and ``profile_batch_prompt_tokens`` length (two
    lengths separate the cost of a decoding request from the cost of its context) whose blocks
    fit in half the cache."""
    from skv.vllm.hashreplay import HashReplayConfig, HashTokenMapper

    bs = int(cfg["block_size"])
    mapper = HashTokenMapper(HashReplayConfig(block_size=bs, seed=int(cfg["seed"]) + 1))
    rng = random.Random(int(cfg["seed"]) * 7919 + 17)
    budget = int(cfg["max_num_batched_tokens"])
    grid = [
        (u, c)
        for u in cfg["profile_uncached"]
        for c in cfg["profile_cached"]
        if 1 <= u <= budget and u + c + 1 < int(cfg["max_model_len"])
    ]
    cells = grid * int(cfg["profile_repeats"])
    rng.shuffle(cells)
    nid = _PROFILE_BASE
    lone: list[dict[str, Any]] = []

    def tokens(n_blocks: int) -> tuple[list[int], list[int]]:
        nonlocal nid
        ids = list(range(nid, nid + n_blocks))
        nid += n_blocks
        return ids, [t for h in ids for t in mapper.block(h)]

    for k, (u, c) in enumerate(cells):
        cached_blocks = c // bs
        _, shared = tokens(cached_blocks)
        _, own = tokens(-(-u // bs) + 1)
        prompt = shared + own[:u]
        if cached_blocks:  # the cached prefix, computed by a request of its own first
            warm = shared + own[:1]
            lone.append({"id": f"warm{k}", "prompt_token_ids": warm, "max_tokens": 1,
                         "arrival_s": 0.0})  # fmt: skip
        lone.append({"id": f"lone{k}", "prompt_token_ids": prompt, "max_tokens": 1,
                     "arrival_s": 0.0})  # fmt: skip
    batches: dict[tuple[int, int], list[dict[str, Any]]] = {}
    decode = int(cfg["profile_decode_tokens"])
    room = int(cfg["num_gpu_blocks"]) // 2  # the batch's blocks: well inside the cache
    for p in cfg["profile_batch_prompt_tokens"]:
        blocks = -(-(int(p) + decode) // bs)
        for b in cfg["profile_batches"]:
            if int(b) * blocks > room:
                continue
            rows = []
            for j in range(int(b)):
                _, toks = tokens(-(-int(p) // bs))
                item = {"id": f"batch{b}x{p}_{j}", "prompt_token_ids": toks[: int(p)]}
                rows.append({**item, "max_tokens": decode, "arrival_s": 0.0})
            batches[(int(b), int(p))] = rows
    return ProfilePlan(lone, batches)


def speed_probe(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The speed probe (sent one at a time): prefills of ``probe_prefill_tokens`` each, twice,
    and one request that decodes ``probe_decode_tokens`` alone. Always the same tokens, so the
    second prefill of each size hits the cache, and so may the first when an earlier probe's
    blocks survived the stage in between; :func:`~skv.experiments.fidelity.calibration.speed_factor`
    prices each request with the cached tokens the engine reports, so either way it compares
    like with like."""
    from skv.vllm.hashreplay import HashReplayConfig, HashTokenMapper

    bs = int(cfg["block_size"])
    mapper = HashTokenMapper(HashReplayConfig(block_size=bs, seed=int(cfg["seed"]) + 2))
    out: list[dict[str, Any]] = []
    base = _PROFILE_BASE - 1_000_000

    def prompt(k: int, n: int) -> list[int]:
        ids = range(base + 1000 * k, base + 1000 * k + -(-n // bs))
        return [t for h in ids for t in mapper.block(h)][:n]

    sizes = [int(n) for n in cfg["probe_prefill_tokens"]]
    for rep in range(2):
        for k, n in enumerate(sizes):
            out.append({"id": f"lone-probe{rep}-{n}", "prompt_token_ids": prompt(k, n),
                        "max_tokens": 1, "arrival_s": 0.0})  # fmt: skip
    out.append({"id": "decode-probe", "prompt_token_ids": prompt(len(sizes), 64),
                "max_tokens": int(cfg["probe_decode_tokens"]), "arrival_s": 0.0})  # fmt: skip
    return out
