"""``kvflow`` (KVFlow's furthest-next-use eviction, sessions as agents): hand-computed evictions
on tiny traces.

Every request is acquired and released at once at its arrival (cache-only replay). A session's
predicted next arrival is its last arrival plus the EWMA of its gaps; with ``age_out`` 1 it is
aged out once that time has passed.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from helpers import check_tree, rb

from skv.blocks import RequestBlocks
from skv.cache.free_order import FreeOrder
from skv.experiments.engine import synthetic_trace
from skv.policies.kvflow import KVFlow
from skv.policies.registry import make_cache, make_vllm_pool
from skv.replay import compile_trace
from skv.vllm import eviction_plugin as ep


def one(key: int, t: float, session: str | None = None) -> RequestBlocks:
    """A one-block request (the block is its own chain root)."""
    return rb([key], parents=[None], arrival_s=t, session=session)


def cache(capacity: int, **params) -> object:
    return make_cache("kvflow", capacity, params, record_evictions=True)


def play(c, steps) -> None:
    """``(key, t, session)`` one-block requests, in order of time."""
    for key, t, session in sorted(steps, key=lambda s: s[1]):
        c.access(one(key, t, session), t)


def evicted(c) -> list[int]:
    return [key for _, key, _, _ in c.eviction_log]


# --- furthest predicted next use first ------------------------------------------------------------


@pytest.mark.parametrize(
    ("a_arrivals", "alpha", "victim"),
    [
        ([0.0, 10.0], 0.5, 1),  # a: gap 10, next at 20; b next at 13: a goes (lru: b's 2)
        ([8.0, 10.0], 0.5, 2),  # a: gap 2, next at 12: now b (13) is further
        ([0.0, 8.0, 10.0], 0.5, 1),  # gaps 8, 2: EWMA 0.5 * 2 + 0.5 * 8 = 5, next at 15
        ([0.0, 8.0, 10.0], 1.0, 2),  # alpha 1: the last gap only, 2, next at 12
    ],
)
def test_the_session_predicted_to_return_last_loses_its_blocks(a_arrivals, alpha, victim):
    """Session ``a`` holds block 1, ``b`` block 2 (b: 5 and 9, gap 4, next at 13). A new
    session's block at 11 needs room: the session whose next arrival is furthest goes."""
    c = cache(2, ewma_alpha=alpha)
    play(c, [(1, t, "a") for t in a_arrivals] + [(2, 5.0, "b"), (2, 9.0, "b"), (3, 11.0, "c")])
    assert evicted(c) == [victim]
    assert c.policy.predicted_next_arrival("b") == 13.0


def test_the_choice_changes_when_a_sessions_gap_changes_in_one_run():
    """ewma_alpha 1 (the last gap). a holds blocks 1 and 6 (0, 10: next at 20), b block 2 (5,
    9). At 11 b brings block 3 (gap 2: next at 13): a is the furthest, its least recently
    released block 6 goes (lru would take b's 2, released at 9). At 11.2 a is back with block 7
    (gap 1.2: next at 12.4): now b (13) is the furthest, and its oldest block 2 goes."""
    c = cache(3, ewma_alpha=1.0)
    for t in (0.0, 10.0):
        c.access(rb([1, 6], parents=[None, None], arrival_s=t, session="a"), t)
    play(c, [(2, 5.0, "b"), (2, 9.0, "b"), (3, 11.0, "b")])
    assert evicted(c) == [6]
    play(c, [(7, 11.2, "a")])
    assert c.policy.predicted_next_arrival("a") == pytest.approx(12.4)
    assert evicted(c) == [6, 2]


# --- ageing, no session, no prediction ------------------------------------------------------------


