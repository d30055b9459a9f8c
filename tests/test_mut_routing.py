"""Boundary cases of the router zoo (issue 14) that mutation testing of ``skv/routing`` showed
unpinned (issue 11): SplitMix64's published outputs, the consistent-hashing ring against a
brute-force walk, the exact threshold and rounding of sglang_cache_aware and dynamo_cost, the
default seeds, parameter limits, and CacheRoute's rate bookkeeping at its thresholds. Every
expected value is worked by hand in the docstring, or comes from a published test vector or an
independent brute-force oracle."""

from __future__ import annotations

import math
import random

import pytest

from skv.blocks import request_blocks
from skv.model import Request, Segment, SemanticType, content_hash
from skv.routing import LOCALITY, FixedView, make_router
from skv.routing.cacheroute import CacheRoute
from skv.routing.consistent_hashing import ConsistentHashing
from skv.routing.keys import mix64, prefix_key

T = SemanticType


def _rb(*segments: tuple[SemanticType, int], block_size: int = 16, t: float = 0.0, tag: str = ""):
    segs = [
        Segment(s, n, content_hash(f"{tag}{s.value}-{n}-{i}")) for i, (s, n) in enumerate(segments)
    ]
    return request_blocks(Request("r", t, segs), block_size, "prefix")


RB = _rb((T.SYSTEM, 64), (T.USER_QUERY, 64))  # 128 tokens, 8 blocks of 16


def _req(prefix: str, t: float = 0.0, tail: str = "q"):
    """First 4 blocks: the shared prefix ``prefix``; then 2 blocks of its own."""
    segs = [
        Segment(T.SYSTEM, 64, content_hash(f"prefix-{prefix}")),
        Segment(T.USER_QUERY, 32, content_hash(f"tail-{prefix}-{tail}-{t}")),
    ]
    return request_blocks(Request("r", t, segs), 16, "prefix")


def _views(*rows: tuple[int, float]) -> list[FixedView]:
    """One view per (load, matched blocks)."""
    return [FixedView(load, 0, lambda _rb, m=m: m) for load, m in rows]


def _loads(*loads: int) -> list[FixedView]:
    return [FixedView(x) for x in loads]


# ------------------------------------------------------------------------------- keys


def test_mix64_is_splitmix64_with_its_published_outputs():
    """SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c): the generator adds the
    golden gamma 0x9E3779B97F4A7C15 to its state and returns mix(state), so mix64(s) is the
    first output of a generator seeded with s. Published outputs: seed 0 -> 0xE220A8397B1DCDAF;
    seed 1234567 -> 6457827717110365317, 3203168211198807973, 9817491932198370423."""
    gamma = 0x9E3779B97F4A7C15
    assert mix64(0) == 0xE220A8397B1DCDAF
    state, outputs = 1234567, []
    for _ in range(3):
        outputs.append(mix64(state))
        state = (state + gamma) % 2**64
    assert outputs == [6457827717110365317, 3203168211198807973, 9817491932198370423]


# ------------------------------------------------------------------------------- consistent hashing


def _walk_oracle(key: int, n: int, vnodes: int) -> tuple[int, ...]:
    """Brute force from the docstring: replica r owns points mix64(r << 32 | v); the walk is
    the distinct owners met going clockwise (increasing, wrapping) from mix64(key)."""
    points = sorted((mix64((r << 32) | v), r) for r in range(n) for v in range(vnodes))
    h = mix64(key)
    clockwise = [p for p in points if p[0] >= h] + [p for p in points if p[0] < h]
    out: list[int] = []
    for _, r in clockwise:
        if r not in out:
            out.append(r)
    return tuple(out)


@pytest.mark.parametrize("vnodes", [None, 1, 3])
def test_consistent_hashing_walks_the_ring_clockwise_as_the_brute_force_does(vnodes):
    """The default ring has 100 points per replica; every walk, on rings of 1 to 8 replicas
    (changing the count back and forth on one router), is the brute-force one."""
    ch = ConsistentHashing() if vnodes is None else ConsistentHashing(vnodes=vnodes)
    v = 100 if vnodes is None else vnodes
    keys = [prefix_key(_req(f"p{i}"), 4) for i in range(12)]
    for n in (3, 1, 5, 8, 3, 2):
        for key in keys:
            assert ch.walk(key, n) == _walk_oracle(key, n, v), (n, key)


