"""The router zoo (issue 14): random, power_of_two, consistent_hashing, sglang_cache_aware,
dynamo_cost and cacheroute, on constructed replica views (hand-worked choices), as properties
over every registered router, through the simulator and through the router service."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skv.blocks import RequestBlocks, request_blocks
from skv.experiments.config import ReplicaSpec
from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType, content_hash
from skv.routing import ROUTERS, FixedView, make_router
from skv.routing.keys import prefix_key
from skv.services import mock_backend, router
from skv.sim import SimConfig, simulate

T = SemanticType
OLD = ["round_robin", "least_loaded", "prefix_locality", "semantic_locality", "precise"]
NEW = ["random", "power_of_two", "consistent_hashing", "sglang_cache_aware", "dynamo_cost",
       "cacheroute"]  # fmt: skip


def _rb(*segments: tuple[SemanticType, int]) -> RequestBlocks:
    """Request blocks (block size 16) of segments given as (type, tokens)."""
    segs = [Segment(t, n, content_hash(f"{t.value}-{n}-{i}")) for i, (t, n) in enumerate(segments)]
    return request_blocks(Request("r", 0.0, segs), 16, "prefix")


RB = _rb((T.SYSTEM, 64), (T.USER_QUERY, 64))  # 4 system blocks, then 4 user-query blocks: 128


def _req(prefix: str, t: float = 0.0, tail: str = "q") -> RequestBlocks:
    """A request at ``t`` whose first 4 blocks (64 tokens) are the shared prefix ``prefix``
    and whose last 2 blocks are its own (``tail``): key = the prefix under the default 4."""
    segs = [
        Segment(T.SYSTEM, 64, content_hash(f"prefix-{prefix}")),
        Segment(T.USER_QUERY, 32, content_hash(f"tail-{prefix}-{tail}-{t}")),
    ]
    return request_blocks(Request("r", t, segs), 16, "prefix")


def _views(*rows: tuple[int, int, float]) -> list[FixedView]:
    """One view per (load, routed, matched blocks)."""
    return [FixedView(load, routed, lambda _rb, m=m: m) for load, routed, m in rows]


def _loads(*loads: int) -> list[FixedView]:
    return [FixedView(x) for x in loads]


# ------------------------------------------------------------------------------- registry


def test_every_new_router_is_registered_once_and_accepted_by_configs_and_the_service():
    assert list(ROUTERS) == OLD + NEW
    from skv.services.router import POLICIES

    assert list(POLICIES) == OLD + NEW
    for name in NEW:
        assert ReplicaSpec(count=3, router=name).router == name
        assert make_router(name).name == name


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("consistent_hashing", {"load_factor": 0.9}, "load_factor must be >= 1"),
        ("consistent_hashing", {"prefix_blocks": 0}, "prefix_blocks must be >= 1"),
        ("sglang_cache_aware", {"cache_threshold": 1.5}, "cache_threshold must be in"),
        ("sglang_cache_aware", {"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
        ("dynamo_cost", {"overlap_score_weight": -1}, "overlap_score_weight must be >= 0"),
        ("cacheroute", {"admit_rate": 0.1, "evict_rate": 0.2}, "evict_rate <= admit_rate"),
        ("cacheroute", {"period_s": 0}, "period_s must be > 0"),
        ("cacheroute", {"ewma_alpha": 0}, "ewma_alpha must be in"),
        ("random", {"max_imbalance": 8}, "bad parameters"),
    ],
)
def test_bad_parameters_are_refused_by_name(name, params, message):
    with pytest.raises(ValueError, match=message):
        make_router(name, **params)


# ------------------------------------------------------------------------------- random


def test_random_is_a_seeded_shuffle_per_request():
    """The rule is ``random.Random(seed).shuffle`` of the replica indices, once per request:
    the same seed gives the same stream, and the load is not read (replica 0 is at 99)."""
    views = _loads(99, 0, 0, 0)
    r = make_router("random", seed=7)
    got = [r.rank(RB, views) for _ in range(5)]
    rng = random.Random(7)
    expected = []
    for _ in range(5):
        order = [0, 1, 2, 3]
        rng.shuffle(order)
        expected.append(order)
    assert [g.order for g in got] == expected
    assert all(g.scores is None and g.reason == "random" for g in got)
    assert len({tuple(o) for o in expected}) > 1  # it does move
    other = make_router("random", seed=8)
    assert [other.rank(RB, views).order for _ in range(5)] != expected


# ------------------------------------------------------------------------------- power_of_two


def test_power_of_two_with_two_replicas_always_takes_the_less_loaded():
    """With two replicas both are always drawn: (load, routed, index) decides, [1, 0] for
    loads (5, 2) and [0, 1] for an exact tie (3, 3) at routed (0, 1)."""
    p2 = make_router("power_of_two", seed=3)
    for _ in range(10):
        assert p2.rank(RB, _loads(5, 2)).order == [1, 0]
        assert p2.rank(RB, [FixedView(3, 0), FixedView(3, 1)]).order == [0, 1]
    assert make_router("power_of_two").rank(RB, _loads(4)).order == [0]


def test_power_of_two_takes_the_less_loaded_of_its_draw_and_never_the_most_loaded():
    """Loads (0, 5, 9): the draw ``random.Random(seed).sample(range(3), 2)`` decides; 0 wins
    any draw it is in, 1 beats 2; so 2 (the most loaded) is never first, and the rest of the
    order is the least loaded's."""
    views = _loads(0, 5, 9)
    p2 = make_router("power_of_two", seed=11)
    rng = random.Random(11)
    firsts = []
    for _ in range(30):
        pair = sorted(rng.sample(range(3), 2))
        r = p2.rank(RB, views)
        third = ({0, 1, 2} - set(pair)).pop()
        assert r.order == [*pair, third]  # by load, the pair sorted by index is by load too
        firsts.append(r.first)
    assert 2 not in firsts and set(firsts) == {0, 1}