@pytest.mark.parametrize(
    ("age_out", "t", "victim"),
    [
        (1.0, 15.0, 2),  # b due at 14: aged out, first to go although a is predicted further
        (1.0, 14.0, 1),  # exactly at 14 b is not late yet: a (next at 20) goes
        (2.0, 15.0, 1),  # b ages at 11 + 2 * 3 = 17
        (math.inf, 15.0, 1),
    ],
)
def test_a_session_late_for_its_predicted_arrival_is_aged_out_first(age_out, t, victim):
    """a: 0, 10 (next at 20); b: 8, 11 (gap 3, next at 14). lru would evict a's block 1."""
    c = cache(2, age_out=age_out)
    play(c, [(1, 0.0, "a"), (2, 8.0, "b"), (1, 10.0, "a"), (2, 11.0, "b"), (3, t, "c")])
    assert evicted(c) == [victim]
    assert c.policy.aged_out == (1 if victim == 2 else 0)


def test_blocks_of_no_session_go_before_live_sessions_and_after_aged_ones():
    """b: 0, 1 (gap 1, due at 2); block 9 (no session) at 0.5. At 4 b is aged out: its block 2
    goes though 9 is older; at 5 the no-session block 9 goes before c (next at 5, not late)."""
    c = cache(2)
    play(c, [(2, 0.0, "b"), (9, 0.5, None), (2, 1.0, "b"), (3, 4.0, "c"), (4, 5.0, "d")])
    assert evicted(c) == [2, 9]


def test_a_block_of_no_session_goes_before_a_session_predicted_far_away():
    c = cache(2)
    play(c, [(1, 0.0, "a"), (1, 10.0, "a"), (9, 11.0, None), (3, 12.0, "c")])
    assert evicted(c) == [9]  # lru would evict a's block 1 (released at 10)


@pytest.mark.parametrize(("prior", "victim"), [(True, 1), (False, 4)])
def test_a_one_turn_session_takes_the_population_gap_or_goes_before_predicted_ones(prior, victim):
    """a: 0, 10 (next at 20); b: 10.2, 10.5 (gap 0.3: the prior with prior_alpha 1). d arrives
    once at 10.6: with the prior it is due at 10.9, so a (20) is the furthest; without, d has no
    prediction and goes before every predicted session."""
    c = cache(3, prior=prior, prior_alpha=1.0)
    play(c, [(1, 0.0, "a"), (1, 10.0, "a"), (2, 10.2, "b"), (2, 10.5, "b"), (4, 10.6, "d")])
    play(c, [(5, 10.7, "e")])
    assert evicted(c) == [victim]


def test_without_any_gap_one_turn_sessions_go_least_recently_arrived_first():
    c = cache(2)
    play(c, [(1, 0.0, "a"), (2, 1.0, "b"), (3, 2.0, "c"), (4, 3.0, "d")])
    assert evicted(c) == [1, 2]
    assert c.policy.predicted_next_arrival("d") == math.inf


# --- shared blocks and the tree -------------------------------------------------------------------


def test_a_block_belongs_to_the_session_that_last_used_it():
    """Block 1 is a's (next at 20) until b hits it at 10.5 (b: 5, 10.5, next at 16): then a's
    bucket is empty and the victim is b's least recently released block, 2, not 1."""
    c = cache(2)
    play(c, [(1, 0.0, "a"), (2, 5.0, "b"), (1, 10.0, "a"), (1, 10.5, "b"), (3, 12.0, "c")])
    assert evicted(c) == [2]


def test_only_unpinned_leaves_are_evicted_and_a_parent_rejoins_its_bucket():
    """a caches chain 1 -> 2 (0, 10: next at 20); b reuses 1 alone (0.5, 11: next at 21.5), so
    1 is in b's bucket and has a child: b's bucket gives nothing, a's gives 2; then 1 is a leaf
    of b's bucket again and goes next."""
    c = cache(2)
    c.access(rb([1, 2], arrival_s=0.0, session="a"), 0.0)
    c.access(rb([1], arrival_s=0.5, session="b"), 0.5)
    c.access(rb([1, 2], arrival_s=10.0, session="a"), 10.0)
    c.access(rb([1], arrival_s=11.0, session="b"), 11.0)
    play(c, [(3, 12.0, "c")])
    assert evicted(c) == [2]
    check_tree(c)
    play(c, [(4, 13.0, "c")])
    assert evicted(c) == [2, 1]
    check_tree(c)


