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
from dataclasses import dataclass, field
from typing import Any

from skv.blocks import RequestBlocks
from skv.latency.base import Iteration, PrefillChunk
from skv.model import Request


@dataclass(slots=True)
class RequestState:
    """A request on its way through a replica; times in seconds of simulated time.

    ``generated`` is exact at the first token (1) and at the end (``output_target``); while the
    request decodes it stays 1 and the replica derives the count from ``decode_from``."""

    index: int
    request: Request
    rb: RequestBlocks
    arrival_s: float
    replica: int = -1
    lease: Any = None
    admitted_s: float | None = None
    cached_tokens: int = 0
    hit_blocks: int = 0
    prefill_total: int = 0
    prefilled: int = 0
    generated: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None
    chunk: int = 0  # prefill tokens scheduled in the current iteration
    seq: int = 0  # admission order on its replica
    decode_from: int = 0  # the replica iteration that produced the first token
    ext_rb: RequestBlocks | None = None  # prompt + answer blocks (see engine._plan_output_blocks)
    ext_start: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.rb.prompt_tokens

    @property
    def output_target(self) -> int:
        return max(1, self.request.output_tokens)

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_total


@dataclass
class Replica:
    """One replica's queue, batch and cache. ``iterations`` counts completed iterations;
    ``decoding`` and ``decode_context`` are the next iteration's decode sums; ``load`` =
    waiting + running requests (kept as a count: routers read it for every arrival)."""

    index: int
    cache: Any
    max_batch_tokens: int
    max_running: int
    waiting: deque[RequestState] = field(default_factory=deque)
    prefilling: list[RequestState] = field(default_factory=list)  # admission order
    running: int = 0  # requests admitted and not finished (prefilling + decoding)
    decoding: int = 0
    decode_context: int = 0
    busy: bool = False
    iterations: int = 0
    load: int = 0
    _finishes: list[tuple[int, int, RequestState]] = field(default_factory=list)
    _chunked: int = 0  # the first _chunked prefilling requests have a chunk planned
    _admitted: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.max_running <= self.max_batch_tokens:
            raise ValueError(
                f"need 1 <= max_running <= max_batch_tokens (every running request must be "
                f"able to decode in one iteration, as vLLM requires), got max_running="
                f"{self.max_running}, max_batch_tokens={self.max_batch_tokens}"
            )

    def enqueue(self, st: RequestState) -> None:
        """A request routed here joins the admission queue."""
        self.waiting.append(st)
        self.load += 1

    @property
    def next_finish(self) -> int | None:
        """The iteration number in which the next decoding request finishes (None: none)."""
        return self._finishes[0][0] if self._finishes else None

    def admit(self, now: float) -> list[RequestState]:
        """Move waiting requests to running while the batch and the cache have room."""
        admitted = []
        cache = self.cache
        while self.waiting and self.running < self.max_running:
            st = self.waiting[0]
            rb = st.rb
            needed = cache.admission_need(rb)  # misses + hits nobody holds
            free = cache.usable_blocks - cache.pinned_blocks
            if needed > free and self.running:
                break  # wait for running requests to release their blocks
            self.waiting.popleft()
            lease = cache.acquire(rb, now)
            st.lease = lease
            st.admitted_s = now
            # the last prompt token is always computed (it yields the first output token)
            st.cached_tokens = max(0, min(lease.hit_tokens, st.prompt_tokens - 1))
            st.hit_blocks = lease.hit_blocks
            st.prefill_total = st.prompt_tokens - st.cached_tokens
            st.seq = self._admitted
            self._admitted += 1
            self.prefilling.append(st)
            self.running += 1
            admitted.append(st)
        return admitted

    def plan(self) -> Iteration | None:
        """This iteration's work: one decode token per decoding request, then prefill chunks."""
        budget = self.max_batch_tokens - self.decoding
        chunks = []
        for st in self.prefilling:
            if budget <= 0:
                break
            st.chunk = min(st.prefill_total - st.prefilled, budget)
            budget -= st.chunk
            chunks.append(PrefillChunk(st.chunk, st.cached_tokens + st.prefilled))
        self._chunked = len(chunks)
        if not chunks and not self.decoding:
            return None
        return Iteration(tuple(chunks), self.decoding, self.decode_context)

    def advance(self, now: float) -> list[RequestState]:
        """Apply the planned iteration, ending at ``now``; returns the requests that finished
        (admission order)."""
        self.iterations += 1
        j = self.iterations
        self.decode_context += self.decoding  # every decoder generated one more token
        done = []
        fin = self._finishes
        while fin and fin[0][0] == j:
            st = heapq.heappop(fin)[2]
            st.generated = st.output_target
            st.finished_s = now
            self.decoding -= 1
            self.decode_context -= st.prompt_tokens + st.generated
            done.append(st)
        if self._chunked:
            chunked = self.prefilling[: self._chunked]
            del self.prefilling[: self._chunked]
            still = []
            for st in chunked:
                st.prefilled += st.chunk
                st.chunk = 0
                if st.prefilled < st.prefill_total:
                    still.append(st)
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
            self.prefilling[:0] = still
            self._chunked = 0
        if done:
            self.running -= len(done)
            self.load -= len(done)
            if len(done) > 1:
                done.sort(key=_by_seq)
        return done

    def skip_decodes(self, count: int) -> None:
        """Apply ``count`` decode-only iterations in which nobody finishes (the engine's fast
        path): only the iteration count and the decode context move."""
        if count <= 0:
            return
        nxt = self.next_finish
        if self.prefilling or (nxt is not None and nxt <= self.iterations + count):
            raise RuntimeError("skip_decodes: a prefill or a finish inside the skipped run")
        self.iterations += count
        self.decode_context += count * self.decoding


def _by_seq(st: RequestState) -> int:
    return st.seq
