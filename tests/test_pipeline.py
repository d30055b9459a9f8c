"""The paper pipeline: registry consistency, one notebook executed by papermill, caching,
missing traces, claims checking."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import time
from pathlib import Path

import nbformat
import pytest

from skv.artifact import pipeline
from skv.artifact.pipeline import STEPS, Layout, check_claims, load_claims, run_pipeline

ROOT = Path(__file__).resolve().parents[1]
REQUIRED_PARAMS = ("quick", "config", "output_dir", "seed")
MOONCAKE_STEP = "fig_hit_rate_mooncake"


def _parameters_cell(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path}: needs exactly one cell tagged 'parameters'"
    return cells[0].source


def test_every_step_has_a_notebook_with_a_parameters_cell_and_a_config():
    for step in STEPS.values():
        nb_path = ROOT / step.notebook
        assert nb_path.is_file(), step.notebook
        source = _parameters_cell(nb_path)
        for name in (*REQUIRED_PARAMS, *(f"{d}_dir" for d in step.depends)):
            assert re.search(rf"^{name}\s*=", source, re.M), f"{step.notebook}: no {name}"
        assert (ROOT / step.config).exists(), f"{step.name}: config {step.config} missing"
        assert step.outputs, step.name


def test_every_notebook_in_the_folder_is_a_registered_step():
    found = {p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").rglob("*.ipynb")}
    assert found == {s.notebook for s in STEPS.values()}


def test_a_study_shares_its_name_across_notebooks_code_and_configs():
    """notebooks/<study>/, skv/experiments/<study>/ (a package) and experiments/<study>/: a
    reader who found one finds the other two."""
    for step in STEPS.values():
        assert step.notebook.startswith(f"notebooks/{step.study}/"), step.name
        assert (ROOT / "skv" / "experiments" / step.study / "__init__.py").is_file(), step.name
        assert (ROOT / "experiments" / step.study).is_dir(), step.name
        assert step.config.startswith(f"experiments/{step.study}"), step.name


def test_notebooks_are_stored_without_outputs():
    for path in (ROOT / "notebooks").rglob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path.name


def test_every_step_has_claims_or_an_explicit_no_claims_marker_with_a_reason():
    claims = load_claims()
    with_claims = {c.step for c in claims.claims}
    no_claims = set(claims.no_claims)
    assert not with_claims & no_claims
    assert set(STEPS) <= with_claims | no_claims
    assert all(why.strip() for why in claims.no_claims.values())


def test_every_figure_the_paper_includes_is_produced_by_a_step_and_every_figure_is_included():
    tex = re.sub(r"(?<!\\)%.*", "", (ROOT / "paper" / "main.tex").read_text())  # no comments
    produced = {Path(o).stem for s in STEPS.values() for o in s.outputs if o.endswith(".pdf")}
    included = set(re.findall(r"\\skvfig(?:\[[^]]*\])?\{([^}]+)\}", tex))
    assert included <= produced, f"no step produces {sorted(included - produced)}"
    assert produced <= included, f"the paper leaves out {sorted(produced - included)}"


def test_dependencies_are_registered_steps_and_selection_pulls_them_in():
    for s in STEPS.values():
        assert set(s.depends) <= set(STEPS)
    chosen = [s.name for s in pipeline.select(["fig_policy_comparison"])]
    assert chosen == ["tab_aggregate_summary", "fig_policy_comparison"]


@pytest.fixture
def tiny_traces(tmp_path, monkeypatch):
    """A trace directory holding the tiny Mooncake fixture under the real trace's name."""
    tdir = tmp_path / "traces"
    (tdir / "mooncake").mkdir(parents=True)
    rng = random.Random(0)
    with open(tdir / "mooncake" / "conversation_trace.jsonl", "w") as f:
        for i in range(400):  # ~1000 unique blocks: every quick capacity is >= 1 block
            ids = [0] + [pos * 1000 + rng.randrange(60) for pos in range(1, 5)]
            rec = {
                "timestamp": 3000 * i,
                "input_length": 512 * 5 - 7,
                "output_length": 9,
                "hash_ids": ids,
            }
            f.write(json.dumps(rec) + "\n")
    monkeypatch.setenv("SKV_TRACE_DIR", str(tdir))
    return tdir


