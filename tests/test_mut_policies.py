"""Cases of the eviction policies (``skv/policies``) that mutation testing showed unpinned
(issue 11). Expected victims, keys and weights are worked by hand in each docstring; every test
runs the same on the compiled build and as plain Python (the mutation run's mode)."""

from __future__ import annotations

import math
import random

import cython
import pytest
from helpers import rb
from scipy import special

from skv.blocks import RequestBlocks
from skv.cache.block import Block, GhostEntry
from skv.cache.policy_pool import PolicyBlockPool
from skv.cache.radix import BlockCache
from skv.cache.vllm_pool import VllmBlockPool
from skv.model import TYPE_INDEX, SemanticType
from skv.policies import saecache as sae
from skv.policies.adaptive_semantic import AdaptiveSemantic
from skv.policies.base import HeapEntry, KeyHeap, PriorityPolicy, key_pair
from skv.policies.lru import LRU
from skv.policies.registry import POLICIES, check_all, make_cache, make_policy, make_vllm_pool
from skv.policies.saecache import LogWindow, SAECache, SAECacheFixed
from skv.policies.slru import SLRU
from skv.policies.static_semantic import StaticSemantic

ST = SemanticType

# ---------------------------------------------------------------- saecache: the exact re-sum


class _CompiledShadow:
    """Cython's pure-Python shadow module with ``compiled`` set: ``_fsum`` takes its compiled
    branch (CPython's fsum algorithm on C doubles) even when saecache runs as plain Python."""

    compiled = True

    def __getattr__(self, name: str):
        return getattr(cython, name)


@pytest.fixture
def compiled_fsum(monkeypatch):
    """The windows' exact re-sum through the algorithm the compiled build runs: compiled, it is
    what runs anyway; as plain Python, ``_fsum`` is made to take its compiled branch, so that
    branch is tested in both modes (a mutation run cannot mutate the compiled build)."""
    if sae.__file__.endswith(".py"):
        monkeypatch.setattr(sae, "cython", _CompiledShadow())


def _window_sums(values: list[float]) -> tuple[float, float]:
    """(s1, s2) of a window of ``len(values)`` just after its re-sum (it is full then)."""
    win = LogWindow(len(values))
    for x in values:
        win.push(x)
    return win.s1, win.s2


FSUM_CASES = [
    # (values, why)
    ([1.0], "one partial"),
    ([1.0, 2.0, 3.0, 4.0], "exact small integers: one partial"),
    ([1e16, 1.0, -1e16], "cancellation: the 1 survives in a second partial"),
    ([1.0, 1e16, -1e16], "the smaller first: the swap"),
    ([1e16, 1.0, 1e-16], "half-even correction upward: 1e16 + 2, not 1e16"),
    ([-1e16, -1.0, -1e-16], "the same downward"),
    ([1e16, 1.0, -1e-16], "no correction: the remainder's sign differs"),
    ([0.1] * 10, "ten inexact tenths: exactly 1.0"),
    ([1e100, 1.0, -1e100, 1e-100], "partials across 200 decades"),
    ([3.0, -3.0, 0.0], "a sum of exactly zero"),
    ([2.0**-1074, 2.0**-1074, 1.0], "subnormals"),
    ([2.0**53, 1.0, 1.0], "two half-ulps that add to one ulp"),
    ([2.0**53, 1.0, -(2.0**-60)], "a half-ulp tie broken by a tiny remainder below it"),
    ([1.0, 2.0**-53, 2.0**-106], "a tie with a third partial above the half"),
    ([2.0**52, 0.5, -(2.0**-61)], "the same below 1: a tie lost to the remainder's sign"),
    ([1e16, 1.0], "two partials, an exact half-way tie: rounds to even, 1e16"),
    ([1e16, 3.0], "two partials, not a tie: 1e16 + 4"),
]


@pytest.mark.parametrize(("values", "why"), FSUM_CASES, ids=[w for _, w in FSUM_CASES])
def test_the_compiled_resum_is_math_fsum_bit_for_bit(compiled_fsum, values, why):
    """Each case drives one step of the algorithm (Shewchuk's partials, the swap by magnitude,
    the top-down sum that stops when it turns inexact, the half-even correction); the window's
    sums must be ``math.fsum`` of its samples and of their squares, bit for bit."""
    s1, s2 = _window_sums(values)
    assert (s1, s2) == (math.fsum(values), math.fsum([v * v for v in values])), why
    assert math.copysign(1.0, s1) == math.copysign(1.0, math.fsum(values))


def test_the_compiled_resum_falls_back_to_math_fsum_on_non_finite_values(compiled_fsum):
    """A non-finite sample, or a square that overflows to inf, makes the algorithm hand over to
    ``math.fsum``: [1e200, 1] sums to 1e200 and its squares to inf; an infinite sample sums to
    inf; NaN to NaN; samples whose sum overflows raise ``math.fsum``'s OverflowError."""
    assert _window_sums([1e200, 1.0]) == (1e200, math.inf)
    s1, s2 = _window_sums([math.inf, 1.0])
    assert (s1, s2) == (math.inf, math.inf)
    s1, s2 = _window_sums([math.nan, 1.0])
    assert math.isnan(s1) and math.isnan(s2)
    with pytest.raises(OverflowError):
        _window_sums([1e308, 1e308])
    with pytest.raises(OverflowError):  # the samples sum, their squares (1e308 each) overflow
        _window_sums([1e154, 1e154])


def test_the_compiled_resum_is_math_fsum_on_random_windows(compiled_fsum):
    """Windows of 1 to 9 samples drawn from mixed magnitudes, cancelling pairs and values a
    half-ulp apart (so every branch of the algorithm runs many times): sums and sums of
    squares equal ``math.fsum``'s bit for bit."""
    rng = random.Random(5)
    pool = [1.0, 3.0, 0.1, 1e16, -1e16, 1e-16, 2.0**53, 2.0**-53, -(2.0**-53), 1e100, -1e100]
    for _ in range(3000):
        values = []
        for _ in range(rng.randint(1, 9)):
            kind = rng.random()
            if kind < 0.4:
                values.append(rng.choice(pool) * rng.choice((1, -1, 0.5, 3)))
            elif kind < 0.7:
                values.append(rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30))
            else:
                values.append(math.ldexp(rng.randint(-(2**53), 2**53), rng.randint(-80, 40)))
        s1, s2 = _window_sums(values)
        assert s1 == math.fsum(values), values
        assert s2 == math.fsum([v * v for v in values]), values


# ---------------------------------------------------------------- params(): defaults and given

PRIOR = {  # static_semantic's documented prior (module docstring)
    "system": 8.0,
    "tool_schema": 8.0,
    "template": 8.0,
    "retrieved_context": 4.0,
    "legal_evidence": 4.0,
    "code": 4.0,
    "tool_output": 2.0,
    "assistant_history": 2.0,
    "user_query": 1.0,
    "output": 1.0,
    "unknown": 1.0,
    "reasoning": 0.5,
}

