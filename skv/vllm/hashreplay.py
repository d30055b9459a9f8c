"""Replay hash-id traces (Mooncake, Claude Code, Bailian) against a real vLLM engine.

A hash-id trace names each block of a prompt by an id (one id per ``hash_block_size`` tokens,
prefix-chained by the trace), never its tokens. To make a real engine see the same sharing, every
id becomes a fixed block of real token ids:

* **Tokens.** Hash id ``h`` maps to ``block_size`` token ids drawn by
  ``random.Random(f"{seed}:{h}")``
  from ``[0, vocab_size)`` minus the special ids (the tiny model's ``<unk> <s> </s>`` and chat
  markers are ids 0-5, so ``min_token_id=6``). Same id -> same tokens, in any process. Token-id
  prompts are sent as is (no BOS is added), so the engine's block ``i`` is exactly trace block
  ``i``.
* **Length scaling.** One trace block becomes one ENGINE block (``block_size`` tokens, 32 by
  default: vLLM's CPU attention needs multiples of 32). A 512-token Mooncake block thus shrinks
  16x, a 64-token Claude Code block 2x; the trailing partial block keeps its fraction
  (``round(L * block_size / hash_block_size)`` tokens, at least 1). Block-level sharing is kept
  exactly; absolute lengths are not.
* **Context budget.** A prompt longer than ``max_model_len - max_tokens`` is cut at the end (the
  shared head is what matters for caching); what was cut is recorded per request
  (``truncated_tokens``, ``dropped_hash_ids``) and in the plan's totals.
* **Output.** ``max_tokens = clamp(output_tokens, 1, max_output_tokens)`` (``ignore_eos`` makes
  the engine decode exactly that many).
* **Time.** ``arrival_s * time_scale``, shifted so the first request arrives at 0.

:func:`plan_hash_replay` does the mapping; :func:`prompts_and_arrivals` gives what
:func:`skv.vllm.client.replay` takes; :func:`replay_plan` runs it; :func:`results_to_trace` turns
the measurements into an skv trace in ENGINE units (``hash_block_size = block_size``, the kept
hash ids, scaled segments, ``observed_ttft_ms`` and ``observed_cached_tokens`` filled) that
:func:`skv.traces.native.write_skv_trace` stores and :mod:`skv.replay` replays; and
:func:`bench_summary` reports it with ``vllm bench serve``'s field names.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skv.model import Request, Segment

#: the tiny test model's vocabulary; its ids 0..5 are special tokens
DEFAULT_VOCAB_SIZE = 512
DEFAULT_MIN_TOKEN_ID = 6


@dataclass(frozen=True)
class HashReplayConfig:
    """How hash ids become token ids and how prompts fit the engine (see the module doc)."""

    block_size: int = 32
    vocab_size: int = DEFAULT_VOCAB_SIZE
    min_token_id: int = DEFAULT_MIN_TOKEN_ID
    special_ids: tuple[int, ...] = ()
    max_model_len: int = 2048
    max_output_tokens: int = 16
    seed: int = 0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be >= 1")
        if self.max_model_len <= self.max_output_tokens:
            raise ValueError("max_model_len must exceed max_output_tokens")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if not self.allowed_ids():
            raise ValueError("no token ids left after removing the special ones")

    def allowed_ids(self) -> list[int]:
        special = set(self.special_ids)
        return [t for t in range(self.min_token_id, self.vocab_size) if t not in special]


class HashTokenMapper:
    """Hash id -> a fixed block of ``block_size`` token ids (cached)."""

    def __init__(self, config: HashReplayConfig) -> None:
        self.config = config
        self._ids = config.allowed_ids()
        self._cache: dict[int, tuple[int, ...]] = {}

    def block(self, hash_id: int) -> tuple[int, ...]:
        got = self._cache.get(hash_id)
        if got is None:
            rng = random.Random(f"{self.config.seed}:{hash_id}")
            got = tuple(rng.choices(self._ids, k=self.config.block_size))
            self._cache[hash_id] = got
        return got


@dataclass
class ReplayItem:
    """One planned request: the original, the prompt as token ids, and what scaling did."""

    request: Request
    token_ids: list[int]
    hash_ids: list[int]  # the ids kept (one per engine block of token_ids)
    max_tokens: int
    arrival_s: float
    trace_prompt_tokens: int
    scaled_tokens: int  # before truncation
    truncated_tokens: int = 0
    dropped_hash_ids: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)

    def record(self) -> dict[str, Any]:
        return {
            "source_request_id": self.request.request_id,
            "trace_prompt_tokens": self.trace_prompt_tokens,
            "trace_hash_block_size": self.request.hash_block_size,
            "scaled_tokens": self.scaled_tokens,
            "truncated_tokens": self.truncated_tokens,
            "dropped_hash_ids": self.dropped_hash_ids,
        }


@dataclass
class HashReplayPlan:
    items: list[ReplayItem]
    config: HashReplayConfig
    totals: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def meta(self) -> dict[str, Any]:
        c = self.config
        return {
            "hashreplay": {
                "block_size": c.block_size,
                "vocab_size": c.vocab_size,
                "min_token_id": c.min_token_id,
                "max_model_len": c.max_model_len,
                "max_output_tokens": c.max_output_tokens,
                "seed": c.seed,
                "time_scale": c.time_scale,
                "rule": "one trace block -> one engine block; prompts cut to "
                "max_model_len - max_tokens",
                **self.totals,
            }
        }


def _scaled_len(n_ids: int, prompt: int, tbs: int, ebs: int) -> int:
    """Engine tokens for a prompt of ``prompt`` trace tokens over ``n_ids`` trace blocks."""
    if n_ids == 0:
        return 0
    last = max(1, min(tbs, prompt - tbs * (n_ids - 1)))
    return (n_ids - 1) * ebs + max(1, min(ebs, round(last * ebs / tbs)))


def plan_hash_replay(
    requests: Sequence[Request],
    config: HashReplayConfig | None = None,
    *,
    mapper: HashTokenMapper | None = None,
) -> HashReplayPlan:
    """Map every request (all must carry ``hash_ids``) onto token ids; order is kept."""
    cfg = config or HashReplayConfig()
    mapper = mapper or HashTokenMapper(cfg)
    ebs = cfg.block_size
    items: list[ReplayItem] = []
    t0 = min((r.arrival_s for r in requests), default=0.0)
    for r in requests:
        if r.hash_ids is None:
            raise ValueError(f"request {r.request_id}: no hash_ids (hash-id traces only)")
        tbs = r.hash_block_size or ebs
        ids = list(r.hash_ids)
        trace_prompt = r.prompt_tokens or len(ids) * tbs
        n = _scaled_len(len(ids), trace_prompt, tbs, ebs)
        max_tokens = max(1, min(int(r.output_tokens or 0), cfg.max_output_tokens))
        budget = cfg.max_model_len - max_tokens
        keep = min(n, budget)
        tokens: list[int] = []
        for hid in ids[: math.ceil(keep / ebs)]:
            tokens.extend(mapper.block(hid))
        del tokens[keep:]
        kept_ids = ids[: math.ceil(keep / ebs)]
        items.append(
            ReplayItem(
                request=r,
                token_ids=tokens,
                hash_ids=kept_ids,
                max_tokens=max_tokens,
                arrival_s=(r.arrival_s - t0) * cfg.time_scale,
                trace_prompt_tokens=trace_prompt,
                scaled_tokens=n,
                truncated_tokens=n - keep,
                dropped_hash_ids=len(ids) - len(kept_ids),
            )
        )
    totals = {
        "requests": len(items),
        "trace_prompt_tokens": sum(i.trace_prompt_tokens for i in items),
        "scaled_tokens": sum(i.scaled_tokens for i in items),
        "prompt_tokens": sum(i.prompt_tokens for i in items),
        "truncated_requests": sum(1 for i in items if i.truncated_tokens),
        "truncated_tokens": sum(i.truncated_tokens for i in items),
        "dropped_hash_ids": sum(i.dropped_hash_ids for i in items),
    }
    return HashReplayPlan(items, cfg, totals)


def prompts_and_arrivals(
    plan: HashReplayPlan, *, typed: bool = False
) -> tuple[list[dict[str, Any]], list[float]]:
    """Request bodies (``prompt`` as token ids, ``max_tokens``, ``id``) and arrival times, for
    :func:`skv.vllm.client.replay`. ``typed`` adds each prompt's semantic segments (in engine
    tokens) and arrival time as ``vllm_xargs`` for skv's eviction plugin
    (:func:`skv.vllm.eviction_plugin.semantic_xargs`)."""
    from skv.vllm.eviction_plugin import semantic_xargs

    prompts = []
    for it in plan.items:
        body: dict[str, Any] = {
            "id": it.request.request_id,
            "prompt": list(it.token_ids),
            "max_tokens": it.max_tokens,
        }
        if typed:
            r = it.request
            sent = Request(
                r.request_id,
                it.arrival_s,
                engine_segments(it, plan.config),
                session_id=r.session_id,
                turn=r.turn,
                templated=r.templated,
            )
            body["vllm_xargs"] = semantic_xargs(sent)
        prompts.append(body)
    return prompts, [it.arrival_s for it in plan.items]


async def replay_plan(
    client, plan: HashReplayPlan, *, concurrency: int | None = None, typed: bool = False, **body
):
    """Send the plan: open loop at its arrival times, or closed loop with ``concurrency``."""
    from skv.vllm.client import replay

    prompts, arrivals = prompts_and_arrivals(plan, typed=typed)
    if concurrency is not None:
        return await replay(client, prompts, concurrency=concurrency, **body)
    return await replay(client, prompts, arrival_times=arrivals, **body)


# ---------------------------------------------------------------------- results


def engine_segments(item: ReplayItem, cfg: HashReplayConfig) -> list[Segment]:
    """The original segments' boundaries mapped into engine tokens (block-wise), clipped to the
    prompt actually sent; empty segments are dropped."""
    r = item.request
    tbs = r.hash_block_size or cfg.block_size
    ebs = cfg.block_size
    total = item.prompt_tokens

    def pos(p: int) -> int:
        return min(total, (p // tbs) * ebs + round((p % tbs) * ebs / tbs))

    out: list[Segment] = []
    start = 0
    acc = 0
    for k, seg in enumerate(r.segments):
        acc += seg.num_tokens
        end = total if k == len(r.segments) - 1 else max(start, pos(acc))
        if end > start:
            out.append(Segment(seg.stype, end - start, reusable=seg.reusable))
        start = end
    if start < total:  # no segments at all, or they were shorter than the hash ids say
        from skv.model import SemanticType

        out.append(Segment(SemanticType.UNKNOWN, total - start))
    return out


def results_to_trace(plan: HashReplayPlan, results: Sequence[Any]) -> list[Request]:
    """An skv trace of what was sent, in engine units, with the engine's measurements.

    ``results`` are :class:`skv.vllm.client.RequestResult` in plan order (what
    :func:`replay_plan` returns). A failed request keeps ``observed_*`` None and its error in
    ``extra``.
    """
    if len(results) != len(plan.items):
        raise ValueError(f"{len(plan.items)} planned requests but {len(results)} results")
    out: list[Request] = []
    for it, res in zip(plan.items, results, strict=True):
        r = it.request
        ok = bool(getattr(res, "ok", False))
        extra: dict[str, Any] = dict(r.extra)
        extra["hashreplay"] = it.record()
        extra["max_tokens"] = it.max_tokens
        if res.sent_at is not None:
            extra["sent_s"] = round(res.sent_at, 6)
        if ok:
            if res.e2e is not None:
                extra["observed_e2e_ms"] = res.e2e * 1000
            if res.tpot is not None:
                extra["observed_tpot_ms"] = res.tpot * 1000
            if res.prompt_tokens is not None and res.prompt_tokens != it.prompt_tokens:
                extra["engine_prompt_tokens"] = res.prompt_tokens
        else:
            extra["error"] = res.error
        out.append(
            Request(
                request_id=r.request_id,
                arrival_s=it.arrival_s,
                segments=engine_segments(it, plan.config),
                output_tokens=(res.completion_tokens if ok and res.completion_tokens else 0)
                or it.max_tokens,
                session_id=r.session_id,
                tenant_id=r.tenant_id,
                turn=r.turn,
                parent_id=r.parent_id,
                templated=r.templated,
                hash_ids=list(it.hash_ids),
                hash_block_size=plan.config.block_size,
                observed_ttft_ms=res.ttft * 1000 if ok and res.ttft is not None else None,
                observed_cached_tokens=res.cached_tokens if ok else None,
                output_hash=r.output_hash,
                extra=extra,
            )
        )
    return out


def _stats(name: str, xs_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    xs = [x * 1000 for x in xs_s]
    d: dict[str, float] = {}
    d[f"mean_{name}_ms"] = statistics.fmean(xs) if xs else 0.0
    d[f"median_{name}_ms"] = statistics.median(xs) if xs else 0.0
    d[f"std_{name}_ms"] = statistics.pstdev(xs) if xs else 0.0
    for p in percentiles:
        key = f"p{p:g}_{name}_ms"
        d[key] = float(np.percentile(xs, p)) if xs else 0.0
    return d


def bench_summary(
    results: Sequence[Any],
    *,
    duration: float | None = None,
    percentiles: Sequence[float] = (99,),
) -> dict[str, Any]:
    """``vllm bench serve``-style metrics (times in ms, throughputs per second).

    ``duration`` defaults to first send to last finish. ``total_cached_tokens`` and
    ``prefix_cache_hit_rate`` (cached / input tokens) are additions.
    """
    ok = [r for r in results if r.ok]
    if duration is None:
        ends = [r.sent_at + r.e2e for r in ok if r.e2e is not None]
        starts = [r.sent_at for r in results]
        duration = (max(ends) - min(starts)) if ends and starts else 0.0
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = sum(r.completion_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    d: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else 0.0,
        "total_cached_tokens": cached,
        "prefix_cache_hit_rate": cached / total_in if total_in else 0.0,
    }
    d.update(_stats("ttft", [r.ttft for r in ok if r.ttft is not None], percentiles))
    d.update(_stats("tpot", [r.tpot for r in ok if r.tpot is not None], percentiles))
    d.update(_stats("itl", [g for r in ok for g in r.itl], percentiles))
    d.update(_stats("e2el", [r.e2e for r in ok if r.e2e is not None], percentiles))
    d["errors"] = [r.error for r in results if not r.ok]
    return d