def test_a_notebook_runs_in_quick_mode_writes_its_outputs_and_is_cached_the_second_time(
    tmp_path, tiny_traces
):
    layout = Layout(tmp_path / "figs", tmp_path / "tables", tmp_path / "build")
    first = run_pipeline([MOONCAKE_STEP], quick=True, layout=layout, echo=False)
    assert [(r.step, r.status) for r in first] == [(MOONCAKE_STEP, "ran")], first[0].note
    for rel in STEPS[MOONCAKE_STEP].outputs:
        out = layout.output(rel)
        assert out.is_file() and out.stat().st_size > 1000, out
    claims = json.loads((layout.step_dir(MOONCAKE_STEP) / "claims.json").read_text())
    assert claims["step"] == MOONCAKE_STEP
    assert 0 < claims["values"]["ceiling_block_hit_rate"] <= 1
    executed = nbformat.read(layout.notebooks / f"{MOONCAKE_STEP}.ipynb", as_version=4)
    assert any(c.get("outputs") for c in executed.cells if c.cell_type == "code")
    assert "run.log" in {p.name for p in layout.build.iterdir()}

    second = run_pipeline([MOONCAKE_STEP], quick=True, layout=layout, echo=False)
    assert second[0].status == "cached"
    assert "cached" in layout.log.read_text() or "CACHED" in layout.log.read_text()


def test_a_changed_config_or_parameter_changes_the_cache_key(tmp_path):
    step = STEPS[MOONCAKE_STEP]
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    params = pipeline.notebook_params(step, layout, quick=True, seed=0, root=ROOT)
    key = pipeline.step_key(step, params, [], "src")
    assert key == pipeline.step_key(step, params, [], "src")
    assert key != pipeline.step_key(step, {**params, "seed": 1}, [], "src")
    assert key != pipeline.step_key(step, params, [], "other source")
    assert key != pipeline.step_key(step, params, ["dep changed"], "src")


def test_an_optional_trace_appearing_changes_the_cache_key(tmp_path, monkeypatch):
    """tab_saecache_reuse_by_type runs without the Claude Code trace (an empty column); adding
    the trace later must rerun it, not leave the empty column cached."""
    step = STEPS["tab_saecache_reuse_by_type"]
    assert step.optional_traces == ("weka_cc",) and not step.needs_traces
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    params = pipeline.notebook_params(step, layout, quick=True, seed=0, root=ROOT)
    (tmp_path / "traces").mkdir()
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "traces"))
    absent = pipeline.step_key(step, params, [], "src")
    assert pipeline.skip_reason(step.name) is None  # an optional trace never skips the step
    (tmp_path / "traces" / "weka_cc").mkdir()
    (tmp_path / "traces" / "weka_cc" / "s.jsonl").write_text("{}\n")
    assert pipeline.step_key(step, params, [], "src") != absent


def test_a_missing_trace_marks_the_step_skipped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "no_traces_here"))
    layout = Layout(tmp_path / "figs", tmp_path / "tables", tmp_path / "build")
    res = run_pipeline([MOONCAKE_STEP, "fig_hit_rate_claude_code"], layout=layout, echo=False)
    assert [r.status for r in res] == ["skipped", "skipped"]
    assert "mooncake/conversation_trace.jsonl" in res[0].note
    assert "not found" in res[0].note
    assert not (layout.figures).exists() or not list(layout.figures.iterdir())
    assert "skipped" in pipeline.summary_table(res, 0.0)


def test_check_reads_values_from_the_step_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "skip_reason", lambda name, quick=False: None)  # traces or not
    claims = tmp_path / "claims.yaml"
    common = (
        "text: t, compares: c, source: measured, source_note: n, tolerance_basis: deterministic,"
        " quick: {not_checked: why}"
    )
    claims.write_text(
        "claims:\n"
        f"  - {{id: a, step: fig_hit_rate_mooncake, value: x, expected: 0.5, tolerance: 0.01,"
        f" {common}}}\n"
        f"  - {{id: b, step: fig_hit_rate_mooncake, value: y, expected: 0.5, tolerance: 0.01,"
        f" {common}}}\n"
        f"  - {{id: c, step: fig_hit_rate_mooncake, value: z, expected: 1, tolerance: 0,"
        f" {common}}}\n"
    )
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    d = layout.step_dir("fig_hit_rate_mooncake")
    d.mkdir(parents=True)
    (d / "claims.json").write_text(json.dumps({"step": "x", "values": {"x": 0.505, "y": 0.6}}))
    rows = check_claims(layout=layout, claims_path=claims, echo=False)
    assert [r.status for r in rows] == ["ok", "FAIL", "missing"]
    rows = check_claims(quick=True, layout=layout, claims_path=claims, echo=False)
    # not checked in quick mode, but a value the step ran without is still missing
    assert [r.status for r in rows] == ["not checked", "not checked", "missing"]


