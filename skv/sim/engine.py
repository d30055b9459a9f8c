"""The discrete-event serving simulator: arrivals -> router -> replicas -> per-request metrics.

Simulated time jumps from event to event: the next arrival, or the end of some replica's
current iteration (whose length the latency model gives). A replica runs iterations back to back
while it has work and idles otherwise. Everything is deterministic: same requests, config and
latency model give identical results.

Runs of decode-only iterations are one event (the fast path that makes decode-heavy cluster
runs cheap): while a replica has no prompt to prefill, nothing changes on it until a decoding
request finishes (known in advance: :mod:`skv.sim.replica`) or a new request is routed to it,
so its next iterations' end times are computed at once (``LatencyModel.decode_ms``) and only the
run's last end is queued. A request routed to the replica mid-run cuts the run at the first
iteration end at or after its arrival, exactly where the iteration-by-iteration loop would have
admitted it, so results are identical to pricing each iteration as its own event (a test checks
this). Runs are capped in length (doubling while runs finish uncut, shrinking when cut) so a cut
wastes little pricing work.
"""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tqdm import tqdm

from skv.blocks import (
    KeyingMode,
    RequestBlocks,
    annotate_next_use,
    compile_trace,
    request_blocks,
)
from skv.latency.base import Iteration, LatencyModel
from skv.model import Request, Segment, SemanticType, content_hash
from skv.policies.registry import OFFLINE, make_cache
from skv.sim.config import SimConfig
from skv.sim.replica import Replica, RequestState
from skv.sim.results import SimResult, summarize
from skv.sim.routers import SimRouting

log = logging.getLogger(__name__)


def simulate(
    requests: Sequence[Request],
    config: SimConfig,
    latency: LatencyModel,
    *,
    progress: bool | None = None,
    on_iteration: IterationHook | None = None,
) -> SimResult:
    """Serve ``requests`` (any order; sorted by arrival here) and measure every request.

    ``on_iteration(replica, start_s, end_s, iteration)`` is called for every iteration a replica
    runs, in each replica's order (for tests and debugging; None costs nothing).

    Every prompt needs at least one token: an engine computes the last prompt token to emit the
    first output token, and a request with nothing to prefill would never get one (it used to
    loop forever). Such a request is rejected with its id, before anything runs."""
    empty = [r.request_id for r in requests if r.prompt_tokens <= 0]
    if empty:
        shown = ", ".join(map(str, empty[:5])) + (
            f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        )
        raise ValueError(
            f"{len(empty)} request(s) with an empty prompt (0 tokens): {shown}; a serving "
            "engine needs at least one prompt token (drop or fix them in the trace)"
        )
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    ordered = [requests[i] for i in order]
    mode = KeyingMode(config.mode)
    trace = compile_trace(ordered, config.block_size, mode, salt_by_tenant=config.salt_by_tenant)
    states = [
        RequestState(rb.index, r, rb, r.arrival_s) for r, rb in zip(ordered, trace, strict=True)
    ]
    replicas = [
        Replica(
            k,
            make_cache(config.policy, config.capacity_blocks, config.policy_params),
            config.max_batch_tokens,
            config.max_running,
        )
        for k in range(config.replicas)
    ]
    if config.include_output_blocks:
        for st in states:
            _plan_output_blocks(st, config)
    if config.policy in OFFLINE:
        _annotate_next_use(states)
        for rep in replicas:
            rep.cache.prepare(trace)
    router = SimRouting(
        config.router,
        config.router_params,
        replicas,
        config.router_view,
        config.router_cache_blocks,
    )
    sim = _Run(config, latency, replicas, on_iteration)
    heap = sim.heap
    nxt = 0
    n = len(states)
    with tqdm(
        total=n,
        desc=f"simulate {config.policy}",
        unit="req",
        leave=False,
        disable=(not progress) if progress is not None else None,
        mininterval=1.0,
    ) as bar:
        while nxt < n or heap:
            if nxt < n and (not heap or states[nxt].arrival_s <= heap[0][0]):
                st = states[nxt]
                nxt += 1
                now = st.arrival_s
                k = router.choose(st.rb)
                st.replica = k
                rep = replicas[k]
                rep.enqueue(st)
                if rep.busy:
                    sim.cut_run(k, now)
                    continue
            else:
                now, _, k, version = heapq.heappop(heap)
                if version != sim.version[k]:
                    continue  # a decode run that an arrival cut short
                rep = replicas[k]
                sim.end_run(rep)
                for st in rep.advance(now):
                    sim.finish(rep, st, now)
                    bar.update(1)
            sim.start_iteration(rep, now)
    unfinished = [st for st in states if st.finished_s is None]
    if unfinished:  # cannot happen unless a request can never be admitted
        raise RuntimeError(
            f"{len(unfinished)} requests never finished (first: {unfinished[0].request.request_id})"
        )
    sim.memory.sort(key=_by_time)  # decode runs add their samples when they end
    return summarize(states, replicas, sim.memory, sim.policy_series, config, latency)


