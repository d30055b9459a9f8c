"""A replica's admission, token budget, iteration bookkeeping and decode fast path, the
simulator's router views and the config's bounds, pinned on small scenarios worked by hand.

These tests drive :class:`skv.sim.replica.Replica` directly (enqueue -> admit -> plan ->
advance, as the engine does) over hand-made prompts (``tests/helpers.rb``: one prefix chain of
full blocks of ``BS`` = 4 tokens), with a real ``lru`` block cache. Every expected value is
worked out in the test's docstring from the rules the replica documents (skv/sim/replica.py):
FCFS admission that waits while the uncached blocks do not fit next to the pinned ones, one
decode token per decoding request and the rest of ``max_batch_tokens`` to prefill chunks in
admission order, the first token from the iteration that ends the prefill, a finish after
``max(1, output_tokens)`` tokens, ``load`` = waiting + running. Router expectations come from
independent oracles: ``random.Random(seed)`` for the seeded random router, the documented
logical clock ("counts the insertions") for the approximate view. Nothing is copied from the
implementation's formulas or merely observed from a run.

They were written to kill mutation-testing survivors of skv/sim/replica.py,
skv/sim/routers.py and skv/sim/config.py (build/mutation/sim-survivors.md).
"""

from __future__ import annotations

import random

import pytest
from helpers import rb

from skv.latency.base import Iteration, PrefillChunk
from skv.model import Request, Segment, SemanticType, content_hash
from skv.policies.registry import make_cache
from skv.sim import SimConfig
from skv.sim.replica import Replica, RequestState
from skv.sim.routers import ApproximateView, ExactCacheView, SimRouting

BS = 4  # tokens per block
#: skip_decodes' refusal says why (any case: only that the message is informative is pinned)
REFUSED = r"(?i)prefill or a finish"


def _state(i: int, keys: list[int], out: int) -> RequestState:
    """Request ``i``: a prompt of ``len(keys)`` full blocks (``BS * len(keys)`` tokens) and
    ``out`` output tokens."""
    seg = Segment(SemanticType.USER_QUERY, BS * len(keys), content_hash(f"r{i}"))
    req = Request(f"r{i}", 0.0, [seg], output_tokens=out)
    return RequestState(i, req, rb(keys, block_size=BS, index=i), 0.0)


def _replica(capacity: int = 64, max_batch_tokens: int = 64, max_running: int = 8) -> Replica:
    return Replica(0, make_cache("lru", capacity), max_batch_tokens, max_running)


def _chunks(it: Iteration | None) -> list[tuple[int, int]]:
    assert it is not None
    return [(c.tokens, c.context_before) for c in it.prefill]


# ----------------------------------------------------------------------------------------
# construction and load


def test_max_running_may_equal_the_token_budget_but_not_exceed_it():
    """``1 <= max_running <= max_batch_tokens`` (every running request must be able to decode
    in one iteration): the boundary max_running == max_batch_tokens is allowed."""
    rep = _replica(max_batch_tokens=4, max_running=4)
    assert (rep.max_running, rep.max_batch_tokens) == (4, 4)
    with pytest.raises(ValueError, match="max_running"):
        _replica(max_batch_tokens=4, max_running=5)
    with pytest.raises(ValueError, match="max_running"):
        _replica(max_batch_tokens=4, max_running=0)


# ----------------------------------------------------------------------------------------
# admission: the batch limit and the cache


def test_admission_stops_at_max_running():
    """Three 1-block requests, ample cache, max_running = 2: the first two are admitted, the
    third waits; running 2, load 3 (2 running + 1 waiting)."""
    rep = _replica(max_running=2)
    a, b, c = _state(0, [1], 2), _state(1, [2], 2), _state(2, [3], 2)
    for st in (a, b, c):
        rep.enqueue(st)
    assert rep.admit(0.0) == [a, b]
    assert rep.running == 2
    assert list(rep.waiting) == [c]
    assert rep.load == 3