def test_a_parent_that_becomes_a_leaf_rejoins_at_the_head_of_its_bucket():
    """a caches chain 1 -> 2 (0, 1: due at 2); a request of no session reuses 1 alone, so 1
    heads the no-session bucket with a child in a's. At 1.7 it is skipped (5 goes); at 3 a is
    aged out and 2 goes, making 1 a leaf: it rejoins the no-session bucket at the head, where
    it was, and goes next, before 6 and 7."""
    c = cache(3)
    c.access(rb([1, 2], arrival_s=0.0, session="a"), 0.0)
    c.access(rb([1, 2], arrival_s=1.0, session="a"), 1.0)
    c.access(rb([1], arrival_s=1.5), 1.5)
    play(c, [(5, 1.6, None), (6, 1.7, None)])
    assert evicted(c) == [5]
    play(c, [(7, 3.0, None), (8, 4.0, None)])
    assert evicted(c) == [5, 2, 1]
    check_tree(c)


def test_an_ageing_time_from_before_a_sessions_last_arrival_does_not_age_it():
    """a: 0, 1 (due at 2), 10 (EWMA 0.5 * 9 + 0.5 * 1 = 5: next at 15); b: 3, 11 (gap 8: next at
    19). At 12 the ageing times 2 (a's) and 4 (b's) are stale: b is the furthest."""
    c = cache(2)
    play(c, [(1, 0.0, "a"), (1, 1.0, "a"), (2, 3.0, "b"), (1, 10.0, "a"), (2, 11.0, "b")])
    play(c, [(3, 12.0, "c")])
    assert evicted(c) == [2]
    assert c.policy.aged_out == 0


def test_forgotten_sessions_start_afresh():
    """max_sessions 1: b pushes a out, so a's gap starts again at 5: next at 6 + 1."""
    c = cache(8, max_sessions=1)
    play(c, [(1, 0.0, "a"), (2, 1.0, "b"), (1, 5.0, "a"), (1, 6.0, "a")])
    assert c.policy.predicted_next_arrival("a") == 7.0


def test_an_answer_grown_into_the_cache_belongs_to_its_own_request():
    """The simulator extends a's request by its answer (``on_extend``) after a request of no
    session began: the answer's block 7 (a hit) joins a's bucket, not the no-session one, so
    the no-session blocks 9 and 10 go first."""
    c = cache(3)
    c.access(rb([1, 7]), 0.0)
    lease_a = c.acquire(rb([1], session="a", arrival_s=1.0), 1.0)
    lease_b = c.acquire(rb([9], arrival_s=2.0), 2.0)
    c.extend(lease_a, rb([1, 7], session="a", arrival_s=1.0), 1, 3.0)
    c.release(lease_a, 4.0)
    c.release(lease_b, 4.0)
    play(c, [(10, 5.0, None), (11, 6.0, None)])
    assert evicted(c) == [9, 10]


def test_a_pinned_block_is_skipped_and_rejoins_on_release():
    c = cache(2)
    play(c, [(1, 0.0, None), (2, 1.0, None)])
    lease = c.acquire(one(1, 2.0), 2.0)
    c.access(one(3, 3.0), 3.0)
    assert evicted(c) == [2]
    c.release(lease, 4.0)
    c.access(one(4, 5.0), 5.0)
    assert evicted(c) == [2, 3]


def test_nothing_evictable_gives_none():
    assert KVFlow().victim() is None
    c = cache(1)
    lease = c.acquire(one(1, 0.0, "a"), 0.0)
    c.access(one(2, 1.0, "b"), 1.0)
    assert set(c.blocks) == {1} and c.stats.uncached_blocks == 1
    c.release(lease, 2.0)


