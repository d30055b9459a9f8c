"""The workloads' Zipf sampler: exact probabilities and a goodness-of-fit test on draws.

``ZipfSampler(n, alpha)`` promises ``P(item i) = (i + 1) ** -alpha / H`` for items 0..n-1, with
``H = sum_{k=1..n} k ** -alpha`` (item 0 the most popular). The probabilities are checked against
that formula computed independently (exact rationals for alpha = 1), and 20,000 seeded draws of
each sampling method against them with a chi-square test and a binomial bound on item 0.
For n = 20, alpha = 1: P(0) = 1 / H_20 = 0.2780; a rank off by one (weights (i + 2) ** -alpha)
would give 0.5 / (H_21 - 1) = 0.1890, a shift of the drawn items by one P(0) = 0.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from skv.workloads import ZipfSampler

DRAWS = 20_000


def zipf_pmf(n: int, alpha: float) -> list[float]:
    """(i + 1) ** -alpha / H, with H summed in the order of increasing rank."""
    weights = [(i + 1) ** -alpha for i in range(n)]
    h = math.fsum(weights)
    return [w / h for w in weights]


def test_alpha_one_probabilities_are_one_over_rank_times_harmonic_number():
    h20 = sum(Fraction(1, k) for k in range(1, 21))  # 55835135 / 15519504
    z = ZipfSampler(20, 1.0)
    assert len(z.probs) == 20
    for i, p in enumerate(z.probs):
        assert p == pytest.approx(float(Fraction(1, i + 1) / h20), rel=1e-13)
    assert z.probs[0] == pytest.approx(0.27795, abs=1e-5)
    assert math.fsum(z.probs) == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize(("n", "alpha"), [(20, 1.0), (100, 1.2), (7, 0.5), (5, 3.0), (10, 0.0)])
def test_probabilities_are_rank_power_over_the_normaliser(n: int, alpha: float):
    z = ZipfSampler(n, alpha)
    assert z.probs.tolist() == pytest.approx(zipf_pmf(n, alpha), rel=1e-13)
    assert all(a > b for a, b in zip(z.probs, z.probs[1:], strict=False)) or alpha == 0.0
    if alpha == 0.0:
        assert z.probs.tolist() == pytest.approx([1 / n] * n, rel=1e-15)


def test_a_one_item_catalogue_always_draws_it_and_an_empty_one_is_rejected():
    z = ZipfSampler(1, 2.0)
    assert z.probs.tolist() == [1.0]
    assert z.sample(np.random.default_rng(0), 50) == [0] * 50
    with pytest.raises(ValueError, match="catalogue size"):
        ZipfSampler(0, 1.0)


def _check_fit(draws: list[int], n: int, alpha: float) -> None:
    pmf = np.array(zipf_pmf(n, alpha))
    counts = np.bincount(draws, minlength=n)
    assert len(counts) == n, "a draw fell outside the catalogue"
    expected = pmf * len(draws)
    assert expected.min() >= 5  # the chi-square approximation holds bin by bin
    _, p = stats.chisquare(counts, expected)
    assert p > 1e-3, f"chi-square p = {p:.2e}: draws do not follow Zipf({alpha}) over {n}"
    # item 0 alone: within 4 binomial standard deviations (about 250 of ~5,556 draws)
    sd = math.sqrt(len(draws) * pmf[0] * (1 - pmf[0]))
    assert abs(counts[0] - expected[0]) <= 4 * sd, (counts[0], expected[0])


@pytest.mark.parametrize(("n", "alpha"), [(20, 1.0), (50, 1.2)])
def test_draws_fit_the_distribution(n: int, alpha: float):
    z = ZipfSampler(n, alpha)
    _check_fit(z.sample(np.random.default_rng(11), DRAWS), n, alpha)


def test_one_at_a_time_draws_fit_the_distribution():
    z = ZipfSampler(20, 1.0)
    rng = np.random.default_rng(12)
    _check_fit([z.sample_one(rng) for _ in range(DRAWS)], 20, 1.0)


def test_the_first_of_distinct_draws_is_a_plain_zipf_draw():
    """``sample_distinct``'s first item is its first draw, unconditioned: Zipf itself."""
    z = ZipfSampler(20, 1.0)
    rng = np.random.default_rng(13)
    _check_fit([z.sample_distinct(rng, 3)[0] for _ in range(DRAWS)], 20, 1.0)