def test_a_request_that_exactly_fills_the_cache_is_admitted_the_next_one_waits():
    """Cache of 4 blocks, max_running 3. R (2 blocks) is admitted into the empty cache: 2
    pinned. B needs 2 new blocks and 4 - 2 = 2 are free: it fits exactly and is admitted (4
    pinned). C needs 1 block, 4 - 4 = 0 are free and requests are running: it waits (head of
    line). ``admit`` returns the admitted requests, in order; their blocks are acquired at the
    admission time (inserted and last accessed at t = 1.5)."""
    rep = _replica(capacity=4, max_running=3)
    r, b, c = _state(0, [1, 2], 2), _state(1, [3, 4], 2), _state(2, [5], 2)
    for st in (r, b, c):
        rep.enqueue(st)
    assert rep.admit(1.5) == [r, b]
    assert rep.running == 2
    assert list(rep.waiting) == [c]
    assert rep.cache.pinned_blocks == 4
    assert (r.admitted_s, b.admitted_s, c.admitted_s) == (1.5, 1.5, None)
    held = r.lease.blocks + b.lease.blocks
    assert [blk.key for blk in held] == [1, 2, 3, 4]
    assert {(blk.inserted_at, blk.last_access) for blk in held} == {(1.5, 1.5)}
    # a second admission attempt with the cache still full admits nobody
    assert rep.admit(2.0) == []
    assert list(rep.waiting) == [c]


def test_cached_blocks_reduce_what_a_request_needs_to_be_admitted():
    """Cache of 4 blocks holding the chain [1, 2] unpinned (seeded by an earlier request). R (1
    block, key 10) is admitted: 1 pinned, 3 free. B = [1, 2, 3] hits 2 blocks, so it needs
    only 3 - 2 = 1 new block <= 3 free: admitted. Its hit is 2 blocks = 8 tokens, all below
    the last prompt token, so cached 8 and 12 - 8 = 4 tokens to prefill."""
    rep = _replica(capacity=4, max_running=3)
    rep.cache.access(rb([1, 2], block_size=BS), 0.0)
    r, b = _state(0, [10], 2), _state(1, [1, 2, 3], 2)
    rep.enqueue(r)
    rep.enqueue(b)
    assert rep.admit(1.0) == [r, b]
    assert (b.hit_blocks, b.cached_tokens, b.prefill_total) == (2, 8, 4)
    assert rep.cache.pinned_blocks == 4


CACHES = [
    ("lru", None),  # BlockCache (radix, SGLang-style)
    ("vllm", None),  # VllmBlockPool
    ("vllm", {"eviction": "lru"}),  # PolicyBlockPool (the eviction plugin, simulated)
]


@pytest.mark.parametrize(("policy", "params"), CACHES, ids=["radix", "vllm", "plugin"])
def test_an_unheld_hit_counts_against_the_free_blocks_on_admission(policy, params):
    """Found by the mutation review (issue 11): a cached block a request would hit that no
    request holds is free only until the request pins it. vLLM v1 counts it as a block to
    allocate (``get_num_blocks_to_allocate``: new blocks + evictable computed blocks).

    4 usable blocks; the chain [1, 2] cached, unheld; R = [10] running (1 pinned, 3 free).
    B = [1, 2, 3, 4] (17 tokens: a short fifth block keeps both hits under vLLM's
    prompt_len - 1 cap) needs 3 misses (3, 4 and the short block) + 2 unheld hits = 5 > 3: it
    waits, where counting hits as free would admit it (5 - 2 = 3 <= 3) and leave a block
    uncached. C = [1, 2, 3] while H holds [1, 2]: 2 misses + 0 unheld hits = 2 <= 2 free:
    admitted."""
    capacity = 4 if policy == "lru" else 5  # the vLLM pools keep one null block
    cache = make_cache(policy, capacity, params)
    rep = Replica(0, cache, 64, 8)
    rep.cache.access(rb([1, 2], block_size=BS), 0.0)
    r = _state(0, [10], 2)
    b = _state(1, [1, 2, 3, 4], 2)
    b.rb.keys.append(99)
    b.rb.parents.append(4)
    b.rb.tokens.append(1)
    b.rb.stypes.append(b.rb.stypes[-1])
    b.rb.seg_tokens.append(b.rb.seg_tokens[-1])
    b.rb.prompt_tokens = 4 * BS + 1
    assert cache.lookup(b.rb) == 2
    assert cache.admission_need(b.rb) == 5
    rep.enqueue(r)
    rep.enqueue(b)
    assert rep.admit(1.0) == [r]
    assert list(rep.waiting) == [b]
    assert cache.stats.uncached_blocks == 0

    cache = make_cache(policy, capacity, params)
    rep = Replica(0, cache, 64, 8)
    h, c = _state(0, [1, 2], 2), _state(1, [1, 2, 3, 5], 2)
    rep.enqueue(h)
    assert rep.admit(0.0) == [h]
    assert cache.admission_need(c.rb) == 2
    rep.enqueue(c)
    assert rep.admit(1.0) == [c]