def test_consistent_hashing_capacity_counts_the_new_request_once():
    """Loads (2, 2, 2, 2): L = 8, cap = ceil(1.25 * 9 / 4) = ceil(2.8125) = 3 (not
    ceil(1.25 * 10 / 4) = 4); load_factor 1 on loads (1, 1): ceil(3 / 2) = 2."""
    assert ConsistentHashing().capacity(_loads(2, 2, 2, 2)) == 3
    assert ConsistentHashing(load_factor=1.0).capacity(_loads(1, 1)) == 2


def test_consistent_hashing_parameter_limits():
    """prefix_blocks 1, load_factor 1.0 and vnodes 1 are the smallest allowed values."""
    ch = ConsistentHashing(prefix_blocks=1, load_factor=1.0, vnodes=1)
    assert (ch.prefix_blocks, ch.load_factor, ch.vnodes) == (1, 1.0, 1)
    with pytest.raises(ValueError, match="vnodes must be >= 1, got 0"):
        ConsistentHashing(vnodes=0)


# ------------------------------------------------------------------------------- sglang


FULL = 8.0  # RB's 8 blocks


def test_sglang_imbalance_thresholds_are_strict_at_their_defaults():
    """Replica 0 holds the whole prompt; imbalanced (shortest queue: [1, 0]) iff
    hi - lo > 64 and hi > 1.5 * lo:
    (100, 36): 64 > 64 is false: balanced, the match wins: [0, 1];
    (100, 35): 65 > 64 and 100 > 52.5: imbalanced: [1, 0];
    (195, 130): 65 > 64 but 195 > 195 is false: balanced: [0, 1];
    (150, 80): 70 > 64 and 150 > 120: imbalanced: [1, 0]."""
    sg = make_router("sglang_cache_aware")
    cases = {(100, 36): [0, 1], (100, 35): [1, 0], (195, 130): [0, 1], (150, 80): [1, 0]}
    for (hi, lo), order in cases.items():
        assert sg.rank(RB, _views((hi, FULL), (lo, 0.0))).order == order, (hi, lo)


def test_sglang_cache_threshold_is_strict_and_scores_are_given_below_it():
    """A 2-block match is 32/128 = 0.25: not > 0.25, so least loaded, with the ratios as
    scores; with the threshold at 0.2 it is a cache match."""
    views = _views((5, 2.0), (0, 0.0), (2, 0.0))
    r = make_router("sglang_cache_aware", cache_threshold=0.25).rank(RB, views)
    assert (r.order, r.scores) == ([1, 2, 0], [0.25, 0.0, 0.0])
    assert r.reason == "sglang_cache_aware: match <= 0.25, least loaded"


def test_sglang_sorts_by_match_ratio_whatever_the_index():
    """Matches (0, 4) blocks: ratios 0, 64/128 = 0.5: replica 1 first although it is busier."""
    r = make_router("sglang_cache_aware").rank(RB, _views((0, 0.0), (3, 4.0)))
    assert (r.order, r.scores) == ([1, 0], [0.0, 0.5])


def test_sglang_ratio_of_a_one_token_prompt_and_six_decimals():
    """A 1-token prompt fully matched: ratio 1/1 = 1.0. A 48-token prompt (3 blocks) with
    1 block matched: 16/48 rounded to 6 decimals = 0.333333."""
    sg = make_router("sglang_cache_aware")
    one = _rb((T.USER_QUERY, 1))
    assert sg.rank(one, _views((0, 1.0), (0, 0.0))).scores == [1.0, 0.0]
    three = _rb((T.USER_QUERY, 48))
    assert sg.rank(three, _views((0, 1.0), (0, 0.0))).scores == [0.333333, 0.0]


