#!/usr/bin/env python3
"""Mutation testing of skv's core with mutmut, in pure-Python mode; ``./reproduce.sh mutate``.

    python scripts/mutate.py [MODULE ...] [--jobs N] [--time-limit MIN] [--list] [--report]

MODULE is a key of ``[tool.mutmut.modules]`` in pyproject.toml (``skv/routing``,
``skv/artifact/claims.py``) or its last part (``routing``, ``claims``); default: all, in the
order listed there. Each module gets one mutmut run in its own copy of the tree,
``build/mutation/work/NAME/``:

- the copy has no compiled hot path (no ``*.so``, ``*.pyd`` or generated ``*.c``), so every
  module runs as plain Python and no extension module shadows a mutated ``.py``; mutmut copies
  that tree into ``work/NAME/mutants/``, which is first on ``sys.path`` (before the editable
  install's finder, which comes after the path entries). The conftest's stale-build check sees
  plain Python and lets the suite run; ``tests/test_mutation_kills.py`` checks under mutmut that
  no hot-path module was loaded from an extension (mutmut stops at the clean run if one was).
- its pyproject.toml carries a ``[tool.mutmut]`` for that module alone: ``only_mutate`` its files,
  ``pytest_add_cli_args_test_selection`` its test files, every other top-level file in
  ``also_copy`` (tests read examples/, experiments/, notebooks/ ...).

Results: ``build/mutation/NAME.json`` (counts, survivors with file:line and diff),
``build/mutation/NAME-survivors.md`` (the survivors' diffs) and ``build/mutation/scores.md`` (the
table over every module measured so far). ``work/NAME/`` stays for inspection: ``cd`` there and
run ``../../../../.venv/bin/mutmut browse`` or ``mutmut show MUTANT``. Each run starts from a fresh
copy, so a score always reflects the current sources and tests.

Standard library only; does not import skv.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "mutation"
WORK = OUT / "work"
MUTMUT_VERSION = "3.8.1"

#: never copied into a work tree (top level)
SKIP_TOP = {
    ".git",
    ".venv",
    ".venv-vllm",
    "build",
    "outputs",
    "out",
    "mutants",
    ".skv-cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".mypy_cache",
}
#: never copied, anywhere: compiled modules, Cython's generated C, caches
SKIP_ANY = ("__pycache__", "*.so", "*.pyd", "*.c", "*.egg-info", "*.pyc")
#: mutmut copies these into mutants/ itself
MUTMUT_COPIES = {"skv", "tests", "pyproject.toml", "setup.cfg", "mutants"}
#: the status mutmut gives each exit code, grouped: detected counts as killed
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}


def load_config() -> tuple[dict, dict[str, list[str]]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    modules = cfg.pop("modules")
    return cfg, modules


def slug(module: str) -> str:
    name = module.removeprefix("skv/").removesuffix(".py").strip("/")
    return name.replace("/", "-")


def resolve(names: list[str], modules: dict[str, list[str]]) -> list[str]:
    if not names:
        return list(modules)
    out = []
    for name in names:
        key = name.rstrip("/")
        hits = [m for m in modules if key in (m, slug(m), Path(m).stem, m.removeprefix("skv/"))]
        if len(hits) != 1:
            sys.exit(f"unknown module {name!r}; known: {', '.join(modules)}")
        out.append(hits[0])
    return out


def prepare(module: str, tests: list[str], base: dict, work: Path) -> list[str]:
    """A fresh copy of the tree without compiled modules, configured for this module alone."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns(*SKIP_ANY)
    for src in sorted(ROOT.iterdir()):
        if src.name in SKIP_TOP or src.name.endswith(".egg-info"):
            continue
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, work / src.name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, work / src.name, follow_symlinks=False)
    compiled = [p for p in work.rglob("*") if p.suffix in (".so", ".pyd")]
    if compiled:
        sys.exit(f"compiled modules in the mutation copy: {compiled[:3]}")

    present = [t for t in tests if (work / t).exists()]
    for t in sorted(set(tests) - set(present)):
        print(f"[mutate] {module}: test file {t} not found, left out", file=sys.stderr)
    guard = "tests/test_mutation_kills.py"
    if (work / guard).exists() and guard not in present:
        present.append(guard)
    if not present:
        sys.exit(f"{module}: none of its test files exist")
    target = module if module.endswith(".py") else module.rstrip("/") + "/*"
    conf = dict(base)
    conf.update(
        source_paths=["skv"],
        only_mutate=[target],
        pytest_add_cli_args_test_selection=present,
        also_copy=sorted(p.name for p in work.iterdir() if p.name not in MUTMUT_COPIES),
        use_git_change_detection=False,
    )
    text = _without_mutmut_tables((ROOT / "pyproject.toml").read_text())
    text += "\n[tool.mutmut]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in conf.items())
    (work / "pyproject.toml").write_text(text)
    return present


