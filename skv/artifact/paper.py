"""The paper's numbers come from the runs: ``generated/values.tex`` and the PDF build.

:func:`write_generated` writes two files beside ``main.tex`` (``paper/generated/`` for the full
run, ``build/quick/paper/generated/`` for ``--quick``):

- ``values.tex``: one macro per claim (``\\val{id}`` its produced value, ``\\ci{id}`` its 95%
  interval, ``\\expected{id}``, ``\\refval{id}`` the paper's or seed's number) and one per value
  any step produced (``\\val{step/key}``), formatted with the claim's unit; a value that was not
  produced prints a framed "not run" mark instead of a number;
- ``layout.tex``: where the figures and tables of this run are, and for each step that was
  skipped the reason and the command that produces it (``\\skvfig`` prints a framed
  placeholder naming that command instead of a missing figure).

``main.tex`` types no result by hand (tests/test_paper.py rejects a digit in its prose).
:func:`build_pdf` runs latexmk (or tectonic) and :func:`figures_in_pdf` reads latexmk's
recorder file to tell which figure files went into the PDF.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from skv.artifact.claims import Claim, ClaimsFile, Produced, read_raw_values

GENERATED = "generated"
_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_escape(text: str) -> str:
    """Plain text for LaTeX: specials escaped, and ``--`` kept as two hyphens (not a dash), so
    a command like ``./reproduce.sh --quick`` reads as typed."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in text).replace("-", "-{}")