SAECACHE_DEFAULTS = {
    "learn": True,
    "queue_weights": True,
    "type_weights": True,
    "lognormal_timing": True,
    "position_decay": True,
    "alpha": {"evict_first": 0.1, "chat": 1.0, "agentic": 1.0, "structural": 1.0},
    "weights": PRIOR,
    "mu": {"chat": 2.28, "agentic": 2.28},
    "sigma": {"chat": 1.34, "agentic": 1.34},
    "gamma": 1.0,
    "update_every": 256,
    "eta": 0.1,
    "ghost_gain": 5.0,
    "reuse_gain": 2.0,
    "alpha_eta": 0.1,
    "alpha_min": 0.05,
    "alpha_max": 20.0,
    "gap_window": 1000,
    "min_gap_samples": 30,
    "sigma_min": 0.05,
    "max_sessions": 100_000,
    "gamma_window": 1000,
    "min_gamma_samples": 30,
    "gamma_min": 0.1,
    "gamma_max": 10.0,
    "position_levels": 16,
    "promote_hits": 1,
    "dt_epsilon": 1e-3,
}

#: name -> params() with no parameters given: the defaults each module's docstring documents
DEFAULT_PARAMS = {
    "fifo": {},
    "lru": {},
    "lfu": {},
    "belady": {},
    "size_lru": {"beta_s": 1.0},
    "gdsf": {"cost": "block_tokens", "size": "1 block"},
    "slru": {"protected_fraction": 0.8, "promote_hits": 1},
    "arc": {},
    "sieve": {},
    "sglang_lru": {"touch_on_release": True},
    "sglang_lfu": {"touch_on_release": True},
    "static_semantic": {"weights": PRIOR, "half_life_s": 10.0},
    "adaptive_semantic": {
        "half_life_s": 10.0,
        "eta": 0.1,
        "update_every": 256,
        "initial_weights": PRIOR,
        "ghost_gain": 5.0,
        "reuse_gain": 2.0,
        "freq_gain": 1.0,
    },
    "saecache": SAECACHE_DEFAULTS,
    "saecache_fixed": {**SAECACHE_DEFAULTS, "learn": False},
}


def _types(d: dict) -> dict:
    return {k: (_types(v) if isinstance(v, dict) else type(v)) for k, v in d.items()}


@pytest.mark.parametrize("name", list(DEFAULT_PARAMS))
def test_params_with_nothing_given_are_the_documented_defaults(name):
    """Values and types (JSON writes 1 and 1.0 differently; a config round-trips through it)."""
    p = make_cache(name, 4).policy.params()
    assert p == DEFAULT_PARAMS[name]
    assert _types(p) == _types(DEFAULT_PARAMS[name])


#: name -> (parameters given, with ints where floats are meant, and params() after)
GIVEN_PARAMS = {
    "size_lru": ({"beta_s": 3}, {"beta_s": 3.0}),
    "slru": (
        {"protected_fraction": 1, "promote_hits": 2.0},
        {"protected_fraction": 1.0, "promote_hits": 2},
    ),
    "sglang_lru": ({"touch_on_release": 0}, {"touch_on_release": False}),
    "sglang_lfu": ({"touch_on_release": 0}, {"touch_on_release": False}),
    "static_semantic": (
        {"weights": {"reasoning": 3, "code": 0.25}, "half_life_s": 2},
        {"weights": {**PRIOR, "reasoning": 3.0, "code": 0.25}, "half_life_s": 2.0},
    ),
    "adaptive_semantic": (
        {
            "half_life_s": 3,
            "eta": 1,
            "update_every": 7.0,
            "initial_weights": {"system": 2},
            "ghost_gain": 0,
            "reuse_gain": 4,
            "freq_gain": 2,
        },
        {
            "half_life_s": 3.0,
            "eta": 1.0,
            "update_every": 7,
            "initial_weights": {**PRIOR, "system": 2.0},
            "ghost_gain": 0.0,
            "reuse_gain": 4.0,
            "freq_gain": 2.0,
        },
    ),
}


@pytest.mark.parametrize("name", list(GIVEN_PARAMS))
def test_params_report_the_values_given_converted(name):
    given, expect = GIVEN_PARAMS[name]
    p = make_cache(name, 4, given).policy.params()
    assert p == expect
    assert _types(p) == _types(expect)


def test_saecache_params_report_every_value_given():
    """Every parameter away from its default (ints where floats are meant), chat and agentic
    given different ``mu`` and ``sigma``, one ``alpha`` and one weight overridden."""
    given = {
        "update_every": 9,
        "weights": {"code": 3},
        "eta": 0,
        "ghost_gain": 1,
        "reuse_gain": 3,
        "alpha": {"chat": 2},
        "alpha_eta": 1,
        "alpha_min": 1,
        "alpha_max": 2,
        "mu": {"chat": 1, "agentic": 3},
        "sigma": {"chat": 2, "agentic": 0.5},
        "gap_window": 5,
        "min_gap_samples": 4,
        "sigma_min": 1,
        "max_sessions": 6,
        "gamma": 2,
        "gamma_window": 7,
        "min_gamma_samples": 8,
        "gamma_min": 1,
        "gamma_max": 3,
        "position_levels": 4,
        "promote_hits": None,
        "dt_epsilon": 1,
        "queue_weights": False,
        "type_weights": False,
        "lognormal_timing": False,
        "position_decay": False,
    }
    expect = {
        "learn": True,
        "queue_weights": False,
        "type_weights": False,
        "lognormal_timing": False,
        "position_decay": False,
        "alpha": {"evict_first": 0.1, "chat": 2.0, "agentic": 1.0, "structural": 1.0},
        "weights": {**PRIOR, "code": 3.0},
        "mu": {"chat": 1.0, "agentic": 3.0},
        "sigma": {"chat": 2.0, "agentic": 0.5},
        "gamma": 2.0,
        "update_every": 9,
        "eta": 0.0,
        "ghost_gain": 1.0,
        "reuse_gain": 3.0,
        "alpha_eta": 1.0,
        "alpha_min": 1.0,
        "alpha_max": 2.0,
        "gap_window": 5,
        "min_gap_samples": 4,
        "sigma_min": 1.0,
        "max_sessions": 6,
        "gamma_window": 7,
        "min_gamma_samples": 8,
        "gamma_min": 1.0,
        "gamma_max": 3.0,
        "position_levels": 4,
        "promote_hits": None,
        "dt_epsilon": 1.0,
    }
    for name, learn in (("saecache", True), ("saecache_fixed", False)):
        p = make_cache(name, 4, given).policy.params()
        assert p == {**expect, "learn": learn}
        assert _types(p) == _types({**expect, "learn": learn})


# ---------------------------------------------------------------- shared builders


def one(
    key: int,
    t: float = 0.0,
    *,
    stype: SemanticType = ST.USER_QUERY,
    tokens: int = 4,
    block_size: int = 4,
    seg_tokens: int | None = None,
    index: int = 0,
    session: str | None = None,
) -> RequestBlocks:
    """A single-block request (its block is its own chain root)."""
    return rb(
        [key],
        parents=[None],
        tokens=[tokens],
        stypes=[stype],
        block_size=block_size,
        index=index,
        arrival_s=t,
        seg_tokens=None if seg_tokens is None else [seg_tokens],
        session=session,
    )