# ----------------------------------------------------------------------------------------
# the token budget of one iteration


def _plan_two(max_batch_tokens: int, a_blocks: int, b_blocks: int) -> Replica:
    rep = _replica(max_batch_tokens=max_batch_tokens, max_running=2)
    rep.enqueue(_state(0, list(range(1, a_blocks + 1)), 2))
    rep.enqueue(_state(1, list(range(100, 100 + b_blocks)), 2))
    assert len(rep.admit(0.0)) == 2
    return rep


def test_prefill_chunks_share_what_is_left_of_the_budget_in_admission_order():
    """Budget 10, A = 4 tokens, B = 8 tokens, nobody decoding: A takes 4, 10 - 4 = 6 are left
    for B (chunk 6 of 8). After the iteration both chunks are applied and nothing is planned
    (``chunk`` 0); next iteration A decodes one token (budget 10 - 1 = 9) and B prefills its
    last 2 tokens after the 6 it has (context 6); A's decode context is 4 + 1 = 5."""
    rep = _plan_two(10, 1, 2)
    a, b = rep.prefilling
    assert _chunks(rep.plan()) == [(4, 0), (6, 0)]
    assert (a.chunk, b.chunk) == (4, 6)
    assert rep.advance(1.0) == []
    assert (a.chunk, b.chunk) == (0, 0)
    assert (a.prefilled, b.prefilled) == (4, 6)
    it = rep.plan()
    assert _chunks(it) == [(2, 6)]
    assert (it.decode_seqs, it.decode_context_tokens) == (1, 5)


def test_a_chunk_that_uses_up_the_budget_exactly_ends_the_plan():
    """Budget 8, A = 8 tokens, B = 4 tokens: A's chunk of 8 leaves 0, so B gets no chunk at
    all (not an empty one): one chunk in the iteration, and B has nothing to apply."""
    rep = _plan_two(8, 2, 1)
    a, b = rep.prefilling
    assert _chunks(rep.plan()) == [(8, 0)]
    rep.advance(1.0)
    assert (a.prefilled, b.prefilled) == (8, 0)
    assert rep.prefilling == [b]


def test_a_single_token_left_in_the_budget_still_buys_a_chunk():
    """Budget 9, A = 8 tokens, B = 4 tokens: A takes 8, the 1 token left goes to B."""
    rep = _plan_two(9, 2, 1)
    assert _chunks(rep.plan()) == [(8, 0), (1, 0)]


# ----------------------------------------------------------------------------------------
# iterations: first tokens, finishes, load, order


def test_a_small_batch_iteration_by_iteration():
    """Budget 8, max_running 4. A and B: 4-token prompts, 2 output tokens; C: 8-token prompt,
    3 output tokens. All three enqueued (load 3) and admitted at t = 0.

    it 1  chunks A 4, B 4 (budget used up; C gets none). A and B end their prefill: first
          token at t = 1, decode_from = 1; each finishes after 2 tokens, in iteration 2.
    it 2  A, B decode (2 seqs, context 5 + 5 = 10); C chunk 8 - 2 = 6. A and B finish
          together, returned in admission order [A, B]; load 3 - 2 = 1, running 1. C has
          6 of 8 tokens.
    it 3  C chunk 2 (context 6): first token at t = 3, decode_from = 3; 3 tokens -> it 5.
    it 4  C decodes (1 seq, context 8 + 1 = 9)
    it 5  C decodes (context 10); finishes at t = 5: load 0, running 0, nothing to plan.
    While C decodes, its token count is ``iterations - decode_from + 1`` (the class docstring:
    the replica derives the count from ``decode_from``): 1 after it 3, 2 after it 4.
    """
    rep = _replica(max_batch_tokens=8, max_running=4)
    a, b, c = _state(0, [1], 2), _state(1, [2], 2), _state(2, [3, 4], 3)
    for n, st in enumerate((a, b, c), 1):
        rep.enqueue(st)
        assert rep.load == n
    assert rep.admit(0.0) == [a, b, c]

    it = rep.plan()
    assert it == Iteration((PrefillChunk(4, 0), PrefillChunk(4, 0)), 0, 0)
    assert rep.advance(1.0) == []
    assert (a.first_token_s, b.first_token_s, c.first_token_s) == (1.0, 1.0, None)
    assert (a.decode_from, b.decode_from) == (1, 1)
    assert (a.chunk, b.chunk, c.chunk) == (0, 0, 0)
    assert rep.next_finish == 2
    assert rep.load == 3

    it = rep.plan()
    assert it == Iteration((PrefillChunk(6, 0),), 2, 10)
    assert rep.advance(2.0) == [a, b]
    assert (a.finished_s, b.finished_s) == (2.0, 2.0)
    assert (a.generated, b.generated) == (2, 2)
    assert (rep.load, rep.running, rep.decoding) == (1, 1, 0)
    assert (c.prefilled, c.chunk) == (6, 0)

    assert rep.plan() == Iteration((PrefillChunk(2, 6),), 0, 0)
    assert rep.advance(3.0) == []
    assert (c.first_token_s, c.decode_from) == (3.0, 3)
    assert rep.iterations - c.decode_from + 1 == 1
    assert rep.next_finish == 5

    assert rep.plan() == Iteration((), 1, 9)
    assert rep.advance(4.0) == []
    assert rep.iterations - c.decode_from + 1 == 2
    assert rep.plan() == Iteration((), 1, 10)
    assert rep.advance(5.0) == [c]
    assert (c.finished_s, c.generated) == (5.0, 3)
    assert (rep.load, rep.running, rep.decoding, rep.decode_context) == (0, 0, 0, 0)
    assert rep.plan() is None