def test_a_claim_on_a_missing_optional_trace_is_skipped_naming_it(tmp_path, monkeypatch):
    """A step that runs without an optional trace leaves that trace's values out; the claims
    on them are skipped with the trace named (not 'missing', which fails the check), the
    step's other claims are checked as usual."""
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "no_traces_here"))
    claims = tmp_path / "claims.yaml"
    common = (
        "text: t, compares: c, source: measured, source_note: n, tolerance_basis: deterministic,"
        " step: fig_policy_leaderboard, expected: 0.5, tolerance: 0.01, quick: {not_checked: w}"
    )
    claims.write_text(
        "claims:\n"
        f"  - {{id: a, value: x, needs_traces: [weka_cc], {common}}}\n"
        f"  - {{id: b, value: y, {common}}}\n"
    )
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    d = layout.step_dir("fig_policy_leaderboard")
    d.mkdir(parents=True)
    (d / "claims.json").write_text(json.dumps({"step": "x", "values": {"y": 0.5}}))
    rows = check_claims(layout=layout, claims_path=claims, echo=False)
    assert [r.status for r in rows] == ["skipped", "ok"]
    assert "weka_cc" in rows[0].why and "optional trace" in rows[0].why


def test_shipped_claims_name_known_steps_and_unique_ids():
    claims = load_claims()
    assert claims.claims, "claims.yaml states no claim"
    ids = [c.id for c in claims.claims]
    assert len(ids) == len(set(ids))
    for c in claims.claims:  # a claim's own traces are optional ones of its step
        assert set(c.needs_traces) <= set(pipeline.STEPS[c.step].optional_traces), c.id


def test_every_claim_the_paper_cites_is_in_claims_yaml():
    tex = (ROOT / "paper" / "main.tex").read_text().split(r"\begin{document}", 1)[1]
    cited = set(re.findall(r"\\(?:claim|thesis)\{([^}]+)\}", tex))
    known = {c.id for c in load_claims().claims}
    assert cited, "the paper cites no claims"
    assert cited <= known, f"cited but not in experiments/claims.yaml: {sorted(cited - known)}"
    assert known <= cited, f"claims the paper never cites: {sorted(known - cited)}"


def _fake_notebooks(monkeypatch, tmp_path, *, quick: bool = True):
    """Route the pipeline into tmp_path and replace papermill by a writer of each step's
    outputs and of the values its claims expect (so only skips can make claims not ok)."""
    layout = Layout(tmp_path / "figs", tmp_path / "tables", tmp_path / "build")
    monkeypatch.setattr(
        pipeline.Layout, "for_run", classmethod(lambda cls, root=ROOT, quick=False: layout)
    )
    doc = load_claims()

    def fake_execute(step, params, lay, root):
        for rel in step.outputs:
            out = lay.output(rel)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("x")
        values = {}
        for c in doc.claims:
            if c.step == step.name:
                exp = c.expectation(quick)
                e = c.expected if exp.expected is None else exp.expected
                lo = hi = e
                if exp.holds and exp.holds.strip().startswith("~"):  # an interval holding t
                    t = float(exp.holds.strip()[1:])
                    lo, hi = min(e, t), max(e, t)
                values[c.value] = {"value": e, "ci95": [lo, hi], "n": 5} if c.seeded else e
        d = lay.step_dir(step.name)
        d.mkdir(parents=True, exist_ok=True)
        (d / "claims.json").write_text(json.dumps({"step": step.name, "values": values}))

    monkeypatch.setattr(pipeline, "execute_notebook", fake_execute)
    return layout, doc


