"""The claims check (skv/artifact/claims.py): statuses, the tolerance boundary, theses on
intervals, tolerances that must cover the seed spread, quick mode, and the shipped claims."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import make_claim as claim

from skv.artifact import claims as C
from skv.artifact.pipeline import STEPS, load_claims

ROOT = Path(__file__).resolve().parents[1]
STEP = "fig_hit_rate_mooncake"


def check(c: C.Claim, got, *, quick=False, skip=None, wrote=True) -> C.Row:
    return C.check_one(c, C.Produced.parse(got), quick=quick, skip_reason=skip, wrote=wrote)


def test_a_value_exactly_at_the_tolerance_passes_and_just_beyond_fails():
    c = claim(expected=1.0, tolerance=0.25)  # binary-exact numbers: the boundary is exact
    assert check(c, 1.25).status == "ok"
    assert check(c, 0.75).status == "ok"
    assert check(c, 1.2500001).status == "FAIL"
    assert check(c, 0.7499999).status == "FAIL"


def test_quick_mode_uses_its_own_expectation():
    c = claim()
    assert check(c, 2.05, quick=True).status == "ok"
    assert check(c, 1.0, quick=True).status == "FAIL"
    assert check(c, 1.0, quick=False).status == "ok"


def test_a_claim_without_a_quick_expectation_is_not_checked_in_quick_mode_with_the_reason():
    c = claim(quick={"not_checked": "too few requests for queueing"})
    row = check(c, 123.0, quick=True)
    assert row.status == "not checked"
    assert "too few requests" in row.why
    assert check(c, 1.0, quick=False).status == "ok"


def test_a_not_checked_value_a_quick_step_stopped_writing_is_missing_unless_marked_absent():
    """Unchecked in quick mode is not unwatched: a step that ran without the value (a renamed
    key, a notebook that stopped writing it) is missing; only a value the quick config leaves
    out on purpose (``absent``) is not."""
    c = claim(quick={"not_checked": "2 seeds are too few"})
    row = check(c, None, quick=True)
    assert row.status == "missing" and "not marked absent" in row.why
    assert check(c, None, quick=True, wrote=False).status == "not checked"  # step did not run
    assert check(c, None, quick=True, skip="no trace").status == "not checked"
    left_out = claim(quick={"not_checked": "quick leaves the policy out", "absent": True})
    assert check(left_out, None, quick=True).status == "not checked"
    with pytest.raises(ValueError, match="absent needs not_checked"):
        claim(quick={"expected": 1.0, "tolerance": 0.5, "absent": True})


def test_a_skipped_step_is_skipped_with_its_reason_not_missing():
    row = check(claim(), None, skip="trace not found; then ./reproduce.sh fig_x")
    assert row.status == "skipped"
    assert "./reproduce.sh" in row.why
    assert C.failing([row]) == []


def test_a_missing_value_nobody_explained_fails_the_check():
    row = check(claim(), None, wrote=True)
    assert row.status == "missing" and "wrote no value" in row.why
    row = check(claim(), None, wrote=False)
    assert row.status == "missing" and "has not run" in row.why
    assert C.failing([row]) == [row]


@pytest.mark.parametrize(
    ("expr", "ci", "ok"),
    [
        ("> 0", (0.1, 2.0), True),
        ("> 0", (-0.1, 2.0), False),
        ("< 0", (-2.0, -0.1), True),
        ("< 0", (-2.0, 0.1), False),
        ("~ 0", (-0.5, 0.5), True),
        ("~ 0", (0.1, 0.5), False),
        ("in [-1, 1]", (-0.5, 0.9), True),
        ("in [-1, 1]", (-0.5, 1.1), False),
        ("in [-1, 1]", (-1.1, 0.5), False),
        ("in [-1, 1]", (-1.0, 1.0), True),
        ("~ 0", (0.0, 0.0), True),
        ("~ 0", (-0.0, 1e-12), True),
        ("> 0", (0.0, 1.0), False),
        (">= 0", (0.0, 1.0), True),
        ("< 0", (-1.0, 0.0), False),
        (">= 1.5", (1.5, 2.0), True),
        ("<= -1", (-3.0, -0.9), False),
    ],
)
def test_a_thesis_is_judged_on_the_whole_interval(expr, ci, ok):
    p = C.Produced((ci[0] + ci[1]) / 2, ci, 5)
    assert C.holds(expr, p) is ok


def seeded(**over) -> C.Claim:
    return claim(tolerance_basis="ci95 over seeds 0-4", **over)


def test_a_false_thesis_fails_even_inside_the_tolerance():
    c = seeded(expected=0.5, tolerance=1.0, holds="> 0", quick={"not_checked": "why"})
    assert check(c, {"value": 0.5, "ci95": [0.1, 0.9], "n": 5}).status == "ok"
    row = check(c, {"value": 0.5, "ci95": [-0.1, 1.1], "n": 5})
    assert row.status == "FAIL" and "thesis" in row.why


def test_a_seeded_claim_needs_an_interval_and_a_tolerance_that_covers_it():
    c = seeded(expected=1.0, tolerance=0.3)
    assert check(c, {"value": 1.0, "ci95": [0.75, 1.3], "n": 5}).status == "ok"
    row = check(c, {"value": 1.0, "ci95": [0.5, 1.5], "n": 5})
    assert row.status == "FAIL" and "narrower than the 95% interval" in row.why
    row = check(c, 1.0)
    assert row.status == "FAIL" and "no interval" in row.why


def test_the_tolerance_must_cover_the_wider_side_of_an_asymmetric_interval():
    c = seeded(expected=1.0, tolerance=0.3)
    assert check(c, {"value": 1.0, "ci95": [0.9, 1.3], "n": 5}).status == "ok"
    row = check(c, {"value": 1.0, "ci95": [0.9, 1.31], "n": 5})  # only the upper side is wide
    assert row.status == "FAIL" and "0.31" in row.why
    row = check(c, {"value": 1.0, "ci95": [0.69, 1.1], "n": 5})  # only the lower side
    assert row.status == "FAIL"


def test_a_seeded_claim_needs_five_seeds_in_full_runs_and_two_in_quick_runs():
    c = seeded(expected=1.0, tolerance=0.3, quick={"expected": 1.0, "tolerance": 0.3})
    assert check(c, {"value": 1.0, "ci95": [1.0, 1.0], "n": 5}).status == "ok"
    row = check(c, {"value": 1.0, "ci95": [1.0, 1.0], "n": 1})  # one seed: zero width
    assert row.status == "FAIL" and "rests on 1 seeds; needs 5" in row.why
    assert check(c, {"value": 1.0, "ci95": [1.0, 1.0], "n": 4}).status == "FAIL"
    assert check(c, {"value": 1.0, "ci95": [1.0, 1.0], "n": 3}, quick=True).status == "ok"
    assert check(c, {"value": 1.0, "ci95": [1.0, 1.0], "n": 1}, quick=True).status == "FAIL"


def test_the_quick_thesis_not_the_full_one_is_judged_in_quick_runs():
    c = seeded(
        expected=1.0,
        tolerance=5.0,
        holds="> 0",
        quick={"expected": 0.0, "tolerance": 5.0, "holds": "~ 0"},
    )
    both = {"value": 0.5, "ci95": [-0.5, 1.5], "n": 5}
    assert check(c, both, quick=True).status == "ok"  # contains 0: the quick thesis holds
    assert check(c, both).status == "FAIL"  # the full thesis needs it above 0


def test_a_non_finite_value_fails():
    assert check(claim(), float("nan")).status == "FAIL"
    assert check(claim(expected=1.0, tolerance=1e9), float("inf")).status == "FAIL"


def test_old_values_of_a_step_that_cannot_run_now_are_skipped_not_ok(tmp_path):
    """A trace deleted since the last run: the leftover value must not pass as current."""
    d = tmp_path / STEP
    d.mkdir()
    (d / "claims.json").write_text(json.dumps({"values": {"v": 1.0}}))
    doc = C.ClaimsFile(claims=[claim()])
    rows = C.check_all(doc, lambda s: tmp_path / s, quick=False, skip_reason=lambda s: None)
    assert rows[0].status == "ok"
    rows = C.check_all(doc, lambda s: tmp_path / s, quick=False, skip_reason=lambda s: "gone")
    assert rows[0].status == "skipped" and rows[0].why == "gone"


def test_a_deterministic_claim_needs_no_interval():
    assert check(claim(), 1.2).status == "ok"


def test_a_claim_on_repeated_runs_needs_no_interval_and_says_runs_in_the_table():
    c = claim(tolerance_basis="spread over 3 runs (1.0, 1.1, 1.3)", expected=1.2, tolerance=0.2)
    assert not c.seeded
    assert check(c, 1.3).status == "ok" and check(c, 1.5).status == "FAIL"
    doc = C.ClaimsFile(claims=[c], no_claims={})
    assert "(runs)" in C.markdown_table(doc)
    with pytest.raises(ValueError, match="tolerance_basis"):
        claim(tolerance_basis="spread over some runs")


@pytest.mark.parametrize(
    ("over", "msg"),
    [
        ({"quick": {}}, "not_checked"),
        ({"quick": {"not_checked": "why", "tolerance": 1}}, "excludes"),
        ({"holds": "bigger"}, "holds"),
        ({"holds": "in [1, -1]"}, "lower end"),
        ({"holds": "> 2", "quick": {"not_checked": "why"}}, "contradicts"),
        ({"holds": "> 0"}, "quick run's thesis"),
        ({"source": "seed", "reference_value": "x"}, "verdict"),
        ({"tolerance_basis": "eyeballed"}, "tolerance_basis"),
        ({"tolerance": -1}, "tolerance"),
        ({"source": "vibes"}, "source"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_malformed_claims_are_rejected_naming_the_claim_and_field(tmp_path, over, msg):
    doc = {
        "claims": [
            {
                "id": "bad_one",
                "text": "t",
                "compares": "c",
                "source": "measured",
                "source_note": "n",
                "step": STEP,
                "value": "v",
                "expected": 1.0,
                "tolerance": 0.1,
                "tolerance_basis": "deterministic",
                "quick": {"expected": 1.0, "tolerance": 0.1},
                **over,
            }
        ]
    }
    f = tmp_path / "claims.yaml"
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        C.load_claims(f, STEPS)
    assert "bad_one" in str(err.value) and msg in str(err.value)
    assert str(f) in str(err.value)


def test_an_unknown_step_is_rejected(tmp_path):
    f = tmp_path / "claims.yaml"
    f.write_text(json.dumps({"claims": [], "no_claims": {"fig_nope": "x"}}))
    with pytest.raises(ValueError, match="fig_nope"):
        C.load_claims(f, STEPS)


def test_summary_counts_every_status():
    rows = [
        check(claim(), 1.0),
        check(claim(), 9.0),
        check(claim(), None, skip="no trace"),
        check(claim(quick={"not_checked": "why"}), 1.0, quick=True),
        check(claim(), None),
    ]
    line = C.summary_line(rows)
    assert line == "claims: 1 ok, 1 FAIL, 1 skipped, 1 not checked, 1 missing"
    table = C.format_rows(rows)
    assert "no trace" in table and "quick mode: why" in table


# ---- the shipped claims -------------------------------------------------------------------


def test_shipped_claims_validate_and_every_claim_is_a_comparison_with_a_source():
    doc = load_claims()
    assert len(doc.claims) >= 10
    for c in doc.claims:
        assert c.compares and c.source_note, c.id
        if c.source in ("paper", "seed"):
            assert c.reference_value, f"{c.id}: a paper or seed claim shows the reference value"


def test_seeded_claims_say_how_many_seeds_and_every_claim_has_a_quick_answer():
    for c in load_claims().claims:
        if c.seeded:
            assert "seeds 0-4" in c.tolerance_basis, c.id
        assert c.quick.not_checked or c.quick.expected is not None, c.id


def test_the_seeds_thesis_is_claimed_for_every_stress_config_against_lru_and_another_baseline():
    from skv.experiments.config import load_config
    from skv.experiments.runner import suite_configs

    values = [c.value for c in load_claims().claims if c.step == "tab_aggregate_summary"]
    for path in suite_configs(ROOT / "experiments" / "semantickv"):
        cfg = load_config(path)
        mine = [v for v in values if v.startswith(f"{cfg.id}_adaptive_vs_")]
        for metric in ("hit_pts", "ttft_pct"):
            assert f"{cfg.id}_adaptive_vs_lru_{metric}" in mine, (cfg.id, metric)
            others = [v for v in mine if v.endswith(metric) and "_vs_lru_" not in v]
            assert len(others) == 1, f"{cfg.id}: one named best-other baseline on {metric}"
            comparator = others[0].removeprefix(f"{cfg.id}_adaptive_vs_").removesuffix(f"_{metric}")
            assert comparator in {p.key for p in cfg.policies}, (cfg.id, comparator)


def test_no_claim_restates_a_config_or_a_reader_rule():
    doc = load_claims()
    assert not {"experiments", "seeds"} & {c.value for c in doc.claims}
    assert "tab_reuse_by_type_claude_code" not in {c.step for c in doc.claims}


def test_claims_skipped_for_the_same_reason_share_one_note_line():
    rows = [
        check(claim(id=f"c{i}"), None, skip="no trace; then ./reproduce.sh x") for i in range(3)
    ]
    notes = [ln for ln in C.format_rows(rows).splitlines() if "no trace" in ln]
    assert notes == ["  c0, c1, c2 (skipped): no trace; then ./reproduce.sh x"]


def test_quick_checks_no_timing_claim_of_a_timed_engine_step():
    """--quick runs the steps that time an engine beside other steps (skv.artifact.pipeline),
    so whatever quick checks of them must be a count of cached tokens, not a time."""
    timing = re.compile(r"TTFT|ITL|TPOT|E2E|latency|QPS|throughput|SLO|\bms\b|second", re.I)
    timed = {n for n, s in STEPS.items() if s.measures_time}
    checked = [
        c for c in load_claims().claims
        if c.step in timed and not c.quick.not_checked
    ]  # fmt: skip
    assert checked, "no quick claim on a timed step: the guard below would check nothing"
    for c in checked:
        assert c.unit in ("fraction", "points"), (c.id, c.unit)
        assert not timing.search(c.compares), (c.id, c.compares)
