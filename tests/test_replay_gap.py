"""The share of Belady's headroom over LRU that an online policy closes (replay study)."""

from __future__ import annotations

import pandas as pd
import pytest

from skv.experiments.replay import capacity as C
from skv.experiments.replay import session_gap as G


def _curve() -> pd.DataFrame:
    rows = []
    for cap, lru, belady, sae, ada in (
        ("1%", 0.20, 0.40, 0.25, 0.18),
        ("10%", 0.50, 0.50, 0.5, 0.5),
    ):
        for pol, v in (("lru", lru), ("belady", belady), ("saecache", sae), ("adaptive", ada)):
            rows.append({"capacity": cap, "policy": pol, "block_hit_rate": v})
    return pd.DataFrame(rows)


def test_gap_closed_is_the_share_of_the_bound_minus_baseline():
    g = C.gap_closed(_curve()).set_index(["capacity", "policy"])
    assert g.loc[("1%", "saecache"), "gap_share"] == pytest.approx(0.25)  # 0.05 of 0.20
    assert g.loc[("1%", "adaptive"), "gap_share"] == pytest.approx(-0.1)  # worse than lru
    assert g.loc[("1%", "saecache"), "vs_lru_pts"] == pytest.approx(5.0)
    assert g.loc[("1%", "saecache"), "belady_minus_lru_pts"] == pytest.approx(20.0)
    assert pd.isna(g.loc[("10%", "saecache"), "gap_share"])  # no headroom: no share
    assert ("1%", "lru") not in g.index and ("1%", "belady") not in g.index


def test_gap_share_over_seeds_is_per_seed():
    rows = []
    for seed, (lru, bel, sae) in enumerate([(0.2, 0.4, 0.3), (0.3, 0.4, 0.32), (0.1, 0.1, 0.1)]):
        for pol, v in (("lru", lru), ("belady", bel), ("saecache", sae)):
            rows.append({"seed": seed, "gap_s": 30.0, "policy": pol, "block_hit_rate": v})
    iv = G.gap_share(pd.DataFrame(rows), "saecache", 30, "block_hit_rate")
    assert iv["n"] == 2  # the seed with no headroom has no share
    assert iv["value"] == pytest.approx((0.5 + 0.2) / 2)
