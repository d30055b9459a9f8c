"""``marconi`` (Marconi's FLOP-aware eviction) on hand-computed traces.

With ``block_size = 4`` and ``attn_crossover = 8`` a full block at position ``p`` costs
(saves, on a hit) ``e = 5 + 2 p`` context-free tokens: 5, 7, 9, ... (see
``tests/test_policy_pgdsf.py``). ``refresh_fraction = 0`` normalises over the candidates at every
eviction (exact), so ``S = (t - t_min) / (t_max - t_min) + alpha (e - e_min) / (e_max - e_min)``
can be worked out by hand."""

from __future__ import annotations

import pytest
from helpers import check_tree, rb
from test_policies import _leased_replay

from skv.policies.marconi import ALPHA_GRID, ARTIFACT_ALPHA_GRID, _prompt_copy
from skv.policies.registry import make_cache

X = 8.0
EXACT = {"tune": False, "refresh_fraction": 0.0, "attn_crossover": X}


def _cache(capacity: int, name: str = "marconi", **params):
    return make_cache(name, capacity, params or None, record_evictions=True)


def _evicted(cache) -> list[int]:
    return [key for _, key, _, _ in cache.eviction_log]


def _play(cache, steps: list[tuple[list[int], float]]) -> None:
    for i, (keys, t) in enumerate(steps):
        cache.access(rb(keys, block_size=4, arrival_s=t, index=i), t)


# --- alpha = 0 is lru -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"tune": False},
        {"tune": False, "refresh_fraction": 0.0},
        {"alpha_grid": [0.0]},  # tuned, to the only alpha there is
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alpha_zero_evicts_exactly_lrus_victims_under_overlapping_leases(params, seed):
    """Shared prefix chains, up to 4 requests in flight released in random order (ties in
    release time across requests, parents that become leaves later): the same victims as lru."""
    logs = []
    for name, p in (("lru", None), ("marconi", params)):
        cache = make_cache(name, 12, p, record_evictions=True)
        for _ in _leased_replay(cache, seed):
            pass
        check_tree(cache)
        logs.append(_evicted(cache))
    assert logs[0] == logs[1] and len(logs[0]) > 100


# --- the utility, by hand ---------------------------------------------------------------------

# capacity 6: t=0 [1, 2, 3] (leaf 3: e = 9), t=30 [4, 5] (leaf 5: e = 7), t=100 [10] (e = 5)
# t=120 [20]: candidates 3 (t 0, e 9), 5 (t 30, e 7), 10 (t 100, e 5); ranges 100 s and 4
#   alpha = 1: S(3) = 0 + 1 = 1.0, S(5) = 0.3 + 0.5 = 0.8, S(10) = 1 + 0 = 1.0  -> 5
TREE = [([1, 2, 3], 0.0), ([4, 5], 30.0), ([10], 100.0), ([20], 120.0)]


def test_utility_is_normalised_recency_plus_alpha_normalised_efficiency():
    """The middle block goes: lru would take 3 (oldest), pure efficiency 10 (shallowest); without
    the normalisation (t + alpha e) the 100 s of recency would swamp the 4 units of cost."""
    cache = _cache(6, alpha=1.0, **EXACT)
    _play(cache, TREE)
    assert _evicted(cache) == [5]
    pol, blocks = cache.policy, cache.blocks
    # the normalisation measured at that eviction: t in [0, 100], e in [5, 9]
    assert (pol._t0, pol._rt, pol._e0, pol._re) == (0.0, 100.0, 5.0, 4.0)
    assert [pol.utility(blocks[k]) for k in (3, 10)] == [1.0, 1.0]
    assert pol.utility(blocks[4]) == pytest.approx(0.3)  # a leaf now: released at 30, e = 5
    assert blocks[3].pk2 == 9.0 and blocks[4].pk2 == 5.0  # e = 5 + 2 pos


@pytest.mark.parametrize(("alpha", "victim"), [(0.0, 3), (0.5, 3), (1.0, 5), (3.0, 10)])
def test_alpha_moves_the_victim_from_the_oldest_to_the_shallowest(alpha, victim):
    """alpha = 0.5: S = 0.5, 0.55, 1.0 -> 3;  alpha = 3: S = 3.0, 1.8, 1.0 -> 10."""
    cache = _cache(6, alpha=alpha, **EXACT)
    _play(cache, TREE)
    assert _evicted(cache) == [victim]


