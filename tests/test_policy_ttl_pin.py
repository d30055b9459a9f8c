"""``ttl_pin`` (Continuum's KV time-to-live): hand-computed evictions on tiny traces.

Every request here is acquired and released at once at its arrival time (cache-only replay), so
a block's release time is its request's arrival. ``T`` marks a request with a tool block (a
tool-calling session), ``U`` one without.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from helpers import check_tree, rb

from skv.blocks import RequestBlocks
from skv.cache.free_order import FreeOrder
from skv.experiments.engine import synthetic_trace
from skv.model import SemanticType
from skv.policies.registry import make_cache, make_vllm_pool
from skv.policies.ttl_pin import TTLPin
from skv.replay import compile_trace
from skv.vllm import eviction_plugin as ep

ST = SemanticType
T = ST.TOOL_OUTPUT
U = ST.USER_QUERY


def one(key: int, t: float, session: str | None = None, stype: SemanticType = U) -> RequestBlocks:
    """A one-block request (the block is its own chain root)."""
    return rb([key], parents=[None], stypes=[stype], arrival_s=t, session=session)


def cache(capacity: int, **params) -> object:
    return make_cache("ttl_pin", capacity, params, record_evictions=True)


def play(c, steps) -> None:
    """``(key, t, session, stype)`` one-block requests, in order."""
    for key, t, session, stype in steps:
        c.access(one(key, t, session, stype), t)


def evicted(c) -> list[int]:
    return [key for _, key, _, _ in c.eviction_log]


# --- protection and expiry ------------------------------------------------------------------------


def test_a_tool_session_within_its_ttl_keeps_its_block_and_an_older_free_block_goes():
    """TTL 10: block 1, released by tool session ``a`` at 0, is protected until 10; block 2
    (no session) released at 1 is the newer, yet it goes first (lru would evict 1)."""
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", T), (2, 1.0, None, U), (3, 2.0, None, U)])
    assert evicted(c) == [2]
    assert set(c.blocks) == {1, 3}


@pytest.mark.parametrize(("t", "victim"), [(9.99, 2), (10.0, 1), (12.0, 1)])
def test_after_its_ttl_a_block_is_lru_again(t, victim):
    """Protected until 0 + 10 (exclusive): at 10 block 1 rejoins LRU order, where its release
    (0) is older than block 2's (1), so it goes first."""
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", T), (2, 1.0, None, U), (3, t, None, U)])
    assert evicted(c) == [victim]
    assert c.policy.expirations == (1 if t >= 10.0 else 0)


def test_expired_and_never_protected_blocks_go_in_release_order_together():
    """Blocks 1 (tool, released 0, expires 5) and 3 (tool, released 2, expires 7) expire into
    E; 2 and 4 (no session; released 1 and 3) stay in N. At 8 the four go 1, 2, 3, 4: one
    LRU order over both lists."""
    c = cache(4, initial_ttl_s=5.0)
    play(c, [(1, 0.0, "a", T), (2, 1.0, None, U), (3, 2.0, "b", T), (4, 3.0, None, U)])
    play(c, [(10 + i, 8.0 + i, None, U) for i in range(4)])
    assert evicted(c) == [1, 2, 3, 4]


def test_protected_blocks_are_evicted_last_oldest_release_first():
    """Nothing unprotected is evictable: the protected block released first goes (no stall)."""
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", T), (2, 1.0, "b", T), (3, 2.0, "c", T)])
    assert evicted(c) == [1]
    assert set(c.blocks) == {2, 3}
    assert c.policy.protected_evictions == 1


def test_a_session_without_tool_blocks_is_not_protected_unless_all_sessions():
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", U), (2, 1.0, None, U), (3, 2.0, None, U)])
    assert evicted(c) == [1]
    c = cache(2, initial_ttl_s=10.0, all_sessions=True)
    play(c, [(1, 0.0, "a", U), (2, 1.0, None, U), (3, 2.0, None, U)])
    assert evicted(c) == [2]


@pytest.mark.parametrize("stype", [ST.TOOL_OUTPUT, ST.TOOL_SCHEMA])
def test_either_tool_type_makes_a_session_tool_calling(stype):
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", stype), (2, 1.0, None, U), (3, 2.0, None, U)])
    assert evicted(c) == [2]


