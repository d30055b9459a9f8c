"""Replay a trace file against a running vLLM server and record what the engine measured.

This is the library side of ``skv vllm replay-trace``. A trace becomes prompts in one of three
ways (``prompts=``, default ``auto``: the first that every request supports):

* ``hash_ids`` (Mooncake, Claude Code, Bailian, and skv traces written by this command): each
  hash id becomes a fixed block of real token ids, one trace block per engine block
  (:mod:`skv.vllm.hashreplay` documents the length scaling and the context budget);
* ``text`` (skv traces collected without redaction): the segments' text, concatenated, is sent
  to ``/v1/completions``; the engine's tokenizer decides the length;
* ``content_hash`` (redacted skv traces, Azure): the prompt is cut into ``block_size`` blocks
  keyed by content exactly as skv's ``prefix`` mode does (:func:`skv.blocks.request_blocks`),
  and those keys are replayed as hash ids of ``block_size`` tokens. Lengths are kept 1:1, and
  two prompts share a prefix on the engine exactly when the simulator says they do.

:func:`run` scrapes ``/metrics`` before and after (the engine's own prefix-cache hit rate is
the delta, see :mod:`skv.vllm.metrics`), replays open loop at the trace's times (``time_scale``)
or Poisson times (``rate``) or closed loop (``concurrency``), and :func:`write_outputs` writes
``requests.jsonl`` (an skv trace with ``observed_*`` filled, readable by ``skv replay``) and
``summary.json`` (``vllm bench serve`` field names plus the engine hit rate, the plan's
truncation totals and the settings), all or nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from skv.model import Request
from skv.vllm.hashreplay import HashReplayPlan
from skv.vllm.metrics import PrefixCacheCounters

log = logging.getLogger(__name__)

PROMPT_SOURCES = ("auto", "hash_ids", "text", "content_hash")
#: when the cache block size cannot be read from the server's /metrics
FALLBACK_BLOCK_SIZE = 32
FALLBACK_MAX_MODEL_LEN = 2048
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"


class ServerUnreachable(ConnectionError):
    """The server did not answer (wrong URL, not started, or not an OpenAI-compatible API)."""


@dataclass(frozen=True)
class ReplayTraceSettings:
    """Everything that decides what is sent; ``None`` means "ask the server" (see :func:`run`)."""

    url: str
    model: str | None = None
    fmt: str | None = None
    limit: int | None = None
    prompts: str = "auto"
    block_size: int | None = None
    vocab_size: int = 512
    min_token_id: int = 6
    max_model_len: int | None = None
    max_output_tokens: int = 16
    time_scale: float | None = None
    rate: float | None = None
    concurrency: int | None = None
    seed: int = 0
    warmup: int = 1
    timeout: float = 600.0
    metrics_wait: float = 10.0

    def __post_init__(self) -> None:
        if self.prompts not in PROMPT_SOURCES:
            raise ValueError(f"prompts={self.prompts!r}: expected one of {PROMPT_SOURCES}")
        loops = [x for x in (self.time_scale, self.rate, self.concurrency) if x is not None]
        if len(loops) > 1:
            raise ValueError("give at most one of time_scale, rate and concurrency")
        checks = [
            (self.limit is not None and self.limit < 1, "--limit must be >= 1"),
            (self.block_size is not None and self.block_size < 1, "--block-size must be >= 1"),
            (self.max_output_tokens < 1, "--max-output-tokens must be >= 1"),
            (
                self.max_model_len is not None and self.max_model_len <= self.max_output_tokens,
                "--max-model-len must exceed --max-output-tokens",
            ),
            (self.time_scale is not None and self.time_scale < 0, "--time-scale must be >= 0"),
            (self.rate is not None and not self.rate > 0, "--rate must be > 0"),
            (self.concurrency is not None and self.concurrency < 1, "--concurrency must be >= 1"),
            (self.min_token_id < 0, "--min-token-id must be >= 0"),
            (self.vocab_size <= self.min_token_id, "--vocab-size must exceed --min-token-id"),
            (self.warmup < 0, "--warmup must be >= 0"),
            (not self.url.startswith(("http://", "https://")), f"--url {self.url!r}: not http"),
        ]
        for bad, msg in checks:
            if bad:
                raise ValueError(msg)

    @property
    def loop(self) -> str:
        if self.concurrency is not None:
            return "closed"
        return "poisson" if self.rate is not None else "trace"


# ---------------------------------------------------------------------- trace -> prompts


def load_requests(
    path: str | Path, fmt: str | None = None, limit: int | None = None
) -> tuple[list[Request], str]:
    """The trace's requests (first ``limit`` by arrival) and its format's name."""
    from skv.traces import detect_format, find_trace, load_trace

    p = Path(path)
    if not p.exists():
        if p.is_absolute():
            raise FileNotFoundError(f"no such trace file or directory: {p}")
        p = find_trace(str(path))  # a name under $SKV_TRACE_DIR, or an error saying where
    name = fmt or detect_format(p)
    requests = load_trace(p, name)
    if limit is not None:
        requests = requests[:limit]
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests, name


def choose_prompt_source(requests: Sequence[Request], wanted: str = "auto") -> str:
    """``hash_ids`` / ``text`` / ``content_hash``: ``wanted``, checked, or the first every
    request supports. Raises ValueError naming the first request (and field) that does not."""

    def lacks(source: str) -> str | None:
        for r in requests:
            if source == "hash_ids" and r.hash_ids is None:
                return f"request {r.request_id!r}: no hash_ids"
            if source != "hash_ids":
                attr = "text" if source == "text" else "content_hash"
                for k, s in enumerate(r.segments):
                    if getattr(s, attr) is None:
                        return f"request {r.request_id!r}: segments.{k}.{attr} is missing"
        return None

    order = ("hash_ids", "text", "content_hash") if wanted == "auto" else (wanted,)
    reasons = []
    for source in order:
        why = lacks(source)
        if why is None:
            return source
        reasons.append(f"{source}: {why}")
    raise ValueError("cannot build prompts (" + "; ".join(reasons) + ")")


def keyed_by_content(requests: Sequence[Request], block_size: int) -> list[Request]:
    """Copies whose ``hash_ids`` are skv's ``prefix``-mode block keys at ``block_size`` (so that
    :func:`skv.vllm.hashreplay.plan_hash_replay` maps them 1:1 onto engine blocks)."""
    from skv.blocks import KeyingMode, request_blocks

    out = []
    for r in requests:
        try:
            rb = request_blocks(r, block_size, KeyingMode.PREFIX)
        except ValueError as exc:
            raise ValueError(f"request {r.request_id!r}: {exc}") from None
        out.append(dataclasses.replace(r, hash_ids=list(rb.keys), hash_block_size=block_size))
    return out


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` per second (the workloads' seeded
    process), shifted so the first request goes at 0."""
    import numpy as np

    from skv.workloads.base import poisson_arrivals as workload_arrivals

    times = workload_arrivals(np.random.default_rng([seed, 0x9015]), n, rate)
    return [t - times[0] for t in times] if times else []


