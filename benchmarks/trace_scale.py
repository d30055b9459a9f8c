"""Trace memory at scale: build an N-times scale-up of the Claude Code sessions, then measure
``skv traces info`` on it (wall seconds and peak RSS of a fresh process).

The scale-up (issue 15's test case) copies every ``weka_cc/trace_*.json`` session ``N`` times,
the copies renamed (``id`` -> ``<id>-x<k>``; local hash ids are tagged per session id, so every
copy is a distinct session with its own blocks: N times the requests, accesses and unique
blocks, the same reuse inside each session). Nothing is downloaded; the files go to ``--out``
(default a temporary directory, deleted afterwards).

Then the binary cache of parsed traces (:mod:`skv.traces.parsed_cache`): one fresh process
loads the trace and writes its cache entry, a second loads it from the entry; both report the
load alone (issue 15's bar for the second load of 20x: <= 5 s), and the entry's size.

With ``--curve``, another runs ``skv replay --capacity-curve`` (the one-pass lru curve, lru and
vllm sampled at R = 0.1 and 0.01, Belady at three capacities): wall seconds and peak RSS.

With ``--replay``, one more fresh process replays the trace (``skv replay``, read through that
cache entry) with lru, vllm and adaptive_semantic at 10% of its unique blocks: peak RSS and
block accesses per second per policy (issue 15's bar for 20x: <= 2 GB, lru >= 3M/s). Online
policies replay a :class:`skv.compact_trace.CompactTrace`.

Each ``--scales`` value is built and measured in turn, smallest first; a scale whose projected
peak RSS (bytes per block access of the previous scale times its accesses) would exceed
``--max-rss-gb`` (default 8) is projected instead of run, so a regression to per-access memory
reports itself rather than exhausting the machine. The issue's bar for 20x: <= 2 GB, <= 60 s.

Run: ``python benchmarks/trace_scale.py [--scales 1 2 4 20] [--max-rss-gb 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skv.traces import find_trace


def scale_up(src: Path, out: Path, copies: int) -> int:
    """Write ``copies`` renamed copies of every session in ``src`` to ``out``; returns files."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for path in sorted(src.glob("trace_*.json")):
        data = json.loads(path.read_text())
        base = data.get("id") or path.stem
        for k in range(copies):
            data["id"] = f"{base}-x{k}"
            (out / f"{path.stem}-x{k}.json").write_text(json.dumps(data))
            n += 1
    return n


_LOAD = """
import sys, time
import os
os.environ["SKV_TRACE_CACHE"] = sys.argv[2]
from skv.traces.cli import load_requests
t0 = time.perf_counter()
load_requests(sys.argv[1], "claude_code", None)  # what every skv command does
print(time.perf_counter() - t0)
"""