def test_a_session_stays_tool_calling_once_it_used_a_tool():
    """``a``'s first request (0) has no tool block: block 1 is unprotected. Its second (10)
    brings a tool output: a gap of 10, TTL 10, block 2 protected until 20. Its third (11) has
    no tool block, but the session stays tool-calling: block 5 is protected until 21 (the
    gaps 10 and 1 still give 10). So the free blocks go: 1 at 12, then 6 (released 12) at 13,
    though 2 and 5 were released before it."""
    c = cache(3)
    play(c, [(1, 0.0, "a", U), (2, 10.0, "a", T), (5, 11.0, "a", U), (6, 12.0, None, U)])
    assert evicted(c) == [1]
    play(c, [(7, 13.0, None, U)])
    assert evicted(c) == [1, 6]


def test_a_shared_block_follows_its_latest_release():
    """Block 1 is inserted by tool session ``a`` (protected) and then hit by a request of no
    session at 1: released unprotected, it is the oldest unprotected release and goes."""
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", T), (1, 1.0, None, U), (2, 2.0, None, U), (3, 3.0, None, U)])
    assert evicted(c) == [1]
    # and the other way round: hit by a tool session, a free block is protected
    c = cache(2, initial_ttl_s=10.0)
    play(c, [(1, 0.0, None, U), (1, 1.0, "a", T), (2, 2.0, None, U), (3, 3.0, None, U)])
    assert evicted(c) == [2]


# --- the learned TTL ------------------------------------------------------------------------------

#: session ``a`` arrives at these times: gaps 1, 2, ..., 10
ARRIVALS = [0.0, 1.0, 3.0, 6.0, 10.0, 15.0, 21.0, 28.0, 36.0, 45.0, 55.0]


@pytest.mark.parametrize(
    ("q", "window", "ttl"),
    [
        (0.9, 1000, 9.0),  # ceil(0.9 * 10) = 9th smallest of 1..10
        (0.5, 1000, 5.0),  # 5th
        (0.75, 1000, 8.0),  # ceil(7.5) = 8th
        (1.0, 1000, 10.0),  # the largest
        (0.05, 1000, 1.0),  # ceil(0.5) = 1st
        (0.5, 4, 8.0),  # window 7, 8, 9, 10: the 2nd
        (0.9, 4, 10.0),  # ceil(3.6) = 4th of 7..10
    ],
)
def test_the_learned_ttl_is_the_nearest_rank_quantile_of_the_recent_gaps(q, window, ttl):
    c = cache(64, ttl_quantile=q, gap_window=window)
    play(c, [(100 + i, t, "a", T) for i, t in enumerate(ARRIVALS)])
    assert c.policy.ttl_s == ttl
    assert c.policy.metrics()["gaps"] == min(10, window)


def test_gaps_of_sessions_that_call_no_tool_do_not_teach_the_ttl():
    c = cache(64, initial_ttl_s=3.0)
    play(c, [(100 + i, t, "chat", U) for i, t in enumerate(ARRIVALS)])
    assert c.policy.ttl_s == 3.0 and c.policy.metrics()["gaps"] == 0
    c = cache(64, initial_ttl_s=3.0, all_sessions=True)
    play(c, [(100 + i, t, "chat", U) for i, t in enumerate(ARRIVALS)])
    assert c.policy.ttl_s == 9.0


def test_the_gap_that_brings_the_first_tool_output_counts():
    """A session's first request has no tool block, its second brings a tool's output: the
    gap between them (4) is a tool call's duration."""
    c = cache(8)
    play(c, [(1, 0.0, "a", U), (2, 4.0, "a", T)])
    assert c.policy.ttl_s == 4.0


def test_gaps_are_kept_per_session():
    """Interleaved sessions: each gap is measured from the same session's previous request
    (a: 0 -> 5, b: 1 -> 3), never from another's."""
    c = cache(8, ttl_quantile=1.0)
    play(c, [(1, 0.0, "a", T), (2, 1.0, "b", T), (3, 3.0, "b", T), (4, 5.0, "a", T)])
    assert sorted(c.policy._sorted) == [2.0, 5.0]
    assert c.policy.ttl_s == 5.0


def test_a_gap_runs_from_the_previous_requests_release_when_it_was_seen():
    """With time in flight (the simulator): a's first request arrives at 0 and is released at
    3; its next arrives at 5: the tool ran for 2 s, not 5."""
    c = cache(8)
    lease = c.acquire(one(1, 0.0, "a", T), 0.0)
    c.release(lease, 3.0)
    c.access(one(2, 5.0, "a", T), 5.0)
    assert c.policy.ttl_s == 2.0