@dataclass
class TextItem:
    """One text-path request: the trace's request, its prompt text, ``max_tokens``, arrival."""

    request: Request
    text: str
    max_tokens: int
    arrival_s: float


def plan_text(
    requests: Sequence[Request], max_output_tokens: int, time_scale: float
) -> list[TextItem]:
    """Text prompts (segment texts concatenated) with the hash path's output and time rules."""
    t0 = min(r.arrival_s for r in requests)
    items = []
    for r in requests:
        text = "".join(s.text or "" for s in r.segments)
        if not text:
            raise ValueError(f"request {r.request_id!r}: segments.*.text: the prompt is empty")
        items.append(
            TextItem(
                r,
                text,
                max(1, min(int(r.output_tokens or 0), max_output_tokens)),
                (r.arrival_s - t0) * time_scale,
            )
        )
    return items


def text_results_to_trace(items: Sequence[TextItem], results: Sequence[Any]) -> list[Request]:
    """The trace's requests as sent (arrival = send schedule) with the engine's measurements;
    segments keep the trace's token counts, the engine's count goes to ``extra``."""
    out = []
    for it, res in zip(items, results, strict=True):
        extra: dict[str, Any] = {**it.request.extra, "max_tokens": it.max_tokens}
        extra["sent_s"] = round(res.sent_at, 6)
        if res.ok:
            if res.prompt_tokens is not None:
                extra["engine_prompt_tokens"] = res.prompt_tokens
            if res.e2e is not None:
                extra["observed_e2e_ms"] = res.e2e * 1000
            if res.tpot is not None:
                extra["observed_tpot_ms"] = res.tpot * 1000
        else:
            extra["error"] = res.error
        out.append(
            dataclasses.replace(
                it.request,
                arrival_s=it.arrival_s,
                output_tokens=(res.completion_tokens if res.ok and res.completion_tokens else 0)
                or it.max_tokens,
                observed_ttft_ms=res.ttft * 1000 if res.ok and res.ttft is not None else None,
                observed_cached_tokens=res.cached_tokens if res.ok else None,
                extra=extra,
            )
        )
    return out


