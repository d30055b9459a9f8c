"""Serving-simulator invariants (simulated time; the linear latency model unless stated)."""

from __future__ import annotations

import random

import pytest

from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, simulate

T = SemanticType


def rag_requests(n: int = 300, rate_rps: float = 5.0, docs: int = 8, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        segs = [
            Segment(T.SYSTEM, 300, content_hash("system")),
            Segment(T.RETRIEVED_CONTEXT, 600, content_hash(f"doc{rng.randrange(docs)}")),
            Segment(T.USER_QUERY, 40, content_hash(f"q{i}")),
        ]
        out.append(Request(f"r{i}", i / rate_rps, segs, output_tokens=rng.randint(5, 60)))
    return out


LINEAR = make_latency_model("linear")


@pytest.mark.parametrize("policy", ["lru", "vllm", "adaptive_semantic", "belady"])
def test_no_request_is_lost_and_ttft_covers_its_prefill(policy):
    reqs = rag_requests()
    res = simulate(reqs, SimConfig(policy=policy, capacity_blocks=300), LINEAR, progress=False)
    assert len(res.requests) == len(reqs)
    assert {r["request_id"] for r in res.requests} == {r.request_id for r in reqs}
    for r in res.requests:
        floor = LINEAR.ttft_ms(r["computed_tokens"], r["cached_tokens"])
        assert r["ttft_ms"] >= floor - 1e-6
        assert r["e2e_ms"] >= r["ttft_ms"] >= r["queue_ms"] >= 0
        assert r["cached_tokens"] + r["computed_tokens"] == r["prompt_tokens"]


def test_same_inputs_give_identical_results():
    a = simulate(rag_requests(), SimConfig(capacity_blocks=200), LINEAR, progress=False)
    b = simulate(rag_requests(), SimConfig(capacity_blocks=200), LINEAR, progress=False)
    assert a.requests == b.requests
    assert a.summary == b.summary


def test_a_warm_cache_lowers_ttft_under_the_linear_model():
    reqs = rag_requests(n=200, rate_rps=1.0)  # light load: no queueing
    cold = simulate(reqs, SimConfig(capacity_blocks=70), LINEAR, progress=False)
    warm = simulate(reqs, SimConfig(capacity_blocks=5000), LINEAR, progress=False)
    assert warm.summary["token_hit_rate"] > cold.summary["token_hit_rate"]
    assert warm.summary["ttft_ms_mean"] < cold.summary["ttft_ms_mean"]


def test_a_lone_request_sees_exactly_the_linear_ttft():
    req = rag_requests(n=1)
    res = simulate(req, SimConfig(), LINEAR, progress=False)
    r = res.requests[0]
    assert r["queue_ms"] == 0
    assert r["ttft_ms"] == pytest.approx(LINEAR.ttft_ms(r["prompt_tokens"] - 0, 0))


def test_the_cache_never_exceeds_capacity_and_pins_running_requests():
    res = simulate(
        rag_requests(rate_rps=50.0),
        SimConfig(capacity_blocks=150),
        LINEAR,
        progress=False,
    )
    assert res.memory
    assert all(m["cached_blocks"] <= 150 for m in res.memory)
    assert max(m["pinned_blocks"] for m in res.memory) > 0


def test_a_second_turn_hits_the_first_turns_answer():
    answer = content_hash("the answer")
    seg_sys = Segment(T.SYSTEM, 64, content_hash("s"))
    q1 = Segment(T.USER_QUERY, 32, content_hash("q1"))
    first = Request("t1", 0.0, [seg_sys, q1], output_tokens=48, output_hash=answer)
    hist = Segment(T.ASSISTANT_HISTORY, 48, answer)
    second = Request("t2", 10.0, [seg_sys, q1, hist, Segment(T.USER_QUERY, 16, content_hash("q2"))])
    res = simulate([first, second], SimConfig(), LINEAR, progress=False)
    by_id = {r["request_id"]: r for r in res.requests}
    # the prompt (64 + 32) and the answer (48) are cached: 144 tokens = 9 full blocks of 16
    assert by_id["t2"]["cached_tokens"] == 144
    off = simulate([first, second], SimConfig(include_output_blocks=False), LINEAR, progress=False)
    assert {r["request_id"]: r for r in off.requests}["t2"]["cached_tokens"] == 96


def test_replicas_split_the_load_and_each_has_its_own_cache():
    reqs = rag_requests(n=120)
    res = simulate(reqs, SimConfig(replicas=3, router="round_robin"), LINEAR, progress=False)
    assert sorted({r["replica"] for r in res.requests}) == [0, 1, 2]
    local = simulate(reqs, SimConfig(replicas=3, router="prefix_locality"), LINEAR, progress=False)
    assert local.summary["token_hit_rate"] >= res.summary["token_hit_rate"]


def test_the_summary_says_its_latencies_are_simulated():
    res = simulate(rag_requests(n=5), SimConfig(), LINEAR, progress=False)
    assert "simulated" in res.summary["simulated"] and "linear" in res.summary["simulated"]
    assert res.latency["model"] == "linear"


def test_policy_metrics_are_logged_over_time():
    res = simulate(
        rag_requests(n=300, rate_rps=40.0),
        SimConfig(policy="adaptive_semantic", capacity_blocks=120, policy_metrics_every=50),
        LINEAR,
        progress=False,
    )
    assert len(res.policy_series) == 6
    assert "w_retrieved_context" in res.policy_series[0]


def test_belady_knows_when_cached_answers_are_used_again():
    # output blocks get their next use too: otherwise Belady would hoard dead answers
    reqs = rag_requests(n=400, rate_rps=20.0, docs=30)
    hits = {
        p: simulate(reqs, SimConfig(policy=p, capacity_blocks=200), LINEAR, progress=False).summary[
            "token_hit_rate"
        ]
        for p in ("lru", "lfu", "belady")
    }
    assert hits["belady"] >= max(hits["lru"], hits["lfu"])


def test_block_hit_rate_by_type_favours_shared_system_blocks():
    res = simulate(rag_requests(n=200), SimConfig(capacity_blocks=300), LINEAR, progress=False)
    by_type = res.summary["block_hit_rate_by_type"]
    assert set(by_type) == set(res.summary["hit_rate_by_type"])
    assert all(0.0 <= v <= 1.0 for v in by_type.values())
    # the system prompt is shared by every request; each user query is unique
    assert by_type["system"] > by_type["user_query"]
    assert by_type["system"] > 0.9
    assert by_type["user_query"] == 0.0


def test_every_summary_field_is_its_definition_over_the_run():
    """The summary recomputed from its sources: percentiles and means over the per-request
    rows (numpy), token and block sums, per-type prompt tokens from the blocks, hits and
    evictions by type from the replicas' caches, iterations from the iteration hook and
    utilisation from the memory samples. A cache that evicts, two replicas, queueing."""
    import numpy as np

    from skv.blocks import compile_trace
    from skv.model import TYPES

    reqs = rag_requests(160, rate_rps=40.0, docs=12, seed=3)
    cfg = SimConfig(capacity_blocks=120, block_size=16, replicas=2, sample_every_s=0.5)
    iterations = []
    res = simulate(reqs, cfg, LINEAR, progress=False,
                   on_iteration=lambda *a: iterations.append(a))  # fmt: skip
    s, rows = res.summary, res.requests
    ttft = [r["ttft_ms"] for r in rows]
    for q in (50, 90, 99):
        assert s[f"ttft_ms_p{q}"] == pytest.approx(np.percentile(ttft, q))
    assert s["ttft_ms_mean"] == pytest.approx(np.mean(ttft))
    tpot = [r["tpot_ms"] for r in rows if r["output_tokens"] > 1]
    assert s["tpot_ms_mean"] == pytest.approx(np.mean(tpot))
    e2e = [r["e2e_ms"] for r in rows]
    assert s["e2e_ms_mean"] == pytest.approx(np.mean(e2e))
    assert s["e2e_ms_p99"] == pytest.approx(np.percentile(e2e, 99))
    assert s["queue_ms_mean"] == pytest.approx(np.mean([r["queue_ms"] for r in rows]))
    assert s["queue_ms_mean"] > 0  # the load queues
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    assert (s["prompt_tokens"], s["cached_tokens"]) == (prompt, cached)
    assert s["computed_tokens"] == prompt - cached > 0
    assert s["token_hit_rate"] == pytest.approx(cached / prompt)
    blocks = sum(r["blocks"] for r in rows)
    assert s["block_hit_rate"] == pytest.approx(sum(r["hit_blocks"] for r in rows) / blocks)
    trace = compile_trace(reqs, 16)
    by_type: dict[str, list[int]] = {}
    for rb in trace:
        for tok, st in zip(rb.tokens, rb.stypes, strict=True):
            by_type.setdefault(TYPES[st].value, [0, 0])
            by_type[TYPES[st].value][0] += tok
            by_type[TYPES[st].value][1] += 1
    assert s["prompt_tokens_by_type"] == {t: v[0] for t, v in by_type.items()}
    assert set(s["hit_rate_by_type"]) == set(by_type) == set(s["block_hit_rate_by_type"])
    assert 0 < s["hit_rate_by_type"]["system"] <= 1
    assert s["hit_rate_by_type"]["system"] > s["hit_rate_by_type"]["user_query"]
    assert s["evictions"] == sum(s["evictions_by_type"].values()) > 0
    assert s["iterations"] == len(iterations)
    util = [m["utilisation"] for m in res.memory]
    assert len(util) > 10 and s["memory_utilisation_mean"] == pytest.approx(np.mean(util))
    span = max(r["arrival_s"] + r["e2e_ms"] / 1e3 for r in rows) - min(r.arrival_s for r in reqs)
    assert s["duration_s"] == pytest.approx(span)
    assert s["throughput_rps"] == pytest.approx(len(rows) / span)
    out = sum(r["output_tokens"] for r in rows)
    assert s["output_tokens_per_s"] == pytest.approx(out / span)


@pytest.mark.parametrize("enabled, frozen", [(True, False), (False, False), (True, True)])
def test_the_garbage_collector_is_left_as_the_caller_had_it(enabled, frozen):
    """The simulator pauses cyclic GC while it builds the trace and leaves the objects that
    exist before the run out of collections during it (``gc.freeze``); afterwards the collector
    is on or off as before, and a caller's own frozen objects stay frozen."""
    import gc

    was_enabled, was_frozen = gc.isenabled(), gc.get_freeze_count()
    gc.unfreeze()  # an earlier test may have frozen objects (skv.runtime.long_lived does)
    try:
        if not enabled:
            gc.disable()
        if frozen:
            gc.freeze()
        count = gc.get_freeze_count()
        seen: list[tuple[bool, int]] = []

        def first_iteration(*_: object) -> None:  # once: get_freeze_count walks every object
            if not seen:
                seen.append((gc.isenabled(), gc.get_freeze_count()))

        res = simulate(
            rag_requests(40),
            SimConfig(capacity_blocks=64, block_size=16, replicas=2, router="least_loaded"),
            make_latency_model("linear"),
            progress=False,
            on_iteration=first_iteration,
        )
        assert len(res.requests) == 40
        assert gc.isenabled() is enabled
        # still frozen (some frozen objects may have died meanwhile), or nothing frozen
        assert 0 < gc.get_freeze_count() <= count if frozen else gc.get_freeze_count() == 0
        # during the run: the collector as the caller had it, the earlier objects frozen
        assert seen and seen[0][0] is enabled and seen[0][1] > 0
    finally:
        gc.unfreeze()
        if was_frozen:
            gc.freeze()
        (gc.enable if was_enabled else gc.disable)()
