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
    (build / M.STAMPS).mkdir(parents=True, exist_ok=True)
    (build / "steps" / step).mkdir(parents=True, exist_ok=True)
    stamp = {"key": "k", "seconds": 1.0, "revision": revision, "finished": finished,
             "mode": "full"}  # fmt: skip
    (build / M.STAMPS / f"{step}.json").write_text(json.dumps(stamp))
    (build / "steps" / step / "claims.json").write_text(json.dumps({"values": values}))


def test_the_stamps_are_where_the_pipeline_writes_them():
    from skv.artifact.pipeline import Layout

    layout = Layout.for_run()
    assert layout.cache == layout.build / M.STAMPS


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


def _git(root: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_revision_is_dirty_for_changed_or_new_result_sources_only(tmp_path):
    from skv.artifact import timings

    repo = tmp_path / "r"
    (repo / "skv").mkdir(parents=True)
    (repo / "experiments").mkdir()
    (repo / "skv" / "a.py").write_text("x = 1\n")
    (repo / "experiments" / "claims.yaml").write_text("claims: []\n")
    (repo / "README.md").write_text("hi\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "add", "-A")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "c")
    clean = timings.revision(repo)
    assert clean and len(clean) == 12 and not clean.endswith("+dirty")
    (repo / "README.md").write_text("changed\n")  # not a source of results
    (repo / "experiments" / "claims.yaml").write_text("claims: [1]\n")  # read by no result
    (repo / "experiments" / "measurements.json").write_text("{}\n")  # written by record
    assert timings.revision(repo) == clean
    (repo / "skv" / "b.py").write_text("y = 2\n")  # a new module, not yet committed
    assert timings.revision(repo) == clean + "+dirty"
    (repo / "skv" / "b.py").unlink()
    (repo / "skv" / "a.py").write_text("x = 2\n")
    assert timings.revision(repo) == clean + "+dirty"
    assert timings.revision(tmp_path / "not_a_repo") is None


def test_the_pipeline_stamps_revision_time_and_mode_and_record_takes_full_runs_only(
    tmp_path, monkeypatch
):
    from skv.artifact import pipeline
    from skv.artifact.pipeline import Layout, run_pipeline

    monkeypatch.setattr(pipeline.timings, "revision", lambda root=None: "abcdef123456")
    step = "fig_saecache_tuning"  # reads no trace and no engine

    def fake_execute(s, params, lay, root):
        for rel in s.outputs:
            lay.output(rel).parent.mkdir(parents=True, exist_ok=True)
            lay.output(rel).write_text("x")
        d = lay.step_dir(s.name)
        d.mkdir(parents=True, exist_ok=True)
        (d / "claims.json").write_text(json.dumps({"values": {"tuned_ratio_vs_vllm": 1.0}}))

    monkeypatch.setattr(pipeline, "execute_notebook", fake_execute)
    d = doc(claim(step=step, value="tuned_ratio_vs_vllm"))
    for quick in (True, False):
        layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / ("bq" if quick else "b"))
        assert run_pipeline([step], quick=quick, layout=layout, echo=False)[0].status == "ran"
        stamp = json.loads((layout.cache / f"{step}.json").read_text())
        assert stamp["revision"] == "abcdef123456" and stamp["finished"][:2] == "20"
        assert stamp["mode"] == ("quick" if quick else "full")
        changed, refused = M.record(d, layout.build, tmp_path / "m.json")
        if quick:
            assert changed == [] and "not a full run (quick)" in refused[0]
        else:
            assert refused == [] and M.load(tmp_path / "m.json")[step]["revision"] == "abcdef123456"


def test_a_tree_that_moves_during_a_step_stamps_it_dirty(tmp_path, monkeypatch):
    from skv.artifact import pipeline
    from skv.artifact.pipeline import Layout, run_pipeline

    calls = []  # the run's start sees one commit, every later look another

    def revision(root=None):
        calls.append(root)
        return "abcdef123456" if len(calls) == 1 else "fedcba654321"

    monkeypatch.setattr(pipeline.timings, "revision", revision)

    def fake_execute(s, params, lay, root):
        for rel in s.outputs:
            lay.output(rel).parent.mkdir(parents=True, exist_ok=True)
            lay.output(rel).write_text("x")

    monkeypatch.setattr(pipeline, "execute_notebook", fake_execute)
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    run_pipeline(["fig_saecache_tuning"], layout=layout, echo=False)
    stamp = json.loads((layout.cache / "fig_saecache_tuning.json").read_text())
    assert stamp["revision"] == "abcdef123456+dirty"