def test_a_gap_runs_from_the_previous_arrival_when_that_request_is_still_in_flight():
    c = cache(8)
    lease = c.acquire(one(1, 0.0, "a", T), 0.0)
    c.access(one(2, 2.0, "a", T), 2.0)  # a's first request is not released yet
    assert c.policy.ttl_s == 2.0
    c.release(lease, 3.0)


def test_a_learned_ttl_protects_later_releases_from_the_first_gap_on():
    """initial_ttl_s 0: ``a``'s first block (0) is not protected. Its second request at 4
    teaches a TTL of 4, so block 2 is protected until 8. Evictions: 1 (free, oldest), 3 (free;
    2 is protected), then at 9 block 2, expired and now the oldest release."""
    c = cache(3)
    play(c, [(1, 0.0, "a", T), (2, 4.0, "a", T), (3, 5.0, None, U), (4, 6.0, None, U)])
    play(c, [(5, 7.0, None, U), (6, 9.0, None, U)])
    assert evicted(c) == [1, 3, 2]


def test_a_ttl_learned_later_applies_to_later_releases_only():
    """Block 1 is released at 0 under the initial TTL 10 (protected until 10). Session ``b``
    then teaches a TTL of 1; block 1 keeps its 10: at 5 the free block 5 goes, not 1."""
    c = cache(3, initial_ttl_s=10.0)
    play(c, [(1, 0.0, "a", T), (9, 0.5, "b", T), (9, 1.5, "b", T), (5, 2.0, None, U)])
    assert c.policy.ttl_s == 1.0
    play(c, [(6, 5.0, None, U)])
    assert evicted(c) == [5]


# --- tree and pins --------------------------------------------------------------------------------


def test_only_unpinned_leaves_are_evicted_and_a_parent_rejoins_at_the_head():
    """Tool session ``a`` caches chain 1 -> 2 (protected until 10). A request of no session
    reuses 1 alone, so 1 (released at 1) is an unprotected parent of a protected child: it is
    skipped (5, then 6 go), not evicted. At 12, 2 has expired and is the oldest release; once
    it goes, 1 is a leaf again and goes next, ahead of 7 and 8."""
    c = cache(3, initial_ttl_s=10.0)
    c.access(rb([1, 2], stypes=[T, T], arrival_s=0.0, session="a"), 0.0)
    c.access(rb([1], arrival_s=1.0), 1.0)
    play(c, [(5, 2.0, None, U), (6, 3.0, None, U), (7, 4.0, None, U)])
    assert evicted(c) == [5, 6]
    check_tree(c)
    play(c, [(8, 12.0, None, U), (9, 13.0, None, U)])
    assert evicted(c) == [5, 6, 2, 1]
    check_tree(c)


def test_an_answer_grown_into_the_cache_belongs_to_its_own_request():
    """The simulator extends a tool session's request by its answer (``on_extend``) after a
    request of no session began: the answer's block 7 (already cached, a hit) is protected with
    the session's prompt, so the free blocks 9 and 10 go first."""
    c = cache(3, initial_ttl_s=10.0)
    c.access(rb([1, 7]), 0.0)
    lease_a = c.acquire(rb([1], stypes=[T], session="a", arrival_s=1.0), 1.0)
    lease_b = c.acquire(rb([9], arrival_s=2.0), 2.0)
    c.extend(lease_a, rb([1, 7], stypes=[T, ST.OUTPUT], session="a", arrival_s=1.0), 1, 3.0)
    c.release(lease_a, 4.0)
    c.release(lease_b, 4.0)
    play(c, [(10, 5.0, None, U), (11, 6.0, None, U)])
    assert evicted(c) == [9, 10]


def test_a_pinned_block_is_skipped_and_rejoins_on_release():
    c = cache(2)
    play(c, [(1, 0.0, None, U), (2, 1.0, None, U)])
    lease = c.acquire(one(1, 2.0), 2.0)  # 1 pinned: the oldest, but not evictable
    c.access(one(3, 3.0), 3.0)
    assert evicted(c) == [2]
    c.release(lease, 4.0)
    c.access(one(4, 5.0), 5.0)
    assert evicted(c) == [2, 3]  # 1 was released at 4, after 3 (at 3)