def test_sglang_parameter_limits():
    """balance_abs_threshold 0, balance_rel_threshold 1.0 and cache_threshold 0.0 / 1.0 are
    allowed. With abs 0 and rel 1.0, loads (2, 1) are imbalanced (1 > 0, 2 > 1): [1, 0] even
    though replica 0 holds the prompt; with cache_threshold 1.0 a full match (1.0) is not
    > 1.0: least loaded; with 0.0 any match is."""
    tight = make_router("sglang_cache_aware", balance_abs_threshold=0, balance_rel_threshold=1.0)
    assert tight.rank(RB, _views((2, FULL), (1, 0.0))).order == [1, 0]
    never = make_router("sglang_cache_aware", cache_threshold=1.0)
    assert never.rank(RB, _views((1, FULL), (0, 0.0))).order == [1, 0]
    always = make_router("sglang_cache_aware", cache_threshold=0.0)
    assert always.rank(RB, _views((1, 1.0), (0, 0.0))).order == [0, 1]
    with pytest.raises(ValueError, match="balance_abs_threshold must be >= 0, got -1"):
        make_router("sglang_cache_aware", balance_abs_threshold=-1)


# ------------------------------------------------------------------------------- dynamo


def test_dynamo_cost_rounds_ceil_blocks_and_three_decimals():
    """40 tokens at block size 16: 3 blocks (16, 16, 8; ceil(40 / 16) = 3). b = 1/3.
    Replica 0 (load 1, no match): 40/16 + 1/3 + 3 = 5.8333.. -> 5.833;
    replica 1 (load 0, 1 block): (40 - 16)/16 + 0 + 3 = 4.5."""
    rb = _rb((T.USER_QUERY, 40))
    r = make_router("dynamo_cost", blocks_per_request=1 / 3).rank(rb, _views((1, 0.0), (0, 1.0)))
    assert (r.order, r.scores) == ([1, 0], [5.833, 4.5])


def test_dynamo_cost_at_block_size_one():
    """5 tokens in blocks of 1, b = 3: (load 0, 2 matched): (5 - 2) / 1 + 0 + 5 = 8;
    (load 1, none): 5 + 3 + 5 = 13."""
    rb = _rb((T.USER_QUERY, 5), block_size=1)
    r = make_router("dynamo_cost", blocks_per_request=3).rank(rb, _views((0, 2.0), (1, 0.0)))
    assert r.scores == [8.0, 13.0]


def test_dynamo_cost_parameter_limits():
    """Weight 0: only decode blocks count, so the full match on the busier replica is
    ignored: b = 10: 1 * 10 + 8 = 18 vs 0 + 8 = 8: [1, 0]. blocks_per_request 0: only
    prefill: (128 - 128)/16 + 8 = 8 vs 128/16 + 8 = 16: [0, 1]."""
    views = _views((1, FULL), (0, 0.0))
    w0 = make_router("dynamo_cost", overlap_score_weight=0, blocks_per_request=10)
    assert (w0.rank(RB, views).order, w0.rank(RB, views).scores) == ([1, 0], [18.0, 8.0])
    b0 = make_router("dynamo_cost", blocks_per_request=0)
    assert (b0.rank(RB, views).order, b0.rank(RB, views).scores) == ([0, 1], [8.0, 16.0])
    with pytest.raises(ValueError, match="blocks_per_request must be >= 0, got -1"):
        make_router("dynamo_cost", blocks_per_request=-1)


# ------------------------------------------------------------------------------- seeds


def test_random_and_power_of_two_default_to_seed_zero():
    """Without a seed: random.Random(0)'s shuffles and samples. Loads (0, 5, 9): power of two
    puts the less loaded of its draw first, and its reason names both."""
    views = _loads(0, 5, 9)
    rr, p2 = make_router("random"), make_router("power_of_two")
    shuffles, samples = random.Random(0), random.Random(0)
    for _ in range(10):
        order = [0, 1, 2]
        shuffles.shuffle(order)
        assert rr.rank(RB, views).order == order
        a, b = sorted(samples.sample(range(3), 2))  # by index = by load here
        r = p2.rank(RB, views)
        assert r.order[:2] == [a, b] and r.reason == f"power_of_two: {a} over {b}"
    single = make_router("power_of_two").rank(RB, _loads(3))
    assert (single.order, single.reason) == ([0], "power_of_two")


