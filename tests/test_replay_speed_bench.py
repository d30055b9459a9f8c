"""benchmarks/replay_speed.py's --json: the file the docs' speed tables cite holds every timed
row with its command and machine (a smoke run on a tiny stream; speeds are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from skv._build import ROOT


def test_json_output_has_every_row_the_command_and_the_machine(tmp_path):
    out = tmp_path / "speed.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "replay_speed.py"), "--accesses", "3000",
         "--objects", "300", "--policies", "lru", "sieve", "--skip-mooncake", "--json", str(out)],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    doc = json.loads(out.read_text())
    impls = [r["implementation"] for r in doc["rows"]]
    assert impls[0] == "OrderedDict flat LRU" and impls[-2:] == ["skv lru", "skv sieve"]
    assert {r["accesses"] for r in doc["rows"]} == {3000}
    assert all(r["accesses_per_s"] > 0 and 0 <= r["block_hit_rate"] <= 1 for r in doc["rows"])
    assert doc["command"].endswith(f"--json {out}") and doc["machine"]["cores"] >= 1