def test_power_of_two_has_a_lower_max_load_than_random_on_seeded_streams():
    """Balls into bins: 1,000 requests onto 100 replicas, no departures. One random choice
    leaves a maximum near ln n / ln ln n above the mean; two choices near ln ln n / ln 2."""
    for seed in range(3):
        maxima = {}
        for name in ("random", "power_of_two"):
            r = make_router(name, seed=seed)
            counts = [0] * 100
            for _ in range(1000):
                counts[r.rank(RB, _loads(*counts)).first] += 1
            maxima[name] = max(counts)
        assert maxima["power_of_two"] < maxima["random"], (seed, maxima)
        assert maxima["power_of_two"] <= 10 + 4


def test_power_of_two_compares_current_load_before_the_requests_routed_so_far():
    """Views whose load and routed count disagree (the more loaded replica was routed fewer
    requests): the current load decides, for the drawn pair and for the failover rest.
    Two replicas (both always drawn): load 1 / routed 9 beats load 4 / routed 0, either way
    round. Four replicas, loads (0, 3, 1, 2) and routed (9, 0, 7, 1) (routed in exactly the
    reverse order): the pair from ``random.Random(5).sample`` by load, then the others by
    load."""
    p2 = make_router("power_of_two", seed=3)
    for _ in range(10):
        assert p2.rank(RB, [FixedView(1, 9), FixedView(4, 0)]).order == [0, 1]
        assert p2.rank(RB, [FixedView(4, 0), FixedView(1, 9)]).order == [1, 0]
    loads, routed = (0, 3, 1, 2), (9, 0, 7, 1)
    views = [FixedView(a, b) for a, b in zip(loads, routed, strict=True)]
    p2, rng = make_router("power_of_two", seed=5), random.Random(5)
    for _ in range(20):
        pair = sorted(rng.sample(range(4), 2), key=loads.__getitem__)
        rest = sorted(set(range(4)) - set(pair), key=loads.__getitem__)
        assert p2.rank(RB, views).order == pair + rest


def test_power_of_two_in_the_simulator_follows_live_load_not_requests_routed():
    """Two replicas, linear latency. r0 (t=0, 2,000 output tokens: busy for ~40 s) goes to
    replica 0 (a tie, by index); r1 (t=0.01, one output token) to the idle replica 1, done
    within 30 ms. From then on replica 0 has load 1 and routed 1, replica 1 load 0 and routed
    1, 2, 3: by load every later request goes to 1 (by routed count r3 would go to 0)."""
    segs = [Segment(T.USER_QUERY, 32, content_hash("q"))]
    reqs = [Request("r0", 0.0, segs, output_tokens=2000)]
    reqs += [Request(f"r{i}", t, segs, output_tokens=1) for i, t in enumerate((0.01, 1, 2, 3), 1)]
    cfg = SimConfig(capacity_blocks=64, block_size=16, replicas=2, router="power_of_two")
    res = simulate(reqs, cfg, make_latency_model("linear"), progress=False)
    assert [r["replica"] for r in res.requests] == [0, 1, 1, 1, 1]
    assert res.requests[0]["e2e_ms"] > 3000  # r0 still running when r3 and r4 arrive


# ------------------------------------------------------------------------------- consistent hashing


