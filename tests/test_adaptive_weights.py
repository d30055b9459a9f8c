"""adaptive_semantic's weight updates, exactly, on a scripted sequence of cache events.

The rule (skv/policies/adaptive_semantic.py), every ``update_every`` = K evictions, for each
semantic type t with evictions or ghost hits in the window:

    ghost_rate = min(1, ghost_hits_t / evictions_t)     (1 when evictions_t = 0)
    reuse_rate = evicted_t blocks that were hit while cached / evictions_t
    w_t <- (1 - eta) w_t + eta (1 + 5 ghost_rate + 2 reuse_rate)

The script: a 2-block cache (ghost list of 64), single-block requests 100 s apart, each acquired
and released at once, K = 4, eta = 0.2, half-life 10 s. Every block is full and has at most one
hit, so a block's eviction key is its release time + 10 log2(w_type) (+ 10 for a hit), and the
weights stay within [2, 4]: a 100 s gap outweighs any of these offsets (< 30 s), so the victim
is always the least recently released block (LRU), whatever the weights learn. D is
``retrieved_context`` (initial weight 2), Q is ``user_query`` (initial weight 3).
"""

from __future__ import annotations

import pytest

from skv.blocks import RequestBlocks
from skv.model import TYPE_INDEX, TYPES, SemanticType
from skv.policies.registry import make_cache

D, Q = SemanticType.RETRIEVED_CONTEXT, SemanticType.USER_QUERY
KEYS = {"D1": 1, "D2": 2, "Q1": 11, "Q2": 12, "Q3": 13, "Q4": 14, "Q5": 15}
ETA = 0.2


def one(name: str, t: float) -> RequestBlocks:
    stype = D if name.startswith("D") else Q
    return RequestBlocks(
        0, t, [KEYS[name]], [None], [16], [TYPE_INDEX[stype]], [16], None, 0, False, 16
    )


def new_cache():
    return make_cache(
        "adaptive_semantic",
        2,
        {
            "eta": ETA,
            "update_every": 4,
            "half_life_s": 10.0,
            "initial_weights": {D.value: 2.0, Q.value: 3.0},
        },
        ghost_capacity=64,
        record_evictions=True,
    )


def play(cache, names: list[str], t0: float) -> None:
    for i, name in enumerate(names):
        t = t0 + 100.0 * i
        cache.access(one(name, t), t)


def evicted(cache) -> list[str]:
    by_key = {v: k for k, v in KEYS.items()}
    return [by_key[key] for _, key, _, _ in cache.eviction_log]


def weights(cache) -> dict[str, float]:
    m = cache.policy.metrics()
    return {"D": m[f"w_{D.value}"], "Q": m[f"w_{Q.value}"]}


# window 1 (t = 100 .. 700) and window 2 (t = 800 .. 1200), see the docstrings
WINDOW_1 = ["D1", "D2", "D1", "Q1", "D2", "Q2", "Q3"]
WINDOW_2 = ["D1", "D2", "Q4", "D2", "Q5"]
W1 = {"D": 0.8 * 2.0 + 0.2 * (1 + 5 / 3 + 2 / 3), "Q": 0.8 * 3.0 + 0.2 * 1.0}


def test_an_uncapped_window_moves_each_weight_a_fifth_of_the_way_to_its_target():
    """cache after each access (LRU order), evictions counted in the window:

    t=100 D1 inserted                      [D1]
    t=200 D2 inserted                      [D1 D2]
    t=300 D1 hit (D1 hits = 1)             [D2 D1]
    t=400 Q1: evict D2 (D evictions 1)     [D1 Q1]          ghost {D2}
    t=500 D2: ghost hit on D (D ghosts 1); evict D1, which was hit (D evictions 2, reused 1)
                                           [Q1 D2]          ghost {D1}
    t=600 Q2: evict Q1 (Q evictions 1)     [D2 Q2]          ghost {D1 Q1}
    t=700 Q3: evict D2 (D evictions 3): the 4th eviction, the update fires:
      D: ghost 1/3, reuse 1/3: target 1 + 5/3 + 2/3 = 10/3; w = 0.8 * 2 + 0.2 * 10/3 = 2.2667
      Q: ghost 0/1, reuse 0/1: target 1;                  w = 0.8 * 3 + 0.2 * 1    = 2.6
    Every other type saw nothing and keeps its initial weight.
    """
    cache = new_cache()
    before = cache.policy.metrics()
    play(cache, WINDOW_1, 100.0)
    assert evicted(cache) == ["D2", "D1", "Q1", "D2"]
    assert cache.stats.ghost_hits == 1
    m = cache.policy.metrics()
    assert m["weight_updates"] == 1.0
    assert weights(cache) == {"D": pytest.approx(W1["D"], rel=1e-12), "Q": pytest.approx(2.6)}
    assert W1["D"] == pytest.approx(2.266666666666667, rel=1e-12)
    others = [f"w_{t.value}" for t in TYPES if t not in (D, Q)]
    assert {k: m[k] for k in others} == {k: before[k] for k in others}


def test_a_ghost_rate_above_one_is_capped_at_one():
    """After window 1 (cache [Q2 Q3], ghost {D1 Q1 D2}), window 2:

    t=800  D1: ghost hit on D (1); evict Q2 (Q evictions 1)      [Q3 D1]
    t=900  D2: ghost hit on D (2); evict Q3 (Q evictions 2)      [D1 D2]
    t=1000 Q4: evict D1, not hit since re-inserted (D evictions 1)  [D2 Q4]
    t=1100 D2 hit: released at 1100 with 1 hit                   [Q4 D2]
    t=1200 Q5: evict Q4 (Q evictions 3): the 4th eviction, the update fires:
      D: 2 ghost hits for 1 eviction: ghost rate min(1, 2/1) = 1, reuse 0/1:
         target 1 + 5 = 6 (uncapped it would be 1 + 10 = 11);
         w = 0.8 * 2.2667 + 0.2 * 6 = 3.0133 (uncapped: 4.0133)
      Q: ghost 0/3, reuse 0/3: target 1; w = 0.8 * 2.6 + 0.2 = 2.28
    """
    cache = new_cache()
    play(cache, WINDOW_1, 100.0)
    play(cache, WINDOW_2, 800.0)
    assert evicted(cache)[4:] == ["Q2", "Q3", "D1", "Q4"]
    assert cache.stats.ghost_hits == 3
    assert cache.policy.metrics()["weight_updates"] == 2.0
    want_d = 0.8 * W1["D"] + 0.2 * 6.0
    assert want_d == pytest.approx(3.013333333333333, rel=1e-12)
    assert weights(cache) == {
        "D": pytest.approx(want_d, rel=1e-12),
        "Q": pytest.approx(0.8 * 2.6 + 0.2 * 1.0, rel=1e-12),
    }


def test_no_update_before_the_kth_eviction():
    """After t=600 only 3 evictions happened: weights are the initial 2 and 3."""
    cache = new_cache()
    play(cache, WINDOW_1[:-1], 100.0)
    assert len(cache.eviction_log) == 3
    assert cache.policy.metrics()["weight_updates"] == 0.0
    assert weights(cache) == {"D": 2.0, "Q": 3.0}