def _without_mutmut_tables(text: str) -> str:
    out, skip = [], False
    for line in text.splitlines(keepends=True):
        header = re.match(r"\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$", line)
        if header:
            name = header.group(1).replace('"', "")
            skip = name == "tool.mutmut" or name.startswith("tool.mutmut.")
        if not skip:
            out.append(line)
    return "".join(out)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"unsupported [tool.mutmut] value {value!r}")


def run_mutmut(work: Path, log: Path, jobs: int, limit_s: float | None) -> tuple[int, bool]:
    """``mutmut run`` in ``work``; on the time limit it is interrupted (its results so far stay)."""
    mutmut = Path(sys.executable).with_name("mutmut")
    cmd = [str(mutmut), "run", "--max-children", str(jobs)]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("MUTANT_UNDER_TEST", None)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=work, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            return proc.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # mutmut stops its workers and keeps results
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return proc.returncode, True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


#: run with the venv's python inside a work tree: every mutant, its status and (unless killed) diff
_COLLECT = r"""
import json, sys
import mutmut.__main__  # noqa: F401  (sets mutmut up as its CLI does)
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files
out = []
for path in walk_mutatable_files():
    m = SourceFileMutationData(path=path)
    try:
        m.load()
    except Exception:
        continue
    for name, code in m.exit_code_by_key.items():
        status = status_by_exit_code[code]
        diff = "" if status == "killed" else get_diff_for_mutant(name, path=path)
        out.append({"name": name, "path": str(path), "status": status, "diff": diff})
json.dump(out, sys.stdout)
"""