def evicted(cache) -> list[int]:
    return [key for _, key, _, _ in cache.eviction_log]


def play(cache, steps: list[tuple[int, float]], **kw) -> None:
    """Access single-block request ``key`` at time ``t`` for each step (acquired and released
    at once); request indices count from 0."""
    for i, (key, t) in enumerate(steps):
        cache.access(one(key, t, index=i, **kw), t)


# ---------------------------------------------------------------- error messages


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("slru", {"protected_fraction": -0.1}, r"slru: protected_fraction must be in \[0, 1\]"),
        ("slru", {"protected_fraction": 1.5}, r"slru: protected_fraction must be in \[0, 1\]"),
        ("slru", {"promote_hits": 0}, "slru: promote_hits must be >= 1, got 0"),
        ("size_lru", {"beta_s": -1}, "size_lru: beta_s must be >= 0 seconds per doubling"),
        ("static_semantic", {"half_life_s": 0}, "static_semantic: half_life_s must be > 0"),
        ("static_semantic", {"weights": {"sytem": 2}}, "static_semantic: unknown semantic type"),
        ("adaptive_semantic", {"half_life_s": 0}, "adaptive_semantic: half_life_s must be > 0"),
    ],
)
def test_bad_parameters_are_refused_with_a_message_naming_the_policy(name, params, message):
    with pytest.raises(ValueError, match=message):
        make_cache(name, 4, params)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("slru", {"protected_fraction": 0.0}),
        ("slru", {"protected_fraction": 1.0}),
        ("size_lru", {"beta_s": 0.0}),
        ("static_semantic", {"half_life_s": 0.5}),
    ],
)
def test_parameters_at_the_edge_of_their_range_are_accepted(name, params):
    assert make_cache(name, 4, params).policy.params() == {**DEFAULT_PARAMS[name], **params}


def test_saecache_fixed_refuses_learn_whatever_its_value():
    for learn in (True, False):
        with pytest.raises(
            TypeError, match=r"^saecache_fixed never learns; use saecache for learn=True$"
        ):
            SAECacheFixed(learn=learn)
    assert SAECacheFixed().params()["learn"] is False


# ---------------------------------------------------------------- slru


def _protected(cache) -> float:
    return cache.policy.metrics()["protected_blocks"]


def test_slru_caps_the_protected_segment_at_the_first_eviction():
    """Capacity 5, protected_fraction 0.5, promote_hits 1; one block per request, released at
    once:

    t=0..4  1 2 3 4 5 inserted (probationary, in that order)
    t=5..7  1 2 3 hit: promoted, protected [1 2 3]; no cap while the cache fills: 3 protected
    t=8     6 misses, the first eviction: the cap becomes int(0.5 * 5 live blocks) = 2, so the
            oldest protected block (1) is demoted to the back of probation [4 5 1]; 4 goes
    t=9..11 7, 8, 9 miss: 5, then the demoted 1, then 6 go (probation is in release order)
    2 and 3 stay protected throughout.
    """
    cache = make_cache("slru", 5, {"protected_fraction": 0.5}, record_evictions=True)
    play(cache, [(k, float(k - 1)) for k in (1, 2, 3, 4, 5)])
    play(cache, [(1, 5.0), (2, 6.0), (3, 7.0)])
    assert _protected(cache) == 3.0
    cache.access(one(6, 8.0, index=8), 8.0)
    assert evicted(cache) == [4]
    assert _protected(cache) == 2.0
    for i, key in enumerate((7, 8, 9)):
        cache.access(one(key, 9.0 + i, index=9 + i), 9.0 + i)
    assert evicted(cache) == [4, 5, 1, 6]
    assert sorted(cache.blocks) == [2, 3, 7, 8, 9]
    assert _protected(cache) == 2.0


def test_slru_evicts_protected_blocks_only_when_probation_is_empty_and_counts_them():
    """Capacity 3, protected_fraction 1 (cap 3): 1 2 3 inserted at 0..2 and hit at 3..5, all
    protected; the 3-block request [4 5 6] at 6 needs three blocks with probation empty, so the
    protected ones go oldest first (1 2 3), and the count falls to 0."""
    cache = make_cache("slru", 3, {"protected_fraction": 1.0}, record_evictions=True)
    play(cache, [(1, 0.0), (2, 1.0), (3, 2.0), (1, 3.0), (2, 4.0), (3, 5.0)])
    assert _protected(cache) == 3.0
    cache.access(rb([4, 5, 6], index=6, arrival_s=6.0), 6.0)
    assert evicted(cache) == [1, 2, 3]
    assert _protected(cache) == 0.0


def test_slru_demotion_skips_a_pinned_protected_block_and_goes_on():
    """Capacity 4, protected_fraction 0.5, promote_hits 1:

    t=0..3 1 2 3 4 inserted; t=4, 5: 1 and 2 hit, protected [1 2]
    t=6    5 misses: cap int(0.5 * 4) = 2, nothing to demote; probation [3 4]: 3 goes -> [4 5]
    t=7    a request holds 1 (a hit: pinned, still first in the protected order)
    t=8    4 hit: promoted, 3 protected > 2: demotion meets 1 pinned (it leaves the order until
           its release) and goes on to 2, which is demoted: probation [5 2], protected [4]
    t=9    the holder of 1 releases it: protected [4 1], 2 protected again within the cap
    t=10, 11  6 and 7 miss: 5 then 2 go (probation first, in release order)
    """
    cache = make_cache("slru", 4, {"protected_fraction": 0.5}, record_evictions=True)
    play(cache, [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0), (1, 4.0), (2, 5.0), (5, 6.0)])
    assert evicted(cache) == [3]
    lease = cache.acquire(one(1, 7.0, index=7), 7.0)
    cache.access(one(4, 8.0, index=8), 8.0)
    assert _protected(cache) == 2.0
    cache.release(lease, 9.0)
    assert _protected(cache) == 2.0
    cache.access(one(6, 10.0, index=10), 10.0)
    cache.access(one(7, 11.0, index=11), 11.0)
    assert evicted(cache) == [3, 5, 2]
    assert sorted(cache.blocks) == [1, 4, 6, 7]


# ---------------------------------------------------------------- adaptive_semantic
# score = w[type] * (1 + hits) ** freq_gain * (tokens / block_size) * 2 ** (-(now - t) / h); the
# victim has the least key(b) + h * log2(w[type]) with key(b) = t + h * (freq_gain *
# log2(1 + hits) + log2(tokens / block_size)). Below h = 10 s and every block is a user query
# (w = 1, offset 0) unless said otherwise.


def _adaptive(cap: int, **params):
    return make_cache("adaptive_semantic", cap, params, record_evictions=True)