def test_nothing_evictable_gives_none():
    p = TTLPin()
    assert p.victim() is None
    c = cache(1)
    lease = c.acquire(one(1, 0.0, "a", T), 0.0)
    c.access(one(2, 1.0), 1.0)  # 1 is pinned: 2 is computed, not cached
    assert set(c.blocks) == {1} and c.stats.uncached_blocks == 1
    c.release(lease, 2.0)


# --- no session, and the vLLM plugin's requests ---------------------------------------------------


def _tree_trace(seed: int, n: int = 400) -> list[RequestBlocks]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        root = rng.randrange(6)
        keys = [root * 1000 + j for j in range(rng.randint(1, 4))]
        keys += [10**6 + i * 10 + j for j in range(rng.randint(0, 2))]
        out.append(rb(keys, arrival_s=float(i), index=i))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_without_sessions_the_order_is_lru(seed):
    tr = _tree_trace(seed)
    ours, lru = cache(12), make_cache("lru", 12, record_evictions=True)
    for r in tr:
        ours.access(r, r.arrival_s)
        lru.access(r, r.arrival_s)
    assert ours.eviction_log == lru.eviction_log and len(lru.eviction_log) > 100


def test_in_the_vllm_pool_without_sessions_it_makes_lrus_choices():
    """The plugin's requests carry no session unless the client sends ``skv_session``."""
    cfg = {
        "num_requests": 200,
        "num_docs": 20,
        "doc_blocks": [2, 6],
        "zipf_s": 1.1,
        "own_blocks": [1, 3],
        "block_size": 32,
        "num_gpu_blocks": 48,
        "max_output_tokens": 0,
        "types": "agent",
        "seed": 3,
    }
    tr = [dataclasses.replace(r, session_id=None) for r in synthetic_trace(cfg)]
    pools = [make_vllm_pool(48, name) for name in ("ttl_pin", "lru")]
    for pool in pools:
        for r in compile_trace(tr, 32):
            pool.access(r, r.arrival_s)
    ours, lru = pools
    assert ours.stats == lru.stats and lru.stats.evictions > 100
    assert set(ours.cached) == set(lru.cached) and ours.order.fallbacks == 0


def test_the_plugins_request_view_protects_a_tool_session():
    """Requests typed the plugin's way (``vllm_xargs``): ``a``'s tool block outlives a later
    untyped block within the TTL, in a flat pool driven through FreeOrder's events."""
    order = FreeOrder(TTLPin(initial_ttl_s=10.0))
    xa = {"skv_types": ["tool_output"], "skv_tokens": [4], "skv_session": "a"}
    for bid, (rid, x, t) in enumerate([("ra", xa, 0.0), ("rb", None, 1.0)]):
        view, _ = ep.request_view(rid, 4, [f"h{rid}"], 4, x, index=bid, now=t)
        assert view.session == ("a" if x else None)
        order.begin(view, t)
        order.hashed(bid, view.keys[0], 4, view.stypes[0], 0, view, 1, t)
        order.freed(bid, t)
    assert order.evict(2.0) == 1  # the untyped block, though released later
    assert order.evict(2.0) == 0 and order.fallbacks == 0


# --- parameters -----------------------------------------------------------------------------------


def test_params_are_the_documented_defaults():
    assert TTLPin().params() == {
        "ttl_quantile": 0.9,
        "gap_window": 1000,
        "initial_ttl_s": 0.0,
        "all_sessions": False,
        "max_sessions": 100_000,
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"ttl_quantile": 0.0}, r"ttl_quantile must be in \(0, 1\]"),
        ({"ttl_quantile": 1.5}, r"ttl_quantile must be in \(0, 1\]"),
        ({"gap_window": 0}, "gap_window must be >= 1"),
        ({"initial_ttl_s": -1.0}, "initial_ttl_s must be >= 0"),
        ({"max_sessions": 0}, "max_sessions must be >= 1"),
    ],
)
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=f"ttl_pin: {message}"):
        make_cache("ttl_pin", 4, params)


def test_forgotten_sessions_start_afresh():
    """max_sessions 1: ``b`` pushes ``a`` out, so ``a``'s next request records no gap."""
    c = cache(8, max_sessions=1, ttl_quantile=1.0)
    play(c, [(1, 0.0, "a", T), (2, 1.0, "b", T), (3, 5.0, "a", T), (4, 6.0, "a", T)])
    assert c.policy._sorted == [1.0]