def test_requests_finishing_together_come_back_in_admission_order():
    """Three 4-token prompts with 3 output tokens, budget 12: all prefill in iteration 1 and
    finish together in iteration 3; ``advance`` returns them in admission order."""
    rep = _replica(max_batch_tokens=12, max_running=3)
    sts = [_state(i, [i + 1], 3) for i in range(3)]
    for st in sts:
        rep.enqueue(st)
    rep.admit(0.0)
    done = []
    for t in (1.0, 2.0, 3.0):
        rep.plan()
        done.append(rep.advance(t))
    assert done == [[], [], sts]
    assert rep.load == 0


# ----------------------------------------------------------------------------------------
# the decode fast path


def _one_decoder() -> tuple[Replica, RequestState]:
    """A: 4-token prompt, 5 output tokens, budget 8. Iteration 1 prefills it (first token,
    decode_from 1), so it finishes in iteration 1 + 5 - 1 = 5; after it 1 the decode context is
    4 + 1 = 5."""
    rep = _replica(max_batch_tokens=8, max_running=2)
    a = _state(0, [1], 5)
    rep.enqueue(a)
    rep.admit(0.0)
    rep.plan()
    rep.advance(1.0)
    assert (rep.iterations, rep.next_finish, rep.decode_context) == (1, 5, 5)
    return rep, a


def test_skip_decodes_runs_up_to_but_not_into_a_finish():
    """From iteration 1, A finishes in iteration 5: skipping 3 iterations (2, 3, 4) is
    allowed and leaves iterations 4 and a context of 4 + 4 = 8 (4 tokens generated); skipping 4
    would include iteration 5 (its finish) and is refused. The next real iteration (5) then
    finishes A with 5 tokens."""
    rep, a = _one_decoder()
    with pytest.raises(RuntimeError, match=REFUSED):
        rep.skip_decodes(4)
    assert (rep.iterations, rep.decode_context) == (1, 5)  # refused: nothing moved
    rep.skip_decodes(3)
    assert (rep.iterations, rep.decode_context) == (4, 8)
    with pytest.raises(RuntimeError):
        rep.skip_decodes(1)  # now iteration 5 is the next one
    assert rep.plan() == Iteration((), 1, 8)
    assert rep.advance(5.0) == [a]
    assert (a.generated, a.finished_s) == (5, 5.0)


def test_skip_decodes_is_refused_while_a_prompt_is_in_prefill_and_zero_is_a_no_op():
    """A request admitted but not yet prefilled (no decoders, so no finish pending): skipping
    1 iteration is refused; skipping 0 (or fewer) iterations does nothing at all."""
    rep = _replica()
    rep.enqueue(_state(0, [1], 2))
    rep.admit(0.0)
    with pytest.raises(RuntimeError, match=REFUSED):
        rep.skip_decodes(1)
    rep.skip_decodes(0)
    rep.skip_decodes(-2)
    assert (rep.iterations, rep.decode_context) == (0, 0)