@pytest.mark.parametrize(
    ("a_tokens", "t_b", "victim"),
    [
        # A full, hit once at t=1: key 1 + 10 * (log2 2 + log2 1) = 11
        (4, 10.5, 2),  # B's key 10.5 < 11: B goes
        (4, 11.5, 1),  # 11 < 11.5: A goes
        # A half full (2 of 4 tokens), hit once at t=1: key 1 + 10 * (1 + log2 0.5) = 1
        (2, 1.5, 1),  # 1 < 1.5: A goes
        (2, 0.5, 2),  # B released at 0.5 (before A's hit): 0.5 < 1, B goes
    ],
)
def test_adaptive_semantic_key_combines_release_time_hits_and_fill(a_tokens, t_b, victim):
    """A (key 1) is inserted at 0 and hit at 1; B (key 2, full, never hit: its key is its
    release time) is inserted at ``t_b``; C at 12 needs the room of one of them."""
    cache = _adaptive(2)
    steps = [(0.0, 1), (1.0, 1), (t_b, 2)]
    for i, (t, key) in enumerate(sorted(steps)):
        cache.access(one(key, t, tokens=a_tokens if key == 1 else 4, index=i), t)
    cache.access(one(3, 12.0, index=9), 12.0)
    assert evicted(cache) == [victim]


def test_adaptive_semantic_fill_is_tokens_over_the_requests_block_size():
    """A: 2 tokens of a 4-token block, released at 0: key 10 * log2(0.5) = -10; B: 4 tokens of a
    16-token block, released at 1: key 1 + 10 * log2(0.25) = -19, so B goes first (it saves
    less prefill per unit of KV memory)."""
    cache = _adaptive(2)
    cache.access(one(1, 0.0, tokens=2, block_size=4, index=0), 0.0)
    cache.access(one(2, 1.0, tokens=4, block_size=16, index=1), 1.0)
    cache.access(one(3, 2.0, index=2), 2.0)
    assert evicted(cache) == [2]


def test_adaptive_semantic_freq_gain_is_the_exponent_of_the_hit_factor():
    """freq_gain 2: A, hit once at 1, has key 1 + 10 * 2 * log2(2) = 21; B released at 20.5
    goes first, B released at 21.5 stays."""
    for t_b, victim in ((20.5, 2), (21.5, 1)):
        cache = _adaptive(2, freq_gain=2.0)
        play(cache, [(1, 0.0), (1, 1.0), (2, t_b)])
        cache.access(one(3, 30.0, index=9), 30.0)
        assert evicted(cache) == [victim]


def test_adaptive_semantic_equal_keys_go_in_release_order_within_and_across_types():
    """Two blocks released at 5 with weight 1 (keys 5): the one released first goes, whether
    both are user queries (one heap) or a user query then an output (two heaps; user_query's
    heap is searched first)."""
    for second in (ST.USER_QUERY, ST.OUTPUT):
        cache = _adaptive(2)
        cache.access(one(1, 5.0, index=0), 5.0)
        cache.access(one(2, 5.0, stype=second, index=1), 5.0)
        cache.access(one(3, 6.0, index=2), 6.0)
        assert evicted(cache) == [1]


def test_adaptive_semantic_a_lower_key_wins_over_an_earlier_release():
    """Y, a user query (w 1) released at 0: key 0; X, reasoning (w 0.5) released at 1: key
    1 + 10 * log2(0.5) = -9. X goes though Y was released first (and X's heap comes first)."""
    cache = _adaptive(2)
    cache.access(one(1, 0.0, index=0), 0.0)
    cache.access(one(2, 1.0, stype=ST.REASONING, index=1), 1.0)
    cache.access(one(3, 2.0, index=2), 2.0)
    assert evicted(cache) == [2]


def test_adaptive_semantic_a_pinned_block_met_at_the_top_comes_back_on_release():
    """freq_gain 0 (hits do not move keys), capacity 2: A at 0, B at 1; a request holds A from
    2 (A's entry, key 0, is at the top and is dropped when C at 3 needs room: B goes); A is
    released at 4 (key 4); D at 5 evicts C (key 3); E at 6 evicts A (4 < D's 5)."""
    cache = _adaptive(2, freq_gain=0.0)
    play(cache, [(1, 0.0), (2, 1.0)])
    lease = cache.acquire(one(1, 2.0, index=2), 2.0)
    cache.access(one(3, 3.0, index=3), 3.0)
    cache.release(lease, 4.0)
    cache.access(one(4, 5.0, index=4), 5.0)
    cache.access(one(5, 6.0, index=5), 6.0)
    assert evicted(cache) == [2, 3, 1]


@pytest.mark.parametrize("a_again_first", [True, False])
def test_adaptive_semantic_a_reused_block_keeps_release_order_on_ties(a_again_first):
    """freq_gain 0: A released at 0, then hit and released again at 5; B released at 5. Both
    keys are 5, so the earlier of the two releases at 5 goes when C arrives at 6 (A's old
    entry, key 0, is re-keyed on the way)."""
    cache = _adaptive(2, freq_gain=0.0)
    cache.access(one(1, 0.0, index=0), 0.0)
    order = [(1, 1), (2, 2)] if a_again_first else [(2, 1), (1, 2)]
    for key, i in order:
        cache.access(one(key, 5.0, index=i), 5.0)
    cache.access(one(3, 6.0, index=3), 6.0)
    assert evicted(cache) == [1 if a_again_first else 2]


def test_adaptive_semantic_a_parent_that_becomes_a_leaf_keeps_its_release_place():
    """freq_gain 0, capacity 3: chain [P C] released at 5 (C first, then P), D released at 5
    after them. E at 6 evicts C (the earliest release); P becomes a leaf with key 5 and its
    release before D's: F at 7 evicts P, not D."""
    cache = _adaptive(3, freq_gain=0.0)
    cache.access(rb([1, 2], arrival_s=5.0, stypes=[ST.USER_QUERY] * 2, index=0), 5.0)
    cache.access(one(3, 5.0, index=1), 5.0)
    cache.access(one(4, 6.0, index=2), 6.0)
    cache.access(one(5, 7.0, index=3), 7.0)
    assert evicted(cache) == [2, 1]


def test_adaptive_semantic_set_weights_reranks_and_keeps_the_other_weights():
    """initial weights: user query 3. A, reasoning (w 0.5) released at 0: key -10; B, user
    query released at 30: key 30 + 10 * log2(3) = 45.85. A goes first; after
    set_weights(reasoning=16) A's key is 0 + 10 * log2(16) = 40 < 45.85: still A; with
    reasoning=64 it is 60: B goes. The user-query weight stays 3."""
    for w, victim in ((None, 1), (16.0, 1), (64.0, 2)):
        cache = _adaptive(2, initial_weights={"user_query": 3.0})
        cache.access(one(1, 0.0, stype=ST.REASONING, index=0), 0.0)
        cache.access(one(2, 30.0, index=1), 30.0)
        if w is not None:
            cache.policy.set_weights({"reasoning": w})
        m = cache.policy.metrics()
        assert m["w_reasoning"] == (0.5 if w is None else w)
        assert m["w_user_query"] == 3.0
        cache.access(one(3, 31.0, index=2), 31.0)
        assert evicted(cache) == [victim]
    with pytest.raises(ValueError, match="adaptive_semantic: unknown semantic type 'sytem'"):
        cache.policy.set_weights({"sytem": 2.0})