def test_main_run_passes_with_no_traces_and_no_engine_and_says_how_to_enable_them(
    tmp_path, monkeypatch, capsys
):
    """A reviewer's first run: no trace directory, no engine venv. Exit 0; the claims of the
    skipped steps are 'skipped' with the reason and the command that enables them."""
    (tmp_path / "empty_traces").mkdir()
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "empty_traces"))
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "no_engine_venv"))
    layout, doc = _fake_notebooks(monkeypatch, tmp_path)
    assert pipeline.main(["run", "--quick", "-j", "1"]) == 0
    out = capsys.readouterr().out
    needs = {s.name for s in STEPS.values() if s.needs_traces or s.needs_engine}
    # (a claim the quick run does not check says "not checked" whether or not its step ran)
    skipped_claims = [
        c.id for c in doc.claims if (c.step in needs or c.needs_traces) and not c.quick.not_checked
    ]
    assert skipped_claims, "no claim depends on a trace or the engine: the test proves nothing"
    table: dict[str, str] = {}
    for line in out.splitlines():  # the table's row comes before the claim's note line
        if line.split():
            table.setdefault(line.split()[0], line)
    for cid in skipped_claims:
        assert table[cid].rstrip().endswith("skipped"), table[cid]
    assert "scripts/setup_vllm.sh" in out
    assert "then ./reproduce.sh --quick fig_fidelity_vllm" in out
    assert "then ./reproduce.sh --quick fig_hit_rate_mooncake" in out
    assert "kvcache-ai/Mooncake" in out  # where to get the missing trace
    summary = [ln for ln in out.splitlines() if ln.startswith("claims: ")][-1]
    assert " 0 FAIL" in summary and " 0 missing" in summary
    assert f"{len(skipped_claims)} skipped" in summary
    # the paper's generated layout names the skipped figures and how to make them
    gen = (layout.paper() / "generated" / "layout.tex").read_text()
    assert "skip:fig_fidelity_vllm" in gen and "setup" in gen

    # the check alone says the same, and exits 0
    assert pipeline.main(["check", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "scripts/setup_vllm.sh" in out and "skipped" in out


def test_main_run_fails_on_a_wrong_value_and_on_a_missing_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "none"))
    layout, _ = _fake_notebooks(monkeypatch, tmp_path)
    assert pipeline.main(["run", "--quick", "-j", "1"]) == 0
    f = layout.step_dir("tab_aggregate_summary") / "claims.json"
    data = json.loads(f.read_text())
    key = next(iter(data["values"]))
    data["values"][key]["value"] += 50.0
    f.write_text(json.dumps(data))
    assert pipeline.main(["check", "--quick"]) == 1
    assert "FAIL" in capsys.readouterr().out
    del data["values"][key]
    f.write_text(json.dumps(data))
    assert pipeline.main(["check", "--quick"]) == 1
    assert "wrote no value" in capsys.readouterr().out


def test_a_failed_step_whose_claims_quick_does_not_check_is_named_last(
    tmp_path, monkeypatch, capsys
):
    """A step with no claim the quick run checks can fail with every claim still 'ok' or
    'not checked': the run exits 1 and its last lines name the step, its error and its log
    (a CI log shows its tail)."""
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "none"))
    layout, doc = _fake_notebooks(monkeypatch, tmp_path)
    name = "fig_cacheroute_load"
    assert not [c for c in doc.claims if c.step == name and not c.quick.not_checked]
    writes = pipeline.execute_notebook

    def failing_one(step, params, lay, root):
        if step.name == name:
            raise RuntimeError("papermill exited 1: | ValueError: boom")
        writes(step, params, lay, root)

    monkeypatch.setattr(pipeline, "execute_notebook", failing_one)
    assert pipeline.main(["run", "--quick", "-j", "1"]) == 1
    out = capsys.readouterr().out
    summary = out.index("claims: ")
    tail = out[summary:].splitlines()
    assert " 0 FAIL" in tail[0] and " 0 missing" in tail[0]
    assert tail[1:] == [
        "",
        "1 step(s) FAILED:",
        f"  {name}: papermill exited 1: | ValueError: boom",
        f"    log: {layout.step_dir(name) / 'papermill.log'}",  # the file execute_notebook writes
    ]


