"""A workload compiled once (skv.sim.compile_run) and served under many policies gives the
results of compiling it for every run, and is never changed by a run."""

from __future__ import annotations

import json

import pytest

from skv.latency import make_latency_model
from skv.sim import SimConfig, compile_run, simulate
from skv.workloads import make_workload

LATENCY = make_latency_model("roofline", model="qwen2.5-1.5b", gpu="A40")


def _result(res) -> str:
    return json.dumps(
        {"summary": res.summary, "requests": res.requests, "memory": res.memory}, sort_keys=True,
        default=str,
    )  # fmt: skip


def _blocks(rb) -> tuple:
    return list(rb.keys), None if rb.next_use is None else list(rb.next_use)


def _snapshot(run) -> list:
    """Everything a run could write onto the compiled blocks."""
    out = []
    for rb, (ext, start) in zip(run.trace, run.answers or [(None, 0)] * len(run.trace),
                                strict=True):  # fmt: skip
        out.append((_blocks(rb), start, None if ext is None else _blocks(ext)))
    return out


@pytest.mark.parametrize(
    ("workload", "params", "extra"),
    [
        ("tool_agent", {"num_requests": 120}, {}),  # text segments: answers are cached
        (
            "sharegpt_like",
            {"num_requests": 150, "arrival_min_s": 0.02, "arrival_max_s": 0.05},
            {"replicas": 2, "router": "round_robin"},
        ),
        (
            "tool_use",
            {"num_requests": 150},
            {"tiers": ["cpu=2GB@lru,link=pcie5"], "tier_model": "qwen2.5-1.5b"},
        ),
        ("tool_agent", {"num_requests": 120}, {"include_output_blocks": False}),  # no answers
        ("hash_ids", {}, {"block_size": 512, "replicas": 2, "router": "least_loaded"}),
    ],
)
def test_one_compiled_workload_serves_every_policy_as_a_fresh_compile_would(
    workload, params, extra
):
    if workload == "hash_ids":  # a hash-id trace (CacheRoute's): answers are not cached
        from skv.experiments.cacheroute.workloads import generate

        requests = generate("aggregate", {"keys": 40, "num_requests": 200}, 20.0, 3)
        assert requests[0].hash_ids is not None
    else:
        requests = make_workload(workload, seed=3, **params)
    shuffled = list(reversed(requests))  # compile_run orders by arrival, as simulate does
    policies = ["lru", "saecache", "vllm", "adaptive_semantic", "lru"]
    if "tiers" not in extra:  # a tier takes an online policy of the radix cache
        policies.insert(2, "belady")  # offline: it writes next uses, onto its own copy
    else:
        policies.remove("vllm")
    capacity = 60 if workload == "hash_ids" else 300
    base = SimConfig(policy="lru", capacity_blocks=capacity, **extra)
    run = compile_run(shuffled, base)
    before = _snapshot(run)
    for policy in policies:
        config = SimConfig(policy=policy, capacity_blocks=capacity, **extra)
        assert _result(simulate(run, config, LATENCY)) == _result(
            simulate(requests, config, LATENCY)
        ), policy
    assert _snapshot(run) == before


def test_a_run_compiled_for_other_keying_is_refused():
    requests = make_workload("tool_agent", seed=0, num_requests=20)
    run = compile_run(requests, SimConfig(policy="lru", capacity_blocks=100))
    for change in ({"block_size": 32}, {"mode": "segment"}, {"include_output_blocks": False},
                   {"salt_by_tenant": True}):  # fmt: skip
        config = SimConfig(policy="lru", capacity_blocks=100, **change)
        with pytest.raises(ValueError, match="compiled for"):
            simulate(run, config, LATENCY)
