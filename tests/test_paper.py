"""The paper's numbers come from the runs: no result typed by hand in main.tex, generated value
macros formatted by unit, and a PDF that builds with placeholders for what a run skipped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from skv.artifact import paper, pipeline
from skv.artifact.claims import ClaimsFile, Expectation
from skv.artifact.pipeline import STEPS, Layout, load_claims

ROOT = Path(__file__).resolve().parents[1]
#: macros whose arguments are names, not prose (ids, labels, files, widths)
NAME_MACROS = (
    "val",
    "ci",
    "refval",
    "claim",
    "label",
    "ref",
    "skvfig",
    "skvtab",
    "pol",
    "thesis",
    "verdict",
    "includegraphics",
    "begin",
    "end",
)


def prose(tex: str) -> str:
    """The body of a LaTeX file with comments, optional arguments and the arguments of
    :data:`NAME_MACROS` removed: what a reader sees as typed text."""
    body = tex.split(r"\begin{document}", 1)[1]
    body = re.sub(r"(?<!\\)%.*", "", body)
    body = re.sub(r"(\\[A-Za-z]+\*?)\[[^\]]*\]", r"\1", body)  # a macro's optional argument
    body = re.sub(r"(\\begin\{[^}]*\})\[[^\]]*\]", r"\1", body)  # a float's placement
    names = "|".join(NAME_MACROS)
    while True:
        stripped = re.sub(rf"\\(?:{names})\*?(?:\{{[^{{}}]*\}})+", "", body)
        if stripped == body:
            return body
        body = stripped


#: words that state a result as a number ("a tenth of", "twice the"), caught like digits
NUMBER_WORDS = r"\b(dozen|tenth|half|twice|double|triple|third|quarter|fifth)s?\b"


def hand_typed(tex: str) -> list[str]:
    # "95%" is the confidence level of every interval (a method, not a result)
    text = prose(tex).replace(r"95\%", "")
    pattern = rf"\d|{NUMBER_WORDS}"
    return [m.group(0) for m in re.finditer(rf".{{0,30}}(?:{pattern}).{{0,30}}", text, re.I)]


def test_main_tex_types_no_result_by_hand():
    found = hand_typed((ROOT / "paper" / "main.tex").read_text())
    assert not found, f"hand-typed numbers in paper/main.tex: {found}"


@pytest.mark.parametrize(
    "typed",
    [
        "FIFO hits 27.9\\% of blocks",
        "a gain of [27.9] points",
        "the cache of \\texttt{128} blocks",
        "LRU hits twice as often",
        "a tenth of the blocks",
        "\\emph{3} seeds",
    ],
)
def test_the_prose_check_catches_a_typed_number(typed):
    tex = r"\begin{document} LRU hits \val{a_2} (\ci{a}) \claim{b_10pct}. " + typed
    assert hand_typed(tex), typed
    assert not hand_typed(r"\begin{document} \skvtab[\textwidth]{t_1}{x} \val{a_2} \claim{b}")


def _claims(tmp_path: Path) -> ClaimsFile:
    f = tmp_path / "claims.yaml"
    common = {
        "text": "t",
        "compares": "c",
        "source": "paper",
        "source_note": "n",
        "step": "fig_hit_rate_mooncake",
        "tolerance_basis": "ci95 over seeds 0-4",
        "reference_value": "2.3x (paper)",
        "verdict": "not reproduced",
        "quick": {"not_checked": "why"},
    }
    f.write_text(
        json.dumps(
            {
                "claims": [
                    {
                        "id": "gain",
                        "value": "g",
                        "unit": "points",
                        "expected": 1.5,
                        "tolerance": 1,
                        **common,
                    },
                    {
                        "id": "hit",
                        "value": "h",
                        "unit": "fraction",
                        "expected": 0.25,
                        "tolerance": 0.1,
                        **common,
                    },
                    {
                        "id": "absent",
                        "value": "nope",
                        "unit": "ms",
                        "expected": 3,
                        "tolerance": 1,
                        **common,
                    },
                ]
            }
        )
    )
    return pipeline.load_claims(f)


def test_values_tex_has_one_macro_per_claim_and_value_formatted_by_unit(tmp_path):
    produced = {
        "fig_hit_rate_mooncake": {
            "g": {"value": 1.234, "ci95": [-0.5, 2.96], "n": 5},
            "h": 0.2789,
            "best": "lfu_x",
            "count_of_things": 12031,
        }
    }
    statuses = {"gain": "ok", "hit": "FAIL"}
    tex = paper.values_tex(_claims(tmp_path), produced, quick=False, statuses=statuses)
    assert r"\skvdefine{gain}{$+$1.2~points}" in tex
    # a verdict only when the check passed: a failing claim can never print "reproduced"
    assert r"\skvdefine{gain.verdict}{not reproduced}" in tex
    assert r"\skvdefine{hit.verdict}{\textbf{check: FAIL}}" in tex
    assert r"\skvdefine{absent.verdict}{\textbf{not checked}}" in tex
    assert r"\skvdefine{gain.ci}{95\% CI [$-$0.5, $+$3.0]}" in tex
    assert r"\skvdefine{gain.ref}{2.3x (paper)}" in tex
    assert r"\skvdefine{hit}{27.9\%}" in tex
    assert r"\skvdefine{hit.ci}{\textit{(deterministic)}}" in tex
    assert r"\skvdefine{absent}" not in tex  # not produced: main.tex prints a 'not run' mark
    assert r"\skvdefine{fig_hit_rate_mooncake/best}{\texttt{lfu\_x}}" in tex
    assert r"\skvdefine{fig_hit_rate_mooncake/count_of_things}{12{,}031}" in tex
    again = paper.values_tex(_claims(tmp_path), produced, quick=False, statuses=statuses)
    assert tex == again  # deterministic


def test_a_value_the_quick_run_leaves_out_on_purpose_reads_full_run_only(tmp_path):
    """A claim not checked in --quick whose value the quick config does not produce (e.g. a
    policy left out to save an engine start; ``absent`` in its quick expectation) prints "full
    run only", and the build's check of undefined values accepts it; a quick-checked claim, or
    a not-checked one not marked absent, without its value is still flagged."""
    base = _claims(tmp_path)
    left_out = Expectation(not_checked="quick leaves the policy out", absent=True)
    absent = base.claims[2].model_copy(update={"quick": left_out})
    quick = Expectation(expected=3, tolerance=1)
    checked = absent.model_copy(update={"id": "absent_checked", "quick": quick})
    unmarked = absent.model_copy(
        update={"id": "absent_unmarked", "quick": Expectation(not_checked="2 seeds")}
    )
    doc = ClaimsFile(claims=[*base.claims[:2], absent, checked, unmarked])
    tex = paper.values_tex(doc, {"fig_hit_rate_mooncake": {}}, quick=True)
    assert r"\skvdefine{absent}{\skvnotquick{absent}}" in tex
    assert r"\skvdefine{absent.ci}{\skvnotquick{absent.ci}}" in tex
    assert r"\skvdefine{absent_checked}" not in tex
    assert r"\skvdefine{absent_unmarked}" not in tex  # not checked, but not left out
    main = r"\begin{document} \val{absent} \ci{absent} \val{absent_checked} "
    main += r"\val{absent_unmarked}"
    steps = {c.id: c.step for c in doc.claims}
    assert paper.undefined_values(main, tex, ["fig_hit_rate_mooncake"], steps) == [
        "absent_checked",
        "absent_unmarked",
    ]
    # a step that did not run keeps its "not run" mark
    assert r"\skvdefine{absent}" not in paper.values_tex(doc, {}, quick=True)
    assert r"\skvdefine{absent}" not in paper.values_tex(
        doc, {"fig_hit_rate_mooncake": None}, quick=True
    )
    # the full run has no such excuse
    full = paper.values_tex(doc, {"fig_hit_rate_mooncake": {}}, quick=False)
    assert r"\skvdefine{absent}" not in full
    assert r"\skvnotquick" in (ROOT / "paper" / "main.tex").read_text()


def test_small_values_get_a_second_decimal_and_zero_has_no_sign():
    c = paper.Produced(0.096, (-0.041, 0.233), 5)
    assert paper.format_value(c.value, "points", paper.decimals(c, "points")) == "$+$0.10~points"
    assert paper.format_ci(c, "points", paper.decimals(c, "points")) == (
        "95\\% CI [$-$0.04, $+$0.23]"
    )
    assert paper.format_value(-0.0004, "points") == "0.0~points"
    big = paper.Produced(8.75)
    assert paper.decimals(big, "points") == 1


def test_tex_escape_neutralises_every_special_character():
    s = paper.tex_escape(r"a_b %c $d #e &f ~g ^h {i} \j")
    assert "_" not in s.replace(r"\_", "")
    for ch in "%$#&":
        assert ch not in s.replace("\\" + ch, "")
    # "--" would typeset as an en dash: a command like "--quick" must read as typed
    assert "--" not in paper.tex_escape("./reproduce.sh --quick fig_x")


def test_layout_tex_names_the_skipped_steps_and_the_command(tmp_path):
    tex = paper.layout_tex(tmp_path / "f", tmp_path / "t", {"fig_x": "no engine; run a_b"})
    assert r"\skvdefine{skip:fig_x}{no engine; run a\_b}" in tex
    assert (tmp_path / "f").resolve().as_posix() in tex


@pytest.mark.skipif(
    paper.latex_engine() is None,
    reason="no LaTeX engine (CI installs one in .ci/run): " + paper.INSTALL_HINT,
)
def test_the_paper_builds_with_placeholders_when_nothing_was_generated(tmp_path, monkeypatch):
    """A clean clone that ran nothing (no traces, no engine): the PDF still builds, every
    figure is a framed note naming the command that makes it, and no figure is read."""
    layout = Layout(tmp_path / "figs", tmp_path / "tables", tmp_path / "build")
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "no_engine"))
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "no_traces"))
    rc = pipeline.build_paper(quick=True, layout=layout)
    assert rc == 0
    pdir = layout.paper()
    assert (pdir / "main.pdf").stat().st_size > 10_000
    assert paper.figures_in_pdf(pdir) == set()
    if shutil.which("pdftotext"):
        import subprocess

        text = subprocess.run(
            ["pdftotext", str(pdir / "main.pdf"), "-"], capture_output=True, text=True
        ).stdout
        assert "was not generated in this run" in text
        # the engine figures say how to get the engine (pdftotext drops OT1 underscores)
        assert re.search(r"scripts/setup.vllm\.sh", text)
    layout_tex = (pdir / "generated" / "layout.tex").read_text()
    for s in STEPS:
        assert f"skip:{s}" in layout_tex


def test_every_claim_the_paper_prints_has_a_unit():
    tex = (ROOT / "paper" / "main.tex").read_text()
    printed = set(re.findall(r"\\val\{([a-z0-9_]+)\}", tex))
    claims = {c.id: c for c in load_claims().claims}
    for cid in printed & set(claims):
        assert claims[cid].unit != "number", f"{cid}: say its unit so the paper prints it"
