"""``pgdsf`` (RAGCache's prefix-aware GDSF) and its cost model (``skv.policies.flop_cost``) on
hand-computed traces.

With ``block_size = 4`` and ``attn_crossover = 8`` a full block at position ``p`` costs
``4 * (1 + (4 p + 2) / 8) = 5 + 2 p`` context-free tokens: 5, 7, 9, ... (the ``+ 2`` is the
block's own causal half, ``t / 2``)."""

from __future__ import annotations

import pytest
from helpers import rb

from skv.blocks import DEFAULT_BLOCK_SIZE
from skv.cache.block import Block
from skv.policies.flop_cost import (
    DEFAULT_ATTN_CROSSOVER,
    attn_crossover,
    block_cost,
    recompute_cost,
)
from skv.policies.registry import make_cache
from skv.sizing import get_model

X = 8.0  # attn_crossover of the hand-computed traces


def _cache(name: str, capacity: int, **params):
    return make_cache(name, capacity, params or None, record_evictions=True)


def _evicted(cache) -> list[int]:
    return [key for _, key, _, _ in cache.eviction_log]


# --- the cost model ---------------------------------------------------------------------------


def test_default_crossover_is_the_llama_3_1_8b_preset_by_the_roofline_formula():
    # 2 P = 4 L h c  ->  c = P / (2 L h) = 8.03e9 / (2 * 32 * 4096)
    assert abs(DEFAULT_ATTN_CROSSOVER - 30632.019) < 1e-3
    assert attn_crossover(get_model("qwen2.5-7b")) == pytest.approx(7.62e9 / (2 * 28 * 3584))


def test_recompute_cost_counts_the_context_and_the_blocks_own_causal_half():
    assert recompute_cost(4, 0, X) == 5.0  # 4 * (1 + 2/8)
    assert recompute_cost(4, 8, X) == 9.0  # 4 * (1 + 10/8)
    assert recompute_cost(2, 4, X) == 2 * (1 + 5 / 8)  # a partial block: 2.0 tokens, 2 + 4 context
    # at the default crossover, a 16-token block after 16k tokens costs 1.53x a first block
    ratio = recompute_cost(16, 16384, DEFAULT_ATTN_CROSSOVER) / recompute_cost(
        16, 0, DEFAULT_ATTN_CROSSOVER
    )
    assert ratio == pytest.approx(1.5347, abs=1e-4)


def test_block_cost_puts_pos_times_the_requests_block_size_before_the_block():
    r = rb([1, 2, 3], block_size=4)
    b = Block(3, None, 4, 0, 2, r, 0.0)  # pos 2: 8 tokens before it
    assert block_cost(b, X) == 9.0
    bare = Block(3, None, 4, 0, 2, None, 0.0)  # no request: DEFAULT_BLOCK_SIZE tokens per block
    assert block_cost(bare, X) == recompute_cost(4, 2 * DEFAULT_BLOCK_SIZE, X)


# --- pgdsf ------------------------------------------------------------------------------------


def test_keeps_a_deep_block_over_a_shallow_one_at_equal_frequency():
    """[1, 2] at t=0, [3] at t=1, [4] at t=2 (capacity 3): the leaves are 2 (pos 1, H = 7) and 3
    (pos 0, H = 5): pgdsf evicts 3 although it is newer; gdsf (cost = tokens: 4 and 4, a tie in
    release order) and lru evict 2. L rises to the victim's H."""
    got = {}
    for name in ("pgdsf", "gdsf", "lru"):
        cache = _cache(name, 3, **({"attn_crossover": X} if name == "pgdsf" else {}))
        cache.access(rb([1, 2], block_size=4, arrival_s=0.0), 0.0)
        cache.access(rb([3], block_size=4, arrival_s=1.0, index=1), 1.0)
        cache.access(rb([4], block_size=4, arrival_s=2.0, index=2), 2.0)
        got[name] = _evicted(cache)
        if name == "pgdsf":
            assert cache.policy.metrics() == {"L": 5.0}
    assert got == {"pgdsf": [3], "gdsf": [2], "lru": [2]}


def test_evicts_in_clock_plus_frequency_times_cost_order_by_hand():
    """Capacity 3. H = L + (hits + 1) * cost, fixed at release; L = max(L, H_victim).

    t0 [10, 11]: H(11) = 7 (10 has a child)      t1 [20]: H = 5
    t2 [10, 11] again: H(11) = 2 * 7 = 14, H(10) = 2 * 5 = 10
    t3 [30]: leaves 11 (14), 20 (5)    -> 20, L = 5;  H(30) = 5 + 5 = 10
    t4 [40]: leaves 11 (14), 30 (10)   -> 30, L = 10; H(40) = 15
    t5 [50]: leaves 11 (14), 40 (15)   -> 11, L = 14; 10 is a leaf now, still H = 10; H(50) = 19
    t6 [60]: leaves 10 (10), 40, 50    -> 10, L stays 14 (a max, not the victim's H); H(60) = 19
    t7 [70]: leaves 40 (15), 50, 60    -> 40, L = 15
    """
    cache = _cache("pgdsf", 3, attn_crossover=X)
    steps = [[10, 11], [20], [10, 11], [30], [40], [50], [60], [70]]
    ls = []
    for t, keys in enumerate(steps):
        cache.access(rb(keys, block_size=4, arrival_s=float(t), index=t), float(t))
        ls.append(cache.policy.metrics()["L"])
    assert _evicted(cache) == [20, 30, 11, 10, 40]
    assert ls == [0.0, 0.0, 0.0, 5.0, 10.0, 14.0, 14.0, 15.0]
    assert set(cache.blocks) == {50, 60, 70}


def test_a_pinned_block_is_never_the_victim_even_with_the_lowest_priority():
    cache = _cache("pgdsf", 3, attn_crossover=X)
    cache.access(rb([1], block_size=4), 0.0)  # H = 5
    cache.access(rb([2, 3], block_size=4, index=1), 1.0)  # H(3) = 7; 2 has a child
    lease = cache.acquire(rb([1], block_size=4, index=2), 2.0)  # 1 is pinned (a hit)
    cache.access(rb([4], block_size=4, index=3), 3.0)  # full: one must go
    assert _evicted(cache) == [3]  # not 1 (pinned, H = 5), not 2 (it had a child)
    cache.release(lease, 3.0)
    # L = 7 now. Leaves: 1 (released at t3: 7 + 2 * 5 = 17), 2 (still 5, from t1), 4 (7 + 5)
    cache.access(rb([5], block_size=4, index=4), 4.0)
    assert _evicted(cache) == [3, 2]
    assert cache.policy.metrics() == {"L": 7.0}  # max(7, 5)


def test_params_and_a_bad_crossover():
    assert make_cache("pgdsf", 4).policy.params() == {
        "cost": "prefix_flops",
        "size": "1 block",
        "attn_crossover": DEFAULT_ATTN_CROSSOVER,
    }
    given = make_cache("pgdsf", 4, {"attn_crossover": 100}).policy.params()
    assert given["attn_crossover"] == 100.0 and type(given["attn_crossover"]) is float
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="pgdsf: attn_crossover must be > 0 tokens"):
            make_cache("pgdsf", 4, {"attn_crossover": bad})
