"""skv's eviction plugin inside the real vLLM (the engine venv): against vLLM's own BlockPool
driven as the scheduler drives it, and served over HTTP with a typed trace that evicts.

Needs the engine venv (scripts/setup_vllm.sh installs the plugin); skipped without it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from skv.vllm.server import checkout_root, engine_env

pytestmark = pytest.mark.vllm
CHECK = "skv.experiments.vllm_eviction.plugin_check"


def engine_run(engine_python, code: list[str], extra_env: dict | None = None, timeout=300):
    env = {**engine_env(), "PYTHONPATH": str(checkout_root()), **(extra_env or {})}
    return subprocess.run(
        [str(engine_python), *code], capture_output=True, text=True, env=env, timeout=timeout,
        cwd=checkout_root(),
    )  # fmt: skip


def test_plugin_pool_against_vllms_pool_and_the_simulator(engine_python):
    """vLLM's own BlockPool (stock) vs the plugin's subclass with lru: identical hits and cached
    hashes over 500 requests that evict; every policy's hits equal skv's simulation."""
    p = engine_run(engine_python, ["-m", CHECK, "--requests", "500"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert res["ok"] and res["stock_vs_lru"]["hits_equal"] and res["stock_vs_lru"]["cached_equal"]
    assert res["stock_vs_lru"]["evictions"] > 1000  # the order was exercised
    pols = res["policies"]
    from skv.policies.registry import OFFLINE, POLICIES

    assert set(pols) == {p for p in POLICIES if p != "vllm" and p not in OFFLINE}
    assert all(v["hits_equal"] and v["requests_disagreeing"] == 0 for v in pols.values())
    # not every policy is LRU under another name: the typed workload separates them
    assert pols["static_semantic"]["plugin_hit_tokens"] > pols["lru"]["plugin_hit_tokens"]


def test_plugin_check_fails_when_the_plugin_misorders(engine_python):
    """The check can fail: a plugin pool that frees head first (not vLLM's tail first) breaks
    stock equality."""
    code = (
        f"import sys, {CHECK} as pc, skv.vllm.eviction_plugin as ep\n"
        "make = ep.make_pool_class\n"
        "def bad(settings):\n"
        "    cls = make(settings)\n"
        "    class Bad(cls):\n"
        "        def free_blocks(self, blocks):\n"
        "            super().free_blocks(list(blocks)[::-1])\n"
        "    return Bad\n"
        "pc.make_pool_class = bad\n"
        "sys.exit(pc.main(['--requests', '300', '--policies', 'lru']))\n"
    )
    p = engine_run(engine_python, ["-c", code])
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads(p.stdout)["stock_vs_lru"]["hits_equal"] is False


def test_plugin_refuses_another_vllm_version(engine_python):
    code = (
        "import skv.vllm.eviction_plugin as ep\n"
        "ep.PINNED_VLLM = '0.0.1'\n"
        "try:\n"
        "    ep.register()\n"
        "except ep.PluginError as e:\n"
        "    print('REFUSED', e)\n"
    )
    p = engine_run(engine_python, ["-c", code], {"SKV_EVICTION": "lru"})
    assert "REFUSED skv eviction plugin: written for vLLM 0.0.1, found 0.32.0" in p.stdout, p.stderr
    # unset, the plugin does nothing (no version check, no patch): stock vLLM
    code_off = (
        "import os, skv.vllm.eviction_plugin as ep\n"
        "import vllm.v1.core.kv_cache_coordinator as c\n"
        "ep.PINNED_VLLM = '0.0.1'\n"
        "ep.register()\n"
        "print('CLASS', c.BlockPool.__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKV_EVICTION")}
    p = engine_run(engine_python, ["-c", code_off], {**env, "SKV_EVICTION": ""})
    assert "CLASS BlockPool" in p.stdout, p.stderr


def test_the_shim_is_installed_and_inert_without_a_policy(engine_python):
    code = (
        "from importlib.metadata import entry_points\n"
        "eps = {e.name: e.value for e in entry_points(group='vllm.general_plugins')}\n"
        "print(eps.get('skv_eviction'))\n"
        "import skv_vllm_eviction; skv_vllm_eviction.register(); print('inert')\n"
    )
    p = engine_run(engine_python, ["-c", code], {"SKV_EVICTION": ""})
    assert p.stdout.split() == ["skv_vllm_eviction:register", "inert"], p.stderr
    p = engine_run(engine_python, ["-c", code], {"SKV_EVICTION": "lru", "SKV_CHECKOUT": "/nope"})
    assert "SKV_CHECKOUT does not name an skv checkout" in p.stderr


def test_served_engine_with_policies_matches_stock_and_the_simulator(engine_python, tmp_path):
    """Over HTTP, on a served tiny model with a cache that evicts: the plugin's lru gives every
    request the cached tokens stock vLLM gives it; saecache's measured cached tokens equal
    skv's simulation of saecache; the types sent in vllm_xargs reach the policy (its side file
    counts evictions of system, tool schema and tool output blocks)."""
    from skv.experiments.vllm_eviction import study

    cfg = {**study.DEFAULTS, "num_requests": 50, "policies": ["lru", "saecache"],
           "spread_seeds": 1, "concurrency": 2, "concurrent_variants": ["saecache"],
           "work_dir": str(tmp_path)}  # fmt: skip
    res = study.run_vllm_eviction(cfg)
    assert not res["skipped"]
    rows = {r["variant"]: r for r in res["rows"]}
    assert res["stock_lru_identical"] == 1.0
    assert all(r["exact_agreement"] == 1.0 for r in rows.values()), rows
    # the engine evicted, and the policies differ on it (the comparison is not vacuous)
    assert rows["stock"]["measured_hit_rate"] < 0.9
    assert rows["saecache"]["measured_hit_rate"] != rows["lru"]["measured_hit_rate"]
    by_type = rows["saecache"]["evictions_by_type"]
    assert {"tool_output", "system"} <= set(by_type), by_type
    # learned state exported, and learned from what the client sent: the sessions in
    # vllm_xargs gave saecache inter-turn gaps to fit
    assert rows["saecache"]["policy_metrics"]["gap_samples_agentic"] > 0
    # the concurrent pass ran on the same engine after a cache reset and reports its gap to the
    # sequential simulation
    assert "concurrent_gap_pts" not in rows["lru"]
    sae = rows["saecache"]
    gap = 100 * abs(sae["concurrent_hit_rate"] - sae["simulated_hit_rate"])
    assert res["max_concurrent_gap_pts"] == sae["concurrent_gap_pts"] == pytest.approx(gap)
    # one engine served both policies: lru from its start, saecache after a switching reset,
    # then saecache's concurrent pass after a second reset
    lines = [json.loads(x) for x in (tmp_path / "eviction-plugin.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["policy"] == "lru"
    resets = [x for x in lines if x["event"] == "reset"]
    assert [x["policy"] for x in resets] == ["saecache", "saecache"]
    assert lines[0]["vllm"] == "0.32.0" and lines[0]["num_blocks"] == 64


def test_a_pass_after_a_cache_reset_or_a_policy_switch_sees_what_a_fresh_engine_sees(
    engine_python, tmp_path
):
    """The study runs every policy on one engine, switched with /reset_prefix_cache
    (VllmServer.switch_eviction), and its concurrent passes after a reset, instead of
    starting an engine for each: that is sound only if a reset engine serves the trace as a
    fresh one does. lru, then saecache (learned gaps, the client clock, a request count: the
    most state of any policy) twice on one engine give every request the cached tokens that
    saecache gives on an engine of its own, both times; lru's differ (the switch is real)."""
    from skv.experiments.engine import synthetic_trace
    from skv.experiments.vllm_eviction import study

    cfg = {**study.DEFAULTS, "num_requests": 50, "work_dir": str(tmp_path)}
    trace = synthetic_trace(cfg)
    got = study.measure_variants(cfg, trace, tmp_path, [("lru", [1]), ("saecache", [1, 1])])
    fresh = study.measure(cfg, trace, tmp_path / "fresh", "saecache")
    cached = {
        name: [r.cached_tokens for r in p["results"]]
        for name, p in (("lru", got["lru"][0]), ("switched", got["saecache"][0]),
                        ("reset", got["saecache"][1]), ("fresh", fresh[0]))
    }  # fmt: skip
    assert all(r.ok for ps in (*got.values(), fresh) for p in ps for r in p["results"])
    assert sum(cached["fresh"]) > 0 and min(cached["fresh"]) == 0  # hits and misses
    assert cached["switched"] == cached["fresh"] == cached["reset"]
    assert cached["lru"] != cached["fresh"]
    # the plugin's log is cut at the resets: each pass has its own lines
    assert got["lru"][0]["plugin_log"][0]["event"] == "start"
    assert [p["plugin_log"][0]["policy"] for p in got["saecache"]] == ["saecache"] * 2
