"""The claims' measurement record (skv/artifact/measurements.py): what it keeps, what it refuses,
and that every shipped full-run claim holds on the run the record names."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import make_claim as claim

from skv.artifact import claims as C
from skv.artifact import measurements as M
from skv.artifact.pipeline import load_claims

ROOT = Path(__file__).resolve().parents[1]
STEP = "fig_hit_rate_mooncake"


def doc(*claims: C.Claim) -> C.ClaimsFile:
    return C.ClaimsFile.model_validate({"claims": [c.model_dump() for c in claims]})


def full_run(build: Path, step: str, values: dict, revision: str, finished: str) -> None:
    (build / "cache").mkdir(parents=True, exist_ok=True)
    (build / "steps" / step).mkdir(parents=True, exist_ok=True)
    stamp = {"key": "k", "seconds": 1.0, "revision": revision, "finished": finished}
    (build / "cache" / f"{step}.json").write_text(json.dumps(stamp))
    (build / "steps" / step / "claims.json").write_text(json.dumps({"values": values}))


def test_record_keeps_the_values_claims_read_with_commit_and_date(tmp_path):
    d = doc(claim(value="v"))
    full_run(tmp_path / "b", STEP, {"v": 1.2, "other": 9}, "abc123def456", "2026-12-05T10:00:00")
    changed, refused = M.record(d, tmp_path / "b", tmp_path / "m.json")
    assert refused == [] and changed == [f"{STEP}: abc123def456 at 2026-12-05T10:00:00"]
    steps = M.load(tmp_path / "m.json")
    assert steps[STEP]["values"] == {"v": 1.2}
    assert M.labels(steps) == {STEP: "2026-12-05 `abc123d`"}
    # the same run again changes nothing; a later run replaces it
    assert M.record(d, tmp_path / "b", tmp_path / "m.json") == ([], [])
    full_run(tmp_path / "b", STEP, {"v": 1.3}, "fedcba987654", "2026-12-06T10:00:00")
    M.record(d, tmp_path / "b", tmp_path / "m.json")
    assert M.load(tmp_path / "m.json")[STEP]["revision"] == "fedcba987654"


def test_a_run_from_uncommitted_sources_is_refused_and_the_old_record_kept(tmp_path):
    d = doc(claim(value="v"))
    full_run(tmp_path / "b", STEP, {"v": 1.0}, "abc123def456", "2026-12-05T10:00:00")
    M.record(d, tmp_path / "b", tmp_path / "m.json")
    full_run(tmp_path / "b", STEP, {"v": 5.0}, "abc123def456+dirty", "2026-12-06T10:00:00")
    changed, refused = M.record(d, tmp_path / "b", tmp_path / "m.json")
    assert changed == [] and "+dirty" in refused[0] and "commit" in refused[0]
    assert M.load(tmp_path / "m.json")[STEP]["values"] == {"v": 1.0}


def test_check_fails_a_claim_its_recorded_run_does_not_support_and_names_a_missing_run():
    c = claim(value="v", expected=1.0, tolerance=0.5)
    rec = {STEP: {"revision": "abc", "finished": "2026-12-05T10:00:00", "values": {"v": 1.2}}}
    assert [r.status for r in M.check(doc(c), rec)] == ["ok"]
    rec[STEP]["values"]["v"] = 1.6  # the claim was not re-set after the run moved
    assert [r.status for r in M.check(doc(c), rec)] == ["FAIL"]
    row = M.check(doc(c), {})[0]
    assert row.status == "missing" and "measured record" in row.why


def test_every_full_run_claim_holds_on_its_recorded_measurement():
    steps = M.load()
    rows = M.check(load_claims(), steps)
    bad = C.failing(rows)
    assert not bad, C.format_rows(bad)
    for name, m in steps.items():
        assert len(m["revision"]) >= 7 and not m["revision"].endswith("+dirty"), name


def test_artifact_md_quotes_the_current_claims_table_with_the_measurements():
    table = C.markdown_table(load_claims(), M.labels(M.load()))
    assert table in (ROOT / "ARTIFACT.md").read_text(), (
        "ARTIFACT.md's claims table is stale: paste "
        "`python -m skv.artifact.pipeline check --markdown`"
    )
