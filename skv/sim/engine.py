"""The discrete-event serving simulator: arrivals -> router -> replicas -> per-request metrics.

Simulated time jumps from event to event: the next arrival, or the end of some replica's
current iteration (whose length the latency model gives). A replica runs iterations back to back
while it has work and idles otherwise. Everything is deterministic: same requests, config and
latency model give identical results.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from skv.blocks import (
    KeyingMode,
    RequestBlocks,
    annotate_next_use,
    compile_trace,
    request_blocks,
)
from skv.latency.base import LatencyModel
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
) -> SimResult:
    """Serve ``requests`` (any order; sorted by arrival here) and measure every request.

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
    router = SimRouting(config.router, config.router_params, replicas)
    sim = _Run(config, latency, replicas)
    heap: list[tuple[float, int, int]] = []
    seq = 0
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
                rep.waiting.append(st)
                if rep.busy:
                    continue
            else:
                now, _, k = heapq.heappop(heap)
                rep = replicas[k]
                for st in rep.advance(now):
                    sim.finish(rep, st, now)
                    bar.update(1)
            dt = sim.start_iteration(rep, now)
            if dt is not None:
                seq += 1
                heapq.heappush(heap, (now + dt, seq, rep.index))
    unfinished = [st for st in states if st.finished_s is None]
    if unfinished:  # cannot happen unless a request can never be admitted
        raise RuntimeError(
            f"{len(unfinished)} requests never finished (first: {unfinished[0].request.request_id})"
        )
    return summarize(states, replicas, sim.memory, sim.policy_series, config, latency)


class _Run:
    """Per-run bookkeeping the event loop delegates to (iterations, completions, samples)."""

    def __init__(self, config: SimConfig, latency: LatencyModel, replicas: list[Replica]):
        self.config = config
        self.latency = latency
        self.replicas = replicas
        self.memory: list[dict[str, float]] = []
        self.policy_series: list[dict[str, float]] = []
        self._next_sample = [0.0] * len(replicas)
        self._finished = 0

    def start_iteration(self, rep: Replica, now: float) -> float | None:
        """Admit, plan and start ``rep``'s next iteration; its duration in s, or None if idle."""
        rep.admit(now)
        it = rep.plan()
        self._sample(rep, now)
        if it is None:
            rep.busy = False
            return None
        rep.busy = True
        return self.latency.iteration_ms(it) / 1000.0

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

    def _sample(self, rep: Replica, now: float) -> None:
        if now < self._next_sample[rep.index]:
            return
        self._next_sample[rep.index] = now + self.config.sample_every_s
        cache = rep.cache
        self.memory.append(
            {
                "time_s": now,
                "replica": rep.index,
                "cached_blocks": len(cache),
                "pinned_blocks": cache.pinned_blocks,
                "utilisation": len(cache) / cache.usable_blocks,
                "waiting": len(rep.waiting),
                "running": len(rep.running),
            }
        )


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