def test_adaptive_semantic_a_type_with_ghost_hits_and_no_eviction_gets_the_full_ghost_target():
    """update_every 2, eta 1 (a weight becomes its target): one ghost hit on a user query and
    two evictions of unreused documents in the window. Documents: ghost 0/2, reuse 0/2, target
    1. User queries: no eviction, so ghost rate 1 and reuse rate 0: target 1 + 5 * 1 = 6."""
    pol = AdaptiveSemantic(update_every=2, eta=1.0)
    q, d = TYPE_INDEX[ST.USER_QUERY], TYPE_INDEX[ST.RETRIEVED_CONTEXT]
    block = Block(1, None, 4, q, 0, None, 0.0)
    pol.on_ghost_hit(block, GhostEntry(q, 0.0, 0, 4, 0), 1.0)
    for key in (2, 3):
        pol.on_evict(Block(key, None, 4, d, 0, None, 0.0), 2.0)
    m = pol.metrics()
    assert m["weight_updates"] == 1.0
    assert (m["w_user_query"], m["w_retrieved_context"]) == (6.0, 1.0)


# ---------------------------------------------------------------- base.py: the heap bases


class _Stamped(PriorityPolicy):
    """An eager-heap policy: a block's priority is the time it is pushed plus a bonus the test
    sets per key (0 by default); on_unpin, on_leaf, push and refresh are the base's."""

    def __init__(self) -> None:
        super().__init__()
        self.bonus: dict[int, float] = {}
        self.compactions = 0

    def priority(self, b, now):
        return now + self.bonus.get(b.key, 0.0)

    def _compact(self) -> None:
        self.compactions += 1
        super()._compact()


def test_priority_policy_pushes_a_new_leaf_with_its_priority_at_that_time():
    """Capacity 3: chain [1 2] released at 0 (2 pushed with priority 0; 1 has a child, so no
    entry), 3 at 1 (priority 1); 4 at 2 evicts 2 and 1, now a leaf, is pushed with priority 2
    (the eviction's time), before 4 (also 2); 5 at 3 evicts 3 (1); 6 at 4 evicts 1 (2, pushed
    before 4)."""
    cache = BlockCache(3, _Stamped(), record_evictions=True)
    cache.access(rb([1, 2], arrival_s=0.0), 0.0)
    for i, key in enumerate((3, 4, 5, 6), start=1):
        cache.access(rb([key], arrival_s=float(i), index=i), float(i))
    assert evicted(cache) == [2, 3, 1]


def test_priority_policy_refresh_recomputes_priorities_at_the_given_time():
    """1 released at 0 with a bonus of 100 (priority 100), 2 released at 50 (50): 2 would go.
    The bonus is dropped (a priority that drifts) and refresh(200) recomputes both at 200: 200
    and 200, a tie that goes in push order (1's entry was pushed first): 1 goes."""
    pol = _Stamped()
    pol.bonus[1] = 100.0
    cache = BlockCache(2, pol, record_evictions=True)
    play(cache, [(1, 0.0), (2, 50.0)])
    pol.bonus.clear()
    pol.refresh(200.0)
    cache.access(one(3, 201.0, index=9), 201.0)
    assert evicted(cache) == [1]


def test_priority_policy_compacts_stale_entries_and_still_evicts_in_priority_order():
    """Capacity 3: 2 at 0, 3 at 1, then 1 hit 4,200 times (t = 2 .. 4201): every hit voids
    1's entry and pushes a new one, so stale entries pass 2 x 3 live + 4096 and the heap is
    compacted; 2's and 3's entries (pushed at 0 and 1) must survive it: 4 at 4202 evicts 2,
    5 at 4203 evicts 3."""
    pol = _Stamped()
    cache = BlockCache(3, pol, record_evictions=True)
    play(cache, [(2, 0.0), (3, 1.0)] + [(1, 2.0 + i) for i in range(4200)])
    assert pol.compactions >= 1
    assert evicted(cache) == []
    cache.access(one(4, 4202.0, index=10**5), 4202.0)
    cache.access(one(5, 4203.0, index=10**5 + 1), 4203.0)
    assert evicted(cache) == [2, 3]


def test_belady_refresh_keeps_the_farthest_next_use_first():
    """Keys 1 2 3 1 2 4 3 1, capacity 3: at request 5 (key 4) next uses are 1 -> 7, 2 -> never,
    3 -> 6, so 2 goes; a refresh of every priority before it changes nothing."""
    keys = [1, 2, 3, 1, 2, 4, 3, 1]
    trace = [one(k, float(i), index=i) for i, k in enumerate(keys)]
    cache = make_cache("belady", 3, record_evictions=True)
    cache.prepare(trace)
    for r in trace[:5]:
        cache.access(r, r.arrival_s)
    cache.policy.refresh(4.5)
    cache.access(trace[5], trace[5].arrival_s)
    assert evicted(cache) == [2]


def test_key_heap_top_and_entries():
    heap = KeyHeap()
    assert heap.top() is None and len(heap) == 0
    b = Block(7, None, 4, 0, 0, None, 0.0)
    heap.push(2.0, 1.0, 5, b)
    heap.push(1.0, 9.0, 6, b)
    e = heap.top()
    assert (e.k1, e.k2, e.seq, e.b) == (1.0, 9.0, 6, b)
    entry = HeapEntry(1.5, 2.5, 3, b)
    assert (entry.k1, entry.k2, entry.seq, entry.b) == (1.5, 2.5, 3, b)


def test_key_pair_reads_a_number_or_a_pair_as_two_floats():
    assert key_pair(3) == (3.0, 0.0)
    assert key_pair((2,)) == (2.0, 0.0)
    assert key_pair((1, 5)) == (1.0, 5.0)
    assert all(type(x) is float for x in key_pair((1, 5)) + key_pair(3) + key_pair((2,)))


# ---------------------------------------------------------------- size_lru, sglang_lfu


def test_size_lru_gives_a_two_token_segment_one_doubling_of_bonus():
    """beta 1 s: A, of a 2-token segment, released at 0: key 0 + log2 2 = 1; B, of a 1-token
    segment, released at 0.5: key 0.5 (no bonus). B goes first."""
    cache = make_cache("size_lru", 2, record_evictions=True)
    cache.access(one(1, 0.0, tokens=2, seg_tokens=2, index=0), 0.0)
    cache.access(one(2, 0.5, tokens=1, seg_tokens=1, index=1), 0.5)
    cache.access(one(3, 1.0, index=2), 1.0)
    assert evicted(cache) == [2]


def test_sglang_lfu_stamps_the_release_time_by_default():
    """Equal hits (0): A acquired at 0 and released at 10, B accessed at 5. touch_on_release
    (default): A's stamp is 10, B goes; without it A's stamp is its insertion (0), A goes."""
    for params, victim in (({}, 2), ({"touch_on_release": False}, 1)):
        cache = make_cache("sglang_lfu", 2, params, record_evictions=True)
        lease = cache.acquire(one(1, 0.0, index=0), 0.0)
        cache.access(one(2, 5.0, index=1), 5.0)
        cache.release(lease, 10.0)
        cache.access(one(3, 11.0, index=2), 11.0)
        assert evicted(cache) == [victim]


# ---------------------------------------------------------------- registry


