"""Claims: every number the paper states, as a thesis the regenerated results must support.

A claim (one entry of ``experiments/claims.yaml``) names what it compares, where its expected
value comes from (a paper, the seed project, an independent oracle, or a measurement here with
the reason it matters), the notebook step and value key that produce it, and a tolerance whose
basis is ``deterministic`` (the value cannot move for a fixed config), the 95% interval over
seeds (then the tolerance must cover the produced interval's half-width: a claim whose slack is
narrower than its own seed spread is a regression check, not a thesis, and fails), or the
spread of repeated runs of a measurement no seed pins (``spread over N runs``: a real engine's
timing under load; the basis lists the runs' values and the tolerance must cover them).
``holds`` optionally states the thesis on the produced interval (``"> 0"``: the whole interval
is above 0; ``"~ 0"``: it contains 0, e.g. "not reproduced"). Quick runs have their own
expectation or say why they check nothing (``quick: {not_checked: why}``); a value the quick
config does not produce at all (a policy it leaves out) says so too (``absent: true``), and the
paper then prints "full run only" for it.

A notebook writes produced values to ``claims.json`` as numbers, or as
``{"value": x, "ci95": [lo, hi], "n": seeds}`` when the value is a mean over seeds.

Statuses of a checked claim: ``ok``; ``FAIL`` (outside the tolerance, thesis false, or
tolerance narrower than the interval); ``skipped`` (its step cannot run here: why, and the
command that enables it); ``not checked`` (no expectation for this mode); ``missing`` (no value
and nobody said why; in a quick run also a not-checked value its step ran without writing,
unless marked ``absent``). Only FAIL and missing make the check exit non-zero.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.notebook import CLAIMS_FILE

#: float slack on the tolerance comparison (values pass through JSON and rounding)
EPS = 1e-9
STATUSES = ("ok", "FAIL", "skipped", "not checked", "missing")
_NUM = r"-?\d+(?:\.\d+)?"
_HOLDS = re.compile(rf"^\s*(?:(>=|<=|>|<|~)\s*({_NUM})|in\s*\[\s*({_NUM})\s*,\s*({_NUM})\s*\])\s*$")
_HOLDS_HELP = "write '> 0', '< 0', '>= x', '<= x', '~ x' or 'in [a, b]'"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _contradicts(expr: str | None, expected: float | None) -> bool:
    """Whether an expected value alone already breaks its thesis (``~`` needs an interval,
    so a point says nothing about it)."""
    if expr is None or expected is None or expr.strip().startswith("~"):
        return False
    return not holds(expr, Produced(expected))


def _check_holds(expr: str | None) -> None:
    if expr is None:
        return
    m = _HOLDS.match(expr)
    if m is None:
        raise ValueError(f"holds {expr!r}: {_HOLDS_HELP}")
    if m.group(1) is None and float(m.group(3)) > float(m.group(4)):
        raise ValueError(f"holds {expr!r}: the interval's lower end is above its upper end")


class Expectation(_Strict):
    """What one mode (full or quick) expects: a value with tolerance (and the thesis, and the
    fewest seeds its interval may rest on), or why nothing is checked in that mode."""

    expected: float | None = None
    tolerance: float | None = Field(default=None, ge=0)
    holds: str | None = None
    #: seeded claims: the produced interval must rest on at least this many seeds
    min_seeds: int | None = Field(default=None, ge=1)
    not_checked: str | None = None
    #: not produced in this mode at all (with not_checked): the step runs without the value
    absent: bool = False

    @model_validator(mode="after")
    def _complete(self) -> Expectation:
        if self.absent and not self.not_checked:
            raise ValueError("absent needs not_checked: <why the value is not produced>")
        if self.not_checked:
            given = [k for k in ("expected", "tolerance", "holds") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"not_checked excludes {', '.join(given)}")
        elif self.expected is None or self.tolerance is None:
            raise ValueError("needs expected and tolerance, or not_checked: <why>")
        _check_holds(self.holds)
        if _contradicts(self.holds, self.expected):
            raise ValueError(f"expected {self.expected} contradicts holds {self.holds!r}")
        return self


#: a seeded claim's interval must rest on at least this many seeds in full runs (issue 9)
MIN_SEEDS_FULL = 5
_BASIS = re.compile(r"^(deterministic\b|ci95 over seeds \d+-\d+\b|spread over \d+ runs\b)")


class Claim(_Strict):
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    text: str = Field(min_length=1)
    compares: str = Field(min_length=1)
    source: Literal["paper", "seed", "oracle", "measured"]
    #: where the expected value comes from (or, for "measured", why the number matters)
    source_note: str = Field(min_length=1)
    step: str
    value: str
    #: display unit for the paper's macros: fraction (printed as %), points, percent, ms, ratio,
    #: count, number
    unit: Literal["fraction", "points", "percent", "ms", "ratio", "count", "number"] = "number"
    expected: float
    tolerance: float = Field(ge=0)
    #: "deterministic (why)", "ci95 over seeds A-B (...)" (requires the produced interval,
    #: resting on at least MIN_SEEDS_FULL seeds in full runs) or "spread over N runs (values)"
    tolerance_basis: str = Field(pattern=_BASIS.pattern)
    holds: str | None = None
    #: what the thesis says about the source's statement when it holds: the paper's words
    verdict: Literal["reproduced", "not reproduced", "inconclusive"] | None = None
    #: the paper's or the seed's own number, shown beside the measured one (text)
    reference_value: str | None = None
    #: traces (as the steps name them) the value needs when its step can run without them
    #: (the step's optional traces): without one the claim is skipped, naming it
    needs_traces: tuple[str, ...] = ()
    quick: Expectation

    @model_validator(mode="after")
    def _check(self) -> Claim:
        _check_holds(self.holds)
        if _contradicts(self.holds, self.expected):
            raise ValueError(f"expected {self.expected} contradicts holds {self.holds!r}")
        if self.source in ("paper", "seed") and self.verdict is None:
            raise ValueError("a claim on a paper's or the seed's statement needs a verdict")
        if self.holds is not None and not (self.quick.not_checked or self.quick.holds):
            raise ValueError(
                "quick: a claim with a thesis (holds) needs the quick run's thesis too, or "
                "not_checked: <why the quick run cannot keep the regime>"
            )
        return self

    @property
    def seeded(self) -> bool:
        """Whether the tolerance rests on the seed spread (else the value is deterministic for
        a fixed config, or a repeated measurement's spread, and the basis says which)."""
        return self.tolerance_basis.startswith("ci95")

    def expectation(self, quick: bool) -> Expectation:
        if quick:
            q = self.quick
            if self.seeded and q.min_seeds is None and not q.not_checked:
                return q.model_copy(update={"min_seeds": 2})
            return q
        return Expectation(
            expected=self.expected,
            tolerance=self.tolerance,
            holds=self.holds,
            min_seeds=MIN_SEEDS_FULL if self.seeded else None,
        )


class ClaimsFile(_Strict):
    claims: list[Claim]
    #: steps that state no number (figures read only qualitatively), each with the reason
    no_claims: dict[str, str] = Field(default_factory=dict)


def load_claims(path: str | Path, steps: Iterable[str]) -> ClaimsFile:
    """Parse and validate ``claims.yaml``; errors name the file, the claim and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    try:
        doc = ClaimsFile.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = list(e["loc"])
            if len(loc) >= 2 and loc[0] == "claims" and isinstance(loc[1], int):
                items = data.get("claims") or []
                cid = items[loc[1]].get("id", "?") if loc[1] < len(items) else "?"
                loc = [f"claim {cid}", *loc[2:]]
            lines.append(f"{path}: {'.'.join(map(str, loc))}: {e['msg']}")
        raise ValueError("\n".join(lines)) from None
    known = set(steps)
    ids: set[str] = set()
    for c in doc.claims:
        if c.step not in known:
            raise ValueError(f"{path}: claim {c.id}: unknown step {c.step!r}")
        if c.id in ids:
            raise ValueError(f"{path}: claim {c.id}: duplicate id")
        ids.add(c.id)
    for s in doc.no_claims:
        if s not in known:
            raise ValueError(f"{path}: no_claims: unknown step {s!r}")
    return doc


# ----------------------------------------------------------------------------------------
# produced values


@dataclass(frozen=True)
class Produced:
    """One value a step wrote: the number and, for means over seeds, its 95% interval."""

    value: float
    ci95: tuple[float, float] | None = None
    n: int | None = None

    @classmethod
    def parse(cls, raw: Any) -> Produced | None:
        if raw is None or isinstance(raw, str):  # strings (names) are for the paper's text
            return None
        if isinstance(raw, dict):
            v = raw.get("value")
            if v is None:
                return None
            ci = raw.get("ci95")
            return cls(float(v), (float(ci[0]), float(ci[1])) if ci else None, raw.get("n"))
        return cls(float(raw))

    @property
    def half_width(self) -> float:
        if self.ci95 is None:
            return 0.0
        return max(self.value - self.ci95[0], self.ci95[1] - self.value)


def read_raw_values(step_dir: Path) -> dict[str, Any] | None:
    """The values one step wrote, as written (numbers, intervals, names); None when it wrote
    no claims file."""
    f = step_dir / CLAIMS_FILE
    if not f.is_file():
        return None
    return json.loads(f.read_text(encoding="utf-8")).get("values", {})


def read_values(step_dir: Path) -> dict[str, Produced | None] | None:
    """The values one step wrote, parsed (names are None: they are not numbers)."""
    raw = read_raw_values(step_dir)
    return None if raw is None else {k: Produced.parse(v) for k, v in raw.items()}


def holds(expr: str, p: Produced) -> bool:
    """Whether the thesis ``expr`` holds on the produced interval (the value when none):
    ``> t`` the whole interval is above t, ``< t`` below, ``~ t`` the interval contains t
    ("no difference detected"), ``in [a, b]`` the whole interval lies within [a, b]."""
    m = _HOLDS.match(expr)
    if m is None:
        raise ValueError(f"holds {expr!r}: {_HOLDS_HELP}")
    lo, hi = p.ci95 if p.ci95 is not None else (p.value, p.value)
    if m.group(1) is None:
        a, b = float(m.group(3)), float(m.group(4))
        return a - EPS <= lo and hi <= b + EPS
    op, t = m.group(1), float(m.group(2))
    return {
        ">": lo > t,
        ">=": lo >= t - EPS,
        "<": hi < t,
        "<=": hi <= t + EPS,
        "~": lo - EPS <= t <= hi + EPS,
    }[op]


# ----------------------------------------------------------------------------------------
# checking


@dataclass(frozen=True)
class Row:
    claim: Claim
    status: str
    expected: float | None
    tolerance: float | None
    got: Produced | None
    why: str = ""


def check_one(
    claim: Claim, got: Produced | None, *, quick: bool, skip_reason: str | None, wrote: bool
) -> Row:
    """The status of one claim given what its step produced (see the module docstring)."""
    exp = claim.expectation(quick)
    if exp.not_checked:
        if wrote and got is None and not exp.absent and not skip_reason:
            why = f"{claim.step} ran but wrote no value {claim.value!r} (not marked absent)"
            return Row(claim, "missing", None, None, got, why)
        return Row(claim, "not checked", None, None, got, f"quick mode: {exp.not_checked}")
    e, tol = exp.expected, exp.tolerance
    assert e is not None and tol is not None
    if skip_reason:
        return Row(claim, "skipped", e, tol, got, skip_reason)
    if got is None:
        why = (
            f"{claim.step} wrote no value {claim.value!r}"
            if wrote
            else f"{claim.step} has not run: ./reproduce.sh{' --quick' if quick else ''} "
            f"{claim.step}"
        )
        return Row(claim, "missing", e, tol, got, why)
    problems = []
    if not math.isfinite(got.value) or abs(got.value - e) > tol + EPS:
        problems.append(f"|{got.value:.6g} - {e:.6g}| > tolerance {tol:.6g}")
    if exp.holds and not holds(exp.holds, got):
        where = f"interval [{got.ci95[0]:.4g}, {got.ci95[1]:.4g}]" if got.ci95 else "value"
        problems.append(f"thesis '{exp.holds}' false on the {where}")
    if claim.seeded:
        if got.ci95 is None:
            problems.append("tolerance basis is the seed spread, but the step wrote no interval")
        elif tol + EPS < got.half_width:
            problems.append(
                f"tolerance {tol:.4g} is narrower than the 95% interval (±{got.half_width:.4g})"
            )
        if exp.min_seeds and (got.n or 0) < exp.min_seeds:
            problems.append(f"the interval rests on {got.n or 0} seeds; needs {exp.min_seeds}")
    if problems:
        return Row(claim, "FAIL", e, tol, got, "; ".join(problems))
    return Row(claim, "ok", e, tol, got)


def check_all(
    doc: ClaimsFile,
    step_dir: Callable[[str], Path],
    *,
    quick: bool,
    skip_reason: Callable[[str], str | None],
    trace_reason: Callable[[tuple[str, ...]], str | None] = lambda traces: None,
) -> list[Row]:
    """Every claim's row; ``skip_reason(step)`` says why a step cannot run here,
    ``trace_reason(traces)`` why a claim's own ``needs_traces`` are not all here (else None)."""
    rows = []
    steps: dict[str, tuple[dict[str, Produced | None] | None, str | None]] = {}
    for c in doc.claims:
        if c.step not in steps:  # once per step: its values, and why it cannot run here
            steps[c.step] = (read_values(step_dir(c.step)), skip_reason(c.step))
        values, why = steps[c.step]
        if why is None and c.needs_traces:
            why = trace_reason(c.needs_traces)
        got = values.get(c.value) if values else None
        # a step that cannot run here is skipped even when an older run left values behind
        rows.append(check_one(c, got, quick=quick, skip_reason=why, wrote=values is not None))
    return rows


def failing(rows: Sequence[Row]) -> list[Row]:
    """Rows that make the check fail: FAIL, and missing values nobody explained."""
    return [r for r in rows if r.status in ("FAIL", "missing")]


def summary_line(rows: Sequence[Row]) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    return "claims: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES)


def format_rows(rows: Sequence[Row]) -> str:
    """A fixed-width table, then one line per skipped / not checked / failing claim's reason."""
    w = max([len(r.claim.id) for r in rows] + [5])
    out = [f"{'claim':<{w}}  {'expected':>9} {'tol':>7} {'got':>9} {'95% CI':>19}  status"]
    for r in rows:
        e = "-" if r.expected is None else f"{r.expected:.4g}"
        t = "-" if r.tolerance is None else f"{r.tolerance:.3g}"
        g = "-" if r.got is None else f"{r.got.value:.4g}"
        ci = (
            "-"
            if r.got is None or r.got.ci95 is None
            else (f"[{r.got.ci95[0]:.3g}, {r.got.ci95[1]:.3g}]")
        )
        out.append(f"{r.claim.id:<{w}}  {e:>9} {t:>7} {g:>9} {ci:>19}  {r.status}")
    # one line per distinct reason (a missing trace skips every claim of its step)
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.why:
            groups.setdefault((r.status, r.why), []).append(r.claim.id)
    if groups:
        out.append("")
        for (status, why), ids in groups.items():
            out.append(f"  {', '.join(ids)} ({status}): {why}")
    return "\n".join(out)


def markdown_table(doc: ClaimsFile, measured: Mapping[str, str] | None = None) -> str:
    """The claims as a Markdown table (ARTIFACT.md quotes it; tests keep the two in step);
    ``measured``: step -> when and from which commit its full run was measured
    (skv.artifact.measurements.labels)."""

    def exp(e: float | None, t: float | None) -> str:
        return "-" if e is None else f"{e:g} ± {t:g}"

    measured = measured or {}
    lines = [
        "| claim | compares | source | expected | thesis | verdict | quick | step | measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc.claims:
        q = c.quick
        quick = "not checked" if q.not_checked else exp(q.expected, q.tolerance)
        basis = {"ci95": "95% CI", "spre": "runs"}.get(c.tolerance_basis[:4], "det.")
        lines.append(
            f"| `{c.id}` | {c.compares} | {c.source} | {exp(c.expected, c.tolerance)} ({basis}) "
            f"| {c.holds or '-'} | {c.verdict or '-'} | {quick} | `{c.step}` "
            f"| {measured.get(c.step, '-')} |"
        )
    return "\n".join(lines)