# ---------------------------------------------------------------------- the server


@dataclass
class ServerInfo:
    """What the server says about itself (anything it does not say stays None)."""

    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    version: str | None = None
    has_metrics: bool = False


def probe_server(
    url: str, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None
) -> ServerInfo:
    """``/v1/models``, ``/version`` and ``/metrics`` (the KV cache's block size and size).

    Raises :class:`ServerUnreachable` when nothing answers at ``url``."""
    from skv.vllm.metrics import parse_prometheus

    info = ServerInfo()
    base = url.rstrip("/")
    with httpx.Client(timeout=timeout, transport=transport) as http:
        try:
            resp = http.get(f"{base}/v1/models")
        except httpx.HTTPError as exc:
            raise ServerUnreachable(
                f"{base}: no server answers ({type(exc).__name__}: {exc}); start one with "
                "`skv vllm serve --model DIR` and pass its URL"
            ) from None
        if resp.status_code != 200:
            raise ServerUnreachable(
                f"{base}/v1/models answered HTTP {resp.status_code}: not an OpenAI-compatible "
                "server?"
            )
        try:
            data = resp.json().get("data") or []
        except (ValueError, AttributeError):
            raise ServerUnreachable(f"{base}/v1/models: not JSON: not an OpenAI API") from None
        info.models = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]
        lens = [m.get("max_model_len") for m in data if isinstance(m, dict)]
        info.max_model_len = next((int(x) for x in lens if isinstance(x, int)), None)
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            v = http.get(f"{base}/version")
            if v.status_code == 200:
                info.version = v.json().get("version")
        try:
            m = http.get(f"{base}/metrics")
        except httpx.HTTPError:
            m = None
        if m is not None and m.status_code == 200:
            info.has_metrics = True
            cache = parse_prometheus(m.text).get("vllm:cache_config_info") or []
            if cache:
                labels = cache[0][0]
                info.block_size = _int_or_none(labels.get("block_size"))
                info.num_gpu_blocks = _int_or_none(labels.get("num_gpu_blocks"))
    return info


def _int_or_none(s: str | None) -> int | None:
    try:
        return int(s) if s not in (None, "", "None") else None
    except ValueError:
        return None


def _scrape(url: str, transport: httpx.BaseTransport | None) -> PrefixCacheCounters:
    from skv.vllm.metrics import prefix_cache_counters, scrape

    with httpx.Client(transport=transport) as http:
        return prefix_cache_counters(scrape(url, client=http))


# ---------------------------------------------------------------------- progress