def test_check_all_imports_every_registered_policy_and_fails_on_a_broken_one(monkeypatch):
    assert check_all() == list(POLICIES)
    monkeypatch.setitem(POLICIES, "broken", "skv.policies.no_such_module:Nothing")
    with pytest.raises(ModuleNotFoundError, match=r"skv\.policies\.no_such_module"):
        check_all()


def test_make_policy_builds_a_fresh_online_policy_with_its_parameters():
    a, b = make_policy("slru", {"protected_fraction": 0.5}), make_policy("slru")
    assert type(a) is SLRU and a is not b
    assert a.params() == {"protected_fraction": 0.5, "promote_hits": 1}
    assert b.params() == {"protected_fraction": 0.8, "promote_hits": 1}
    from skv.policies.registry import OFFLINE, POLICIES

    names = [p for p in POLICIES if p != "vllm" and p not in OFFLINE]  # registry order
    assert {"lru", "slru", "saecache"} <= set(names) and "belady" not in names
    online = ", ".join(names)
    for name in ("vllm", "belady"):
        with pytest.raises(ValueError, match=f"policy '{name}' cannot order") as err:
            make_policy(name)
        assert str(err.value).endswith(f"({online})")
    with pytest.raises(ValueError, match=r"^policy 'lru': bad parameters \{'x': 1\}: "):
        make_policy("lru", {"x": 1})
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")
    # an integer past a compiled policy's C field (64 bits) is a bad parameter, not a traceback
    for name, key in (("lhd", "associativity"), ("kvflow", "max_sessions")):
        with pytest.raises(ValueError, match=rf"^policy '{name}': bad parameters"):
            make_policy(name, {key: 2**70})
        with pytest.raises(ValueError, match=rf"^policy '{name}': bad parameters"):
            make_cache(name, 10, {key: 2**70})


def test_make_vllm_pool_orders_its_free_queue_by_the_named_policy():
    pool = make_vllm_pool(8, "static_semantic", {"half_life_s": 3.0})
    assert pool.capacity_blocks == 8
    assert type(pool.policy) is StaticSemantic
    assert pool.policy.params()["half_life_s"] == 3.0
    assert type(make_vllm_pool(4, "lru").policy) is LRU


# ---------------------------------------------------------------- adaptive_semantic's checks


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"half_life_s": 0}, r"half_life_s must be > 0, got 0"),
        ({"eta": -0.5}, r"eta must be in \[0, 1\], got -0.5"),
        ({"eta": 1.5}, r"eta must be in \[0, 1\], got 1.5"),
        ({"update_every": 0}, "update_every must be >= 1, got 0"),
        ({"ghost_gain": -1}, "ghost_gain, reuse_gain, freq_gain must be >= 0"),
        ({"reuse_gain": -1}, "ghost_gain, reuse_gain, freq_gain must be >= 0"),
        ({"freq_gain": -1}, "ghost_gain, reuse_gain, freq_gain must be >= 0"),
        ({"initial_weights": {"sytem": 1.0}}, "unknown semantic type 'sytem'"),
    ],
)
def test_adaptive_semantic_refuses_each_bad_parameter(params, message):
    with pytest.raises(ValueError, match="^adaptive_semantic: " + message):
        AdaptiveSemantic(**params)


@pytest.mark.parametrize(
    "params",
    [
        {"half_life_s": 0.5},
        {"eta": 0.0},
        {"eta": 1.0},
        {"update_every": 1},
        {"ghost_gain": 0.0, "reuse_gain": 0.0, "freq_gain": 0.0},
        {"ghost_gain": 0.5, "reuse_gain": 0.5, "freq_gain": 0.5},
    ],
)
def test_adaptive_semantic_accepts_the_edges_of_each_range(params):
    p = AdaptiveSemantic(**params).params()
    assert {k: p[k] for k in params} == params


def test_adaptive_semantic_reuse_rate_counts_every_reused_eviction():
    """update_every 3, eta 1: three documents evicted, two of them hit while cached, no ghost
    hit: reuse 2/3, target 1 + 2 * 2/3 = 7/3."""
    pol = AdaptiveSemantic(update_every=3, eta=1.0)
    d = TYPE_INDEX[ST.RETRIEVED_CONTEXT]
    for key, hits in ((1, 1), (2, 0), (3, 2)):
        b = Block(key, None, 4, d, 0, None, 0.0)
        b.hits = hits
        pol.on_evict(b, 1.0)
    assert pol.metrics()["w_retrieved_context"] == pytest.approx(7 / 3, rel=1e-15)


# ---------------------------------------------------------------- saecache


@pytest.mark.parametrize("z", [25.5, 30.0, 40.0])
def test_log_survival_far_in_the_tail_matches_scipy(z):
    """Past z = 25 (erfc's argument) the survival is the asymptotic erfc series; its first
    omitted term, 6.5625 / z**8, is below 4e-11 there, so the log survival must match scipy's
    log_ndtr to 1e-9 (each of the series' three terms is above 3e-9 at these z)."""
    sigma = 0.05
    dt = math.exp(z * sigma * math.sqrt(2.0))
    want = float(special.log_ndtr(-math.log(dt) / sigma))
    assert sae.log_survival(dt, 0.0, sigma) == pytest.approx(want, abs=1e-9, rel=0)


def test_saecache_gamma_fit_is_clipped_to_its_range():
    """gamma_window 1, min_gamma_samples 1 (gamma is the fit of the last single-turn request's
    depth D = (hits + 0.5) / (blocks + 1)), gamma_min 0.5: a 20-block template prompt, all
    missed: D = 0.5 / 21, gamma = -1 / ln D = 0.2675, clipped up to 0.5; the same prompt again,
    all hit: D = 20.5 / 21, gamma = 41.5, clipped down to gamma_max = 10."""
    cache = make_cache(
        "saecache",
        64,
        {"gamma_window": 1, "min_gamma_samples": 1, "gamma_min": 0.5},
    )
    keys = list(range(1, 21))
    for i in range(3):
        cache.access(rb(keys, index=i, arrival_s=float(i)), float(i))
        expect = {0: 1.0, 1: 0.5, 2: 10.0}[i]
        assert cache.policy.metrics()["gamma"] == expect
    assert -1 / math.log(0.5 / 21) == pytest.approx(0.2675, abs=1e-4)


def test_saecache_queue_weights_move_from_their_own_value():
    """Default alphas (Evict-First 0.1, others 1), alpha_eta 0.5, one window with hits /
    evictions / ghost hits Evict-First 0/4/2 -> e = 2/4 = 0.5, Chat 3/1/0 -> e = 3/4 = 0.75;
    mean 0.625, targets 0.8 and 1.2: alpha_EF = 0.5 * 0.1 + 0.5 * 0.8 = 0.45, alpha_chat =
    0.5 * 1 + 0.5 * 1.2 = 1.1; Agentic and Structural had no events and stay 1."""
    pol = SAECache(alpha_eta=0.5)
    pol._hits_q = [0, 3, 0, 0]  # EVICT_FIRST, CHAT, AGENTIC, STRUCTURAL
    pol._evicted_q = [4, 1, 0, 0]
    pol._ghost_q = [2, 0, 0, 0]
    pol._update_alpha()
    m = pol.metrics()
    assert m["alpha_evict_first"] == pytest.approx(0.45, rel=1e-15)
    assert m["alpha_chat"] == pytest.approx(1.1, rel=1e-15)
    assert (m["alpha_agentic"], m["alpha_structural"], m["alpha_updates"]) == (1.0, 1.0, 1.0)