def test_a_parent_that_becomes_a_leaf_keeps_its_release_time():
    """After 5 goes, 4 (released at t=30, e = 5) is a leaf. t=150 [30]: candidates 3 (0, 9),
    4 (30, 5), 10 (100, 5), 20 (120, 5); ranges 120 s and 4; alpha = 1:
    S = 1.0, 0.25, 0.833, 1.0 -> 4 (stamped at its last child's eviction, t=120, it would
    score 1.0 and 10 would go)."""
    cache = _cache(6, alpha=1.0, **EXACT)
    _play(cache, [*TREE, ([30], 150.0)])
    assert _evicted(cache) == [5, 4]


@pytest.mark.parametrize(("alpha", "victim"), [(0.9, 2), (1.0, 2), (1.1, 3)])
def test_large_alpha_keeps_the_deep_block(alpha, victim):
    """Capacity 3: t=0 [1, 2], t=1 [3], t=2 [4]: leaves 2 (t 0, e 7) and 3 (t 1, e 5):
    S(2) = alpha, S(3) = 1; a tie (alpha = 1) goes to the earlier release, 2."""
    cache = _cache(3, alpha=alpha, **EXACT)
    _play(cache, [([1, 2], 0.0), ([3], 1.0), ([4], 2.0)])
    assert _evicted(cache) == [victim]


def test_only_unpinned_leaves_are_victims():
    """2 (pinned by an in-flight request) has the lowest utility; 1 has a child."""
    cache = _cache(3, alpha=0.0, **EXACT)
    _play(cache, [([1, 5], 0.0), ([2], 1.0)])
    lease = cache.acquire(rb([2], block_size=4, index=2), 2.0)
    cache.access(rb([3], block_size=4, index=3), 3.0)
    assert _evicted(cache) == [5]  # 5 (t 0) is the least recent unpinned leaf
    cache.access(rb([4], block_size=4, index=4), 4.0)
    assert _evicted(cache) == [5, 1]  # 1 became a leaf (t 0); 2 still pinned
    cache.release(lease, 5.0)


def test_the_ranges_are_measured_over_the_candidates_only():
    """t=0 [1] (e 5), t=10 [2, 3], 1 pinned from t=20: at t=30 the only candidate is 3
    (t 10, e 7): the offsets are its own, not the pinned block's (whose old entry is void)."""
    cache = _cache(3, alpha=1.0, **EXACT)
    _play(cache, [([1], 0.0), ([2, 3], 10.0)])
    lease = cache.acquire(rb([1], block_size=4, index=2), 20.0)
    cache.access(rb([4], block_size=4, index=3), 30.0)
    assert _evicted(cache) == [3]
    assert (cache.policy._t0, cache.policy._e0) == (10.0, 7.0)
    cache.release(lease, 40.0)


def test_a_victim_is_checked_evictable_never_assumed():
    """Hooks driven by hand: a block pinned or given a child behind the policy's back (no
    ``on_pin``) is skipped; a block released with children gets no entry."""
    from skv.cache.block import Block
    from skv.policies.marconi import Marconi

    pol = Marconi(tune=False)
    r = rb([1, 2, 3], block_size=4)
    a, b, c = (Block(k, None, 4, 0, i, r, 0.0) for i, k in enumerate((1, 2, 3)))
    for blk in (a, b, c):
        pol.on_insert(blk, 0.0)
    c.n_children = 1  # released with a child: no entry
    pol.on_unpin(c, 1.0)
    assert pol._heap == []
    pol.on_unpin(a, 2.0)
    pol.on_unpin(b, 3.0)
    a.ref = 1  # pinned, unannounced
    b.n_children = 1  # a parent now, unannounced
    assert pol.victim() is None
    a.ref = 0
    pol.on_leaf(a, 4.0)
    assert pol.victim() is a


def test_refreshes_come_every_refresh_fraction_of_the_cached_blocks():
    """Capacity 8, refresh_fraction 0.5: the first eviction refreshes, then every 4th
    (``evictions since >= 0.5 * 8``): evictions 1, 5, 9."""
    cache = _cache(8, alpha=1.0, tune=False, refresh_fraction=0.5, attn_crossover=X)
    _play(cache, [([k], float(k)) for k in range(8 + 9)])
    assert len(_evicted(cache)) == 9
    assert cache.policy.metrics()["refreshes"] == 3.0