def guess_unit(key: str, value: Any) -> str:
    """The display unit of a produced value without a claim, from its name."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "count"
    if key.endswith("_pts"):
        return "points"
    if key.endswith("_pct"):
        return "percent"
    if key.endswith("_ms"):
        return "ms"
    if "hit_rate" in key or "share" in key or "reuse_rate" in key:
        return "fraction"
    return "number"


def decimals(p: Produced | None, unit: str) -> int:
    """One decimal, two when the value or its interval would otherwise round to nothing."""
    scale = 100.0 if unit == "fraction" else 1.0
    if p is None:
        return 1
    spans = [abs(p.value) * scale]
    if p.ci95 is not None:
        spans.append((p.ci95[1] - p.ci95[0]) * scale)
    return 2 if min(spans) < 0.5 else 1


def _num(v: float, unit: str, signed: bool, digits: int = 1) -> str:
    if unit == "fraction":
        s = f"{100 * v:.{digits}f}"
    elif unit in ("points", "percent"):
        s = f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    elif unit == "ms":
        s = f"{v:.0f}"
    elif unit == "count":
        s = f"{v:,.0f}".replace(",", "{,}")
    elif unit == "ratio":
        s = f"{v:.2f}"
    else:
        s = f"{v:.3g}"
    if float(s.replace("{,}", "")) == 0:  # no "-0.0" or "+0.00"
        s = s.lstrip("+-")
    return s.replace("-", "$-$").replace("+", "$+$")


def format_value(v: float, unit: str, digits: int = 1) -> str:
    """A number with its unit, as LaTeX (fractions print as percent)."""
    signed = unit in ("points", "percent")
    n = _num(v, unit, signed, digits)
    return {
        "fraction": n + r"\%",
        "points": n + r"~points",
        "percent": n + r"\%",
        "ms": n + r"\,ms",
        "ratio": n + r"$\times$",
    }.get(unit, n)


def format_ci(p: Produced, unit: str, digits: int = 1) -> str:
    if p.ci95 is None:
        return r"\textit{(deterministic)}"
    signed = unit in ("points", "percent")
    lo, hi = (_num(x, unit, signed, digits) for x in p.ci95)
    suffix = r"\%" if unit in ("fraction", "percent") else ""
    return f"95\\% CI [{lo}, {hi}]{suffix}"


def _define(name: str, body: str) -> str:
    return f"\\skvdefine{{{name}}}{{{body}}}"


def verdict_text(claim: Claim, status: str | None) -> str:
    """What the paper says the claim shows: its verdict on the source's statement (or "thesis
    holds") when the check passed, else the check's status, so a failing or skipped claim can
    never print "reproduced"."""
    if status == "ok":
        return claim.verdict or "thesis holds"
    if status is None:
        return r"\textbf{not checked}"
    return rf"\textbf{{check: {tex_escape(status)}}}"


def values_tex(
    claims: ClaimsFile,
    produced: Mapping[str, Mapping[str, Any] | None],
    *,
    quick: bool,
    statuses: Mapping[str, str] | None = None,
) -> str:
    """The body of ``values.tex`` (deterministic: sorted, fixed formats). ``statuses``: claim
    id -> the claims check's status for this run (skv.artifact.claims)."""
    statuses = statuses or {}
    lines = [
        "% Generated by `python -m skv.artifact.pipeline paper` from the runs' claims.json",
        "% files and experiments/claims.yaml. Do not edit: rerun ./reproduce.sh paper.",
        f"\\newcommand{{\\skvrunmode}}{{{'quick' if quick else 'full'}}}",
    ]
    for c in claims.claims:
        raw = (produced.get(c.step) or {}).get(c.value)
        p = Produced.parse(raw)
        lines.append(f"% {c.id}: {c.compares}")
        exp = c.expectation(quick)
        if p is not None and math.isfinite(p.value):
            d = decimals(p, c.unit)
            lines.append(_define(c.id, format_value(p.value, c.unit, d)))
            lines.append(_define(f"{c.id}.ci", format_ci(p, c.unit, d)))
        elif quick and exp.absent and produced.get(c.step) is not None:
            # the step ran, and its quick config leaves this value out on purpose (the claim
            # says why): "full run only", not "not run"
            for name in (c.id, f"{c.id}.ci"):
                lines.append(_define(name, f"\\skvnotquick{{{name}}}"))
        if exp.expected is not None:
            lines.append(_define(f"{c.id}.expected", format_value(exp.expected, c.unit)))
        if c.reference_value:
            lines.append(_define(f"{c.id}.ref", tex_escape(c.reference_value)))
        lines.append(_define(f"{c.id}.verdict", verdict_text(c, statuses.get(c.id))))
    lines.append("% every value a step produced, as <step>/<key>")
    for step in sorted(produced):
        for key, raw in sorted((produced[step] or {}).items()):
            name = f"{step}/{key}"
            if isinstance(raw, str):
                lines.append(_define(name, f"\\texttt{{{tex_escape(raw)}}}"))
                continue
            p = Produced.parse(raw)
            if p is None or not math.isfinite(p.value):
                continue
            plain = raw["value"] if isinstance(raw, dict) else raw
            unit = guess_unit(key, plain)
            d = decimals(p, unit)
            lines.append(_define(name, format_value(p.value, unit, d)))
            if p.ci95 is not None:
                lines.append(_define(f"{name}.ci", format_ci(p, unit, d)))
    return "\n".join(lines) + "\n"


def layout_tex(figures_dir: Path, tables_dir: Path, skipped: Mapping[str, str]) -> str:
    lines = [
        "% Generated by `python -m skv.artifact.pipeline paper`: where this run's figures and",
        "% tables are, and why a step did not produce its outputs here. Do not edit.",
        f"\\renewcommand{{\\skvfigdir}}{{{figures_dir.resolve().as_posix()}}}",
        f"\\renewcommand{{\\skvtabdir}}{{{tables_dir.resolve().as_posix()}}}",
    ]
    for step, why in sorted(skipped.items()):
        lines.append(_define(f"skip:{step}", tex_escape(why)))
    return "\n".join(lines) + "\n"


def collect_produced(steps: Iterable[str], step_dir: Callable[[str], Path]) -> dict[str, Any]:
    """step -> the values its claims.json holds, as written (None when it wrote none)."""
    return {s: read_raw_values(step_dir(s)) for s in steps}


