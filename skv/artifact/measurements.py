"""Which run each full-run claim's expected value comes from: the measurement record.

``experiments/claims.yaml`` states what each claim expects; ``experiments/measurements.json``
says which run measured it. Per step of the full run it keeps the commit the step ran from, when
it finished, the machine, and the values it wrote that claims read. ARTIFACT.md's claims table
prints the commit and date beside each claim (:func:`labels`), and tests/test_measurements.py
fails when a claim's expected value, tolerance or thesis does not hold on the recorded values: a
claim re-set by hand without a run, or a rerun whose values moved and were not recorded.

``python -m skv.artifact.pipeline measured record [BUILD]`` folds what a full run wrote
(``BUILD/.cache/<step>.json``, stamped by the pipeline with its revision and time, and
``BUILD/steps/<step>/claims.json``) into the record. A step run from a tree whose sources of
results had uncommitted changes (revision ``...+dirty``) is refused: no commit reproduces it.
Quick-mode claims need no record: CI runs ``--quick`` and checks them every time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skv.artifact import claims as claims_mod
from skv.artifact import timings
from skv.artifact.claims import ClaimsFile, Produced, Row

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "experiments" / "measurements.json"
#: where under BUILD the pipeline stamps the steps it ran (skv.artifact.pipeline.Layout.cache)
STAMPS = ".cache"


def load(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    """The record's steps: name -> {revision, finished, machine, values}."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    steps = data.get("steps")
    if not isinstance(steps, dict):
        raise ValueError(f"{path}: field 'steps' must be an object")
    for name, m in steps.items():
        for field in ("revision", "finished", "values"):
            if field not in m:
                raise ValueError(f"{path}: steps.{name}: field {field!r} missing")
    return steps


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def record(doc: ClaimsFile, build: Path, record_path: Path = RECORD) -> tuple[list[str], list[str]]:
    """Fold the full-run steps under ``build`` into the record; return (what changed, what was
    refused and why). Only the values some claim reads are kept."""
    steps = load(record_path)
    read: dict[str, set[str]] = {}
    for c in doc.claims:
        read.setdefault(c.step, set()).add(c.value)
    run = _read_json(build / "timings.json") or {}
    ran_in_run = {n for n, s in run.get("steps", {}).items() if s.get("status") == "ran"}
    changed, refused = [], []
    for step, names in sorted(read.items()):
        stamp = _read_json(build / STAMPS / f"{step}.json")
        wrote = claims_mod.read_raw_values(build / "steps" / step)
        if stamp is None or wrote is None:
            continue
        rev = stamp.get("revision")
        if not rev or rev.endswith("+dirty"):
            refused.append(f"{step}: ran from {rev or 'an unknown revision'}; commit, then rerun")
            continue
        # stamps before the pipeline wrote the mode: the run's record, or the quick layout
        mode = stamp.get("mode") or (
            run.get("mode") if step in ran_in_run else ("quick" if build.name == "quick" else None)
        )
        if mode != "full":
            refused.append(f"{step}: not a full run ({mode or 'mode unknown'}); only full runs "
                           "are recorded")  # fmt: skip
            continue
        new = {
            "revision": rev,
            "finished": stamp["finished"],
            "values": {k: wrote[k] for k in sorted(names) if k in wrote},
        }
        old = steps.get(step)
        if step in ran_in_run and run.get("machine"):
            new["machine"] = run["machine"]
        elif old is not None and old.get("finished") == new["finished"] and "machine" in old:
            new["machine"] = old["machine"]  # the same run, recorded before
        if old == new:
            continue
        steps[step] = new
        changed.append(f"{step}: {rev} at {new['finished']}")
    if changed:
        timings.write_json(record_path, {"steps": dict(sorted(steps.items()))})
    return changed, refused


def check(doc: ClaimsFile, steps: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """Every claim's full-run expectation against the recorded values of its step."""
    rows = []
    for c in doc.claims:
        m = steps.get(c.step)
        got = Produced.parse(m["values"].get(c.value)) if m else None
        row = claims_mod.check_one(c, got, quick=False, skip_reason=None, wrote=m is not None)
        if row.status == "missing":
            why = (
                f"the record of {c.step} has no value {c.value!r}"
                if m
                else f"no recorded full run of {c.step}: ./reproduce.sh {c.step}, commit, then "
                "python -m skv.artifact.pipeline measured record"
            )
            row = Row(row.claim, row.status, row.expected, row.tolerance, None, why)
        rows.append(row)
    return rows


def labels(steps: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Step -> "DATE `COMMIT`", the measurement column of ARTIFACT.md's claims table."""
    return {name: f"{m['finished'][:10]} `{m['revision'][:7]}`" for name, m in steps.items()}