def test_the_run_log_holds_a_timing_table_with_the_install_time(tmp_path):
    install = tmp_path / "install.json"
    install.write_text(json.dumps({"seconds": 61.25, "finished": "2026-11-30T10:00:00"}))
    res = [pipeline.Result("fig_a", "ran", 12.0), pipeline.Result("fig_b", "skipped", 0.0, "x|y")]
    table = pipeline.summary_table(res, 12.5, install)
    lines = table.splitlines()
    assert lines[0] == "| step | status | seconds | note |"
    assert "| (install .venv) |" in lines[2] and "61.2" in lines[2]
    assert "| fig_b | skipped | 0.0 | x/y |" in table
    assert lines[-1].startswith("| total (notebooks) | | 12.5")


def test_a_failed_rerun_removes_the_previous_runs_values(tmp_path, monkeypatch):
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    old = layout.step_dir(MOONCAKE_STEP) / "claims.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"values": {"x": 1}}))

    def failing(step, params, lay, root):
        raise RuntimeError("papermill exited 1")

    monkeypatch.setattr(pipeline, "execute_notebook", failing)
    monkeypatch.setattr(pipeline, "skip_reason", lambda name, quick=False: None)
    res = run_pipeline([MOONCAKE_STEP], layout=layout, echo=False, force=True)
    assert res[0].status == "failed"
    assert not old.exists()


def test_a_notebook_opened_from_notebooks_dir_moves_to_the_repository_root(tmp_path, monkeypatch):
    from skv.experiments.notebook import at_repo_root

    (tmp_path / "experiments").mkdir()
    (tmp_path / "notebooks" / "replay").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "notebooks" / "replay")  # a study's folder
    assert at_repo_root() == tmp_path
    monkeypatch.chdir(tmp_path / "notebooks")
    assert at_repo_root() == tmp_path
    assert at_repo_root() == tmp_path  # at the root already: nothing moves
    monkeypatch.chdir(tmp_path / "experiments")
    assert at_repo_root() == tmp_path / "experiments"