# ------------------------------------------------------------------------------- cacheroute


def _stream(cr, views, arrivals):
    return [cr.rank(_req(p, t, tail=f"{p}{i}"), views) for i, (p, t) in enumerate(arrivals)]


def test_cacheroute_parameter_limits():
    """Allowed: period_s 0.5, ewma_alpha 1, evict_rate 0, evict_rate == admit_rate,
    prefix_blocks 1, slack 0. Refused, with the value named: ewma_alpha 1.5,
    prefix_blocks 0, replica_rps 0, slack -0.1."""
    cr = CacheRoute(period_s=0.5, ewma_alpha=1.0, evict_rate=0.0, prefix_blocks=1, slack=0.0)
    assert (cr.period_s, cr.ewma_alpha, cr.evict_rate, cr.prefix_blocks, cr.slack) == (
        0.5, 1.0, 0.0, 1, 0.0,
    )  # fmt: skip
    assert CacheRoute(admit_rate=0.3, evict_rate=0.3).evict_rate == 0.3
    for params, message in [
        ({"ewma_alpha": 1.5}, r"ewma_alpha must be in \(0, 1\], got 1.5"),
        ({"prefix_blocks": 0}, "prefix_blocks must be >= 1, got 0"),
        ({"replica_rps": 0}, "replica_rps must be > 0 or None, got 0"),
        ({"slack": -0.1}, "slack must be >= 0, got -0.1"),
    ]:
        with pytest.raises(ValueError, match=message):
            CacheRoute(**params)