def test_consistent_hashing_capacity_is_ceil_of_load_factor_times_mean_with_the_new_request():
    """Loads (3, 3, 0, 0): L = 6, cap = ceil(1.25 * 7 / 4) = ceil(2.1875) = 3, so replicas
    0 and 1 (3 + 1 > 3) are full and 2, 3 have room."""
    ch = make_router("consistent_hashing")
    views = _loads(3, 3, 0, 0)
    assert ch.capacity(views) == 3
    walk = ch.walk(prefix_key(RB, 4), 4)
    r = ch.rank(RB, views)
    assert r.order == [i for i in walk if i in (2, 3)] + [i for i in walk if i in (0, 1)]
    assert r.scores is None


def test_consistent_hashing_sends_a_prefix_home_and_spills_along_the_ring_when_full():
    """Home = the first replica of the key's walk. Loads 3 at home, 1 elsewhere: L = 6,
    cap = ceil(1.25 * 7 / 4) = 3, home 3 + 1 > 3 is full: the next replica of the walk goes
    first and home last; the reason says one was skipped."""
    ch = make_router("consistent_hashing")
    a1, a2 = _req("A", tail="x"), _req("A", tail="y")
    assert prefix_key(a1, 4) == prefix_key(a2, 4) != prefix_key(_req("B"), 4)
    walk = ch.walk(prefix_key(a1, 4), 4)
    assert sorted(walk) == [0, 1, 2, 3]
    idle = _loads(0, 0, 0, 0)
    assert ch.rank(a1, idle).order == list(walk) == ch.rank(a2, idle).order
    assert ch.rank(a1, idle).reason == "consistent_hashing"
    loads = [1, 1, 1, 1]
    loads[walk[0]] = 3
    r = ch.rank(a1, _loads(*loads))
    assert r.order == [*walk[1:], walk[0]]
    assert r.reason == "consistent_hashing: 1 full (cap 3), spilled"


def test_consistent_hashing_keeps_a_key_home_until_its_load_passes_the_cap():
    """Four replicas at load 10 each; requests of one key arrive and stay (load += 1 where
    routed). cap = ceil(1.25 * (L + 1) / 4):
    L=40: 13, home 10 -> 11; L=41: 14, 11 -> 12; L=42: 14, 12 -> 13; L=43: 14, 13 -> 14;
    L=44: ceil(14.0625) = 15, 14 -> 15; L=45: ceil(14.375) = 15, home 15 + 1 > 15: spill to
    the walk's second replica; L=46: ceil(14.6875) = 15, home still full: the second again."""
    ch = make_router("consistent_hashing")
    rb = _req("hot")
    walk = ch.walk(prefix_key(rb, 4), 4)
    loads = [10, 10, 10, 10]
    chosen = []
    for _ in range(7):
        k = ch.rank(rb, _loads(*loads)).first
        loads[k] += 1
        chosen.append(k)
    assert chosen == [walk[0]] * 5 + [walk[1]] * 2


def test_consistent_hashing_spreads_distinct_prefixes_and_routes_blockless_requests_least_loaded():
    ch = make_router("consistent_hashing")
    idle = _loads(0, 0, 0, 0)
    homes = {ch.rank(_req(f"p{i}"), idle).first for i in range(40)}
    assert homes == {0, 1, 2, 3}
    empty = RequestBlocks(0, 0.0, [], [], [], [], [], None, 0, False, 16, prompt_tokens=5)
    r = ch.rank(empty, _loads(2, 0, 1, 0))
    assert (r.order, r.reason) == ([1, 3, 2, 0], "consistent_hashing: no key, least loaded")