class _Progress:
    """Wraps a :class:`~skv.vllm.client.StreamingClient` to count finished requests for the
    progress log (:func:`skv.vllm.client.replay` only calls ``request``)."""

    def __init__(self, client: Any, total: int) -> None:
        self._client = client
        self.total = total
        self.done = 0
        self.failed = 0

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        res = await self._client.request(*args, **kwargs)
        self.done += 1
        if not res.ok:
            self.failed += 1
            if self.failed <= 3:
                log.warning("request %s failed: %s", res.id, res.error)
        return res

    async def report(self, every: float) -> None:
        t0 = time.monotonic()
        while True:
            await asyncio.sleep(every)
            log.info(
                "%d/%d done (%d failed), %.0f s",
                self.done,
                self.total,
                self.failed,
                time.monotonic() - t0,
            )


# ---------------------------------------------------------------------- run


@dataclass
class ReplayTraceRun:
    """What :func:`run` measured, ready for :func:`write_outputs`."""

    trace: list[Request]  # what was sent, in engine units (hash / content) or as given (text)
    meta: dict[str, Any]  # the requests.jsonl header
    summary: dict[str, Any]
    results: list[Any]


@dataclass
class _Resolved:
    """The settings that were left to the server, decided."""

    model: str
    max_model_len: int
    block_size: int
    time_scale: float


def _resolve(s: ReplayTraceSettings, info: ServerInfo, source: str) -> _Resolved:
    """Model, context budget and block size: given, else the server's, else the fallbacks."""
    model = s.model
    if model is None:
        if len(info.models) != 1:
            raise ValueError(
                f"{s.url}/v1/models lists {len(info.models)} models "
                f"({', '.join(info.models) or 'none'}): pass --model"
            )
        model = info.models[0]
    elif info.models and model not in info.models:
        raise ValueError(f"--model {model!r}: the server serves {', '.join(info.models)}")
    max_model_len = s.max_model_len or info.max_model_len or FALLBACK_MAX_MODEL_LEN
    if info.max_model_len is not None and max_model_len > info.max_model_len:
        log.warning(
            "--max-model-len %d exceeds the server's %d: using %d",
            max_model_len,
            info.max_model_len,
            info.max_model_len,
        )
        max_model_len = info.max_model_len
    if max_model_len <= s.max_output_tokens:
        raise ValueError(
            f"max_model_len {max_model_len} leaves no room for --max-output-tokens "
            f"{s.max_output_tokens}"
        )
    block_size = s.block_size or info.block_size or FALLBACK_BLOCK_SIZE
    if info.block_size is not None and block_size != info.block_size and source != "text":
        log.warning(
            "--block-size %d but the engine caches %d-token blocks: trace blocks no longer map "
            "1:1 onto engine blocks",
            block_size,
            info.block_size,
        )
    time_scale = 1.0 if s.time_scale is None else s.time_scale
    return _Resolved(model, max_model_len, block_size, time_scale)


@dataclass
class _Planned:
    """What will be sent: a hash plan (hash ids, content) or text items, and the arrivals."""

    plan: HashReplayPlan | None  # None on the text path
    items: list[TextItem]
    arrivals: list[float]
    totals: dict[str, int]

    def prompts(self) -> list[dict[str, Any]]:
        return [
            {"id": it.request.request_id, "prompt": it.text, "max_tokens": it.max_tokens}
            for it in self.items
        ]


