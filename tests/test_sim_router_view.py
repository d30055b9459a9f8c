"""The simulator's router views: ``exact`` (the replica's own cache, the default) and
``approximate`` (the router's own LRU of the prompts it routed there, as the router service
keeps), through ``SimRouting``, ``SimConfig`` and the experiment config layer."""

from __future__ import annotations

import random

import numpy as np
import pytest
import yaml

import skv.sim.engine as sim_engine
from skv.experiments.config import ReplicaSpec, config_from_dict, load_config
from skv.experiments.runner import sim_config
from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType, content_hash
from skv.policies.registry import make_cache
from skv.routing import ROUTERS, make_router
from skv.sim import SimConfig, simulate
from skv.sim.replica import Replica
from skv.sim.routers import ApproximateView, ExactCacheView, SimRouting

T = SemanticType
LINEAR = make_latency_model("linear")
CACHE_AWARE = [n for n, c in ROUTERS.items() if c.cache_aware]
CACHE_BLIND = [n for n, c in ROUTERS.items() if not c.cache_aware]


def _rag(n: int = 120, seed: int = 0) -> list[Request]:
    """One of six documents, then a unique query: locality matters, with evictions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        segs = [
            Segment(T.RETRIEVED_CONTEXT, 480, content_hash(f"doc{rng.randrange(6)}")),
            Segment(T.USER_QUERY, 40, content_hash(f"q{i}")),
        ]
        out.append(Request(f"r{i}", i / 8.0, segs, output_tokens=rng.randint(4, 40)))
    return out


def _same(a, b) -> None:
    assert a.requests == b.requests
    assert a.summary == b.summary
    assert a.memory == b.memory
    assert a.policy_series == b.policy_series


class _TodaysRouting:
    """The simulator's routing before views existed: an exact view per replica, always."""

    def __init__(self, name, params, replicas, *_args) -> None:
        self.router = make_router(name, **params)
        self.views = [ExactCacheView(r) for r in replicas]

    def choose(self, rb) -> int:
        k = self.router.rank(rb, self.views).first
        self.views[k].routed += 1
        return k


# ----------------------------------------------------------------------------------------
# (a) the exact view is today's routing, and the default


@pytest.mark.parametrize("router", ["prefix_locality", "sglang_cache_aware", "round_robin"])
def test_the_exact_view_is_the_default_and_routes_as_before(router, monkeypatch):
    reqs = _rag()
    base = dict(capacity_blocks=60, block_size=16, replicas=3, router=router)
    default = simulate(reqs, SimConfig(**base), LINEAR, progress=False)
    assert default.config["router_view"] == "exact"
    assert default.config["router_cache_blocks"] is None
    # exact ignores the approximate cache's size
    explicit = SimConfig(**base, router_view="exact", router_cache_blocks=5)
    _same(default, simulate(reqs, explicit, LINEAR, progress=False))
    monkeypatch.setattr(sim_engine, "SimRouting", _TodaysRouting)
    _same(default, simulate(reqs, SimConfig(**base), LINEAR, progress=False))
    assert len({r["replica"] for r in default.requests}) == 3


@pytest.mark.parametrize("router", CACHE_BLIND)
def test_cache_blind_routers_route_the_same_under_either_view_and_insert_nothing(router):
    reqs = _rag(60)
    base = dict(capacity_blocks=60, block_size=16, replicas=3, router=router)
    exact = simulate(reqs, SimConfig(**base), LINEAR, progress=False)
    approx = simulate(reqs, SimConfig(**base, router_view="approximate"), LINEAR, progress=False)
    _same(exact, approx)
    routing = SimRouting(router, {}, _replicas(2, 60), "approximate")
    assert all(isinstance(v, ApproximateView) for v in routing.views)
    for rb in _blocks(reqs[:10]):
        routing.choose(rb)
    assert [len(v.cache) for v in routing.views] == [0, 0]  # no cost: never updated
    assert sum(v.routed for v in routing.views) == 10


# ----------------------------------------------------------------------------------------
# (b) a case computed by hand where the approximate view routes differently


def _docs(*docs: str) -> list[Request]:
    """One request per document, 100 s apart (each ends before the next arrives): a 20-block
    document (320 tokens) and a unique 1-block query (16 tokens), block size 16: 21 blocks."""
    return [
        Request(
            f"r{i}",
            100.0 * i,
            [
                Segment(T.RETRIEVED_CONTEXT, 320, content_hash(f"doc-{d}")),
                Segment(T.USER_QUERY, 16, content_hash(f"q{i}")),
            ],
            output_tokens=2,
        )
        for i, d in enumerate(docs)
    ]


def _route(router: str, capacity: int, view: str, router_blocks: int | None = None):
    """A, B, C, A on two replicas: (replica per request, cached tokens of the last A)."""
    cfg = SimConfig(
        capacity_blocks=capacity,
        block_size=16,
        replicas=2,
        router=router,
        include_output_blocks=False,  # the replica caches exactly the prompts
        router_view=view,
        router_cache_blocks=router_blocks,
    )
    res = simulate(_docs("A", "B", "C", "A"), cfg, LINEAR, progress=False)
    return [r["replica"] for r in res.requests], res.requests[-1]["cached_tokens"]


