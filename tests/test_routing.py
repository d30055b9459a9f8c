"""skv.routing: the shared routers, on constructed replica views and through the simulator."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skv.blocks import request_blocks
from skv.experiments.config import ReplicaSpec
from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType, content_hash
from skv.routing import ROUTERS, FixedView, make_router
from skv.sim import SimConfig, simulate

T = SemanticType
NAMES = ["round_robin", "least_loaded", "prefix_locality", "semantic_locality", "precise",
         "random", "power_of_two", "consistent_hashing", "sglang_cache_aware", "dynamo_cost",
         "cacheroute"]  # fmt: skip


def _rb(*segments: tuple[SemanticType, int]):
    """Request blocks (block size 16) of segments given as (type, tokens)."""
    segs = [Segment(t, n, content_hash(f"{t.value}-{n}-{i}")) for i, (t, n) in enumerate(segments)]
    return request_blocks(Request("r", 0.0, segs), 16, "prefix")


RB = _rb((T.SYSTEM, 64), (T.USER_QUERY, 64))  # 4 system blocks, then 4 user-query blocks


def _views(*rows: tuple[int, int, float]) -> list[FixedView]:
    """One view per (load, routed, matched blocks)."""
    return [FixedView(load, routed, lambda _rb, m=m: m) for load, routed, m in rows]


def test_one_registry_with_a_clear_unknown_name_error():
    assert list(ROUTERS) == NAMES
    with pytest.raises(ValueError, match=f"unknown router 'nope'; known: {', '.join(NAMES)}"):
        make_router("nope")
    with pytest.raises(ValueError, match="router 'round_robin': bad parameters"):
        make_router("round_robin", max_imbalance=3)
    from skv.services.router import POLICIES

    assert list(POLICIES) == NAMES  # the service's policy names are the registry's


def test_experiment_configs_validate_router_names_and_parameters_against_the_registry():
    assert ReplicaSpec(count=2, router="semantic_locality").router == "semantic_locality"
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        ReplicaSpec(count=2, router="nearest")
    with pytest.raises(ValueError, match="bad parameters"):
        ReplicaSpec(count=2, router="least_loaded", router_params={"max_imbalance": 2})
    assert ReplicaSpec(router="precise", router_params={"max_imbalance": 2}).router == "precise"


def test_round_robin_rotates_whatever_the_load():
    rr = make_router("round_robin")
    views = _views((9, 0, 4.0), (0, 0, 0.0), (0, 0, 0.0))
    ranks = [rr.rank(RB, views) for _ in range(4)]
    assert [r.order for r in ranks] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert all(r.scores is None and r.reason == "round_robin" for r in ranks)
    assert make_router("round_robin").rank(RB, views).order == [0, 1, 2]  # state per object


def test_least_loaded_orders_by_load_then_routed_then_index():
    r = make_router("least_loaded").rank(RB, _views((2, 0, 4.0), (1, 5, 0.0), (1, 3, 0.0)))
    assert (r.order, r.scores, r.reason) == ([2, 1, 0], None, "least_loaded")


@pytest.mark.parametrize("name", ["prefix_locality", "semantic_locality", "precise"])
def test_locality_ties_go_by_load_then_routed_then_index(name):
    views = _views((3, 0, 2.0), (1, 4, 2.0), (1, 2, 2.0), (0, 0, 1.0), (1, 2, 2.0))
    r = make_router(name).rank(RB, views)
    assert r.order == [2, 4, 1, 0, 3] and r.reason == name
    if name != "semantic_locality":
        assert r.scores == [2.0, 2.0, 2.0, 1.0, 2.0]


@pytest.mark.parametrize("name", ["prefix_locality", "semantic_locality", "precise"])
def test_no_match_anywhere_is_the_least_loaded_order(name):
    r = make_router(name, max_imbalance=8).rank(RB, _views((2, 0, 0), (1, 1, 0), (1, 0, 0)))
    assert r.order == [2, 1, 0]
    assert r.reason == f"{name}: no match, least loaded"


def test_imbalance_rule_on_and_off():
    views = _views((10, 0, 5.0), (2, 0, 0.0), (1, 7, 0.0))
    off = make_router("prefix_locality").rank(RB, views)  # the simulator's default: None
    assert (off.order, off.reason) == ([0, 2, 1], "prefix_locality")
    on = make_router("prefix_locality", max_imbalance=8).rank(RB, views)  # 10 - 1 > 8
    assert on.order == [2, 0, 1]
    assert on.reason == "prefix_locality: imbalance > 8, least loaded"
    assert on.scores == [5.0, 0.0, 0.0]
    edge = make_router("prefix_locality", max_imbalance=9).rank(RB, views)  # 10 - 1 = 9: stays
    assert (edge.order, edge.reason) == ([0, 2, 1], "prefix_locality")


def test_semantic_scores_weigh_the_matched_tokens_by_type():
    views = _views((0, 0, 0.0), (0, 0, 2.0), (0, 0, 6.0))  # blocks 0-3 system, 4-7 user query
    r = make_router("semantic_locality").rank(RB, views)
    assert r.scores == [0.0, 2 * 16 * 3.0, 4 * 16 * 3.0 + 2 * 16 * 0.5]
    assert r.order == [2, 1, 0] and r.reason == "semantic_locality"


def test_semantic_weights_change_the_choice_prefix_locality_makes():
    """Replica 1 holds more blocks, but the extra ones are user-query text: with that text
    weighted 0 both score the same and the less loaded replica 0 wins."""
    views = _views((0, 0, 4.0), (3, 0, 6.0))
    assert make_router("prefix_locality").rank(RB, views).order == [1, 0]
    sem = make_router("semantic_locality", weights={T.SYSTEM: 3.0, T.USER_QUERY: 0.0})
    r = sem.rank(RB, views)
    assert r.scores == [192.0, 192.0] and r.order == [0, 1]


def test_routing_imports_nothing_above_it():
    code = (
        "import sys, skv.routing, skv.routing.registry\n"
        "bad = [m for m in sys.modules if m.startswith(('skv.sim', 'skv.services', 'skv.vllm'))]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_locality_beats_round_robin_when_a_replica_cannot_hold_both_working_sets():
    """Two documents (20 blocks each) on two replicas of 30 blocks, requested A A B B A A ...
    one at a time: round robin sends both to each replica, which thrash; prefix_locality keeps
    A on one replica and B on the other (the first B matches nowhere; both replicas are idle, so
    the tie goes to the one with fewer requests routed)."""
    reqs = []
    for i in range(24):
        doc = "AB"[(i // 2) % 2]
        segs = [
            Segment(T.RETRIEVED_CONTEXT, 320, content_hash(f"doc-{doc}")),
            Segment(T.USER_QUERY, 16, content_hash(f"q{i}")),
        ]
        reqs.append(Request(f"r{i}", 100.0 * i, segs, output_tokens=4))
    latency = make_latency_model("linear")
    rate, home = {}, {}
    for router in ("round_robin", "prefix_locality"):
        cfg = SimConfig(capacity_blocks=30, block_size=16, replicas=2, router=router)
        res = simulate(reqs, cfg, latency, progress=False)
        rate[router] = res.summary["token_hit_rate"]
        home[router] = {
            doc: {
                r["replica"]
                for r in res.requests
                if "AB"[(int(r["request_id"][1:]) // 2) % 2] == doc
            }
            for doc in "AB"
        }
    assert rate["prefix_locality"] > rate["round_robin"]
    assert home["round_robin"] == {"A": {0, 1}, "B": {0, 1}}
    assert home["prefix_locality"] == {"A": {0}, "B": {1}}  # ties by routed: B to the idle one


def test_order_by_sorts_by_each_column_in_turn_then_by_index():
    """``order_by`` (one stable sort per column) gives the order of sorting the tuples
    (column values..., index), on columns full of ties, mixed ints and floats and negatives."""
    import random

    from skv.routing.base import order_by

    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 40)
        cols = [
            [rng.choice([0, 1, 2, -1.5, 0.25, 2.0]) for _ in range(n)]
            for _ in range(rng.randint(1, 4))
        ]
        want = [t[-1] for t in sorted(zip(*cols, range(n), strict=True))]
        assert order_by(*cols) == want
    with pytest.raises(ValueError, match="columns of 3 and 2"):
        order_by([1, 2, 3], [1, 2])


def test_matched_tokens_sums_the_leading_blocks_and_caps_at_the_prompt():
    from helpers import rb

    from skv.routing.base import matched_tokens

    block = rb([1, 2, 3], tokens=[4, 4, 3])  # a partial last block
    assert matched_tokens(block, [0.0, 1.0, 2.0, 3.0, 7.0]) == [0, 4, 8, 11, 11]
    with pytest.raises(ValueError, match=">= 0"):
        matched_tokens(block, [-1.0])


def test_an_empty_ranking_has_no_first():
    from skv.routing.base import Ranking

    r = Ranking([2, 0, 1], [1.0, 0.5, 0.0], "why")
    assert r.first == 2 and r == Ranking([2, 0, 1], [1.0, 0.5, 0.0], "why")
    assert r != Ranking([2, 1, 0], [1.0, 0.5, 0.0], "why")
    with pytest.raises(IndexError, match="no first"):
        _ = Ranking([], None, "none").first