def test_keys_and_ring_walks_are_the_same_in_every_process():
    """Keys hash ints only (tuple hashes of ints are not randomised per process): two
    interpreters with different string-hash seeds agree on a key and its walk."""
    code = (
        "from skv.blocks import request_blocks\n"
        "from skv.model import Request, Segment, SemanticType as T, content_hash\n"
        "from skv.routing.consistent_hashing import ConsistentHashing\n"
        "from skv.routing.keys import prefix_key\n"
        "seg = Segment(T.SYSTEM, 80, content_hash('shared'))\n"
        "k = prefix_key(request_blocks(Request('r', 0.0, [seg]), 16, 'prefix'), 4)\n"
        "print(k, ConsistentHashing().walk(k, 7))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(outs) == 1


def test_consistent_hashing_key_length_is_a_parameter():
    """Two requests sharing 4 blocks and differing in block 5 share a key with
    prefix_blocks=4 and not with prefix_blocks=5."""
    a, b = _req("A", tail="x"), _req("A", tail="y")
    assert prefix_key(a, 4) == prefix_key(b, 4)
    assert prefix_key(a, 5) != prefix_key(b, 5)
    assert make_router("consistent_hashing", prefix_blocks=5).prefix_blocks == 5


# ------------------------------------------------------------------------------- sglang


def test_sglang_balanced_takes_the_best_match_above_the_cache_threshold():
    """RB has 128 tokens in 8 blocks of 16. Matches 3, 1, 0 blocks: ratios 48/128 = 0.375,
    16/128 = 0.125, 0; 0.375 > 0.3, so by ratio, although replica 0 is the most loaded."""
    r = make_router("sglang_cache_aware").rank(RB, _views((5, 0, 3.0), (0, 0, 1.0), (2, 0, 0.0)))
    assert r.order == [0, 1, 2]
    assert r.scores == [0.375, 0.125, 0.0]
    assert r.reason == "sglang_cache_aware: cache match"


def test_sglang_below_the_cache_threshold_is_the_least_loaded():
    """A 2-block match is 32/128 = 0.25 <= 0.3: least loaded [1, 2, 0]. With
    cache_threshold 0.2 it passes: replica 0 first, then the ties (0) by load: 1, 2."""
    views = _views((5, 0, 2.0), (0, 0, 0.0), (2, 0, 0.0))
    r = make_router("sglang_cache_aware").rank(RB, views)
    assert (r.order, r.reason) == ([1, 2, 0], "sglang_cache_aware: match <= 0.3, least loaded")
    low = make_router("sglang_cache_aware", cache_threshold=0.2).rank(RB, views)
    assert (low.order, low.reason) == ([0, 1, 2], "sglang_cache_aware: cache match")


def test_sglang_imbalance_needs_both_thresholds_then_takes_the_shortest_queue():
    """Replica 0 holds the whole prompt (ratio 1.0).
    (100, 30, 40): 100 - 30 = 70 > 64 and 100 > 1.5 * 30 = 45: imbalanced: [1, 2, 0].
    (90, 30): 60 <= 64: balanced: the match wins: [0, 1].
    (200, 135): 65 > 64 but 200 <= 1.5 * 135 = 202.5: balanced: [0, 1]."""
    sg = make_router("sglang_cache_aware")
    full = 8.0
    r = sg.rank(RB, _views((100, 0, full), (30, 0, 0.0), (40, 0, 0.0)))
    assert (r.order, r.scores) == ([1, 2, 0], None)
    assert r.reason == "sglang_cache_aware: imbalanced, shortest queue"
    assert sg.rank(RB, _views((90, 0, full), (30, 0, 0.0))).order == [0, 1]
    assert sg.rank(RB, _views((200, 0, full), (135, 0, 0.0))).order == [0, 1]
    tight = make_router("sglang_cache_aware", balance_abs_threshold=50)
    assert tight.rank(RB, _views((90, 0, full), (30, 0, 0.0))).order == [1, 0]


# ------------------------------------------------------------------------------- dynamo


def test_dynamo_cost_is_weighted_prefill_blocks_plus_decode_blocks():
    """RB: 128 tokens = 8 blocks of 16. blocks_per_request b = 10. Views (load, match):
    (2, 6), (0, 0), (1, 4). cost = w * (128 - 16 * match) / 16 + load * b + 8:
    w = 1: 2 + 20 + 8 = 30, 8 + 0 + 8 = 16, 4 + 10 + 8 = 22 -> [1, 2, 0];
    w = 4: 8 + 20 + 8 = 36, 32 + 0 + 8 = 40, 16 + 10 + 8 = 34 -> [2, 0, 1]."""
    views = _views((2, 0, 6.0), (0, 0, 0.0), (1, 0, 4.0))
    r = make_router("dynamo_cost", blocks_per_request=10).rank(RB, views)
    assert (r.order, r.scores, r.reason) == ([1, 2, 0], [30.0, 16.0, 22.0], "dynamo_cost")
    w4 = make_router("dynamo_cost", blocks_per_request=10, overlap_score_weight=4).rank(RB, views)
    assert (w4.order, w4.scores) == ([2, 0, 1], [36.0, 40.0, 34.0])


def test_dynamo_cost_counts_requests_in_flight_at_the_mean_request_size_it_has_seen():
    """Without blocks_per_request, b = the mean blocks of the requests ranked so far: a
    2-block request (32 tokens) then RB (8 blocks): b = 5. Costs for RB on the views above:
    2 + 2 * 5 + 8 = 20, 8 + 0 + 8 = 16, 4 + 5 + 8 = 17 -> [1, 2, 0]."""
    dy = make_router("dynamo_cost")
    views = _views((2, 0, 6.0), (0, 0, 0.0), (1, 0, 4.0))
    dy.rank(_rb((T.USER_QUERY, 32)), views)
    r = dy.rank(RB, views)
    assert (r.order, r.scores) == ([1, 2, 0], [20.0, 16.0, 17.0])


def test_dynamo_cost_ties_go_by_load_then_routed_then_index():
    """Equal costs (no match, equal loads): routed decides, then the index."""
    r = make_router("dynamo_cost").rank(RB, _views((1, 3, 0.0), (1, 1, 0.0), (1, 1, 0.0)))
    assert r.order == [1, 2, 0]


# ------------------------------------------------------------------------------- cacheroute


def _stream(cr, views, arrivals):
    """Rank ``(prefix, t)`` requests in order; the rankings."""
    return [cr.rank(_req(p, t, tail=f"{p}{i}"), views) for i, (p, t) in enumerate(arrivals)]


def test_cacheroute_admits_a_key_only_at_the_admit_rate_and_evicts_below_the_evict_rate():
    """period 10 s, alpha 0.5, admit 0.2, evict 0.1 (the defaults); rates start at 0.
    Period 0: A 4 requests (0.4/s), B 3 (0.3/s). At t=10: A = 0.5 * 0.4 = 0.2 >= 0.2: warm;
    B = 0.15 < 0.2: cold. Total 0.5 * 0.7 = 0.35/s, share 0.35 / 3: A gets ceil(0.2 / 0.1167) =
    2 destinations.
    Period 1: A 1 request, B 3. At t=20: A = 0.5 * 0.1 + 0.5 * 0.2 = 0.15: below admit but
    >= evict: stays warm (hysteresis); B = 0.5 * 0.3 + 0.5 * 0.15 = 0.225: joins.
    Period 2: A none, B 3. At t=30: A = 0.075 < 0.1: evicted; B = 0.2625: stays."""
    cr = make_router("cacheroute")
    views = _loads(0, 0, 0)
    a, b = prefix_key(_req("A"), 4), prefix_key(_req("B"), 4)
    _stream(cr, views, [("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 4), ("B", 5), ("B", 6)])
    assert cr.warm == set()  # no plan before the first period ends
    r = _stream(cr, views, [("A", 10)])[0]
    assert cr.rates[a] == 0.2 and math.isclose(cr.rates[b], 0.15)
    assert cr.warm == {a} and r.reason == "cacheroute: warm, 2 destinations"
    _stream(cr, views, [("B", 11), ("B", 12), ("B", 13)])  # and A at t=10: A 1, B 3
    _stream(cr, views, [("B", 20)])
    assert math.isclose(cr.rates[a], 0.15) and math.isclose(cr.rates[b], 0.225)
    assert cr.warm == {a, b}
    _stream(cr, views, [("B", 21), ("B", 22), ("B", 30)])
    assert math.isclose(cr.rates[a], 0.075) and math.isclose(cr.rates[b], 0.2625)
    assert cr.warm == {b}


def test_cacheroute_decays_rates_through_periods_without_requests():
    """A: 4 requests in period 0 (0.2/s once closed); the next request comes at t=35, in
    period 3: periods 1 and 2 had none, so A = 0.2 * 0.5 ** 2 = 0.05 < 0.2: not warm."""
    cr = make_router("cacheroute")
    a = prefix_key(_req("A"), 4)
    _stream(cr, _loads(0, 0), [("A", 0), ("A", 1), ("A", 2), ("A", 3), ("A", 35)])
    assert math.isclose(cr.rates[a], 0.05) and cr.warm == set() and cr.period == 3


def test_cacheroute_gives_a_hot_key_several_destinations_and_the_least_loaded_of_them():
    """Period 0: H 40 requests, A 4, and 40 one-off prefixes: rates H 2.0, A 0.2, one-offs
    0.05 each (cold), total 0.5 * 84 / 10 = 4.2/s; 4 replicas: share C = 1.05/s.
    d_H = ceil(2.0 / 1.05) = 2, d_A = ceil(0.2 / 1.05) = 1. Placement, hottest first, least
    planned first: H -> (0, 1) (1.0/s each), A -> (2,).
    Loads (3, 1, 2, 0): least loaded order [3, 1, 2, 0].
    H: its destinations least loaded first [1, 0], then [3, 2];
    A: [2], then [3, 1, 0]; a cold key: [3, 1, 2, 0]."""
    cr = make_router("cacheroute")
    idle = _loads(0, 0, 0, 0)
    arrivals = [("H", i * 0.25) for i in range(40)] + [("A", 1.0 + i) for i in range(4)]
    arrivals += [(f"once{i}", i * 0.25) for i in range(40)]
    _stream(cr, idle, sorted(arrivals, key=lambda x: x[1]))
    h, a = prefix_key(_req("H"), 4), prefix_key(_req("A"), 4)
    views = _loads(3, 1, 2, 0)
    rh, ra, rc = (cr.rank(_req(p, 10.0, tail="z"), views) for p in ("H", "A", "new"))
    assert math.isclose(cr.total_rate, 4.2) and math.isclose(cr.rates[h], 2.0)
    assert cr.plan == {h: (0, 1), a: (2,)}
    assert cr.planned == pytest.approx([1.0, 1.0, 0.2, 0.0])
    assert rh.order == [1, 0, 3, 2] and rh.reason == "cacheroute: warm, 2 destinations"
    assert ra.order == [2, 3, 1, 0]
    assert rc.order == [3, 1, 2, 0] and rc.reason == "cacheroute: cold, least loaded"
    assert rh.scores is ra.scores is rc.scores is None
    fixed = make_router("cacheroute", replica_rps=0.5)
    _stream(fixed, idle, [*sorted(arrivals, key=lambda x: x[1]), ("H", 10.0)])
    assert fixed.plan[h] == (0, 1, 2, 3)  # ceil(2.0 / 0.5) = 4


def test_cacheroute_sends_cold_keys_cache_blind():
    """Nothing is warm: the replica holding the whole prompt (match 8) is ignored, the least
    loaded goes first."""
    cr = make_router("cacheroute")
    r = cr.rank(RB, _views((5, 0, 8.0), (0, 0, 0.0), (2, 0, 0.0)))
    assert (r.order, r.scores) == ([1, 2, 0], None)


def test_cacheroute_placement_keeps_a_key_where_it_was_within_the_slack():
    """total 4.0/s on 4 replicas: share 1.0, budget 1.25 * 1.0 = 1.25.
    Old plan {10: (3,)}, rates 10: 0.5, 20 (new, hotter): 0.9. Old keys first: 10 keeps 3
    (0 + 0.5 <= 1.25); 20 takes the least planned, 0.
    Old plan {10: (0,), 20: (0,)}, rates 1.0 and 0.5: 10 keeps 0 (1.0 <= 1.25); 20 would put
    0 at 1.5 > 1.25, so it moves to the least planned, 1.
    Old plan {10: (0,)} at 0.5, new keys 20, 30, 40 at 0.9 each: 10 is placed first and keeps
    0; the new ones fill 1, 2, 3 (hottest first, it would have been pushed off 0: 0.9 + 0.5 >
    1.25)."""
    cr = make_router("cacheroute")
    cr.total_rate, cr.warm = 4.0, {10, 20}
    cr.rates, cr.plan = {10: 0.5, 20: 0.9}, {10: (3,)}
    cr.place(4)
    assert cr.plan == {10: (3,), 20: (0,)}
    cr.rates, cr.plan = {10: 1.0, 20: 0.5}, {10: (0,), 20: (0,)}
    cr.place(4)
    assert cr.plan == {10: (0,), 20: (1,)}
    cr.warm = {10, 20, 30, 40}
    cr.rates, cr.plan = {10: 0.5, 20: 0.9, 30: 0.9, 40: 0.9}, {10: (0,)}
    cr.place(4)
    assert cr.plan == {10: (0,), 20: (1,), 30: (2,), 40: (3,)}


def test_cacheroute_needs_only_the_request_clock_and_replans_for_a_new_replica_count():
    """The same stream gives the same plan whatever the loads; a different replica count
    rebuilds the placement at once (no destination beyond the replicas)."""
    arrivals = [("H", i * 0.1) for i in range(60)] + [("H", 10.0)]
    one, two = make_router("cacheroute"), make_router("cacheroute")
    _stream(one, _loads(0, 0, 0, 0), arrivals)
    _stream(two, _loads(5, 0, 9, 1), arrivals)
    assert one.plan == two.plan and one.warm == two.warm != set()
    r = one.rank(_req("H", 10.5), _loads(0, 0))
    assert set(one.plan[prefix_key(_req("H"), 4)]) <= {0, 1} and sorted(r.order) == [0, 1]


def _period(start: float, hot: int, once: int) -> list[tuple[str, float]]:
    """One 10 s period from ``start``: ``hot`` requests of H (the first at ``start``) and
    ``once`` one-off prefixes, each evenly spread."""
    arrivals = [("H", start + i * 10.0 / hot) for i in range(hot)]
    arrivals += [(f"once-{start:g}-{i}", start + 0.05 + i * 9.9 / once) for i in range(once)]
    return sorted(arrivals, key=lambda x: x[1])


def test_cacheroute_shrinks_a_cooling_hot_key_to_its_new_destination_count():
    """ewma_alpha 1 (a rate is its last period's count / 10 s), 4 replicas, 40 requests per
    period (total 4.0/s, share C = 1.0/s, budget 1.25/s); one-offs (0.1/s) stay cold.
    Period 0: H 30 requests, 3.0/s: at t=10 d = ceil(3.0 / 1.0) = 3, placed on (0, 1, 2).
    Period 1: H 15, 1.5/s: at t=20 d = 2; it keeps the first 2 of its old destinations (each
    at 0.75 <= 1.25): (0, 1). Period 2: H 9, 0.9/s: at t=30 d = 1: (0,), planned load
    [0.9, 0, 0, 0]. Its next request goes to 0 first even though 1, 2 and 3 are idle."""
    cr = make_router("cacheroute", ewma_alpha=1.0)
    idle = _loads(0, 0, 0, 0)
    h = prefix_key(_req("H"), 4)
    _stream(cr, idle, _period(0.0, 30, 10))
    assert cr.plan == {}
    _stream(cr, idle, _period(10.0, 15, 25))
    assert math.isclose(cr.rates[h], 3.0) and cr.plan == {h: (0, 1, 2)}
    _stream(cr, idle, _period(20.0, 9, 31))
    assert cr.plan == {h: (0, 1)} and cr.planned == pytest.approx([0.75, 0.75, 0.0, 0.0])
    r = cr.rank(_req("H", 30.0, tail="z"), _loads(5, 0, 0, 0))
    assert math.isclose(cr.rates[h], 0.9) and math.isclose(cr.total_rate, 4.0)
    assert cr.plan == {h: (0,)} and cr.planned == pytest.approx([0.9, 0.0, 0.0, 0.0])
    assert r.order == [0, 1, 2, 3] and r.reason == "cacheroute: warm, 1 destinations"


# ------------------------------------------------------------------------------- properties


@st.composite
def _streams(draw):
    """A stream of requests (prefix among 5, arrival non-decreasing) over random views."""
    n = draw(st.integers(1, 7))
    steps = draw(st.lists(st.tuples(
        st.integers(0, 4),  # prefix
        st.floats(0, 6, allow_nan=False),  # gap to the previous arrival
        st.lists(st.tuples(st.integers(0, 90), st.integers(0, 5), st.integers(0, 6)),
                 min_size=n, max_size=n),  # (load, routed, matched of the 6 blocks)
    ), min_size=1, max_size=25))  # fmt: skip
    return steps


def _run(name, steps):
    r = make_router(name)
    t = 0.0
    out = []
    for prefix, gap, rows in steps:
        t += gap
        rank = r.rank(_req(f"p{prefix}", t), _views(*[(a, b, float(c)) for a, b, c in rows]))
        out.append((rank.order, rank.scores, rank.reason))
    return out


@settings(max_examples=40, deadline=None)
@given(_streams())
def test_every_router_ranks_every_replica_once_and_deterministically(steps):
    for name in ROUTERS:
        first = _run(name, steps)
        for (order, scores, _), (_, _, rows) in zip(first, steps, strict=True):
            assert sorted(order) == list(range(len(rows))), name
            assert scores is None or len(scores) == len(rows)
        assert _run(name, steps) == first, name  # a fresh router, the same stream: the same


# ------------------------------------------------------------------------------- simulator


def _workload(n: int = 60, prefixes: int = 4) -> list[Request]:
    reqs = []
    for i in range(n):
        p = i % prefixes
        segs = [
            Segment(T.SYSTEM, 128, content_hash(f"sys-{p}")),
            Segment(T.USER_QUERY, 32, content_hash(f"q{i}")),
        ]
        reqs.append(Request(f"r{i}", 0.5 * i, segs, output_tokens=8))
    return reqs


@pytest.mark.parametrize("name", NEW)
def test_the_simulator_runs_every_new_router(name):
    cfg = SimConfig(capacity_blocks=64, block_size=16, replicas=3, router=name)
    res = simulate(_workload(), cfg, make_latency_model("linear"), progress=False)
    used = [r["replica"] for r in res.requests]
    assert len(used) == 60 and set(used) <= {0, 1, 2}
    assert res.summary["token_hit_rate"] > 0


def test_the_simulator_passes_router_parameters():
    cfg = SimConfig(capacity_blocks=64, block_size=16, replicas=3, router="random",
                    router_params={"seed": 5})  # fmt: skip
    runs = [
        [r["replica"] for r in simulate(_workload(), cfg, make_latency_model("linear"),
                                        progress=False).requests]
        for _ in range(2)
    ]  # fmt: skip
    assert runs[0] == runs[1] and len(set(runs[0])) == 3


def test_cacheroute_serves_more_hits_than_least_loaded_on_steady_shared_prefixes():
    """Six prefixes of 20 blocks, one request every 0.5 s for 120 s with the prefix drawn
    uniformly (seeded), on three replicas of 48 blocks: a replica holds two prefixes, not six.
    least_loaded (idle replicas: effectively by requests routed) spreads every prefix over
    every replica, which thrash (31% of tokens hit); cacheroute warms every prefix (about
    1/3 req/s >= 0.2) after the first period and pins each on one replica (fair share 2/3
    req/s: one destination each, two per replica), 79%."""
    rng = random.Random(0)
    reqs = []
    for i in range(240):
        segs = [
            Segment(T.SYSTEM, 320, content_hash(f"doc-{rng.randrange(6)}")),
            Segment(T.USER_QUERY, 16, content_hash(f"q{i}")),
        ]
        reqs.append(Request(f"r{i}", 0.5 * i, segs, output_tokens=4))
    rate = {}
    for name in ("least_loaded", "cacheroute"):
        cfg = SimConfig(capacity_blocks=48, block_size=16, replicas=3, router=name)
        res = simulate(reqs, cfg, make_latency_model("linear"), progress=False)
        rate[name] = res.summary["token_hit_rate"]
    assert rate["cacheroute"] > rate["least_loaded"] + 0.3, rate


# ------------------------------------------------------------------------------- service


def _replicas(n: int):
    apps = [mock_backend.create_app(mock_backend.MockConfig(name=f"r{i}")) for i in range(n)]
    mounts = {f"http://replica-{i}": httpx.ASGITransport(a) for i, a in enumerate(apps)}
    return apps, [f"http://replica-{i}" for i in range(n)], mounts


def _msgs(k: int) -> list[dict]:
    return [
        {"role": "system", "content": f"You are assistant number {k}. " + "Be precise. " * 40},
        {"role": "user", "content": f"question {k}"},
    ]


@pytest.mark.parametrize("name", NEW)
def test_the_router_service_routes_with_every_new_router(tmp_path, name):
    async def go():
        apps, urls, mounts = _replicas(3)
        cfg = router.RouterConfig(replicas=urls, policy=name, routing_output_dir=tmp_path)
        app = router.create_app(cfg, mounts=mounts)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            for k in range(6):
                r = await c.post("/v1/chat/completions", json={"messages": _msgs(k % 2)})
                assert r.status_code == 200
        log = next(tmp_path.glob("routing-*.jsonl"))
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [d["policy"] for d in lines] == [name] * 6
        assert all(d["chosen"] in (0, 1, 2) and d["reason"].startswith(name) for d in lines)
        assert sum(a.state.engine.calls for a in apps) == 6

    asyncio.run(go())


@pytest.mark.parametrize("name", NEW)
def test_the_router_service_takes_every_new_name_from_the_environment(monkeypatch, name):
    monkeypatch.setenv("SKV_REPLICAS", "http://a:1,http://b:2")
    monkeypatch.setenv("SKV_ROUTING_POLICY", name)
    cfg = router.RouterConfig.from_env()
    assert cfg.policy == name
    assert router.router_params(cfg) == {}  # no max_imbalance: these routers do not take it
    assert router.RouterState(cfg).router.name == name


def test_the_router_service_gives_cacheroute_the_arrival_clock(monkeypatch):
    """The service stamps each request with its monotonic clock, so cacheroute's plan moves
    with time: four requests of one prefix in period 0 (0.2/s once closed) make it warm for
    the request at t=10 (with arrival_s stuck at 0 it would stay cold); total 0.2/s over two
    replicas: share 0.1, so ceil(0.2 / 0.1) = 2 destinations."""
    clock = iter([0.0, 1.0, 2.0, 3.0, 10.0])
    cfg = router.RouterConfig(replicas=["http://a", "http://b"], policy="cacheroute",
                              routing_output_dir=None, block_size=4)  # fmt: skip
    state = router.RouterState(cfg)
    segs = router.token_segments(list(range(100, 120)), 4)
    reasons = []
    for _ in range(5):
        now = next(clock)
        monkeypatch.setattr(router, "time", SimpleNamespace(monotonic=lambda t=now: t))
        rb = state.blocks(segs, None)
        reasons.append(state.candidates(rb)[2])
    assert reasons == ["cacheroute: cold, least loaded"] * 4 + ["cacheroute: warm, 2 destinations"]