def write_generated(
    paper_dir: Path,
    claims: ClaimsFile,
    produced: Mapping[str, Any],
    *,
    quick: bool,
    figures_dir: Path,
    tables_dir: Path,
    skipped: Mapping[str, str],
    statuses: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write ``generated/values.tex`` and ``generated/layout.tex`` beside ``main.tex``."""
    from skv.fileio import atomic_write

    gen = paper_dir / GENERATED
    gen.mkdir(parents=True, exist_ok=True)
    out = []
    for name, body in (
        ("values.tex", values_tex(claims, produced, quick=quick, statuses=statuses)),
        ("layout.tex", layout_tex(figures_dir, tables_dir, skipped)),
    ):
        with atomic_write(gen / name) as f:
            f.write(body)
        out.append(gen / name)
    return out


def latex_engine() -> list[str] | None:
    if shutil.which("latexmk"):
        return ["latexmk", "-pdf", "-recorder", "-interaction=nonstopmode", "-halt-on-error"]
    if shutil.which("tectonic"):
        return ["tectonic", "--keep-intermediates", "--keep-logs"]
    return None


INSTALL_HINT = (
    "no LaTeX engine found: install latexmk (Debian: apt-get install --no-install-recommends "
    "latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended) or "
    "tectonic, then rerun ./reproduce.sh paper"
)


def build_pdf(paper_dir: Path, main: str = "main.tex") -> Path:
    """Compile ``paper_dir/main`` with latexmk (or tectonic); raise RuntimeError with the log's
    first error when it fails."""
    cmd = latex_engine()
    if cmd is None:
        raise RuntimeError(INSTALL_HINT)
    proc = subprocess.run([*cmd, main], cwd=paper_dir, capture_output=True, text=True, check=False)
    pdf = paper_dir / Path(main).with_suffix(".pdf").name
    if proc.returncode != 0 or not pdf.is_file():
        log = paper_dir / Path(main).with_suffix(".log").name
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else proc.stdout
        errors = [ln for ln in text.splitlines() if ln.startswith("!")][:3]
        raise RuntimeError(
            f"LaTeX failed ({cmd[0]} exited {proc.returncode}): "
            + (" | ".join(errors) or proc.stderr[-400:])
        )
    return pdf


def figures_in_pdf(paper_dir: Path, main: str = "main.tex") -> set[str]:
    """Names of the figures the last build really included: ``\\skvfig`` writes
    ``skv-figure: NAME`` to the log in its branch that calls ``\\includegraphics`` (an
    existence probe alone is not an inclusion)."""
    log = paper_dir / Path(main).with_suffix(".log").name
    if not log.is_file():
        raise FileNotFoundError(f"{log}: no LaTeX log (build the paper first)")
    text = log.read_text(encoding="utf-8", errors="replace")
    return set(re.findall(r"^skv-figure: (\S+)$", text, flags=re.M))


def undefined_values(
    main_tex: str, values_tex: str, ran_steps: Iterable[str], claim_steps: Mapping[str, str]
) -> list[str]:
    """``\\val`` keys the paper prints that a step which ran did not produce (a typo, or a
    notebook that stopped writing the value): the PDF would say "not run" although it ran.
    Keys of steps that did not run are left to their "not run" marks."""
    body = main_tex.split(r"\begin{document}", 1)[-1]
    body = re.sub(r"(?<!\\)%.*", "", body)
    defined = set(re.findall(r"\\skvdefine\{([^}]*)\}", values_tex))
    ran = set(ran_steps)
    out = []
    suffix = {"val": "", "ci": ".ci", "refval": ".ref", "verdict": ".verdict"}
    for kind, key in sorted(set(re.findall(r"\\(val|ci|refval|verdict)\{([^}]*)\}", body))):
        step = key.split("/", 1)[0] if "/" in key else claim_steps.get(key, "")
        if step in ran and key + suffix[kind] not in defined:
            out.append(key + suffix[kind])
    return out