def test_cacheroute_decays_one_idle_period_and_the_total_rate_too():
    """A: 4 requests in period 0. The next request (B) comes at t=25, in period 2: period 0
    closes at A = 0.5 * 0.4 = 0.2 and total 0.2, then one empty period halves both: 0.1, and
    A (0.1 < 0.2) is not warm."""
    cr = CacheRoute()
    a = prefix_key(_req("A"), 4)
    _stream(cr, _loads(0, 0), [("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 25)])
    assert math.isclose(cr.rates[a], 0.1) and math.isclose(cr.total_rate, 0.1)
    assert cr.warm == set() and cr.period == 2


def test_cacheroute_keeps_a_key_at_exactly_the_evict_rate_and_restarts_the_count():
    """Period 0: A 4 requests: at t=10 A = 0.2 (warm), total 0.2. Period 1: B at 10 and 11.
    At t=20: A = 0.5 * 0 + 0.5 * 0.2 = 0.1, exactly the evict rate: it stays warm (leaves only
    below it); B = 0.5 * 0.2 = 0.1 < 0.2: cold; total = 0.5 * 2 / 10 + 0.5 * 0.2 = 0.2 (the
    count of period 1 is 2, starting from 0)."""
    cr = CacheRoute()
    a, b = prefix_key(_req("A"), 4), prefix_key(_req("B"), 4)
    _stream(cr, _loads(0, 0, 0), [("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 10)])
    assert cr.warm == {a} and math.isclose(cr.total_rate, 0.2)
    _stream(cr, _loads(0, 0, 0), [("B", 11), ("C", 20)])
    assert cr.rates[a] == 0.1 and math.isclose(cr.rates[b], 0.1)
    assert cr.warm == {a} and math.isclose(cr.total_rate, 0.2)


def test_cacheroute_forgets_a_cold_key_below_admit_rate_over_64():
    """X: 1 request at t=0; the next request at t=50 (period 5): X = 0.5 * 0.1 = 0.05 at the
    close of period 0, then 4 empty periods: 0.05 / 16 = 0.003125, exactly 0.2 / 64: kept (a
    key is forgotten only below it). With admit_rate 0.202 the bound is 0.00315625: X is
    forgotten."""
    x = prefix_key(_req("X"), 4)
    kept = CacheRoute()
    _stream(kept, _loads(0, 0), [("X", 0), ("Y", 50)])
    assert kept.rates[x] == 0.2 / 64
    gone = CacheRoute(admit_rate=0.202)
    _stream(gone, _loads(0, 0), [("X", 0), ("Y", 50)])
    assert x not in gone.rates and gone.warm == set()


def test_cacheroute_destinations_without_traffic_and_with_a_fixed_capacity():
    """No traffic measured yet (total 0): one destination. replica_rps 0.5: a 2.0/s key needs
    4, capped at the replica count (3); a 0.4/s key needs 1."""
    assert CacheRoute().destinations(0.3, 4) == 1
    fixed = CacheRoute(replica_rps=0.5)
    assert (fixed.destinations(2.0, 4), fixed.destinations(2.0, 3)) == (4, 3)
    assert fixed.destinations(0.4, 4) == 1


def test_cacheroute_placement_budget_is_inclusive_and_loads_add_up():
    """total 4.0/s on 4 replicas: budget 1.25 * 4 / 4 = 1.25. Keys 10 and 20 at 0.625/s, both
    on replica 3 before: 10 keeps it (0.625), and 20 too: 0.625 + 0.625 = 1.25 <= 1.25.
    Planned load: [0, 0, 0, 1.25]."""
    cr = CacheRoute()
    cr.total_rate, cr.warm = 4.0, {10, 20}
    cr.rates, cr.plan = {10: 0.625, 20: 0.625}, {10: (3,), 20: (3,)}
    cr.place(4)
    assert cr.plan == {10: (3,), 20: (3,)}
    assert cr.planned == [0.0, 0.0, 0.0, 1.25]


def test_cacheroute_places_old_keys_first_then_new_ones_hottest_first():
    """total 4.0/s on 4 replicas (budget 1.25). Key 20 (0.5/s) was on replica 0, key 10
    (0.9/s) is new: 20 goes first and keeps 0, 10 takes the least planned, 1 (by key, 10
    would take 0 and push 20 off: 0.9 + 0.5 > 1.25). New keys 30 (0.3/s) and 40 (0.9/s):
    40, the hotter, is placed first (replica 0), then 30 (replica 1)."""
    cr = CacheRoute()
    cr.total_rate, cr.warm = 4.0, {10, 20}
    cr.rates, cr.plan = {10: 0.9, 20: 0.5}, {20: (0,)}
    cr.place(4)
    assert cr.plan == {20: (0,), 10: (1,)}
    cr.warm, cr.rates, cr.plan = {30, 40}, {30: 0.3, 40: 0.9}, {}
    cr.place(4)
    assert cr.plan == {40: (0,), 30: (1,)}


def test_cacheroute_plans_for_the_replica_count_of_its_first_request():
    """One replica: the (empty) plan is built for 1 replica, planned load [0.0]."""
    cr = CacheRoute()
    assert cr.rank(RB, _loads(4)).order == [0]
    assert (cr.plan, cr.planned) == ({}, [0.0])


def test_cacheroute_builds_the_plan_once_per_period_end():
    """ewma_alpha 1 (a rate is its last period's count / period_s), period 20 s, 2 replicas.
    Period 0: P and Q 5 requests each: at t=20 both 0.25/s, total 0.5, share 0.25: one
    destination each, both new, placed by key: the smaller key K0 on 0, K1 on 1.
    Period 1: K0 5, K1 5, N 9, X 1: at t=40 K0 = K1 = 0.25, N = 0.45, X = 0.05 (cold); total
    1.0, share 0.5 (one destination each), budget 1.25 * 1.0 / 2 = 0.625. Old keys first:
    K0 keeps 0, K1 keeps 1; then the new N takes the least planned (a tie: 0), over the budget
    (0.7): only kept destinations are held to it. (Placing a second time, with N then old and
    first, would move K0 to 1.)"""
    cr = CacheRoute(period_s=20.0, ewma_alpha=1.0)
    views = _loads(0, 0)
    k0, k1 = sorted((prefix_key(_req("P"), 4), prefix_key(_req("Q"), 4)))
    name = {prefix_key(_req(p), 4): p for p in ("P", "Q")}
    n = prefix_key(_req("N"), 4)
    _stream(cr, views, [(p, 2.0 * i + j) for i in range(5) for j, p in enumerate("PQ")])
    _stream(cr, views, [("X", 20.0)])
    assert cr.plan == {k0: (0,), k1: (1,)}
    period1 = [(name[k0], 21.0 + i) for i in range(5)] + [(name[k1], 26.0 + i) for i in range(5)]
    _stream(cr, views, [*period1, *(("N", 31.0 + i) for i in range(9)), ("X", 40.0)])
    assert math.isclose(cr.total_rate, 1.0) and cr.rates[n] == 0.45
    assert cr.plan == {k0: (0,), k1: (1,), n: (0,)}
    assert cr.planned == pytest.approx([0.7, 0.25])


# ------------------------------------------------------------------------------- batch matches


class _Batch(list):
    """Views that answer for all replicas in one pass (``match_all``, like the simulator's
    ApproximateCluster): it records what it was asked; asking a view alone is an error."""

    def __init__(self, hits: list[float]) -> None:
        super().__init__(FixedView(0, 0, self._one) for _ in hits)
        self.hits, self.asked = hits, []

    def _one(self, _rb):
        raise AssertionError("a view with match_all was asked one replica at a time")

    def match_all(self, rb):
        self.asked.append(rb)
        return list(self.hits)


def test_cache_aware_routers_ask_a_batch_view_once_with_the_request():
    """base.matches: views with ``match_all`` are asked once, with the request. Replica 1
    holds all 8 blocks of RB, replica 0 none, both idle: every cache-aware router (the
    locality ones, sglang: ratio 1.0 > 0.3, dynamo: 0 + 8 < 8 + 8) puts replica 1 first."""
    for name in (*LOCALITY, "sglang_cache_aware", "dynamo_cost"):
        views = _Batch([0.0, FULL])
        assert make_router(name).rank(RB, views).order == [1, 0], name
        assert len(views.asked) == 1 and views.asked[0] is RB, name


# ------------------------------------------------------------------------------- ties


def _rviews(*rows: tuple[int, int, float]) -> list[FixedView]:
    """One view per (load, routed, matched blocks)."""
    return [FixedView(load, routed, lambda _rb, m=m: m) for load, routed, m in rows]


def test_sglang_equal_matches_go_to_the_least_loaded_then_the_least_routed():
    """Replicas 0-2 hold all of RB (ratio 1.0), replica 3 none; loads (2, 2, 1, 0) are
    balanced (max - min = 2 <= 64). Order by (-ratio, load, routed, index): replica 2 (load
    1), then 1 (load 2, routed 0) before 0 (load 2, routed 5), then 3."""
    views = _rviews((2, 5, FULL), (2, 0, FULL), (1, 9, FULL), (0, 0, 0.0))
    r = make_router("sglang_cache_aware").rank(RB, views)
    assert (r.order, r.scores) == ([2, 1, 0, 3], [1.0, 1.0, 1.0, 0.0])


def test_sglang_imbalanced_reads_the_loads_of_the_views():
    """Default thresholds: loads (100, 35): 65 > 64 and 100 > 52.5: imbalanced; (100, 36):
    64 > 64 is false: balanced."""
    sg = make_router("sglang_cache_aware")
    assert sg.imbalanced(_loads(100, 35)) is True
    assert sg.imbalanced(_loads(100, 36)) is False


def test_dynamo_cost_ties_go_to_the_least_loaded_before_the_least_routed():
    """b = 1, RB 128 tokens = 8 blocks: replica 0 (load 1, 1 block matched, routed 0):
    (128 - 16) / 16 + 1 + 8 = 16; replica 1 (load 0, no match, routed 4): 128 / 16 + 0 + 8 =
    16. Equal costs: the less loaded, replica 1, first, though it was routed more."""
    r = make_router("dynamo_cost", blocks_per_request=1).rank(RB, _rviews((1, 0, 1.0), (0, 4, 0.0)))
    assert (r.order, r.scores) == ([1, 0], [16.0, 16.0])


# ------------------------------------------------------------------------------- semantic


def test_semantic_locality_scores_of_no_replicas_are_empty():
    """``scores`` is one score per replica's hits: none given, none returned (as the base
    LocalityRouter's ``scores``, which returns the hits)."""
    assert make_router("semantic_locality").scores(RB, []) == []
    assert make_router("prefix_locality").scores(RB, []) == []