IterationHook = Callable[[int, float, float, Iteration], None]

#: a decode run's length cap starts here, doubles while runs end uncut, and never exceeds the max
_RUN_CAP_START = 8
_RUN_CAP_MAX = 1024


@dataclass(slots=True)
class _DecodeRun:
    """Decode-only iterations of one replica priced at once: the first starts at ``start``
    with ``context`` decode tokens; ``ends[i]`` is iteration i's end; ``sample`` the replica's
    memory sample (constant during the run)."""

    start: float
    context: int
    ends: list[float]
    sample: dict[str, float]


def _by_time(row: dict[str, float]) -> float:
    return row["time_s"]


class _Run:
    """Per-run bookkeeping the event loop delegates to (iterations, decode runs, completions,
    samples). ``heap`` holds ``(end_s, seq, replica, version)``; an entry whose version is not
    the replica's current one belongs to a cut decode run and is skipped."""

    def __init__(
        self,
        config: SimConfig,
        latency: LatencyModel,
        replicas: list[Replica],
        on_iteration: IterationHook | None = None,
    ):
        self.config = config
        self.latency = latency
        self.replicas = replicas
        self.on_iteration = on_iteration
        self.memory: list[dict[str, float]] = []
        self.policy_series: list[dict[str, float]] = []
        self.heap: list[tuple[float, int, int, int]] = []
        self.version = [0] * len(replicas)
        self._seq = 0
        self._runs: list[_DecodeRun | None] = [None] * len(replicas)
        self._cap = [_RUN_CAP_START] * len(replicas)
        self._next_sample = [0.0] * len(replicas)
        self._finished = 0

    def _push(self, k: int, end: float) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (end, self._seq, k, self.version[k]))

    def start_iteration(self, rep: Replica, now: float) -> None:
        """Admit, plan and start ``rep``'s next iteration (or decode run), or mark it idle."""
        rep.admit(now)
        it = rep.plan()
        self._sample(rep, now)
        if it is None:
            rep.busy = False
            return
        rep.busy = True
        k = rep.index
        nxt = rep.next_finish
        length = 1 if it.prefill or nxt is None else min(nxt - rep.iterations, self._cap[k])
        if length <= 1:
            end = now + self.latency.iteration_ms(it) / 1000.0
            if self.on_iteration is not None:
                self.on_iteration(k, now, end, it)
            self._push(k, end)
            return
        ends = self.latency.decode_run_ends(rep.decoding, rep.decode_context, length, now)
        self._runs[k] = _DecodeRun(now, rep.decode_context, ends, self._snapshot(rep))
        self._push(k, ends[-1])

    def cut_run(self, k: int, now: float) -> None:
        """A request was routed to busy replica ``k`` at ``now``: end its decode run at the first
        iteration end >= ``now`` (where it will be admitted)."""
        run = self._runs[k]
        if run is None:
            return
        m = bisect_left(run.ends, now)
        if m >= len(run.ends) - 1:
            return
        del run.ends[m + 1 :]
        self._cap[k] = max(_RUN_CAP_START, (m + 1) * 2)
        self.version[k] += 1
        self._push(k, run.ends[m])

    def end_run(self, rep: Replica) -> None:
        """Before ``rep``'s last iteration of a decode run is applied: apply the others, and
        report their iterations and memory samples."""
        k = rep.index
        run = self._runs[k]
        if run is None:
            return
        self._runs[k] = None
        ends = run.ends
        if len(ends) >= self._cap[k]:
            self._cap[k] = min(_RUN_CAP_MAX, self._cap[k] * 2)
        rep.skip_decodes(len(ends) - 1)
        every = self.config.sample_every_s
        start = run.start
        for i, end in enumerate(ends):
            if i and start >= self._next_sample[k]:
                self._next_sample[k] = start + every
                self.memory.append({"time_s": start, **run.sample})
            if self.on_iteration is not None:
                d = rep.decoding
                self.on_iteration(k, start, end, Iteration((), d, run.context + i * d))
            start = end

    def finish(self, rep: Replica, st: RequestState, now: float) -> None:
        if self.config.include_output_blocks:
            self._grow_by_output(rep, st, now)
        rep.cache.release(st.lease, now)
        st.lease = None
        self._finished += 1
        every = self.config.policy_metrics_every
        policy = getattr(rep.cache, "policy", None)
        if every and policy is not None and self._finished % every == 0:
            m = policy.metrics()
            if m:
                self.policy_series.append({"time_s": now, "replica": rep.index, **m})

    def _grow_by_output(self, rep: Replica, st: RequestState, now: float) -> None:
        """Cache the generated answer's blocks (type ``output``) after the prompt's chain."""
        if st.ext_rb is not None:
            rep.cache.extend(st.lease, st.ext_rb, st.ext_start, now)

    def _snapshot(self, rep: Replica) -> dict[str, float]:
        cache = rep.cache
        return {
            "replica": rep.index,
            "cached_blocks": len(cache),
            "pinned_blocks": cache.pinned_blocks,
            "utilisation": len(cache) / cache.usable_blocks,
            "waiting": len(rep.waiting),
            "running": rep.running,
        }

    def _sample(self, rep: Replica, now: float) -> None:
        if now < self._next_sample[rep.index]:
            return
        self._next_sample[rep.index] = now + self.config.sample_every_s
        self.memory.append({"time_s": now, **self._snapshot(rep)})


