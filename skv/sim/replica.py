"""One serving replica: an admission queue, continuous batching, and its own block cache.

Per iteration (vLLM-style chunked prefill): every running request that has finished its prefill
decodes one token; the remaining token budget goes to prefill chunks of running requests in
admission order. Admission is FCFS and waits (head of line) while the cache cannot hold the
request's uncached blocks next to the blocks pinned by running requests. A request holds its
prompt blocks (pinned) from admission to completion; its generated output grows its blocks
(type ``output``) when it finishes, so a later turn that quotes the answer can hit it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from skv.blocks import RequestBlocks
from skv.latency.base import Iteration, PrefillChunk
from skv.model import Request


@dataclass(slots=True)
class RequestState:
    """A request on its way through a replica; times in seconds of simulated time."""

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
    decoding: bool = False  # decodes a token in the current iteration
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
    index: int
    cache: Any
    max_batch_tokens: int
    max_running: int
    waiting: deque[RequestState] = field(default_factory=deque)
    running: list[RequestState] = field(default_factory=list)
    busy: bool = False
    iterations: int = 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def admit(self, now: float) -> list[RequestState]:
        """Move waiting requests to running while the batch and the cache have room."""
        admitted = []
        cache = self.cache
        while self.waiting and len(self.running) < self.max_running:
            st = self.waiting[0]
            rb = st.rb
            needed = rb.num_blocks - cache.lookup(rb)
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
            self.running.append(st)
            admitted.append(st)
        return admitted

    def plan(self) -> Iteration | None:
        """This iteration's work: one decode token per decoding request, then prefill chunks."""
        budget = self.max_batch_tokens
        decode = []
        for st in self.running:
            st.chunk = 0
            st.decoding = not st.in_prefill and budget > 0
            if st.decoding:
                decode.append(st.prompt_tokens + st.generated)
                budget -= 1
        prefill = []
        for st in self.running:
            if st.in_prefill and budget > 0:
                st.chunk = min(st.prefill_total - st.prefilled, budget)
                budget -= st.chunk
                prefill.append(PrefillChunk(st.chunk, st.cached_tokens + st.prefilled))
        if not decode and not prefill:
            return None
        return Iteration(tuple(prefill), tuple(decode))

    def advance(self, now: float) -> list[RequestState]:
        """Apply the planned iteration, ending at ``now``; returns the requests that finished."""
        done = []
        for st in self.running:
            if st.chunk:
                st.prefilled += st.chunk
                if not st.in_prefill:  # the iteration that ends prefill samples the first token
                    st.first_token_s = now
                    st.generated = 1
            elif st.decoding:
                st.generated += 1
            st.chunk = 0
            st.decoding = False
            if st.first_token_s is not None and st.generated >= st.output_target:
                st.finished_s = now
                done.append(st)
        if done:
            finished = {id(st) for st in done}
            self.running = [st for st in self.running if id(st) not in finished]
        self.iterations += 1
        return done
