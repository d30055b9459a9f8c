"""Measured times, and the only place the docs get them from.

Every time the docs state (installing ``.venv``, setting up the engine venv, the test suite,
``--quick``, the full run, each step, ``.ci/run``) is rendered from ``experiments/timings.json``,
a record of real runs, never typed by hand:

1. runs write what they measured into ``build/``: reproduce.sh's bootstrap and ``test``,
   scripts/setup_vllm.sh and .ci/run call ``mark`` (``build/<phase>.json``); every pipeline run
   writes ``build/timings.json`` (``build/quick/timings.json`` for ``--quick``) with each
   step's status and seconds. Each file names the machine (cores, memory, CPU) and the time.
2. ``python -m skv.artifact.pipeline timings record [BUILD]`` merges those files into the
   record: a phase keeps its latest measurement; a step keeps its latest ``ran`` time per mode;
   a mode's end-to-end time is replaced only by a *complete* run (every step of the registry
   ran, none cached, skipped or failed), so a total is never a sum passed off as one run.
3. ``python -m skv.artifact.pipeline timings render`` (also done by ``record``) rewrites the
   marked blocks (``<!-- skv:timings NAME -->`` ... ``<!-- /skv:timings -->``) of the docs.

``timings check`` (and tests/test_timings.py) fails when a block differs from what the record
renders, or when a sentence outside the blocks states a duration and names one of the timed things
(:data:`TIMED`). Stdlib only, importing nothing of skv: scripts/setup_vllm.sh runs ``mark``
with the system Python, before any venv of the project exists.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "experiments" / "timings.json"
#: the phases ``mark`` records, with the command each one times (rendered in the summary)
PHASES = {
    "install": "`./reproduce.sh` (first run: creates `.venv` from the lock)",
    "engine_setup": "`bash scripts/setup_vllm.sh` (the vLLM engine venv, once)",
    "test": "`./reproduce.sh test` (ruff + pytest)",
    "ci": "`.ci/run` (all of the above, `--quick`, the paper; clean clone)",
}
MODES = {"quick": "`./reproduce.sh --quick`", "full": "`./reproduce.sh`"}
#: the project's time budgets on the 2-core reference machine (issue 34): a reviewer's evening
BUDGETS = {"quick": 600.0, "full": 3600.0, "ci": 2700.0}
#: files whose sentences may state no time of a timed thing outside a generated block
CHECKED_DOCS = ("README.md", "ARTIFACT.md", "reproduce.sh", ".ci/run")
CHECKED_GLOBS = ("docs/*.md", "benchmarks/README.md", "notebooks/README.md",
                 "experiments/README.md")  # fmt: skip
BEGIN = re.compile(r"<!-- skv:timings (\w+) -->")
END = "<!-- /skv:timings -->"
#: a duration: 5 s, ~1.5 min, 2,520 s, 21-24 minutes, about 2 hours
DURATION = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s*-\s*\d[\d,]*(?:\.\d+)?)?\s*"
    r"(?:s|sec|secs|seconds|min|mins|minutes|h|hrs|hours)\b"
)
#: what the docs must not time by hand: the commands a reader budgets for, and the steps
TIMED = re.compile(
    r"--quick|reproduce\.sh|\.ci/run|\binstall|\bvenv\b|setup_vllm|"
    r"test suite|\bpytest\b|full run|\bstep(?:'s)?\b|\bquick\b|\b(?:fig|tab)_[a-z0-9_]+|"
    r"(?<!% )\bCI\b"
)
#: a sentence with one of these gives a duration as a parameter of a study (a TTFT, an SLO, a
#: session gap, a timeout), not the time something takes to run
PARAMETER = re.compile(
    r"TTFT|\bSLO\b|\b[Gg]aps?\b|_gap|[Ii]nterval|[Tt]imeout|think time|"
    r"[Aa]rrival|[Ww]arm-up|\bqueue\b|\bevery\b"
)
STEP = re.compile(r"\b(?:fig|tab)_[a-z0-9_]+")


# ------------------------------------------------------------------------- measuring


def machine() -> dict[str, Any]:
    """What the time was measured on: logical cores, memory, CPU model."""
    mem_gib = None
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
                break
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "memory_gib": mem_gib, "cpu": cpu}


#: what a result depends on: a change here that is not committed (an untracked file that git
#: does not ignore included) makes a revision "+dirty"
RESULT_SOURCES = ("skv", "experiments", "notebooks", "pyproject.toml", "requirements.lock")
#: files under RESULT_SOURCES that no result reads: the claims, and the records that
#: ``timings record`` and ``measured record`` write
NOT_RESULT_SOURCES = (
    "experiments/claims.yaml",
    "experiments/measurements.json",
    "experiments/timings.json",
)


def revision(root: Path = REPO) -> str | None:
    """The git commit the results come from (12 hex digits), with "+dirty" when a source of
    results (:data:`RESULT_SOURCES`) differs from it; None outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(("git", "-C", str(root), *args), capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        excluded = [f":(exclude){f}" for f in NOT_RESULT_SOURCES]
        dirty = git("status", "--porcelain", "--untracked-files=normal", "--", *RESULT_SOURCES,
                    *excluded)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def write_text(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_bench_json(path: Path, script: str, argv: list[str], rows: list[Any]) -> None:
    """A benchmark's rows with the command that made them, the date, the machine and what
    ran compiled: the file the docs' speed statements cite (``benchmarks/results/``)."""
    from skv._build import build_status

    write_json(
        path,
        {
            "command": f"python benchmarks/{script} " + " ".join(argv),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(),
            "python": sys.version.split()[0],
            "compiled": sorted(k for k, v in build_status().items() if v == "compiled"),
            "rows": rows,
        },
    )


def mark(phase: str, start: float, build: Path, **extra: Any) -> dict[str, Any]:
    """Record that ``phase`` ran from ``start`` (epoch seconds) until now, in
    ``build/<phase>.json``."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: expected one of {', '.join(PHASES)}")
    rec = {"seconds": round(time.time() - start, 1), "finished": now(), "machine": machine(),
           **extra}  # fmt: skip
    write_json(build / f"{phase}.json", rec)
    return rec


def run_record(
    results: Iterable[Any], total_s: float, *, quick: bool, jobs: int, all_steps: Sequence[str]
) -> dict[str, Any]:
    """A pipeline run's times (``results``: the pipeline's Result objects). ``complete``: every
    step of ``all_steps`` ran in this run, so ``total_s`` is the time of the whole mode."""
    steps = {}
    for r in results:
        steps[r.step] = {"status": r.status, "seconds": round(r.seconds, 1)}
        if getattr(r, "cpu_seconds", None) is not None:
            steps[r.step]["cpu_s"] = round(r.cpu_seconds, 1)
    complete = set(steps) == set(all_steps) and all(s["status"] == "ran" for s in steps.values())
    cpu = [s["cpu_s"] for s in steps.values() if "cpu_s" in s]
    return {"mode": "quick" if quick else "full", "finished": now(), "machine": machine(),
            "revision": revision(), "jobs": jobs, "total_s": round(total_s, 1),
            **({"cpu_s": round(sum(cpu), 1)} if cpu else {}),
            "complete": complete, "steps": steps}  # fmt: skip


# ------------------------------------------------------------------------- the record


def load(path: Path = RECORD) -> dict[str, Any]:
    """The record: ``phases[phase]`` and ``runs[mode]`` are the latest measurement of a phase
    and complete run of a mode, ``phases_by_cpu`` and ``runs_by_cpu`` the latest per CPU model
    (a time differs by machine more than by commit, and a reader's machine may be either),
    ``steps[mode]`` each step's latest time."""
    if not path.is_file():
        return {"phases": {}, "phases_by_cpu": {}, "runs": {}, "runs_by_cpu": {}, "steps": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    data.setdefault("phases_by_cpu", {})
    data.setdefault("runs_by_cpu", {})
    for key in ("phases", "phases_by_cpu", "runs", "runs_by_cpu", "steps"):
        if not isinstance(data.get(key), dict):
            raise ValueError(f"{path}: field {key!r} must be an object")
    for latest, by_cpu in (("phases", "phases_by_cpu"), ("runs", "runs_by_cpu")):
        for name, rec in data[latest].items():  # a record from before the per-CPU fields
            data[by_cpu].setdefault(name, {}).setdefault(_cpu(rec), rec)
    return data


def _newer(rec: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """``rec`` was measured after ``than`` (or there is nothing to compare): a build folder
    kept from an earlier run never replaces a later measurement (``finished``: ISO 8601 UTC
    times of one format, so they order as strings)."""
    return than is None or str(rec.get("finished", "")) > str(than.get("finished", ""))


def _keep(record: dict[str, Any], latest: str, name: str, rec: dict[str, Any]) -> bool:
    """Keep ``rec`` as the latest of ``name`` (a phase or mode) under ``latest`` ("phases" or
    "runs") and as the latest on its CPU model, each only where it is newer than what is
    there; True when it was kept as either."""
    by_cpu = record.setdefault(f"{latest}_by_cpu", {}).setdefault(name, {})
    kept = False
    if _newer(rec, by_cpu.get(_cpu(rec))):
        by_cpu[_cpu(rec)] = rec
        kept = True
    if _newer(rec, record[latest].get(name)):
        record[latest][name] = rec
        kept = True
    return kept


def _each_cpu(record: Mapping[str, Any], latest: str, name: str) -> list[Mapping[str, Any]]:
    """The latest of ``name`` on each CPU model, latest first (a record that did not come
    through :func:`load` may have no per-CPU field: then its one latest)."""
    by_cpu = record.get(f"{latest}_by_cpu", {}).get(name)
    if not by_cpu:
        rec = record[latest].get(name)
        by_cpu = {_cpu(rec): rec} if rec else {}
    return sorted(by_cpu.values(), key=lambda r: str(r.get("finished")), reverse=True)


def _cpu(run: Mapping[str, Any]) -> str:
    return str(run.get("machine", {}).get("cpu", "?"))


def merge(record: dict[str, Any], build: Path) -> list[str]:
    """Fold the measurements under ``build`` into ``record``; return what changed."""
    changed = []
    for phase in PHASES:
        f = build / f"{phase}.json"
        if f.is_file():
            rec = json.loads(f.read_text(encoding="utf-8"))
            if _keep(record, "phases", phase, rec):
                changed.append(f"{phase}: {rec['seconds']} s")
    for f in (build / "timings.json", build / "quick" / "timings.json"):
        if not f.is_file():
            continue
        run = json.loads(f.read_text(encoding="utf-8"))
        mode = run["mode"]
        per_step = record["steps"].setdefault(mode, {})
        for name, s in run["steps"].items():
            if s["status"] == "ran":
                new = {"seconds": s["seconds"], "finished": run["finished"],
                       "machine": run["machine"]}  # fmt: skip
                if "cpu_s" in s:  # runs from before CPU accounting have none
                    new["cpu_s"] = s["cpu_s"]
                if _newer(new, per_step.get(name)):
                    per_step[name] = new
                    changed.append(f"{mode} {name}: {s['seconds']} s")
        keep = ("finished", "machine", "revision", "jobs", "total_s", "cpu_s")
        rec = {k: run[k] for k in keep if k in run} | {"steps": len(run["steps"])}
        if run["complete"] and _keep(record, "runs", mode, rec):
            changed.append(f"{mode} run: {run['total_s']} s")
    return changed


# ------------------------------------------------------------------------- rendering


def fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_machine(m: Mapping[str, Any]) -> str:
    mem = f", {m['memory_gib']} GiB" if m.get("memory_gib") else ""
    return f"{m.get('cores', '?')} cores{mem}, {m.get('cpu', '?')}"


def _when(rec: Mapping[str, Any]) -> str:
    return str(rec.get("finished", "?"))[:10]


def _budget(key: str, seconds: float | None) -> str:
    if key not in BUDGETS:
        return "-"
    b = BUDGETS[key]
    if seconds is None:
        return fmt_seconds(b)
    return f"{fmt_seconds(b)}: {'within' if seconds <= b else 'over'}"


def render_summary(
    record: Mapping[str, Any], steps: Sequence[str], engine: Collection[str] = ()
) -> str:
    """What a reader budgets for: each phase and mode, its time against the project's budget
    (:data:`BUDGETS`), when and on what it was measured; a phase or mode measured on several
    CPU models gets a row for each (latest first)."""
    rows = ["| what | time | budget | measured on |", "|---|---:|---|---|"]
    for phase, what in PHASES.items():
        recs = _each_cpu(record, "phases", phase)
        if recs:
            for rec in recs:
                rows.append(f"| {what} | {fmt_seconds(rec['seconds'])} | "
                            f"{_budget(phase, rec['seconds'])} | {_when(rec)}, "
                            f"{fmt_machine(rec['machine'])} |")  # fmt: skip
        else:
            rows.append(f"| {what} | not measured yet | {_budget(phase, None)} | |")
    for mode, what in MODES.items():
        runs = _each_cpu(record, "runs", mode)
        timed = record["steps"].get(mode, {})
        if runs:
            for run in runs:
                rows.append(f"| {what}, {run['steps']} steps, `-j {run['jobs']}` | "
                            f"{fmt_seconds(run['total_s'])} | {_budget(mode, run['total_s'])} | "
                            f"{_when(run)}, {fmt_machine(run['machine'])} |")  # fmt: skip
        elif timed:
            total = sum(s["seconds"] for s in timed.values())
            missing = len([s for s in steps if s not in timed])
            note = f"; {missing} steps never timed" if missing else ""
            rows.append(f"| {what}: not timed end to end; its steps one by one add up to | "
                        f"{fmt_seconds(total)} | {_budget(mode, None)} | {len(timed)} steps"
                        f"{note}, {_when(min(timed.values(), key=_when))} to "
                        f"{_when(max(timed.values(), key=_when))} |")  # fmt: skip
        else:
            rows.append(f"| {what} | not measured yet | {_budget(mode, None)} | |")
    return "\n".join(rows)


def render_steps(
    record: Mapping[str, Any], steps: Sequence[str], engine: Collection[str] = ()
) -> str:
    """Every step's latest measured time, quick and full (one row per step), and its CPU time
    where the run recorded one (the step's processes, engines and workers included: what it
    costs however it shared the machine), then the sums of the steps that measure a real
    engine's time (``engine``: they run alone, one at a time) and of the others (two at a
    time)."""
    rows = ["| step | `--quick` | CPU | quick measured on | full | CPU | full measured on |",
            "|---|---:|---:|---|---:|---:|---|"]  # fmt: skip
    quick, full = record["steps"].get("quick", {}), record["steps"].get("full", {})

    def on(t: Mapping[str, Any] | None) -> str:
        return f"{_when(t)}, {fmt_machine(t['machine'])}" if t else "not timed yet"

    def cell(t: Mapping[str, Any] | None, key: str) -> str:
        return fmt_seconds(t[key]) if t and key in t else "-"

    for name in steps:
        q, f = quick.get(name), full.get(name)
        rows.append(
            f"| `{name}` | {cell(q, 'seconds')} | {cell(q, 'cpu_s')} | {on(q)} | "
            f"{cell(f, 'seconds')} | {cell(f, 'cpu_s')} | {on(f)} |"
        )
    groups = {
        "steps timing an engine (full run: alone)": [s for s in steps if s in engine],
        "other steps, two at a time": [s for s in steps if s not in engine],
    }
    for label, group in groups.items():
        if not group:
            continue
        sums = []
        for times in (quick, full):
            for key in ("seconds", "cpu_s"):
                timed = [times[s][key] for s in group if key in times.get(s, {})]
                part = "" if len(timed) == len(group) else f" ({len(timed)} of {len(group)} timed)"
                sums.append(fmt_seconds(sum(timed)) + part if timed else "-")
        rows.append(f"| sum of the {len(group)} {label} | {sums[0]} | {sums[1]} | | "
                    f"{sums[2]} | {sums[3]} | |")  # fmt: skip
    return "\n".join(rows)


RENDERERS = {"summary": render_summary, "steps": render_steps}


def render_text(
    text: str,
    record: Mapping[str, Any],
    steps: Sequence[str],
    where: str,
    engine: Collection[str] = (),
) -> str:
    """``text`` with every generated block replaced by what ``record`` renders."""
    out, pos = [], 0
    for m in BEGIN.finditer(text):
        if m.start() < pos:
            continue
        name = m.group(1)
        end = text.find(END, m.end())
        if name not in RENDERERS:
            raise ValueError(f"{where}: unknown timings block {name!r} ({', '.join(RENDERERS)})")
        if end < 0:
            raise ValueError(f"{where}: timings block {name!r} has no {END}")
        out += [text[pos : m.end()], "\n", RENDERERS[name](record, steps, engine), "\n"]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _blocks_removed(text: str) -> str:
    """``text`` with the generated blocks blanked out (line numbers kept)."""

    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(r"<!-- skv:timings \w+ -->.*?<!-- /skv:timings -->", blank, text, flags=re.S)


def _units(text: str, markdown: bool) -> list[list[tuple[int, str]]]:
    """Prose paragraphs and list items (lines joined: sentences wrap); every heading, table
    row, code line or shell comment is a unit of its own."""
    units: list[list[tuple[int, str]]] = []
    cur: list[tuple[int, str]] = []
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        alone = (not markdown or in_code or s.startswith(("|", "#", "```"))
                 or s.startswith("<!--"))  # fmt: skip
        if s.startswith("```"):
            in_code = not in_code
        if not s or alone or s.startswith(("- ", "* ")) or re.match(r"\d+\. ", s):
            if cur:
                units.append(cur)
            cur = []
        if s and alone:
            units.append([(n, s)])
        elif s:
            cur.append((n, s))
    if cur:
        units.append(cur)
    return units


def hand_typed(text: str, where: str) -> list[str]:
    """Durations outside the generated blocks in a paragraph (or list item, table row, line of
    code) that names a timed thing (:data:`TIMED`), unless the duration's own sentence makes it
    a parameter of a study (:data:`PARAMETER`: a TTFT, an SLO, a gap, a timeout)."""
    problems = []
    markdown = where.endswith(".md")
    for unit in _units(_blocks_removed(text), markdown):
        joined = " ".join(s for _, s in unit)
        timed = TIMED.search(joined)
        if not timed:
            continue
        start = 0
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", joined):
            start = joined.index(sentence, start)
            for d in DURATION.finditer(sentence):
                if PARAMETER.search(STEP.sub("", sentence)):
                    break
                line = next((n for n, s in unit if d.group(0) in s), unit[0][0])
                problems.append(f"{where}:{line}: {d.group(0)!r} in a paragraph naming "
                                f"{timed.group(0)!r}: {sentence.strip()[:140]}")  # fmt: skip
            start += len(sentence)
    problems += _timed_table_rows(text, where) if markdown else []
    return problems


def _timed_table_rows(text: str, where: str) -> list[str]:
    """Rows of a Markdown table with a seconds/time column that give a timed thing a number."""
    problems, header = [], None
    for n, line in enumerate(_blocks_removed(text).splitlines(), 1):
        s = line.strip()
        if not s.startswith("|"):
            header = None
        elif header is None:
            header = s
        elif (re.search(r"seconds|\btime\b|wall", header, re.I) and TIMED.search(s)
              and re.search(r"\|\s*[\d,.]+\s*(?:s|min)?\s*\|", s)):  # fmt: skip
            problems.append(f"{where}:{n}: a timed row in a table of times: {s[:140]}")
    return problems


def checked_files(root: Path = REPO) -> list[Path]:
    files = [root / p for p in CHECKED_DOCS if (root / p).is_file()]
    for g in CHECKED_GLOBS:
        files += sorted(root.glob(g))
    return files


def _rendered(
    steps: Sequence[str], root: Path, record_path: Path | None, engine: Collection[str]
) -> Iterator[tuple[Path, str, str, str]]:
    """Each checked doc: its path, its name under ``root``, its text, and that text with the
    generated blocks rendered from the record."""
    record = load(record_path or root / "experiments" / "timings.json")
    for f in checked_files(root):
        text = f.read_text(encoding="utf-8")
        rel = f.relative_to(root).as_posix()
        yield f, rel, text, render_text(text, record, steps, rel, engine)


def check(
    steps: Sequence[str],
    root: Path = REPO,
    record_path: Path | None = None,
    engine: Collection[str] = (),
) -> list[str]:
    """Every problem with the docs' times: stale blocks, and times typed by hand (``steps``: the
    pipeline's step names, in order; ``engine``: those that run a real engine)."""
    problems = []
    for _, rel, text, rendered in _rendered(steps, root, record_path, engine):
        if rendered != text:
            problems.append(f"{rel}: a timings block differs from experiments/timings.json "
                            "(python -m skv.artifact.pipeline timings render)")  # fmt: skip
        problems += hand_typed(text, rel)
    return problems


def render(
    steps: Sequence[str],
    root: Path = REPO,
    record_path: Path | None = None,
    engine: Collection[str] = (),
) -> list[Path]:
    """Rewrite the generated blocks; return the files that changed."""
    changed = []
    for f, _, text, rendered in _rendered(steps, root, record_path, engine):
        if rendered != text:
            write_text(f, rendered)
            changed.append(f)
    return changed


# ------------------------------------------------------------------------- command line


def record(build: Path, record_path: Path = RECORD) -> list[str]:
    """Fold ``build``'s measurements into the committed record; return what changed."""
    data = load(record_path)
    changed = merge(data, build)
    write_json(record_path, data)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """``mark`` only: the one command shell scripts call, with any Python 3.11 and no venv
    (``record``, ``render`` and ``check`` need the step registry:
    ``python -m skv.artifact.pipeline timings``)."""
    ap = argparse.ArgumentParser(prog="python -m skv.artifact.timings",
                                 description=__doc__.split("\n")[0])  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mark", help="record that a phase ran from --start until now")
    m.add_argument("phase", choices=list(PHASES))
    m.add_argument("--start", type=float, required=True, help="epoch seconds (date +%%s.%%N)")
    m.add_argument("--build", type=Path, default=REPO / "build")
    m.add_argument("--exit", type=int, default=None, help="the phase's exit status")
    m.add_argument("--note", default=None)
    args = ap.parse_args(argv)
    extra = {k: v for k, v in (("exit", args.exit), ("note", args.note)) if v is not None}
    rec = mark(args.phase, args.start, args.build, **extra)
    print(f"[timings] {args.phase}: {rec['seconds']} s -> {args.build / args.phase}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