def _plan(requests: list[Request], source: str, s: ReplayTraceSettings, r: _Resolved) -> _Planned:
    from skv.vllm.hashreplay import HashReplayConfig, plan_hash_replay

    if source == "text":
        items = plan_text(requests, s.max_output_tokens, r.time_scale)
        over = sum(it.request.prompt_tokens > r.max_model_len - it.max_tokens for it in items)
        if over:
            log.warning(
                "%d request(s) have more trace tokens than max_model_len - max_tokens; the "
                "engine may reject them (the text path does not truncate)",
                over,
            )
        totals = {
            "requests": len(items),
            "trace_prompt_tokens": sum(it.request.prompt_tokens for it in items),
        }
        planned = _Planned(None, items, [it.arrival_s for it in items], totals)
    else:
        if source == "content_hash":
            requests = keyed_by_content(requests, r.block_size)
        for q in requests:
            if not q.hash_ids:
                raise ValueError(f"request {q.request_id!r}: hash_ids: the prompt is empty")
        cfg = HashReplayConfig(
            block_size=r.block_size,
            vocab_size=s.vocab_size,
            min_token_id=s.min_token_id,
            max_model_len=r.max_model_len,
            max_output_tokens=s.max_output_tokens,
            seed=s.seed,
            time_scale=r.time_scale,
        )
        plan = plan_hash_replay(requests, cfg)
        t = plan.totals
        if t["truncated_requests"]:
            log.warning(
                "%d request(s) cut to max_model_len - max_tokens: %d tokens, %d hash ids dropped",
                t["truncated_requests"],
                t["truncated_tokens"],
                t["dropped_hash_ids"],
            )
        planned = _Planned(plan, [], [it.arrival_s for it in plan.items], dict(t))
    if s.rate is not None:
        planned.arrivals = poisson_arrivals(len(planned.arrivals), s.rate, s.seed)
        targets = planned.plan.items if planned.plan is not None else planned.items
        for target, at in zip(targets, planned.arrivals, strict=True):
            target.arrival_s = at
    return planned


async def _send(
    s: ReplayTraceSettings,
    r: _Resolved,
    p: _Planned,
    info: ServerInfo,
    transport: httpx.MockTransport | None,
    progress_every: float,
) -> tuple[list[Any], float, PrefixCacheCounters | None]:
    """Warm up, scrape, replay (with a progress log); results, wall seconds, the first scrape."""
    from skv.vllm.client import StreamingClient, replay
    from skv.vllm.hashreplay import replay_plan

    async with StreamingClient(s.url, r.model, timeout=s.timeout, transport=transport) as c:
        for k in range(s.warmup):  # first-call overheads stay out of the measurements
            body = (
                {"prompt": "warm up"}
                if p.plan is None
                else {"prompt": [s.min_token_id + k % 2] * (r.block_size + 1)}
            )
            w = await c.request(body, max_tokens=1)
            if not w.ok:
                raise RuntimeError(f"{s.url}: the warm-up request failed: {w.error}")
        before = await asyncio.to_thread(_scrape, s.url, transport) if info.has_metrics else None
        counting = _Progress(c, len(p.arrivals))
        reporter = asyncio.create_task(counting.report(progress_every))
        how = (
            f"closed loop, concurrency {s.concurrency}"
            if s.concurrency is not None
            else f"open loop over {max(p.arrivals):.1f} s ({s.loop} arrivals)"
        )
        log.info("replaying %d requests: %s", len(p.arrivals), how)
        t = time.perf_counter()
        try:
            if p.plan is not None:
                res = await replay_plan(counting, p.plan, concurrency=s.concurrency)
            elif s.concurrency is not None:
                res = await replay(counting, p.prompts(), concurrency=s.concurrency)
            else:
                res = await replay(counting, p.prompts(), arrival_times=p.arrivals)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        return res, time.perf_counter() - t, before