def test_between_refreshes_the_keys_keep_the_last_weight():
    """refresh_fraction = 1 (capacity 6): the refresh at the first eviction (t=120, ranges
    100 s and 4: w = alpha * 100 / 4 = 25 s per unit of cost) holds for the next ones.
    t=150 [30]: k = t + 25 e: 3 -> 225, 4 -> 155, 10 -> 225, 20 -> 245 -> 4 (as exact).
    t=400 [40]: candidates 3 (0, 9), 10 (100, 5), 20 (120, 5), 30 (150, 5); exact ranges 150 s
    and 4 (w = 37.5): 3 -> 337.5, 10 -> 287.5, 20 -> 307.5, 30 -> 337.5 -> 10; with w = 25:
    3 -> 225, 10 -> 225, 20 -> 245, 30 -> 275 -> 3 (a tie, released first)."""
    steps = [*TREE, ([30], 150.0), ([40], 400.0)]
    stale = _cache(6, alpha=1.0, tune=False, refresh_fraction=1.0, attn_crossover=X)
    _play(stale, steps)
    exact = _cache(6, alpha=1.0, **EXACT)
    _play(exact, steps)
    assert _evicted(stale) == [5, 4, 3]
    assert _evicted(exact) == [5, 4, 10]
    assert stale.policy._w == 25.0


# --- tuning -----------------------------------------------------------------------------------


# Capacity 3: a chain [1, 2] (costs 5 + 7) every third request, one-off blocks in between.
# The first eviction is at the third request, so the bootstrap window is 5 * 3 = 15 requests.
# alpha = 0 (lru): each period the chain's tail is evicted, only 1 hits: saves 5 in each of
#   the 4 repeats -> 20;  alpha >= 1.5: the one-offs go, both hit: 4 * (5 + 7) -> 48;
#   alpha = 0.5 and 1.0 evict 2 at the first eviction (S(2) = alpha <= S(x) = 1) -> 20.
def _chain_and_one_offs(n: int) -> list[tuple[list[int], float]]:
    steps = []
    for i in range(n):
        steps.append(([1, 2] if i % 3 == 0 else [100 + i], float(i)))
    return steps


@pytest.mark.parametrize(("alpha", "saved"), [(0.0, 20.0), (0.5, 20.0), (1.0, 20.0), (1.5, 48.0)])
def test_the_window_saves_by_hand(alpha, saved):
    cache = _cache(3, alpha=alpha, **EXACT)
    _play(cache, _chain_and_one_offs(15))
    assert cache.policy.saved == saved


@pytest.mark.parametrize(
    ("refresh_fraction", "arrival_s"),
    [(0.0, None), (1.0, None), (0.0, 0.0)],
    ids=["exact", "a-refresh-per-capacity-of-evictions", "times-from-the-cache-not-the-request"],
)
def test_tuning_after_five_times_the_requests_before_the_first_eviction_picks_the_best_alpha(
    refresh_fraction, arrival_s
):
    """Grid 0, 0.5, 1, 1.5, 2: 1.5 and 2 both save 48; the smaller wins. The tuned alpha is
    used at once (the eviction of request 14 re-keys, whatever the refresh cadence); the replay
    times are the ``now`` the cache passed (a request's ``arrival_s`` may differ)."""
    cache = _cache(3, refresh_fraction=refresh_fraction, attn_crossover=X)
    steps = _chain_and_one_offs(16)
    for i, (keys, t) in enumerate(steps):
        arrival = t if arrival_s is None else arrival_s
        cache.access(rb(keys, block_size=4, arrival_s=arrival, index=i), t)
        m = cache.policy.metrics()
        if i < 14:
            assert (m["alpha"], m["tuned"]) == (0.0, 0.0), i
    assert (m["alpha"], m["tuned"]) == (1.5, 1.0)
    assert cache.policy.params()["alpha"] == 0.0  # the configured start, not the tuned value
    assert cache.policy._window is None
    # live: lru until request 14 (saves 5 at requests 3, 6, 9 and 12); at 14, alpha = 1.5 keeps
    # the chain (S(2) = 1.5 > S(13) = 1), so request 15 hits both blocks: 20 + 12
    assert cache.policy.saved == 32.0


