"""The simulator's event loop: arrivals and iteration ends in time order (compiled: see
skv/_build.py; the module docstring of :mod:`skv.sim.engine` describes the model).

:class:`EventLoop` owns the event heap and the per-replica bookkeeping (iterations, decode
runs, completions, memory samples); :mod:`skv.sim.engine` builds the requests, replicas and
router, runs the loop and summarises. Invariant: the heap holds ``(end_s, seq, replica,
version)``; an entry whose version is not the replica's current one belongs to a decode run
that an arrival cut short, and is skipped.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

import cython

from skv.latency.base import Iteration, LatencyModel
from skv.sim.replica import Replica, RequestState

IterationHook = Callable[[int, float, float, Iteration], None]


class DecodeRun:
    """Decode-only iterations of one replica priced at once: the first starts at ``start``
    with ``context`` decode tokens; ``ends[i]`` is iteration i's end; ``sample`` the replica's
    memory sample (constant during the run), or None when the run ends before the replica's
    next sample is due (the sample is then never read)."""

    def __init__(self, start: float, context: int, ends: list, sample: dict | None) -> None:
        self.start = start
        self.context = context
        self.ends = ends
        self.sample = sample


class EventLoop:
    """One simulation's events. ``run_cap_start``/``run_cap_max``: a decode run's length cap
    starts at the first, doubles while runs end uncut (up to the second) and shrinks to twice
    the length a cut left (:meth:`cut_run`)."""

    def __init__(
        self,
        config: Any,
        latency: Any,
        replicas: list,
        on_iteration: IterationHook | None,
        run_cap_start: int,
        run_cap_max: int,
    ) -> None:
        n = len(replicas)
        self.latency = latency
        self.replicas = replicas
        self.on_iteration = on_iteration
        self.memory = []
        self.policy_series = []
        self.heap = []
        self.version = [0] * n
        self.seq = 0
        self.runs = [None] * n
        self.cap = [run_cap_start] * n
        self.next_sample = [0.0] * n
        self.finished = 0
        self.run_cap_start = run_cap_start
        self.run_cap_max = run_cap_max
        self.sample_every_s = config.sample_every_s
        self.policy_metrics_every = config.policy_metrics_every or 0  # None: off
        self.include_output_blocks = config.include_output_blocks
        self.tiered = bool(config.tiers)
        self.tier_overlap = bool(config.tier_overlap)
        # an iteration with prefill is priced from its chunks' numbers (no Iteration built)
        # when no hook needs the Iteration and the model prices them itself
        own = getattr(type(latency), "prefill_ms", LatencyModel.prefill_ms)
        self.price_chunks = on_iteration is None and own is not LatencyModel.prefill_ms

    def run(self, states: list, router: Any, progress: Callable[[int], Any] | None) -> None:
        """Serve ``states`` (in arrival order) to the end; ``router.choose(rb)`` picks each
        request's replica; ``progress(n)`` is told of every ``n`` requests that finish."""
        heap: list = self.heap
        replicas: list = self.replicas
        version: list = self.version
        nxt: cython.Py_ssize_t = 0
        n: cython.Py_ssize_t = len(states)
        k: cython.Py_ssize_t
        now: cython.double
        st: RequestState
        rep: Replica
        while nxt < n or heap:
            st = states[nxt] if nxt < n else None
            if st is not None and (not heap or st.arrival_s <= heap[0][0]):
                nxt += 1
                now = st.arrival_s
                k = router.choose(st.rb)
                if not 0 <= k < len(replicas):  # compiled, the lists are indexed unchecked
                    raise ValueError(f"the router chose replica {k} of {len(replicas)}")
                st.replica = k
                rep = replicas[k]
                rep.enqueue(st)
                if rep.busy:
                    self.cut_run(k, now)
                    continue
            else:
                event = heapq.heappop(heap)
                k = event[2]
                if event[3] != version[k]:
                    continue  # a decode run that an arrival cut short
                now = event[0]
                rep = replicas[k]
                self.end_run(rep)
                done: list = rep.advance(now)
                if done:
                    for st in done:
                        self.finish(rep, st, now)
                    if progress is not None:
                        progress(len(done))
            self.start_iteration(rep, now)

    def push(self, k: cython.Py_ssize_t, end: cython.double) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (end, self.seq, k, self.version[k]))

    def start_iteration(self, rep: Replica, now: cython.double) -> None:
        """Admit, plan and start ``rep``'s next iteration (or decode run), or mark it idle."""
        rep.admit(now)
        chunked: cython.Py_ssize_t = rep.plan_chunks()
        if now >= self.next_sample[rep.index]:
            self.sample(rep, now)
        if not chunked and not rep.decoding:
            rep.busy = False
            return
        rep.busy = True
        k: cython.Py_ssize_t = rep.index
        length: cython.longlong = 1
        fin: list = rep.finishes
        end: cython.double
        ms: cython.double
        load_ms: cython.double = 0.0
        if self.tiered:  # lower-tier loads of the requests admitted above
            load_ms = rep.cache.take_load_ms()
        if not chunked and fin and load_ms == 0.0:
            length = min(fin[0][0] - rep.iterations, self.cap[k])
        if length <= 1:
            if chunked and self.price_chunks:
                tokens, contexts = rep.chunk_lists()  # the chunks planned above
                ms = self.latency.prefill_ms(tokens, contexts, rep.decoding, rep.decode_context)
                it = None
            elif chunked:
                it = rep.iteration()
                ms = self.latency.iteration_ms(it)
            else:
                ms = self.latency.decode_ms(rep.decoding, rep.decode_context)
                it = None
            if load_ms > 0.0:  # overlapped (layer by layer): the longer; else in series
                ms = max(ms, load_ms) if self.tier_overlap else ms + load_ms
            end = now + ms / 1000.0
            if self.on_iteration is not None:
                if it is None:
                    it = Iteration((), rep.decoding, rep.decode_context)
                self.on_iteration(k, now, end, it)
            self.push(k, end)
            return
        ends: list = self.latency.decode_run_ends(rep.decoding, rep.decode_context, length, now)
        last: cython.double = ends[len(ends) - 1]
        # :meth:`end_run` samples at iteration ends up to the last (a cut only drops ends), and
        # nothing moves ``next_sample[k]`` while the run lasts: past it, no sample is taken
        sample = self.snapshot(rep) if self.next_sample[k] <= last else None
        self.runs[k] = DecodeRun(now, rep.decode_context, ends, sample)
        self.push(k, last)

    def cut_run(self, k: cython.Py_ssize_t, now: cython.double) -> None:
        """A request was routed to busy replica ``k`` at ``now``: end its decode run at the first
        iteration end >= ``now`` (where it will be admitted)."""
        run = self.runs[k]
        if run is None:
            return
        ends: list = run.ends
        m: cython.Py_ssize_t = bisect_left(ends, now)
        if m >= len(ends) - 1:
            return
        del ends[m + 1 :]
        self.cap[k] = max(self.run_cap_start, (m + 1) * 2)
        self.version[k] += 1
        self.push(k, ends[m])

    def end_run(self, rep: Replica) -> None:
        """Before ``rep``'s last iteration of a decode run is applied: apply the others, and
        report their iterations and memory samples."""
        k: cython.Py_ssize_t = rep.index
        run = self.runs[k]
        if run is None:
            return
        self.runs[k] = None
        ends: list = run.ends
        count: cython.Py_ssize_t = len(ends)
        if count >= self.cap[k]:
            self.cap[k] = min(self.run_cap_max, self.cap[k] * 2)
        rep.skip_decodes(count - 1)
        every: cython.double = self.sample_every_s
        start: cython.double = run.start
        i: cython.Py_ssize_t
        for i in range(count):
            if i and start >= self.next_sample[k]:
                self.next_sample[k] = start + every
                self.memory.append({"time_s": start, **run.sample})
            if self.on_iteration is not None:
                d = rep.decoding
                self.on_iteration(k, start, ends[i], Iteration((), d, run.context + i * d))
            start = ends[i]

    def finish(self, rep: Replica, st: RequestState, now: cython.double) -> None:
        if self.include_output_blocks and st.ext_rb is not None:
            # the generated answer's blocks (type ``output``) after the prompt's chain
            rep.cache.extend(st.lease, st.ext_rb, st.ext_start, now)
        rep.cache.release(st.lease, now)
        st.lease = None
        self.finished += 1
        every: cython.longlong = self.policy_metrics_every
        if every and self.finished % every == 0:
            policy = getattr(rep.cache, "policy", None)
            if policy is not None:
                m = policy.metrics()
                if m:
                    self.policy_series.append({"time_s": now, "replica": rep.index, **m})

    def snapshot(self, rep: Replica) -> dict:
        cache = rep.cache
        return {
            "replica": rep.index,
            "cached_blocks": len(cache),
            "pinned_blocks": cache.pinned_blocks,
            "utilisation": len(cache) / cache.usable_blocks,
            "waiting": len(rep.waiting),
            "running": rep.running,
        }

    def sample(self, rep: Replica, now: cython.double) -> None:
        self.next_sample[rep.index] = now + self.sample_every_s
        self.memory.append({"time_s": now, **self.snapshot(rep)})