def test_a_router_cache_larger_than_the_replica_believes_an_evicted_prefix_is_cached():
    """Replicas of 21 blocks. A -> 0 and B -> 1 (no match anywhere: fewest routed, then
    index), C -> 0 (tie, both routed once): replica 0 must evict every block of A to hold C's
    21. The second A then matches nowhere in the exact view and goes to replica 1 (routed 1 <
    2); the router's own 100-block LRU still holds A on replica 0 (20 blocks), so the
    approximate view sends it there, where it hits nothing."""
    assert _route("prefix_locality", 21, "exact") == ([0, 1, 0, 1], 0)
    assert _route("prefix_locality", 21, "approximate", 100) == ([0, 1, 0, 0], 0)
    # the default size is the replica's: the router's LRU evicts what the replica's evicts
    assert _route("prefix_locality", 21, "approximate") == ([0, 1, 0, 1], 0)


def test_a_router_cache_smaller_than_the_replica_forgets_a_prefix_it_still_holds():
    """Replicas of 100 blocks hold A, B and C; the router's 21-block LRU of replica 0 dropped
    A for C. Exact: the second A goes to replica 0 and hits its 20 blocks (320 tokens);
    approximate: no match anywhere, so replica 1 (routed 1 < 2), a miss."""
    assert _route("prefix_locality", 100, "exact") == ([0, 1, 0, 0], 320)
    assert _route("prefix_locality", 100, "approximate", 21) == ([0, 1, 0, 1], 0)
    assert _route("prefix_locality", 100, "approximate") == ([0, 1, 0, 0], 320)


def test_the_approximate_view_learns_at_routing_time_from_the_prompt_only():
    reps = _replicas(2, 100)
    routing = SimRouting("prefix_locality", {}, reps, "approximate", 50)
    a, b = _blocks(_docs("A", "B"))
    assert [v.cache.capacity_blocks for v in routing.views] == [50, 50]
    assert routing.choose(a) == 0
    # before the replica has seen anything the router already believes it holds A
    assert [v.match(a) for v in routing.views] == [21.0, 0.0]
    assert [reps[0].cache.lookup(a), len(routing.views[0].cache)] == [0, 21]
    assert routing.choose(b) == 1 and routing.choose(a) == 0
    assert [v.routed for v in routing.views] == [2, 1]
    default = SimRouting("prefix_locality", {}, reps, "approximate")
    assert [v.cache.capacity_blocks for v in default.views] == [100, 100]


def test_the_approximate_view_evicts_the_least_recently_routed_prefix():
    """A router LRU of 42 blocks (two prompts) fed A, B, A, C: the second A refreshes A (its
    old query block goes), so C pushes out B, not A."""
    view = ApproximateView(_replicas(1, 100)[0], 42)
    a, b, a2, c, a3, b2 = _blocks(_docs("A", "B", "A", "C", "A", "B"))
    for rb in (a, b, a2, c):
        view.record(rb)
    assert len(view.cache) == 42
    assert [view.match(a3), view.match(b2), view.match(c)] == [20.0, 0.0, 21.0]


@pytest.mark.parametrize("mode", ["prefix", "segment"])
@pytest.mark.parametrize("n", [4, 63, 64, 70])
def test_the_shared_index_answers_what_each_replicas_own_cache_answers(mode, n):
    """``ApproximateCluster.match_all`` (one walk over the request for every replica) against
    each view's own ``lookup``, before every routing decision of a stream that evicts (router
    caches of 40 blocks, prompts of 21-31) and, in segment keying, restarts chains at every
    document; the index holds a replica's bit on exactly the keys its cache holds. Up to 63
    replicas take the C-integer walk, 64 and 70 (more bits than it holds) the Python-int one."""
    from skv.blocks import request_blocks
    from skv.sim.routers import ApproximateCluster

    rng = random.Random(3)
    reqs = [
        Request(
            f"r{i}",
            float(i),
            [Segment(T.SYSTEM, 64, content_hash(f"sys{rng.randrange(2)}"))]
            + [
                Segment(T.RETRIEVED_CONTEXT, 160, content_hash(f"doc{rng.randrange(5)}"))
                for _ in range(rng.randint(1, 2))
            ]
            + [Segment(T.USER_QUERY, 16, content_hash(f"q{rng.randrange(3)}"))],
        )
        for i in range(400)
    ]
    cluster = ApproximateCluster(_replicas(n, 100), 40)
    checked = dict.fromkeys(range(n), 0)
    whole = 0
    for i, r in enumerate(reqs):
        rb = request_blocks(r, 16, mode, index=i)
        want = [v.match(rb) for v in cluster]
        assert cluster.match_all(rb) == want, i
        checked.update({k: checked[k] + 1 for k, h in enumerate(want) if 0 < h < len(rb.keys)})
        whole += sum(h == len(rb.keys) for h in want)
        # with 70 replicas most records go to the first 4 (so their caches evict), the rest
        # to all: masks with high bits set are checked too
        cluster[rng.randrange(4) if rng.random() < 0.8 else rng.randrange(n)].record(rb)
        held: dict = {}
        for k, v in enumerate(cluster):
            for key in v.cache.blocks:
                held[key] = held.get(key, 0) | 1 << k
        assert cluster.index == held, i
    assert min(checked[k] for k in range(4)) > 20 and whole > 20  # partial and whole matches
    assert n < 63 or sum(checked[k] for k in range(n - 6, n)) > 20  # the highest bits too
    assert sum(v.cache.stats.evictions for v in cluster) > 100
    if mode == "segment":
        assert sum(p is None for p in rb.parents) > 1  # several lookup runs per request