def test_a_tuning_back_to_zero_zeroes_the_weight_of_the_keys():
    """Started at alpha = 3 (the chain is kept), tuned to the only grid value, 0: from the next
    eviction on the keys are release times again (w = 0), as lru's."""
    cache = _cache(3, alpha=3.0, alpha_grid=[0.0], refresh_fraction=0.0, attn_crossover=X)
    _play(cache, _chain_and_one_offs(14))
    assert cache.policy._w > 0.0
    _play(cache, [([200], 14.0)])
    assert (cache.policy.alpha, cache.policy._w) == (0.0, 0.0)


def test_tuning_with_only_zero_and_two():
    cache = _cache(3, alpha_grid=[2.0, 0.0], refresh_fraction=0.0, attn_crossover=X)
    _play(cache, _chain_and_one_offs(15))
    assert cache.policy.metrics()["alpha"] == 2.0


def test_tuning_is_skipped_when_every_block_costs_the_same():
    """A flat trace: alpha cannot change a victim, so the given alpha stays (a replay would pick
    the grid's first, 0.0, on a tie)."""
    cache = _cache(2, alpha=0.7, attn_crossover=X)
    _play(cache, [([k % 5], float(k)) for k in range(40)])
    m = cache.policy.metrics()
    assert (m["alpha"], m["tuned"]) == (0.7, 1.0)


def test_a_window_longer_than_tune_max_blocks_is_dropped():
    cache = _cache(3, tune_max_blocks=10, refresh_fraction=0.0, attn_crossover=X)
    _play(cache, _chain_and_one_offs(16))
    m = cache.policy.metrics()
    assert (m["alpha"], m["tuned"]) == (0.0, 0.0)
    assert cache.policy._window is None


def test_the_window_replays_each_requests_blocks_as_they_were_on_arrival():
    r = rb([1, 2, 3], tokens=[4, 4, 2], block_size=4, arrival_s=7.0)
    copy = _prompt_copy(r, 3, 9.0)
    assert (copy.keys, copy.parents, copy.tokens) == ([1, 2], [None, 1], [4, 4])
    assert (copy.prompt_tokens, copy.arrival_s) == (8, 9.0)
    full = rb([1, 2], block_size=4)  # 2 blocks on arrival, then grown by decoding
    for field, value in (("keys", 3), ("parents", 2), ("tokens", 4), ("stypes", 0)):
        getattr(full, field).append(value)
    assert _prompt_copy(full, 2, 9.0).keys == [1, 2]
    assert _prompt_copy(full, 3, 9.0).keys == [1, 2, 3]
    seg = rb([1, 2, 3], parents=[None, 1, None], tokens=[4, 2, 4], block_size=4)
    assert _prompt_copy(seg, 3, 0.0).keys == [1, 2, 3]  # segment keying: every block


# --- parameters -------------------------------------------------------------------------------


def test_params_defaults_and_grids():
    assert make_cache("marconi", 4).policy.params() == {
        "alpha": 0.0,
        "tune": True,
        "alpha_grid": [0.0, 0.5, 1.0, 1.5, 2.0],
        "bootstrap_multiplier": 5,
        "refresh_fraction": 0.125,
        "tune_max_blocks": 1_000_000,
        "attn_crossover": pytest.approx(30632.019, abs=1e-3),
    }
    assert ALPHA_GRID == (0.0, 0.5, 1.0, 1.5, 2.0)
    assert len(ARTIFACT_ALPHA_GRID) == 21 and ARTIFACT_ALPHA_GRID[1] == 0.1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"alpha": -0.1}, "marconi: alpha must be >= 0"),
        ({"alpha_grid": []}, "marconi: alpha_grid must not be empty"),
        ({"alpha_grid": [0.0, -1.0]}, "marconi: alpha_grid values must be >= 0"),
        ({"bootstrap_multiplier": 0}, "marconi: bootstrap_multiplier must be an integer >= 1"),
        ({"bootstrap_multiplier": 2.5}, "marconi: bootstrap_multiplier must be an integer"),
        ({"tune_max_blocks": 0}, "marconi: tune_max_blocks must be an integer >= 1"),
        ({"refresh_fraction": -1}, "marconi: refresh_fraction must be >= 0"),
        ({"attn_crossover": 0}, "marconi: attn_crossover must be > 0"),
    ],
)
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        make_cache("marconi", 4, params)
