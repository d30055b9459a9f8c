"""The ``quick:`` overrides every study config loader shares (``read_with_quick``)."""

from __future__ import annotations

import pytest

from skv.experiments.config import ConfigError, read_with_quick

DOC = """\
id: x
seeds: [0, 1, 2]
axes: {capacity: [0.1, 0.2], rate: [1, 2]}
other: {a: 1, b: 2}
quick:
  seeds: [0]
  axes: {capacity: [0.1]}
  other: {a: 9}
"""


def _write(tmp_path, text=DOC):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_named_keys_merge_key_by_key_and_the_others_are_replaced(tmp_path):
    data = read_with_quick(_write(tmp_path), "config", quick=True, merged=("axes",))
    assert data["seeds"] == [0]
    assert data["axes"] == {"capacity": [0.1], "rate": [1, 2]}
    assert data["other"] == {"a": 9}  # not named: replaced whole
    assert "quick" not in data


def test_without_names_every_mapping_over_a_mapping_merges(tmp_path):
    data = read_with_quick(_write(tmp_path), "config", quick=True)
    assert data["axes"] == {"capacity": [0.1], "rate": [1, 2]}
    assert data["other"] == {"a": 9, "b": 2}


def test_a_full_run_drops_the_overrides(tmp_path):
    data = read_with_quick(_write(tmp_path), "config", quick=False, merged=("axes",))
    assert data["seeds"] == [0, 1, 2] and data["axes"]["capacity"] == [0.1, 0.2]
    assert "quick" not in data


@pytest.mark.parametrize(
    "text",
    [
        "axes: [1, 2]\nquick: {axes: {capacity: [0.1]}}\n",
        "axes: {capacity: [1]}\nquick: {axes: [0.1]}\n",
    ],
)
def test_a_named_key_that_is_not_a_mapping_is_refused_by_name(tmp_path, text):
    with pytest.raises(ConfigError, match=r"axes and quick\.axes: expected mappings"):
        read_with_quick(_write(tmp_path, text), "config", quick=False, merged=("axes",))


@pytest.mark.parametrize(
    ("text", "match"),
    [("- 1\n- 2\n", "expected a mapping at top level"), ("a: 1\nquick: [1]\n", "quick: expected")],
)
def test_a_top_level_or_quick_that_is_not_a_mapping_is_refused(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        read_with_quick(_write(tmp_path, text), "config", quick=True)