# ----------------------------------------------------------------------------------------
# (c) precise reads the exact cache whatever the view


def test_precise_ignores_the_view():
    routing = SimRouting("precise", {}, _replicas(2, 21), "approximate", 100)
    assert routing.view == "exact"
    assert all(type(v) is ExactCacheView for v in routing.views)
    # the hand-computed case above: precise routes as the exact view there
    assert _route("precise", 21, "approximate", 100) == ([0, 1, 0, 1], 0)
    assert _route("precise", 100, "approximate", 21) == ([0, 1, 0, 0], 320)


# ----------------------------------------------------------------------------------------
# (d) bad names and sizes


def test_a_bad_view_name_is_a_clear_error():
    msg = "unknown router view 'approx'; allowed: exact, approximate"
    with pytest.raises(ValueError, match=msg):
        SimConfig(router_view="approx")
    with pytest.raises(ValueError, match=msg):
        SimRouting("round_robin", {}, _replicas(1, 8), "approx")
    with pytest.raises(ValueError, match="router_cache_blocks must be >= 1"):
        SimConfig(router_view="approximate", router_cache_blocks=0)
    with pytest.raises(ValueError, match="unknown router view 'approx'; known: exact, approx"):
        ReplicaSpec(count=2, router="prefix_locality", view="approx")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ReplicaSpec(count=2, router="prefix_locality", cache_blocks=0)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [({"replicas": 0}, "replicas must be >= 1, got 0"),
     ({"replicas": -2}, "replicas must be >= 1, got -2"),
     ({"replicas": 1.5}, "replicas must be a whole number"),
     ({"replicas": True}, "replicas must be a whole number"),
     ({"sample_every_s": -1.0}, "sample_every_s must be >= 0"),
     ({"sample_every_s": float("nan")}, "sample_every_s must be >= 0"),
     ({"sample_every_s": "1"}, "sample_every_s must be >= 0")],
)  # fmt: skip
def test_a_cluster_without_replicas_or_a_sampling_period_is_refused(kw, msg):
    """Zero replicas used to end in a ZeroDivisionError inside the router."""
    with pytest.raises(ValueError, match=msg):
        SimConfig(**kw)
    SimConfig(replicas=1, sample_every_s=0.0)  # the edges that are fine
    assert SimConfig(replicas=np.int64(3)).replicas == 3  # a numpy count is a count


# ----------------------------------------------------------------------------------------
# (e) the experiment config layer


def _experiment(replicas: dict) -> dict:
    return {
        "id": "view",
        "workload": {"name": "shared_system_prompt", "params": {"num_requests": 20}},
        "policies": ["lru"],
        "capacities": [64],
        "latency": {"name": "linear"},
        "seeds": [0],
        "replicas": replicas,
    }


def test_experiment_configs_map_the_view_to_the_simulator(tmp_path):
    path = tmp_path / "view.yaml"
    data = _experiment({})
    del data["replicas"]
    text = yaml.safe_dump(data, sort_keys=False)
    path.write_text(text + "replicas: {count: 2, router: prefix_locality, view: approximate}\n")
    cfg = load_config(path)
    sim = sim_config(cfg, cfg.policies[0], 64)
    assert (sim.replicas, sim.router) == (2, "prefix_locality")
    assert (sim.router_view, sim.router_cache_blocks) == ("approximate", None)
    sized = _experiment({"count": 2, "router": "prefix_locality", "view": "approximate",
                         "cache_blocks": 500})  # fmt: skip
    cfg = config_from_dict(sized)
    assert sim_config(cfg, cfg.policies[0], 64).router_cache_blocks == 500
    # configs without the keys keep today's simulator settings
    cfg = config_from_dict(_experiment({"count": 2, "router": "prefix_locality"}))
    sim = sim_config(cfg, cfg.policies[0], 64)
    assert (sim.router_view, sim.router_cache_blocks) == ("exact", None)
    with pytest.raises(ValueError, match="unknown router view 'nope'"):
        config_from_dict(_experiment({"count": 2, "view": "nope"}))


# ----------------------------------------------------------------------------------------
# helpers


def _replicas(n: int, capacity: int) -> list[Replica]:
    return [Replica(k, make_cache("lru", capacity), 8192, 256) for k in range(n)]


def _blocks(reqs: list[Request]):
    from skv.blocks import request_blocks

    return [request_blocks(r, 16, "prefix", index=i) for i, r in enumerate(reqs)]