def test_skip_decodes_on_an_idle_replica_only_counts_iterations():
    """No prefill, nobody decoding (no finish pending): 3 skipped iterations count, the decode
    context stays 0 (3 x 0 decoders)."""
    rep = _replica()
    rep.skip_decodes(3)
    assert (rep.iterations, rep.decode_context) == (3, 0)


# ----------------------------------------------------------------------------------------
# router views


def _replicas(n: int, capacity: int = 64) -> list[Replica]:
    return [Replica(k, make_cache("lru", capacity), 64, 8) for k in range(n)]


def test_sim_routing_defaults_to_the_exact_view():
    routing = SimRouting("round_robin", {}, _replicas(2))
    assert routing.view == "exact"
    assert all(type(v) is ExactCacheView for v in routing.views)
    assert [routing.choose(rb([i + 1], block_size=BS)) for i in range(3)] == [0, 1, 0]


def test_a_one_block_router_cache_is_allowed_and_zero_is_refused():
    """``cache_blocks`` (and ``SimConfig.router_cache_blocks``) must be >= 1 or None: 1 is the
    smallest allowed size; the error names the offending setting."""
    routing = SimRouting("prefix_locality", {}, _replicas(2), "approximate", 1)
    assert [v.cache.capacity_blocks for v in routing.views] == [1, 1]
    with pytest.raises(ValueError, match="cache_blocks"):
        SimRouting("prefix_locality", {}, _replicas(2), "approximate", 0)
    assert SimConfig(router_view="approximate", router_cache_blocks=1).router_cache_blocks == 1
    with pytest.raises(ValueError, match="router_cache_blocks"):
        SimConfig(router_view="approximate", router_cache_blocks=0)


def test_router_params_reach_the_router():
    """``random`` with seed 7 shuffles the replicas with ``random.Random(7)``, one shuffle per
    request (its docstring): the choices are the first of each shuffle. Seed 0 (the default)
    gives a different stream here, so the params must have been passed on."""

    def oracle(seed: int, n: int) -> list[int]:
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            order = [0, 1, 2]
            rng.shuffle(order)
            out.append(order[0])
        return out

    routing = SimRouting("random", {"seed": 7}, _replicas(3))
    got = [routing.choose(rb([i + 1], block_size=BS)) for i in range(12)]
    assert got == oracle(7, 12)
    assert oracle(7, 12) != oracle(0, 12)


def test_the_approximate_view_inserts_at_a_clock_that_counts_insertions():
    """The approximate view inserts each routed prompt at a logical clock counting the
    insertions (ApproximateView's docstring): X = [1, 2] is insertion 1 (inserted and last
    used at 1), Y = [3] insertion 2, X again insertion 3 (last used at 3, inserted still 1).
    An empty prompt is not an insertion."""
    view = ApproximateView(_replicas(1)[0], 16)
    x, y = rb([1, 2], block_size=BS), rb([3], block_size=BS)
    view.record(x)
    view.record(rb([], block_size=BS))
    view.record(y)
    blocks = view.cache.blocks
    assert [(blocks[k].inserted_at, blocks[k].last_access) for k in (1, 2, 3)] == [
        (1.0, 1.0),
        (1.0, 1.0),
        (2.0, 2.0),
    ]
    view.record(x)
    assert [(blocks[k].inserted_at, blocks[k].last_access) for k in (1, 2)] == [
        (1.0, 3.0),
        (1.0, 3.0),
    ]
    assert view.match(x) == 2.0


@pytest.mark.parametrize("field", ["max_batch_tokens", "max_running", "replicas"])
@pytest.mark.parametrize("value", [8.5, 8.0, True, "8", 0])
def test_batch_limits_and_replicas_must_be_whole_numbers(field, value):
    """Compiled, the limits are C integers: 8.5 would silently become 8 there, so the config
    refuses anything but a whole number >= 1 (numpy's included)."""
    import numpy as np

    with pytest.raises(ValueError, match=f"{field} must be"):
        SimConfig(**{field: value})
    assert getattr(SimConfig(**{field: np.int64(8)}), field) == 8


def test_a_router_choosing_a_replica_that_does_not_exist_is_an_error():
    from skv.latency import make_latency_model
    from skv.sim.events import EventLoop

    class Wrong:
        def choose(self, rb):
            return -1

    reps = [Replica(0, make_cache("lru", 8), 64, 8)]
    loop = EventLoop(SimConfig(), make_latency_model("linear"), reps, None, 8, 8)
    with pytest.raises(ValueError, match="replica -1 of 1"):
        loop.run([_state(0, [1], 2)], Wrong(), None)