def run(
    trace_path: str | Path,
    settings: ReplayTraceSettings,
    *,
    transport: httpx.MockTransport | None = None,
    progress_every: float = 10.0,
) -> ReplayTraceRun:
    """Load, plan, probe the server, scrape, replay, scrape again; nothing is written here.

    Bad input raises ValueError (TraceFormatError) or FileNotFoundError before any request is
    sent; an unreachable server :class:`ServerUnreachable`; a failed warm-up, or every request
    failing, RuntimeError. ``transport`` replaces the network (an ``httpx.MockTransport`` serves
    both the sync probes and the async requests in tests)."""
    from skv.vllm.hashreplay import bench_summary, results_to_trace

    s = settings
    requests, fmt = load_requests(trace_path, s.fmt, s.limit)
    try:
        source = choose_prompt_source(requests, s.prompts)
    except ValueError as exc:
        raise ValueError(f"{trace_path}: {exc}") from None
    log.info("%s: %d requests (%s), prompts from %s", trace_path, len(requests), fmt, source)
    info = probe_server(s.url, transport=transport)
    r = _resolve(s, info, source)
    log.info(
        "server %s: model %s, max_model_len %d, block size %s (engine %s), %s",
        s.url,
        r.model,
        r.max_model_len,
        r.block_size,
        info.block_size,
        f"vLLM {info.version}" if info.version else "version unknown",
    )
    p = _plan(requests, source, s, r)

    results, wall_s, before = asyncio.run(_send(s, r, p, info, transport, progress_every))
    ok = [x for x in results if x.ok]
    if not ok:
        raise RuntimeError(
            f"all {len(results)} requests failed, e.g. {results[0].error}; nothing written"
        )
    engine: dict[str, Any] | None = None
    if before is not None:
        engine = _engine_delta(s, transport, before, ok)
    else:
        log.warning("%s has no /metrics: the engine's own hit rate is not reported", s.url)

    settings_out = {
        **{k: v for k, v in dataclasses.asdict(s).items() if k != "fmt"},
        "model": r.model,
        "format": fmt,
        "prompts": source,
        "block_size": r.block_size,
        "max_model_len": r.max_model_len,
        "time_scale": r.time_scale if s.loop == "trace" else None,
        "loop": s.loop,
    }
    summary = {
        **bench_summary(results),
        "engine_prefix_cache_hit_rate": engine["hit_rate"] if engine else None,
        "engine_prefix_cache": engine,
        "replay_wall_s": wall_s,
        "plan": p.totals,
        "settings": settings_out,
        "trace": str(trace_path),
        "server": {**dataclasses.asdict(info), "url": s.url},
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if p.plan is not None:
        trace = results_to_trace(p.plan, results)
        meta = p.plan.meta()
    else:
        trace = text_results_to_trace(p.items, results)
        meta = {"textreplay": {"max_output_tokens": s.max_output_tokens, **p.totals}}
    meta.update(
        {
            "source": str(trace_path),
            "format": fmt,
            "prompts": source,
            "model": r.model,
            "server": s.url,
            "loop": s.loop,
            "measured": "observed_ttft_ms and observed_cached_tokens measured on a real "
            "engine (skv vllm replay-trace)",
        }
    )
    return ReplayTraceRun(trace, meta, summary, results)


def _engine_delta(
    s: ReplayTraceSettings,
    transport: httpx.MockTransport | None,
    before: PrefixCacheCounters,
    ok: Sequence[Any],
) -> dict[str, Any]:
    """The /metrics delta, polled briefly: the engine updates its counters after each step."""
    want_q = sum((r.prompt_tokens or 0) - 1 for r in ok)
    want_h = sum(r.cached_tokens or 0 for r in ok)
    deadline = time.monotonic() + s.metrics_wait
    while True:
        delta = _scrape(s.url, transport) - before
        if (delta.queries >= want_q and delta.hits >= want_h) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {
        "queries": delta.queries,
        "hits": delta.hits,
        "hit_rate": delta.hit_rate,
        "note": "vllm:prefix_cache_{queries,hits}_total delta over the replay (other traffic "
        "on the server counts too)",
    }


# ---------------------------------------------------------------------- outputs


def _clean(v: Any) -> Any:
    """JSON without NaN/inf (strict readers reject them)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def write_outputs(out_dir: str | Path, result: ReplayTraceRun) -> list[Path]:
    """``requests.jsonl`` and ``summary.json`` in ``out_dir``; both are serialised before either
    lands, each is written atomically, and a failure on the second removes the first."""
    from skv.fileio import atomic_write
    from skv.traces.native import write_skv_trace

    out = Path(out_dir)
    summary_text = json.dumps(_clean(result.summary), indent=2, sort_keys=False) + "\n"
    req_path = out / REQUESTS_FILE
    sum_path = out / SUMMARY_FILE
    write_skv_trace(req_path, result.trace, meta=_clean(result.meta))
    try:
        with atomic_write(sum_path) as f:
            f.write(summary_text)
    except BaseException:
        req_path.unlink(missing_ok=True)
        raise
    log.info("wrote %s and %s", req_path, sum_path)
    return [req_path, sum_path]