def test_saecache_counts_every_ghost_hit_of_its_queue():
    """A 1-block cache, single-turn user queries never promoted: 1 at 0; 2 at 1 evicts 1; 1 at
    2 is a ghost hit of an Evict-First eviction and evicts 2; 2 at 3 is a second one."""
    cache = make_cache(
        "saecache", 1, {"promote_hits": None, "update_every": 1000}, ghost_capacity=8
    )
    play(cache, [(1, 0.0), (2, 1.0), (1, 2.0), (2, 3.0)])
    pol = cache.policy
    assert cache.stats.ghost_hits == 2
    assert pol._ghost_q == [2, 0, 0, 0]
    assert pol._evicted_q == [3, 0, 0, 0]


def test_saecache_fitted_reports_each_queue_its_own_values():
    given = {
        "alpha": {"chat": 2.0},
        "weights": {"code": 3.0},
        "mu": {"chat": 1.0, "agentic": 3.0},
        "sigma": {"chat": 2.0, "agentic": 0.5},
        "gamma": 2.0,
    }
    want = {
        "alpha": {"evict_first": 0.1, "chat": 2.0, "agentic": 1.0, "structural": 1.0},
        "weights": {**PRIOR, "code": 3.0},
        "mu": {"chat": 1.0, "agentic": 3.0},
        "sigma": {"chat": 2.0, "agentic": 0.5},
        "gamma": 2.0,
    }
    assert SAECacheFixed(**given).fitted() == want
    assert SAECacheFixed(**SAECacheFixed(**given).fitted()).fitted() == want


class _Slack0(SAECache):
    """saecache whose heaps are compacted as soon as entries exceed twice the live ones."""

    compact_slack = 0

    def _compact(self) -> None:
        self.compactions = getattr(self, "compactions", 0) + 1
        super()._compact()


def test_saecache_compaction_keeps_release_order_among_equal_release_times():
    """Capacity 5, compaction slack 0. Blocks 1-4: single-turn user queries released at 0
    (Evict-First, one group, keys equal, release order 1 2 3 4). Block 5, a system block, is
    hit 6 times at 0, alternately by a templated and a chat request: each hit moves it to
    another group and voids its entry, so void entries pile up and the heaps are compacted.
    At 10 four new blocks evict 1 2 3 4 in release order (all P = 0.1 / 10, ties)."""
    pol = _Slack0(promote_hits=None)
    cache = BlockCache(5, pol, record_evictions=True)
    play(cache, [(k, 0.0) for k in (1, 2, 3, 4)])
    for i in range(7):
        session = "s" if i % 2 else None
        r = RequestBlocks(
            10 + i, 0.0, [5], [None], [4], [TYPE_INDEX[ST.SYSTEM]], [4], session, 0, True, 4
        )
        cache.access(r, 0.0)
    assert pol.compactions >= 1
    for i, key in enumerate((6, 7, 8, 9)):
        cache.access(one(key, 10.0, index=20 + i), 10.0)
    assert evicted(cache) == [1, 2, 3, 4]


def test_saecache_queue_weights_update_every_kth_eviction():
    """A 1-block cache, update_every 3: keys 1 2 1 2 1 2 1 at t = 0..6, every access after the
    first evicts the other key, and from the third on is a ghost hit (so a window's hit
    efficiency is positive and the update happens). The 3rd eviction comes with the 4th
    access, the 6th with the 7th: alpha updates after each access 0 0 0 1 1 1 2."""
    cache = make_cache("saecache", 1, {"update_every": 3}, ghost_capacity=8)
    seen = []
    for i in range(7):
        cache.access(one(1 + i % 2, float(i), index=i), float(i))
        seen.append(cache.policy.metrics()["alpha_updates"])
    assert seen == [0, 0, 0, 1, 1, 1, 2]
    assert cache.stats.ghost_hits == 5


@pytest.mark.parametrize(
    ("params", "t_y"),
    [
        # mu moves from the seed 2.28 to ln 10, sigma stays 5 (clamped at sigma_min 5):
        # P_X = S(8) / 8 = 0.0645 before, 0.0647 after; P_Y = 0.1 / 1.548 = 0.0646
        ({"sigma": 5.0, "sigma_min": 5.0}, 8.452),
        # mu stays ln 10 (the seed given equals the one sample), sigma falls from 5 to
        # sigma_min 0.5 (one sample has no spread): P_X = 0.0647 before, 0.0840 after;
        # P_Y = 0.1 / 1.35 = 0.0741
        ({"mu": math.log(10.0), "sigma": 5.0, "sigma_min": 0.5}, 8.65),
    ],
    ids=["mu", "sigma"],
)
def test_saecache_a_new_gap_fit_at_the_same_instant_reprices_the_chat_queue(params, t_y):
    """Capacity 3, min_gap_samples 1. X: chat block of session a, acquired at 0, released at
    2; Z: Evict-First user query at 0; Y: Evict-First user query at ``t_y``. At 10 a first
    request of session b evicts Z (P = 0.1 / 10, the least). Still at 10, session a's second
    request gives a gap sample (10 s) that changes the chat queue's log-normal fit: X, with dt
    = 8, must be priced with the new fit (P_X above P_Y: Y goes), not the one the previous
    eviction at the same instant used (P_X below P_Y)."""
    cache = make_cache(
        "saecache",
        3,
        {**params, "min_gap_samples": 1, "promote_hits": None, "update_every": 1000},
        record_evictions=True,
    )
    lease = cache.acquire(one(1, 0.0, session="a", index=0), 0.0)
    cache.access(one(2, 0.0, index=1), 0.0)
    cache.release(lease, 2.0)
    cache.access(one(3, t_y, index=2), t_y)
    cache.access(one(4, 10.0, session="b", index=3), 10.0)
    assert evicted(cache) == [2]
    cache.access(one(5, 10.0, session="a", index=4), 10.0)
    assert evicted(cache) == [2, 3]
    m = cache.policy.metrics()
    assert (m["mu_chat"], m["sigma_chat"]) == (math.log(10.0), params["sigma_min"])


def test_saecache_counts_every_hit_of_its_queue():
    """A single-turn user query accessed three times (never promoted, so it stays Evict-First):
    two hits in the Evict-First queue."""
    cache = make_cache("saecache", 4, {"promote_hits": None, "update_every": 1000})
    play(cache, [(1, 0.0), (1, 1.0), (1, 2.0)])
    assert cache.policy._hits_q == [2, 0, 0, 0]


