"""One serving replica: an admission queue, continuous batching, and its own block cache.

Per iteration (vLLM-style chunked prefill): every running request that has finished its prefill
decodes one token; the remaining token budget goes to prefill chunks of running requests in
admission order. Admission is FCFS and waits (head of line) while the cache cannot hold the
request's uncached blocks next to the blocks pinned by running requests; a cached block it
would hit that no request holds counts as needed too, since pinning it takes it out of the
evictable pool (vLLM v1 counts it the same way; ``admission_need``). A request holds its
prompt blocks (pinned) from admission to completion; its generated output grows its blocks
(type ``output``) when it finishes, so a later turn that quotes the answer can hit it.

Decoding costs O(1) per iteration, not O(batch): ``max_running <= max_batch_tokens`` (vLLM
requires the same), so every decoding request decodes in every iteration; its token count is
implied by the iteration it started decoding in, the decoders' context lengths are kept as one
running sum, and the iteration each one finishes in is known when it starts decoding (a heap).
Per iteration the replica touches only the requests in prefill and the ones finishing.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

import cython

from skv.blocks import RequestBlocks
from skv.latency.base import Iteration, PrefillChunk
from skv.model import Request


class RequestState:
    """A request on its way through a replica; times in seconds of simulated time (None:
    not reached yet).

    ``generated`` is exact at the first token (1) and at the end (``output_target``); while the
    request decodes it stays 1 and the replica derives the count from ``decode_from``.
    ``prompt_tokens`` and ``output_target`` are fixed at creation (read on every iteration)."""

    def __init__(self, index: int, request: Request, rb: RequestBlocks, arrival_s: float) -> None:
        self.index = index
        self.request = request
        self.rb = rb
        self.arrival_s = arrival_s
        self.prompt_tokens = rb.prompt_tokens
        self.output_target = max(1, int(request.output_tokens))
        self.replica = -1
        self.lease = None
        self.admitted_s = None
        self.first_token_s = None
        self.finished_s = None
        self.cached_tokens = 0
        self.hit_blocks = 0
        self.prefill_total = 0
        self.prefilled = 0
        self.generated = 0
        self.chunk = 0  # prefill tokens scheduled in the current iteration
        self.seq = 0  # admission order on its replica
        self.decode_from = 0  # the replica iteration that produced the first token
        self.ext_rb = None  # prompt + answer blocks (see engine._answer_blocks)
        self.ext_start = 0

    def __repr__(self) -> str:
        return (
            f"RequestState(index={self.index}, request={self.request.request_id!r}, "
            f"replica={self.replica}, prefilled={self.prefilled}/{self.prefill_total})"
        )

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_total


class Replica:
    """One replica's queue, batch and cache. ``iterations`` counts completed iterations;
    ``decoding`` and ``decode_context`` are the next iteration's decode sums; ``load`` =
    waiting + running requests (kept as a count: routers read it for every arrival).
    ``prefilling`` is in admission order; its first ``chunked`` requests have a chunk planned
    for the current iteration; ``finishes`` is the heap of (finish iteration, seq, state) of
    the decoding requests."""

    def __init__(self, index: int, cache: Any, max_batch_tokens: int, max_running: int) -> None:
        if not 1 <= max_running <= max_batch_tokens:
            raise ValueError(
                f"need 1 <= max_running <= max_batch_tokens (every running request must be "
                f"able to decode in one iteration, as vLLM requires), got max_running="
                f"{max_running}, max_batch_tokens={max_batch_tokens}"
            )
        self.index = index
        self.cache = cache
        self.max_batch_tokens = max_batch_tokens
        self.max_running = max_running
        self.waiting = deque()
        self.prefilling = []
        self.running = 0  # requests admitted and not finished (prefilling + decoding)
        self.decoding = 0
        self.decode_context = 0
        self.busy = False
        self.iterations = 0
        self.load = 0
        self.finishes = []
        self.chunked = 0
        self.admitted = 0

    def enqueue(self, st: RequestState) -> None:
        """A request routed here joins the admission queue."""
        self.waiting.append(st)
        self.load += 1

    @property
    def next_finish(self) -> int | None:
        """The iteration number in which the next decoding request finishes (None: none)."""
        return self.finishes[0][0] if self.finishes else None

    def admit(self, now: float) -> list[RequestState]:
        """Move waiting requests to running while the batch and the cache have room."""
        admitted: list = []
        cache = self.cache
        waiting = self.waiting
        st: RequestState
        needed: cython.longlong
        free: cython.longlong
        hit: cython.longlong
        while waiting and self.running < self.max_running:
            st = waiting[0]
            rb = st.rb
            needed = cache.admission_need(rb)  # misses + hits nobody holds
            free = cache.usable_blocks - cache.pinned_blocks
            if needed > free and self.running:
                break  # wait for running requests to release their blocks
            waiting.popleft()
            lease = cache.acquire(rb, now)
            st.lease = lease
            st.admitted_s = now
            # the last prompt token is always computed (it yields the first output token)
            hit = lease.hit_tokens
            st.cached_tokens = max(0, min(hit, st.prompt_tokens - 1))
            st.hit_blocks = lease.hit_blocks
            st.prefill_total = st.prompt_tokens - st.cached_tokens
            st.seq = self.admitted
            self.admitted += 1
            self.prefilling.append(st)
            self.running += 1
            admitted.append(st)
        return admitted

    def plan(self) -> Iteration | None:
        """This iteration's work: one decode token per decoding request, then prefill chunks
        (None: nothing to run). Sets every chunk (``RequestState.chunk``) that ``advance``
        applies."""
        if not self.plan_chunks() and not self.decoding:
            return None
        return self.iteration()

    def iteration(self) -> Iteration:
        """The ``Iteration`` of the chunks :meth:`plan_chunks` set, plus this step's decodes."""
        chunks = []
        st: RequestState
        i: cython.Py_ssize_t
        for i in range(self.chunked):
            st = self.prefilling[i]
            chunks.append(PrefillChunk(st.chunk, st.cached_tokens + st.prefilled))
        return Iteration(tuple(chunks), self.decoding, self.decode_context)

    def chunk_lists(self) -> tuple[list, list]:
        """The numbers of :meth:`iteration`'s prefill chunks, in its order: (tokens,
        context_before) lists, for ``LatencyModel.prefill_ms`` (no objects built)."""
        tokens = []
        contexts = []
        st: RequestState
        i: cython.Py_ssize_t
        for i in range(self.chunked):
            st = self.prefilling[i]
            tokens.append(st.chunk)
            contexts.append(st.cached_tokens + st.prefilled)
        return tokens, contexts

    def plan_chunks(self) -> int:
        """:meth:`plan` without building the ``Iteration`` (the event loop's path): sets the
        chunks and returns how many requests got one (the first ``chunked`` of
        ``prefilling``)."""
        budget: cython.longlong = self.max_batch_tokens - self.decoding
        n: cython.Py_ssize_t = 0
        st: RequestState
        for st in self.prefilling:
            if budget <= 0:
                break
            st.chunk = min(st.prefill_total - st.prefilled, budget)
            budget -= st.chunk
            n += 1
        self.chunked = n
        return n

    def advance(self, now: float) -> list[RequestState]:
        """Apply the planned iteration, ending at ``now``; returns the requests that finished
        (admission order)."""
        self.iterations += 1
        j: cython.longlong = self.iterations
        self.decode_context += self.decoding  # every decoder generated one more token
        done: list = []
        fin: list = self.finishes
        st: RequestState
        i: cython.Py_ssize_t
        while fin and fin[0][0] == j:
            st = heapq.heappop(fin)[2]
            st.generated = st.output_target
            st.finished_s = now
            self.decoding -= 1
            self.decode_context -= st.prompt_tokens + st.generated
            done.append(st)
        if self.chunked:
            prefilling: list = self.prefilling
            kept: cython.Py_ssize_t = 0  # still in prefill, moved to the front in order
            for i in range(self.chunked):
                st = prefilling[i]
                st.prefilled += st.chunk
                st.chunk = 0
                if st.prefilled < st.prefill_total:
                    prefilling[kept] = st
                    kept += 1
                    continue
                # the iteration that ends prefill samples the first token
                st.first_token_s = now
                st.generated = 1
                if st.output_target <= 1:
                    st.finished_s = now
                    done.append(st)
                else:
                    st.decode_from = j
                    self.decoding += 1
                    self.decode_context += st.prompt_tokens + 1
                    heapq.heappush(fin, (j + st.output_target - 1, st.seq, st))
            del prefilling[kept : self.chunked]
            self.chunked = 0
        if done:
            self.running -= len(done)
            self.load -= len(done)
            if len(done) > 1:
                done.sort(key=_by_seq)
        return done

    def skip_decodes(self, count: cython.longlong) -> None:
        """Apply ``count`` decode-only iterations in which nobody finishes (the engine's fast
        path): only the iteration count and the decode context move."""
        if count <= 0:
            return
        fin: list = self.finishes
        if self.prefilling or (fin and fin[0][0] <= self.iterations + count):
            raise RuntimeError("skip_decodes: a prefill or a finish inside the skipped run")
        self.iterations += count
        self.decode_context += count * self.decoding


def _by_seq(st: RequestState) -> int:
    return st.seq