def test_every_notebook_moves_to_the_root_right_after_its_parameters():
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        i = next(k for k, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        assert "at_repo_root()" in nb.cells[i + 1].source, path.name


def test_quick_figures_are_stamped_and_say_when_engine_times_shared_the_cpu():
    timed, untimed = STEPS["fig_fidelity_load"], STEPS["fig_repurpose_vllm"]
    assert pipeline.figure_stamp(timed, quick=False) is None
    assert pipeline.figure_stamp(untimed, quick=False) is None
    assert "--quick" in pipeline.figure_stamp(untimed, quick=True)
    assert "shared" not in pipeline.figure_stamp(untimed, quick=True)
    assert "shared with other steps" in pipeline.figure_stamp(timed, quick=True)


def _scheduled(monkeypatch, tmp_path, names, *, quick=False, jobs=4, record=None, sleep=None):
    """Run ``names`` through the pipeline with notebooks that sleep (``sleep(step)`` seconds,
    0.15 by default) and a timing record ``record`` (empty: registry order); returns
    ``(spans, overlap)``: each step's (start, end) and whether two steps overlapped."""
    spans: dict[str, tuple[float, float]] = {}

    def fake_execute(step, params, layout, root):
        t0 = time.monotonic()
        time.sleep(sleep(step) if sleep else 0.15)
        for rel in step.outputs:
            out = layout.output(rel)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("x")
        spans[step.name] = (t0, time.monotonic())

    monkeypatch.setattr(pipeline, "execute_notebook", fake_execute)
    monkeypatch.setattr(pipeline, "missing_engine", lambda step: None)
    monkeypatch.setattr(pipeline, "missing_traces", lambda step: None)
    mode = "quick" if quick else "full"
    rec = {"phases": {}, "runs": {}, "steps": {mode: record or {}}}
    monkeypatch.setattr(pipeline.timings, "load", lambda *a, **k: rec)
    layout = Layout(tmp_path / "f", tmp_path / "t", tmp_path / "b")
    res = run_pipeline(names, quick=quick, jobs=jobs, layout=layout, echo=False)
    assert {r.status for r in res} == {"ran"}

    def overlap(a: str, b: str) -> bool:
        (a0, a1), (b0, b1) = spans[a], spans[b]
        return not (a1 <= b0 or b1 <= a0)

    return spans, overlap


def test_timed_steps_run_alone_and_servers_one_at_a_time(tmp_path, monkeypatch):
    """Full run: a step that measures engine time shares the CPU with nothing; an engine step
    that does not (cache hits) runs beside a simulation, never beside another server; the
    quality probe (engine venv, no server) beside anything; simulations side by side."""
    # routing as an untimed server step, so two of them can meet
    monkeypatch.setitem(
        pipeline.STEPS, "fig_routing_vllm",
        dataclasses.replace(STEPS["fig_routing_vllm"], measures_time=False),
    )  # fmt: skip
    servers = ["fig_routing_vllm", "fig_repurpose_vllm"]
    probe, sims = "fig_repurpose_quality", [MOONCAKE_STEP, "fig_hit_rate_claude_code"]
    assert not pipeline.STEPS[probe].starts_server and pipeline.STEPS[probe].needs_engine
    names = ["fig_fidelity_vllm", *servers, probe, *sims]
    _spans, overlap = _scheduled(monkeypatch, tmp_path, names)
    assert not any(overlap("fig_fidelity_vllm", o) for o in names if o != "fig_fidelity_vllm")
    assert not overlap(*servers)  # two servers would stall each other's requests
    assert any(overlap(s, m) for s in servers for m in sims)  # a server beside a simulation
    assert any(overlap(probe, s) for s in servers)  # the probe starts no server
    assert overlap(*sims)


def test_quick_runs_timed_engine_steps_beside_simulations_still_one_server_at_a_time(
    tmp_path, monkeypatch
):
    """--quick checks no timing claim, so a timed engine step shares the CPU with a
    simulation there; two servers still never run at once."""
    engines = ["fig_fidelity_vllm", "fig_routing_vllm", "fig_repurpose_vllm"]
    _spans, overlap = _scheduled(
        monkeypatch, tmp_path, [*engines, MOONCAKE_STEP], quick=True, jobs=2,
        sleep=lambda step: 0.15 if step.needs_engine else 0.8,  # the simulation outlasts one
    )  # fmt: skip
    assert not any(overlap(a, b) for a in engines for b in engines if a != b)
    assert any(overlap(e, MOONCAKE_STEP) for e in engines[:2])  # a timed step beside a sim


def test_free_slots_go_to_the_longest_recorded_steps_first(tmp_path, monkeypatch):
    """Registry order is mooncake, claude code, learned params; the record reorders them."""
    names = [MOONCAKE_STEP, "fig_hit_rate_claude_code", "fig_saecache_learned_params"]
    assert not any(STEPS[n].depends for n in names)
    record = {"fig_saecache_learned_params": {"seconds": 90.0},
              "fig_hit_rate_claude_code": {"seconds": 5.0}}  # fmt: skip
    spans, _ = _scheduled(monkeypatch, tmp_path, names, jobs=1, record=record,
                          sleep=lambda step: 0.02)  # fmt: skip
    assert sorted(spans, key=lambda n: spans[n][0]) == [names[2], names[1], names[0]]


def test_an_unreadable_timing_record_orders_nothing_and_fails_nothing(tmp_path, caplog):
    (tmp_path / "experiments").mkdir()
    rec = tmp_path / "experiments" / "timings.json"
    assert pipeline.recorded_seconds(tmp_path, "quick") == {}  # absent
    rec.write_text("<<<<<<< HEAD\n")
    assert pipeline.recorded_seconds(tmp_path, "quick") == {}
    assert "not used to order the steps" in caplog.text
    rec.write_text(json.dumps({"phases": {}, "runs": {}, "steps": {"quick": {"a": None}}}))
    assert pipeline.recorded_seconds(tmp_path, "quick") == {}
    rec.write_text(json.dumps({"phases": {}, "runs": {},
                               "steps": {"quick": {"a": {"seconds": 3.5}}}}))  # fmt: skip
    assert pipeline.recorded_seconds(tmp_path, "quick") == {"a": 3.5}


def test_a_step_that_times_an_engine_must_start_one():
    with pytest.raises(ValueError, match="measures_time"):
        pipeline.Step("x", "s", "c", (), measures_time=True)
