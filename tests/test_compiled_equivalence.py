"""The compiled hot path and the plain-Python fallback must give identical results.

``setup.py`` compiles the hot path with Cython when a C compiler exists; without one the same
files run as Python. This test copies the package's sources (no compiled modules) to a temporary
directory, replays a small trace there through every policy, and compares with this process.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from skv._build import ROOT
from skv.policies.registry import POLICIES

SCRIPT = """
import json, sys
from skv._build import build_status
from skv.traces import load_trace
from skv.replay import compile_trace, replay_trace
assert set(build_status().values()) == {"python"}, build_status()
trace = compile_trace(load_trace(sys.argv[1]), 512)
rows = replay_trace(trace, sys.argv[2].split(","), ["8", "20%"], progress=False)
print(json.dumps([{k: v for k, v in r.items() if k != "replay_seconds"} for r in rows]))
"""


def _rows_here(trace_path: Path, policies: list[str]) -> list[dict]:
    from skv.replay import compile_trace, replay_trace
    from skv.traces import load_trace

    trace = compile_trace(load_trace(trace_path), 512)
    rows = replay_trace(trace, policies, ["8", "20%"], progress=False)
    return json.loads(
        json.dumps([{k: v for k, v in r.items() if k != "replay_seconds"} for r in rows])
    )


def _write_tree_trace(path: Path, n: int = 400, seed: int = 7) -> None:
    """A Mooncake-format trace: prompts share prefixes of a random tree of 512-token blocks."""
    rng = random.Random(seed)
    prefixes: list[list[int]] = [[0]]
    next_id = 1
    with path.open("w") as f:
        for i in range(n):
            base = list(rng.choice(prefixes))
            for _ in range(rng.randint(1, 4)):
                base.append(next_id)
                next_id += 1
            prefixes.append(base)
            tokens = 512 * (len(base) - 1) + rng.randint(1, 512)
            rec = {
                "timestamp": i * 100,
                "input_length": tokens,
                "output_length": 5,
                "hash_ids": base,
            }
            f.write(json.dumps(rec) + "\n")


def test_pure_python_fallback_matches_the_compiled_hot_path(tmp_path):
    trace_path = tmp_path / "tree.jsonl"
    _write_tree_trace(trace_path)
    policies = list(POLICIES)
    copy = tmp_path / "src"
    shutil.copytree(
        ROOT / "skv",
        copy / "skv",
        ignore=shutil.ignore_patterns("*.so", "*.c", "*.pyd", "__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(copy)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(trace_path), ",".join(policies)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    fallback = json.loads(out.stdout)
    assert fallback == _rows_here(trace_path, policies)
    assert any(r["evictions"] for r in fallback)  # the comparison exercised eviction