def _plan_output_blocks(st: RequestState, config: SimConfig) -> None:
    """The blocks of prompt + answer: the answer's blocks are cached when the request ends.

    ``ext_start`` is the first block that differs from the prompt's own (the prompt's partial
    last block is completed by the answer's first tokens). Hash-id traces carry no identity for
    generated tokens, so their answers are not cached.
    """
    r = st.request
    if r.hash_ids is not None:
        return
    answer = Segment(
        SemanticType.OUTPUT,
        st.output_target,
        content_hash=r.output_hash or content_hash(f"output:{r.request_id}"),
        reusable=False,
    )
    ext = Request(
        r.request_id,
        r.arrival_s,
        [*r.segments, answer],
        tenant_id=r.tenant_id,
        session_id=r.session_id,
        turn=r.turn,
        templated=r.templated,
    )
    rb = st.rb
    ext_rb = request_blocks(
        ext,
        rb.block_size,
        KeyingMode(config.mode),
        index=rb.index,
        salt_by_tenant=config.salt_by_tenant,
    )
    start = 0
    for a, b in zip(rb.keys, ext_rb.keys, strict=False):
        if a != b:
            break
        start += 1
    st.ext_rb, st.ext_start = ext_rb, start


def _annotate_next_use(states: list[RequestState]) -> None:
    """Next use of every block a request touches, prompt and answer, for offline policies."""
    combined = []
    for st in states:
        rb = st.rb
        keys = list(rb.keys)
        if st.ext_rb is not None:
            keys += st.ext_rb.keys[st.ext_start :]
        combined.append(
            RequestBlocks(
                rb.index,
                rb.arrival_s,
                keys,
                [None] * len(keys),
                [1] * len(keys),
                [0] * len(keys),
                [1] * len(keys),
                None,
                0,
                False,
                rb.block_size,
            )
        )
    annotate_next_use(combined)
    for st, comb in zip(states, combined, strict=True):
        n = len(st.rb.keys)
        st.rb.next_use = comb.next_use[:n]
        if st.ext_rb is not None:
            st.ext_rb.next_use = st.rb.next_use[: st.ext_start] + comb.next_use[n:]


def config_dict(config: SimConfig) -> dict[str, Any]:
    return asdict(config)