def collect(work: Path) -> list[dict]:
    res = subprocess.run(
        [sys.executable, "-c", _COLLECT], cwd=work, capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        sys.exit("could not read mutmut's results")
    mutants = json.loads(res.stdout)
    for m in mutants:
        m["line"] = locate(work / m["path"], m["name"], m["diff"])
    return mutants


def locate(src: Path, name: str, diff: str) -> int | None:
    """The source line a mutant changes: its diff's first removed line, searched in its function."""
    func = name.rpartition(".")[2].rsplit("__mutmut_", 1)[0]
    parts = func.removeprefix("x_").split("ǁ") if "ǁ" in func else [func.removeprefix("x_")]
    parts = [p for p in parts if p and p != "x"]
    tree = ast.parse(src.read_text())
    lines = src.read_text().splitlines()
    span = None
    scope: list = [tree]
    for part in parts:
        found = None
        for node in scope:
            for child in ast.walk(node):
                if (
                    isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and child.name == part
                ):
                    found = child
                    break
            if found:
                break
        if found is None:
            break
        scope, span = [found], (found.lineno, found.end_lineno)
    removed = [
        ln[1:].strip()
        for ln in diff.splitlines()
        if ln.startswith("-") and not ln.startswith("---") and ln[1:].strip()
    ]
    if span and removed:
        for i in range(span[0] - 1, span[1]):
            if lines[i].strip() == removed[0]:
                return i + 1
    return span[0] if span else None


def summarise(
    module: str, tests: list[str], mutants: list[dict], wall_s: float, interrupted: bool
) -> dict:
    counts: dict[str, int] = {}
    for m in mutants:
        counts[m["status"]] = counts.get(m["status"], 0) + 1
    total = len(mutants)
    killed = sum(n for s, n in counts.items() if s in DETECTED)
    undetected = [m for m in mutants if m["status"] not in DETECTED]
    undetected.sort(key=lambda m: (m["path"], m["line"] or 0, m["name"]))
    return {
        "module": module,
        "date": datetime.date.today().isoformat(),
        "mutmut": MUTMUT_VERSION,
        "tests": tests,
        "total": total,
        "killed": killed,
        "survived": counts.get("survived", 0),
        "no_tests": counts.get("no tests", 0),
        "not_checked": counts.get("not checked", 0),
        "other": total
        - killed
        - counts.get("survived", 0)
        - counts.get("no tests", 0)
        - counts.get("not checked", 0),
        "statuses": counts,
        "score": round(100 * killed / total, 1) if total else None,
        "wall_s": round(wall_s),
        "interrupted": interrupted,
        "survivors": [
            {k: m[k] for k in ("name", "path", "line", "status", "diff")} for m in undetected
        ],
    }


def write_survivors(summary: dict, path: Path) -> None:
    lines = [f"# Mutants of {summary['module']} not killed ({summary['date']})", ""]
    for m in summary["survivors"]:
        lines += [
            f"## {m['path']}:{m['line']} {m['status']}: `{m['name']}`",
            "",
            "```diff",
            m["diff"].strip(),
            "```",
            "",
        ]
    path.write_text("\n".join(lines))


def write_table(modules: list[str]) -> Path:
    rows = []
    for module in modules:
        f = OUT / f"{slug(module)}.json"
        if not f.exists():
            rows.append(f"| `{module}` | not measured | | | | | | |")
            continue
        s = json.loads(f.read_text())
        score = "" if s["score"] is None else f"{s['score']:.1f}%"
        checked = s["total"] - s["not_checked"]
        if s["interrupted"] or s["not_checked"]:
            of_checked = f"{100 * s['killed'] / checked:.1f}%" if checked else "-"
            score = f"partial: {checked} checked, {of_checked} of them killed"
        rows.append(
            f"| `{module}` | {s['total']} | {s['killed']} | {s['survived']} | {s['no_tests']} | "
            f"{s['not_checked'] + s['other']} | {score} | {s['date']}, {s['wall_s']} s |"
        )
    table = OUT / "scores.md"
    table.write_text(
        f"# Mutation scores (mutmut {MUTMUT_VERSION}, pure Python; `./reproduce.sh mutate`)\n\n"
        "killed = killed + timeout (a mutant the tests detect); score = killed / mutants.\n"
        "no tests = mutated code that no selected test runs (an undetected mutant too).\n\n"
        "| module | mutants | killed | survived | no tests | not checked / other | score | "
        "measured |\n|---|---:|---:|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n"
    )
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules of [tool.mutmut.modules] (default: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel mutants")
    ap.add_argument(
        "--time-limit",
        type=float,
        metavar="MIN",
        help="stop each module's run after MIN minutes (its score is then partial)",
    )
    ap.add_argument("--list", action="store_true", help="list the modules and their tests")
    ap.add_argument("--report", action="store_true", help="only rewrite build/mutation/scores.md")
    args = ap.parse_args(argv)
    base, modules = load_config()
    if args.list:
        for module, tests in modules.items():
            print(f"{module:26} {' '.join(tests)}")
        return 0
    chosen = resolve(args.modules, modules)
    OUT.mkdir(parents=True, exist_ok=True)
    status = 0
    for module in [] if args.report else chosen:
        name = slug(module)
        work = WORK / name
        tests = prepare(module, modules[module], base, work)
        print(f"[mutate] {module}: mutmut in {work.relative_to(ROOT)} with {' '.join(tests)}")
        start = time.monotonic()
        rc, interrupted = run_mutmut(
            work, OUT / f"{name}.log", args.jobs, args.time_limit * 60 if args.time_limit else None
        )
        wall = time.monotonic() - start
        if rc != 0 and not interrupted:
            print(
                f"[mutate] {module}: mutmut failed (exit {rc}); see build/mutation/{name}.log",
                file=sys.stderr,
            )
            status = 1
            continue
        summary = summarise(module, tests, collect(work), wall, interrupted)
        (OUT / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
        write_survivors(summary, OUT / f"{name}-survivors.md")
        print(
            f"[mutate] {module}: {summary['killed']}/{summary['total']} killed "
            f"({summary['score']}%), {len(summary['survivors'])} not killed, {wall:.0f} s"
            + (" (time limit: partial)" if interrupted else "")
        )
    print(f"[mutate] {write_table(list(modules)).relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