def measure_load(trace_dir: Path, cache: Path) -> float:
    """Seconds to load the trace through the binary cache in ``cache``, in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD, str(trace_dir), str(cache)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(proc.stdout.split()[-1])


REPLAY_POLICIES = ("lru", "vllm", "adaptive_semantic")

#: runs ``skv ARGS`` and reports its own peak RSS, so each measurement is of one process
_SKV = """
import resource, sys
from skv.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def run_skv(argv: list[str], **env: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """``skv ARGV`` in a fresh process: the finished process, wall seconds, peak RSS in GB."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _SKV, *argv], capture_output=True, text=True, check=True,
        env={**os.environ, **env},
    )  # fmt: skip
    wall = time.perf_counter() - t0
    peak_kb = int(re.search(r"PEAK_RSS_KB (\d+)", proc.stderr)[1])  # Linux: KiB
    return proc, wall, peak_kb / 2**20


def measure_replay(trace_dir: Path, cache: Path, out: Path) -> dict[str, float]:
    """``skv replay`` in a fresh process: peak RSS and each policy's accesses per second."""
    proc, _, peak_gb = run_skv(
        ["replay", str(trace_dir), "--format", "claude_code", "--policies", *REPLAY_POLICIES,
         "--capacity", "10%", "--quiet", "--output", str(out)],
        SKV_TRACE_CACHE=str(cache),
    )  # fmt: skip
    rows = json.loads((out / "replay_results.json").read_text())["results"]
    seconds = {m[1]: float(m[2]) for m in re.finditer(r"(\w+) @ \d+ blocks: .*\(([\d.]+)s\)",
                                                      proc.stderr)}  # fmt: skip
    result = {"peak_rss_gb": peak_gb}
    for r in rows:
        result[r["policy"]] = r["block_accesses"] / seconds[r["policy"]]
    return result


CURVE_RATES = ("0.1", "0.01")


def measure_curve(trace_dir: Path, cache: Path, out: Path) -> dict[str, float]:
    """``skv replay --capacity-curve`` in a fresh process (lru and vllm sampled at
    :data:`CURVE_RATES`, Belady at the default three capacities): wall seconds (the load from
    the trace cache included), peak RSS, and how Belady was had (full or the sample's rate)."""
    _, wall, peak_gb = run_skv(
        ["replay", str(trace_dir), "--format", "claude_code", "--capacity-curve", "--policies",
         "lru", "vllm", "--sample-rate", *CURVE_RATES, "--output", str(out)],
        SKV_TRACE_CACHE=str(cache),
    )  # fmt: skip
    rows = json.loads((out / "capacity_curve.json").read_text())["rows"]
    belady = {r["sample_rate"] for r in rows if r["method"] == "belady"}
    return {"wall_s": wall, "peak_rss_gb": peak_gb, "belady_rate": max(belady, default=0.0)}


def measure_info(trace_dir: Path) -> dict[str, float | int]:
    """``skv traces info`` in a fresh process (trace cache off): wall seconds, peak RSS and the
    block accesses."""
    proc, wall, peak_gb = run_skv(
        ["traces", "info", str(trace_dir), "--format", "claude_code", "--no-trace-cache"]
    )
    accesses = int(re.search(r"block accesses\s+([\d,]+)", proc.stdout)[1].replace(",", ""))
    requests = int(re.search(r"requests\s+([\d,]+)", proc.stdout)[1].replace(",", ""))
    return {"wall_s": wall, "peak_rss_gb": peak_gb, "accesses": accesses, "requests": requests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 2, 4, 20])
    ap.add_argument("--max-rss-gb", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=None, help="keep the scaled traces here")
    ap.add_argument("--replay", action="store_true", help="also measure skv replay (slower)")
    ap.add_argument(
        "--curve", action="store_true", help="also measure skv replay --capacity-curve (slower)"
    )
    args = ap.parse_args()
    src = find_trace("weka_cc")
    root = args.out or Path(tempfile.mkdtemp(prefix="skv-scale-"))
    print(f"source: {src} ({len(list(src.glob('trace_*.json')))} sessions)")
    print(f"  {'scale':>5} {'requests':>9} {'accesses':>12} {'wall s':>8} {'peak RSS':>9} "
          f"{'B/access':>9} {'load+cache s':>12} {'cached s':>8} {'entry':>8}")  # fmt: skip
    per_access = None
    base_accesses = None
    try:
        for scale in sorted(args.scales):
            if per_access is not None and base_accesses is not None:
                projected = per_access * base_accesses * scale / 2**30
                if projected > args.max_rss_gb:
                    print(f"  {scale:>5} projected {projected:,.1f} GB peak RSS (> "
                          f"--max-rss-gb {args.max_rss_gb:g}): not run")  # fmt: skip
                    continue
            d = root / f"x{scale}"
            scale_up(src, d, scale)
            m = measure_info(d)
            if base_accesses is None:
                base_accesses = m["accesses"] / scale
            per_access = m["peak_rss_gb"] * 2**30 / m["accesses"]
            cache = root / f"cache-x{scale}"
            first = measure_load(d, cache)
            second = measure_load(d, cache)
            entry_mb = sum(f.stat().st_size for f in cache.iterdir()) / 2**20
            print(f"  {scale:>5} {m['requests']:>9,} {m['accesses']:>12,} {m['wall_s']:>8.1f} "
                  f"{m['peak_rss_gb']:>7.2f} GB {per_access:>9.0f} {first:>12.1f} {second:>8.1f} "
                  f"{entry_mb:>5.0f} MB")  # fmt: skip
            if args.replay:
                r = measure_replay(d, cache, root / f"replay-x{scale}")
                rates = ", ".join(f"{p} {r[p] / 1e6:.2f}M/s" for p in REPLAY_POLICIES)
                print(f"        replay: peak RSS {r['peak_rss_gb']:.2f} GB; accesses/s: {rates}")
            if args.curve:
                c = measure_curve(d, cache, root / f"curve-x{scale}")
                how = "full" if c["belady_rate"] == 1.0 else f"sampled at {c['belady_rate']:g}"
                print(f"        capacity curve: {c['wall_s']:.1f} s, peak RSS "
                      f"{c['peak_rss_gb']:.2f} GB (Belady {how})")  # fmt: skip
            if args.out is None:
                shutil.rmtree(d)
                shutil.rmtree(cache)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