def test_saecache_a_block_released_back_in_time_is_priced_in_its_own_queue_only():
    """Guards ``on_unpin``'s ``b.version += 1`` (a release earlier than the block's last one,
    saecache.py:674) against ``b.version = 1``: the reset lets the version climb back to one
    stored in a void entry of another queue, which then counts as live again.

    Capacity 2, single-turn user queries never promoted (Evict-First). X (key 1) is released at
    2 (entry, version 1), then hit at 3 and released back in time at 1 (re-pushed: version 3;
    the mutant's reset re-pushes at version 2, in Evict-First). A chat hit at 4 moves X to Chat
    (version 5; the mutant's 4), and a chat hit at 5 released back in time at 3.5 re-pushes it
    there (version 7; the mutant resets and re-pushes at 2, the version of its void Evict-First
    entry, never popped: no eviction yet). V (key 2), a chat block released at 0. At 6 a new
    block evicts V: P_V = S(6) / 6 = 0.107 is below X's chat P = S(2.5) / 2.5 = 0.338 (S the
    seed log-normal survival); the mutant also prices X as Evict-First, 0.1 / 2.5 = 0.04, and
    evicts X."""
    cache = make_cache("saecache_fixed", 2, {"promote_hits": None}, record_evictions=True)
    cache.access(one(2, 0.0, index=0, session="t"), 0.0)
    cache.access(one(1, 2.0, index=1), 2.0)
    cache.release(cache.acquire(one(1, 3.0, index=2), 3.0), 1.0)
    cache.access(one(1, 4.0, index=3, session="s"), 4.0)
    cache.release(cache.acquire(one(1, 5.0, index=4, session="s"), 5.0), 3.5)
    assert (cache.stats.hit_blocks, evicted(cache)) == (3, [])
    cache.access(one(3, 6.0, index=5), 6.0)
    assert evicted(cache) == [2]


def test_saecache_a_block_dropped_pinned_from_a_heap_top_is_priced_in_its_own_queue_only():
    """Guards ``victim``'s ``b.version += 1`` on a pinned block dropped from the top of its
    heap (saecache.py:733) against ``b.version = 1``: the reset lets the version climb back to
    one stored in a void entry of another queue, which then counts as live again.

    Capacity 2, single-turn user queries never promoted (Evict-First). X (key 1) released at 1,
    W (key 2) at 2. At 3 X is hit and, while it is pinned, A (key 3) evicts W: X's entry, the
    top of Evict-First, is dropped (version 2; the mutant's 1) and X is re-pushed on release at
    3 (version 3; the mutant's 2), under A's entry (also released at 3, earlier). A chat hit at
    4 moves X to Chat (version 5; the mutant's 4). At 5, X hit by a chat request and pinned, a
    chat block B (key 4) evicts A: X's Chat entry is dropped again (version 6; the mutant resets
    to 1) and X is re-pushed on release at 6 (version 7; the mutant's 2, the version of its void
    Evict-First entry, which A's entry kept from the top). At 7 a new block evicts B, the older
    chat block: P_B = S(2) / 2 = 0.441 is below X's chat P = S(1) / 1 = 0.956 (S the seed
    log-normal survival); the mutant also prices X as Evict-First, 0.1 / 1, and evicts X."""
    cache = make_cache("saecache_fixed", 2, {"promote_hits": None}, record_evictions=True)
    cache.access(one(1, 1.0, index=0), 1.0)
    cache.access(one(2, 2.0, index=1), 2.0)
    lease = cache.acquire(one(1, 3.0, index=2), 3.0)
    cache.access(one(3, 3.0, index=3), 3.0)
    cache.release(lease, 3.0)
    assert evicted(cache) == [2]
    cache.access(one(1, 4.0, index=4, session="s"), 4.0)
    lease = cache.acquire(one(1, 5.0, index=5, session="s"), 5.0)
    cache.access(one(4, 5.0, index=6, session="t"), 5.0)
    cache.release(lease, 6.0)
    assert (cache.stats.hit_blocks, evicted(cache)) == (3, [2, 3])
    cache.access(one(5, 7.0, index=7), 7.0)
    assert evicted(cache) == [2, 3, 4]


def test_make_cache_for_vllm_builds_the_stock_pool_or_a_policy_ordered_one():
    """``vllm`` alone: vLLM's own pool, with the cache options given; with ``eviction``: the
    pool whose free queue the named policy orders, with ``eviction_params``."""
    stock = make_cache("vllm", 8, record_evictions=True, ghost_capacity=5)
    assert type(stock) is VllmBlockPool and stock.capacity_blocks == 8
    assert stock.eviction_log == [] and stock.ghost.capacity == 5
    ordered = make_cache(
        "vllm", 6, {"eviction": "static_semantic", "eviction_params": {"half_life_s": 2.0}}
    )
    assert type(ordered) is PolicyBlockPool and ordered.capacity_blocks == 6
    assert type(ordered.policy) is StaticSemantic
    assert ordered.policy.params()["half_life_s"] == 2.0
    assert type(make_cache("vllm", 4, {"eviction": "lru"}).policy) is LRU


@pytest.mark.parametrize(
    ("params", "options", "message"),
    [
        (
            {"eviction": "lru", "capacity": 3, "x": 1},
            {},
            r"^policy 'vllm' takes only eviction and eviction_params, got \['capacity', 'x'\]$",
        ),
        (
            {"eviction_params": {"half_life_s": 3}},
            {},
            r"^policy 'vllm': eviction_params without eviction$",
        ),
        (
            {"eviction": "lru"},
            {"record_evictions": True},
            r"^policy 'vllm' with eviction: no cache options \(\['record_evictions'\]\); the "
            r"policy-ordered pool keeps its own ghost list and no eviction log$",
        ),
    ],
)
def test_make_cache_for_vllm_refuses_what_the_pool_cannot_take(params, options, message):
    with pytest.raises(ValueError, match=message):
        make_cache("vllm", 8, params, **options)


def test_an_unknown_policy_name_lists_the_known_ones():
    known = ", ".join(POLICIES)
    assert known.startswith("fifo, lru, lfu, ") and known.endswith(", belady, vllm")
    with pytest.raises(ValueError, match=rf"^unknown policy 'nope'; known: {known}$"):
        make_cache("nope", 4)


def test_type_weights_must_be_positive_and_known():
    """The message names the policy, the weight and the value; an unknown type name lists the
    known ones, in skv's type order."""
    with pytest.raises(
        ValueError, match=r"^static_semantic: weight of 'system' must be > 0, got 0$"
    ):
        make_cache("static_semantic", 4, {"weights": {"system": 0}})
    known = ", ".join(t.value for t in SemanticType)
    with pytest.raises(
        ValueError,
        match=rf"^adaptive_semantic: unknown semantic type 'sytem' in weights; known: {known}$",
    ):
        make_cache("adaptive_semantic", 4, {"initial_weights": {"sytem": 1.0}})


def test_saecache_timing_given_for_one_queue_keeps_the_seed_for_the_other():
    """mu / sigma as a dict may name chat, agentic or both; the other keeps the seed (2.28 /
    1.34); any other name is refused, naming the parameter."""
    p = SAECacheFixed(mu={"agentic": 3.0}, sigma={"chat": 0.5}).params()
    assert (p["mu"], p["sigma"]) == (
        {"chat": 2.28, "agentic": 3.0},
        {"chat": 0.5, "agentic": 1.34},
    )
    with pytest.raises(ValueError, match=r"^saecache: sigma is given for chat and agentic, not"):
        SAECache(sigma={"struct": 1.0})
