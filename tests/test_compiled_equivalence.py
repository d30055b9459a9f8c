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

import pytest

from skv._build import ROOT, build_status
from skv.policies.registry import POLICIES

# without a build both sides are plain Python and every comparison here passes vacuously
pytestmark = pytest.mark.skipif(
    "compiled" not in build_status().values(),
    reason="nothing is compiled here (no C compiler?): nothing to compare the fallback with",
)

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


def _run_pure_python(tmp_path: Path, script: str, *args: str) -> str:
    """Run ``script`` with ``args`` on a copy of ``skv/`` without its compiled modules (so the
    plain-Python fallback runs); returns its stdout."""
    copy = tmp_path / "src"
    shutil.copytree(
        ROOT / "skv",
        copy / "skv",
        ignore=shutil.ignore_patterns("*.so", "*.c", "*.pyd", "__pycache__"),
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": str(copy)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


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
    fallback = json.loads(_run_pure_python(tmp_path, SCRIPT, str(trace_path), ",".join(policies)))
    assert fallback == _rows_here(trace_path, policies)
    assert any(r["evictions"] for r in fallback)  # the comparison exercised eviction


COMPACT_LRU = """
import json, sys
from skv.blocks import iter_blocks
from skv.compact_trace import CompactTrace
from skv.replay import replay_trace
from skv.traces import load_trace
ct = CompactTrace(iter_blocks(load_trace(sys.argv[1]), 512, "prefix"))
rows = replay_trace(ct, ["lru", "vllm"], ["8", "20%"], progress=False)
print(json.dumps([{k: v for k, v in r.items() if k != "replay_seconds"} for r in rows]))
"""


def test_node_replay_fallback_matches_the_compiled_one(tmp_path):
    """lru and vllm on a compact trace run a radix node at a time (skv.cache.node_replay),
    compiled here and plain Python in the copy: the same rows as the block replay of the
    list."""
    trace_path = tmp_path / "tree.jsonl"
    _write_tree_trace(trace_path)
    script = (
        "from skv._build import build_status\n"
        'assert set(build_status().values()) == {"python"}, build_status()\n' + COMPACT_LRU
    )
    fallback = json.loads(_run_pure_python(tmp_path, script, str(trace_path)))
    assert fallback == _rows_here(trace_path, ["lru", "vllm"])
    assert fallback[0]["evictions"] > 0 and fallback[1]["evictions"] > 0


# saecache reads what the tree trace above lacks (sessions, tool and template segments, output
# blocks, in-flight requests), so its compiled and pure runs are also compared on a trace that
# exercises every queue, the log-normal timing and every learner, down to the last bit of every
# logged parameter (json keeps floats exactly).
SAECACHE_RUN = """
import json, random
from skv.blocks import RequestBlocks
from skv.model import TYPE_INDEX, SemanticType as ST
from skv.policies.registry import make_cache

LABELS = [ST.SYSTEM, ST.TEMPLATE, ST.USER_QUERY, ST.TOOL_OUTPUT, ST.TOOL_SCHEMA,
          ST.ASSISTANT_HISTORY, ST.RETRIEVED_CONTEXT, ST.REASONING, ST.OUTPUT]


def trace(seed, n=700):
    rng = random.Random(seed)
    ids, history, out, t = {}, {}, [], 0.0
    for i in range(n):
        t += rng.choice((0.0, 0.0, 0.3, 1.0, 2.0, 7.0, 30.0, 120.0))
        r = rng.random()
        session, templated = None, False
        if r < 0.45:
            s = rng.randrange(10)
            session = f"s{s}"
            labels = list(history.get(session, [rng.choice((0, 1))]))
            for _ in range(rng.randint(1, 3)):
                labels.append(rng.choice((2, 5, 7, 3, 4) if s < 4 else (2, 5, 7)))
            if rng.random() < 0.4:
                labels.append(8)
            history[session] = labels
        elif r < 0.75:
            templated = True
            labels = [1, rng.choice((1, 6)), *[rng.choice((2, 6, 4)) for _ in range(4)]]
            labels = labels[: rng.randint(1, 6)]
        else:
            labels = [0, *[rng.choice((2, 6, 7, 8)) for _ in range(rng.randint(0, 4))]]
        keys, parent = [], None
        for lab in labels:
            keys.append(ids.setdefault((parent, lab), len(ids) + 1))
            parent = keys[-1]
        k = len(keys)
        stypes = [TYPE_INDEX[LABELS[lab]] for lab in labels]
        out.append(RequestBlocks(i, t, keys, [None, *keys[:-1]], [4] * k, stypes, [4 * k] * k,
                                 session, 0, templated, 4))
    return out


FAST = {"update_every": 5, "min_gap_samples": 3, "gap_window": 20, "min_gamma_samples": 3,
        "gamma_window": 15}
SAECACHE = [
    ("saecache", FAST),
    ("saecache", {**FAST, "position_levels": 3, "promote_hits": 2}),
    ("saecache", {}),
    ("saecache_fixed", {"gamma": 0.6, "mu": {"chat": 1.0, "agentic": 3.0}, "sigma": 0.4}),
]


def run(configs=SAECACHE):
    rows = []
    for seed, (name, params) in enumerate(configs):
        cache = make_cache(name, 30, params, record_evictions=True)
        rng = random.Random(seed)
        held, series = [], []
        for rb in trace(seed):
            held.append(cache.acquire(rb, rb.arrival_s))
            while len(held) > 3 or (held and rng.random() < 0.5):
                cache.release(held.pop(rng.randrange(len(held))), rb.arrival_s)
            if rb.index % 20 == 0:
                series.append(cache.policy.metrics())
        rows.append({"evictions": cache.eviction_log, "metrics": series,
                     "hit": cache.stats.block_hit_rate})
    return rows
"""


def test_saecache_pure_python_fallback_is_bit_identical_on_every_queue(tmp_path):
    script = (
        "from skv._build import build_status\n"
        'assert set(build_status().values()) == {"python"}, build_status()\n'
        + SAECACHE_RUN
        + "print(json.dumps(run()))\n"
    )
    fallback = _run_pure_python(tmp_path, script)
    namespace: dict = {}
    exec(SAECACHE_RUN, namespace)
    here = json.dumps(namespace["run"]())
    assert fallback.strip() == here
    rows = json.loads(here)
    assert all(len(r["evictions"]) > 200 for r in rows)
    last = rows[0]["metrics"][-1]  # the learners moved every parameter
    assert last["alpha_updates"] > 10 and last["weight_updates"] > 10
    assert last["gap_samples_chat"] >= 3 and last["gap_samples_agentic"] >= 3
    assert last["mu_chat"] != 2.28 and last["mu_agentic"] != 2.28 and last["gamma"] != 1.0


# The literature's policies (issue 31) read what the tree trace lacks as well: ttl_pin and kvflow
# act on sessions and tool calls only (on the tree trace they are exactly LRU), lhd learns per
# semantic type, marconi tunes alpha online. So each is also compared on saecache's session
# trace, with parameters that make its learner move within 700 requests.
FRONTIER = [
    ("ttl_pin", {}),
    ("ttl_pin", {"initial_ttl_s": 5.0, "gap_window": 7, "ttl_quantile": 0.5}),
    ("ttl_pin", {"all_sessions": True, "max_sessions": 4, "gap_window": 3}),
    ("ttl_pin", {"ttl_quantile": 0.75}),
    ("kvflow", {}),
    ("kvflow", {"prior": False, "age_out": 1.5}),
    ("kvflow", {"age_out": float("inf"), "ewma_alpha": 0.3, "max_sessions": 5}),
    ("kvflow", {"age_out": 2.0}),
    ("pgdsf", {"attn_crossover": 8.0}),
    ("pgdsf", {"attn_crossover": "4e4"}),  # as YAML reads it: converted as in plain Python
    ("lhd", {"reconfigure_interval": 256}),
    ("lhd", {"reconfigure_interval": 64, "associativity": 4}),
    ("marconi", {}),
    ("marconi", {"bootstrap_multiplier": 1, "refresh_fraction": 0.5, "attn_crossover": 8.0}),
    ("marconi", {"tune": False, "alpha": 1.0}),
    ("lhd", {"features": "hits"}),
    ("lhd", {"features": "reuse", "reconfigure_interval": 128}),
    ("arc", {}),
    ("s3fifo", {}),
    ("s3fifo", {"small_ratio": 0.3}),
    ("sieve", {}),
    ("wtinylfu", {}),
    ("wtinylfu", {"window_ratio": 0.5}),
]


def test_frontier_policies_pure_python_fallback_is_bit_identical_on_sessions(tmp_path):
    script = (
        "from skv._build import build_status\n"
        'assert set(build_status().values()) == {"python"}, build_status()\n'
        + SAECACHE_RUN
        + f"print(json.dumps(run(json.loads({json.dumps(FRONTIER)!r}))))\n"  # keeps inf
    )
    fallback = _run_pure_python(tmp_path, script)
    namespace: dict = {}
    exec(SAECACHE_RUN, namespace)
    here = json.dumps(namespace["run"](FRONTIER))
    rows = json.loads(here)
    for (name, params), got, want in zip(FRONTIER, json.loads(fallback), rows, strict=True):
        assert got == want, (name, params)
    assert all(len(r["evictions"]) > 100 for r in rows)
    assert fallback.strip() == here


# The serving simulator and the routers are compiled too: a small cluster run per router and
# view, compiled here against plain Python in a copy, request by request, every memory sample
# and every iteration priced (json keeps floats).
SIM_RUN = """
import hashlib, json, sys
from skv.experiments.cacheroute.workloads import generate
from skv.latency import make_latency_model
from skv.sim import SimConfig, simulate

def run(routers):
    reqs = generate("aggregate", {"num_requests": 1500}, 40.0, 0)
    latency = make_latency_model("roofline", model="llama-3.3-70b-fp8", gpu="H100", tp=4)
    out = {}
    for router in routers:
        for view in ("exact", "approximate"):
            cfg = SimConfig(policy="vllm", capacity_blocks=150, block_size=512, replicas=4,
                            router=router, router_view=view, sample_every_s=0.5)
            steps = []  # every iteration priced: replica, start, end, batch (floats by repr)
            hook = lambda k, s, e, it: steps.append(repr((k, s, e, it)))
            res = simulate(reqs, cfg, latency, progress=False, on_iteration=hook)
            out[f"{router}/{view}"] = {
                "requests": res.requests,
                "summary": res.summary,
                "memory": res.memory,
                "iterations": [len(steps), hashlib.sha256("\\n".join(steps).encode()).hexdigest()],
            }
    return json.loads(json.dumps(out))

if __name__ == "__main__":
    from skv._build import build_status
    assert set(build_status().values()) == {"python"}, build_status()
    print(json.dumps(run(sys.argv[1].split(","))))
"""

SIM_ROUTERS = ["least_loaded", "prefix_locality", "semantic_locality", "sglang_cache_aware",
               "dynamo_cost", "cacheroute", "precise"]  # fmt: skip


def test_pure_python_simulator_and_routers_match_the_compiled_ones(tmp_path):
    fallback = json.loads(_run_pure_python(tmp_path, SIM_RUN, ",".join(SIM_ROUTERS)))
    namespace: dict = {}
    exec(compile(SIM_RUN, "sim_run", "exec"), namespace)
    here = namespace["run"](SIM_ROUTERS)
    assert fallback.keys() == here.keys()
    for key in here:
        assert fallback[key] == here[key], key
    hits = [here[f"{r}/approximate"]["summary"]["token_hit_rate"] for r in SIM_ROUTERS]
    assert max(hits) > min(hits) > 0  # the routers differ and the caches hit


# The tiered store (skv.tiers) is compiled too: every movement rule (write-through or on
# eviction, copy or move on load, cascades over three tiers, a GPU tier smaller than a
# request), the pricer's both choices on lookup runs of several segments, requests held in
# flight, and a serving run with answers written down, compiled here against plain Python in
# a copy, request by request (json keeps the floats).
TIERED_RUN = """
import json, random
from dataclasses import asdict
from skv.blocks import RequestBlocks
from skv.latency import make_latency_model
from skv.model import NUM_TYPES, Request, Segment, SemanticType as ST, content_hash
from skv.sim import SimConfig, simulate
from skv.sizing import get_model
from skv.tiers import LINKS, LoadPricer, TieredCache, TierSpec

MODEL = "llama-3.1-8b"
LAT = make_latency_model("roofline", model=MODEL, gpu="H100")


def trace(seed, n=500):
    # 1-3 lookup runs per request, each a prefix of one of 60 chains of 1-6 blocks (a key's
    # parent, tokens and type are fixed; no key twice in a request)
    rng = random.Random(seed)
    chains = [[100 * c + b for b in range(rng.randint(1, 6))] for c in range(60)]
    out = []
    for i in range(n):
        runs = rng.sample(chains[: 8 + i // 8], rng.randint(1, 3))
        keys, parents = [], []
        for run in runs:
            run = run[: rng.randint(1, len(run))]
            keys += run
            parents += [None, *run[:-1]]
        tokens = [(4, 16, 64)[k % 3] for k in keys]
        stypes = [k % NUM_TYPES for k in keys]
        out.append(RequestBlocks(i, 0.5 * i, keys, parents, tokens, stypes, list(tokens), None,
                                 0, False, 64))
    return out


STACKS = [
    ("lru", 12, [("cpu", 30, "lru")], "through", "copy", "cheaper"),
    ("lru", 10, [("cpu", 15, "lru"), ("disk", 40, "sieve")], "evict", "move", "load"),
    ("s3fifo", 8, [("cpu", 20, "s3fifo"), ("disk", 30, "lru"), ("remote", 60, "wtinylfu")],
     "through", "copy", "cheaper"),
    ("gdsf", 10, [("cpu", 25, "arc")], "evict", "copy", None),
    ("lru", 3, [("cpu", 6, "fifo"), ("disk", 50, "lru")], "evict", "move", "cheaper"),
    ("saecache", 9, [("ssd", 40, "lhd")], "through", "copy", "load"),
]


def replays():
    rows = []
    for seed, (top, cap, lower, write, load, choice) in enumerate(STACKS):
        specs = [(TierSpec(name, str(c), policy), c) for name, c, policy in lower]
        links = [LINKS[spec.link] for spec, _ in specs]
        pricer = None if choice is None else LoadPricer(
            LAT, get_model(MODEL).kv_bytes_per_token, links, choice=choice)
        tc = TieredCache(top, cap, specs, write=write, load=load, pricer=pricer)
        rng = random.Random(seed)
        held, served = [], []
        for rb in trace(seed):
            lease = tc.acquire(rb, rb.arrival_s)
            served.append([lease.where, lease.hit_blocks, lease.hit_tokens, lease.load_ms])
            held.append(lease)
            while len(held) > 2 or (held and rng.random() < 0.6):
                tc.release(held.pop(rng.randrange(len(held))), rb.arrival_s)
        for lease in held:
            tc.release(lease, 1e6)
        rows.append({"served": served, "tiers": asdict(tc.tier_stats),
                     "stats": asdict(tc.stats), "load_ms": tc.take_load_ms(),
                     "held": [sorted(s.blocks) for s in tc.tiers]})
    return rows


def serving():
    rng = random.Random(5)
    reqs = []
    for i in range(150):
        a, b = rng.sample(range(15), 2)  # two distinct documents
        segs = [Segment(ST.SYSTEM, 48, content_hash(f"sys{rng.randrange(2)}")),
                Segment(ST.RETRIEVED_CONTEXT, 96, content_hash(f"d{a}")),
                Segment(ST.RETRIEVED_CONTEXT, 96, content_hash(f"d{b}")),
                Segment(ST.USER_QUERY, 20, content_hash(f"q{i}"))]
        reqs.append(Request(f"r{i}", 0.02 * i, segs, output_tokens=rng.randint(1, 40)))
    out = {}
    for mode in ("prefix", "segment"):
        choice = "cheaper" if mode == "prefix" else "load"
        config = SimConfig(policy="lru", capacity_blocks=40, block_size=16, mode=mode,
                           tiers=["cpu=60", "disk=400@sieve"], tier_choice=choice,
                           tier_model=MODEL)
        res = simulate(reqs, config, LAT, progress=False)
        out[mode] = {"requests": res.requests, "summary": res.summary}
    return out


def run():
    return json.loads(json.dumps({"replays": replays(), "serving": serving()}))
"""


def test_tiered_store_pure_python_fallback_is_bit_identical(tmp_path):
    script = (
        "from skv._build import build_status\n"
        'assert set(build_status().values()) == {"python"}, build_status()\n'
        + TIERED_RUN
        + "print(json.dumps(run()))\n"
    )
    fallback = json.loads(_run_pure_python(tmp_path, script))
    namespace: dict = {}
    exec(compile(TIERED_RUN, "tiered_run", "exec"), namespace)
    here = namespace["run"]()
    assert len(fallback["replays"]) == len(here["replays"])
    for stack, (got, want) in enumerate(zip(fallback["replays"], here["replays"], strict=True)):
        assert got == want, stack
    assert fallback["serving"] == here["serving"]
    tiers = [r["tiers"] for r in here["replays"]]
    # the comparison exercised loads from every lower tier, recomputes, drops and demotions
    assert all(sum(t["hit_blocks"][1:]) > 0 for t in tiers)
    assert all(t["evictions"][-1] > 0 for t in tiers)
    assert sum(sum(t["recomputed_segments"]) for t in tiers) > 0
    assert sum(sum(t["loaded_segments"]) for t in tiers) > 0
    summary = here["serving"]["segment"]["summary"]
    assert summary["tiers"][1]["hit_tokens"] > 0 and summary["tiers"][2]["hit_tokens"] > 0