def test_stale_heap_entries_are_compacted():
    """A session re-keyed at every arrival leaves one stale entry each time: both heaps stay
    bounded, and the choices stay right."""
    c = cache(2)
    for i in range(3000):
        c.access(one(1, float(i), "a"), float(i))
    p = c.policy
    assert len(p._heap) < 1100 and len(p._ageing) < 1100
    play(c, [(2, 3000.0, None), (3, 3000.5, "b")])
    assert evicted(c) == [1]  # a was due at 3000: aged out at 3000.5, before the free block 2


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


def test_in_the_vllm_pool_without_sessions_it_makes_lrus_choices_and_with_them_no_fallback():
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
    agent = synthetic_trace(cfg)
    bare = [dataclasses.replace(r, session_id=None) for r in agent]
    pools = [make_vllm_pool(48, name) for name in ("kvflow", "lru", "kvflow")]
    for pool, tr in zip(pools, (bare, bare, agent), strict=True):
        for r in compile_trace(tr, 32):
            pool.access(r, r.arrival_s)
    ours, lru, with_sessions = pools
    assert ours.stats == lru.stats and lru.stats.evictions > 100
    assert set(ours.cached) == set(lru.cached) and ours.order.fallbacks == 0
    assert with_sessions.order.fallbacks == 0 and with_sessions.stats.evictions > 100


def test_the_plugins_request_view_carries_the_session():
    """Requests typed the plugin's way (``vllm_xargs`` with ``skv_session``), driven through
    FreeOrder's events: a (0, 10: next at 20) loses its block to b (5, 9: next at 13)."""
    order = FreeOrder(KVFlow())
    bids = {"a": 0, "b": 1}
    for i, (session, t) in enumerate([("a", 0.0), ("b", 5.0), ("b", 9.0), ("a", 10.0)]):
        x = {"skv_types": ["user_query"], "skv_tokens": [4], "skv_session": session}
        view, _ = ep.request_view(f"r{i}", 4, [f"h{session}"], 4, x, index=i, now=t)
        order.begin(view, t)
        bid = bids[session]
        if bid in order.blocks:
            order.touched(bid, t)
        else:
            order.hashed(bid, view.keys[0], 4, view.stypes[0], 0, view, 1, t)
        order.freed(bid, t)
    view, _ = ep.request_view("r9", 4, ["hc"], 4, None, index=9, now=11.0)
    order.begin(view, 11.0)
    assert order.evict(11.0) == 0 and order.fallbacks == 0


# --- parameters -----------------------------------------------------------------------------------


def test_params_are_the_documented_defaults():
    assert KVFlow().params() == {
        "ewma_alpha": 0.5,
        "prior": True,
        "prior_alpha": 0.05,
        "age_out": 1.0,
        "max_sessions": 100_000,
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"ewma_alpha": 0.0}, r"ewma_alpha must be in \(0, 1\]"),
        ({"ewma_alpha": 1.5}, r"ewma_alpha must be in \(0, 1\]"),
        ({"prior_alpha": 0.0}, r"prior_alpha must be in \(0, 1\]"),
        ({"age_out": 0.0}, "age_out must be > 0"),
        ({"max_sessions": 0}, "max_sessions must be >= 1"),
    ],
)
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=f"kvflow: {message}"):
        make_cache("kvflow", 4, params)


def test_metrics_report_sessions_and_the_prior_once_known():
    c = cache(8)
    play(c, [(1, 0.0, "a")])
    assert "prior_gap_s" not in c.policy.metrics()
    play(c, [(1, 4.0, "a")])
    m = c.policy.metrics()
    assert m["prior_gap_s"] == 4.0 and m["sessions"] == 1.0 and m["sessions_with_blocks"] == 1.0
    play(c, [(1, 14.0, "a")])  # the population's EWMA, prior_alpha 0.05: 0.05 * 10 + 0.95 * 4
    assert c.policy.metrics()["prior_gap_s"] == pytest.approx(4.3)
