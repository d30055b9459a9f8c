"""The shadow-replay gate (``skv shadow``): the decision rule on hand cases, a counterexample
where cache-affinity routing loses and the gate keeps the baseline, a case where it wins and
the gate enables it, and the command line's exit codes."""

from __future__ import annotations

import math
import random

import pytest

from skv.cli import main
from skv.experiments.replay.shadow import (
    KEEP_EXIT,
    RouterPrediction,
    decide,
    shadow_replay,
    time_scaled,
)
from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType
from skv.traces.native import write_skv_trace

LINEAR = make_latency_model("linear")


def _pred(router: str, p99: float) -> RouterPrediction:
    return RouterPrediction(router, p99, p99 / 2, 10.0, 0.5)


def test_decide_enables_only_a_candidate_that_meets_the_slo_and_is_not_worse():
    base = _pred("least_loaded", 900.0)
    v = decide(base, _pred("cacheroute", 800.0), 1000.0)
    assert v.enable and v.exit_code == 0 and v.margin_ms == 100.0
    # equal p99 is "not worse": enabled with the default min_gain 0, kept with a 1 ms minimum
    assert decide(base, _pred("c", 900.0), 1000.0).enable
    assert not decide(base, _pred("c", 900.0), 1000.0, min_gain_ms=1.0).enable
    worse = decide(base, _pred("c", 950.0), 1000.0)
    assert not worse.enable and worse.exit_code == KEEP_EXIT and "not better" in worse.reason
    slo = decide(_pred("b", 2000.0), _pred("c", 1500.0), 1000.0)  # better, but misses the SLO
    assert not slo.enable and "misses the SLO" in slo.reason
    assert not decide(base, _pred("c", math.nan), 1000.0).enable


def burst_trace(burst_rps: float = 200.0, seed: int = 0) -> list[Request]:
    """30 s of 8 shared 2,000-token prefixes at 8 req/s in total (every key warm for
    cacheroute, one destination each), then a 3 s burst on key 0 at ``burst_rps``: a router
    that pins the key to its planned replica queues the whole burst there; least_loaded
    spreads it (and the other replicas have the prefix after one miss)."""
    rng = random.Random(seed)
    out: list[Request] = []

    def add(t: float, key: int) -> None:
        i = len(out)
        segs = [
            Segment(SemanticType.SYSTEM, 2000, content_hash=f"{0xA0 + key:x}"),
            Segment(SemanticType.USER_QUERY, 50, content_hash=f"{0x10000 + i:x}"),
        ]
        out.append(Request(f"r{i}", t, segs, output_tokens=20))

    t = 0.0
    while t < 30.0:
        t += rng.expovariate(8.0)
        add(t, rng.randrange(8))
    t = 30.0
    while t < 33.0:
        t += rng.expovariate(burst_rps)
        add(t, 0)
    return out


def test_the_gate_keeps_the_baseline_when_affinity_loses():
    v = shadow_replay(
        burst_trace(),
        candidate="cacheroute",
        baseline="least_loaded",
        candidate_params={"period_s": 5.0},
        slo_p99_s=1.0,
        latency=LINEAR,
        replicas=4,
        capacity_blocks=2000,
    )
    # measured when written: least_loaded ~123 ms, cacheroute ~1,633 ms at p99 (simulated)
    assert v.candidate.ttft_ms_p99 > 5 * v.baseline.ttft_ms_p99
    assert not v.enable and v.exit_code == KEEP_EXIT
    assert v.candidate.token_hit_rate >= v.baseline.token_hit_rate  # it did cache better
    # the candidate's parameters reach it: with no period ending inside the trace cacheroute
    # never plans, routes everything cold (least loaded) and predicts the baseline exactly
    never = shadow_replay(
        burst_trace(),
        candidate="cacheroute",
        baseline="least_loaded",
        candidate_params={"period_s": 1000.0},
        slo_p99_s=1.0,
        latency=LINEAR,
        replicas=4,
        capacity_blocks=2000,
    )
    assert never.candidate.ttft_ms_p99 == never.baseline.ttft_ms_p99 and never.enable


def test_the_gate_enables_a_router_that_wins():
    """Eight prefixes at ten times the steady rate, no burst: affinity saves prefill and wins
    (prefix_locality ~145 ms vs least_loaded ~429 ms at p99 when written)."""
    steady = [r for r in burst_trace() if r.arrival_s < 30.0]
    v = shadow_replay(
        time_scaled(steady, 10.0),
        candidate="prefix_locality",
        baseline="least_loaded",
        slo_p99_s=3.5,
        latency=LINEAR,
        replicas=4,
        capacity_blocks=2000,
    )
    assert v.enable and v.exit_code == 0
    assert v.candidate.ttft_ms_p99 < v.baseline.ttft_ms_p99


def test_time_scaling_and_bad_inputs():
    reqs = burst_trace()[:10]
    fast = time_scaled(reqs, 2.0)
    assert [r.arrival_s for r in fast] == sorted(r.arrival_s / 2 for r in reqs)
    with pytest.raises(ValueError, match="time_scale"):
        time_scaled(reqs, 0)
    kw = dict(slo_p99_s=1.0, latency=LINEAR, capacity_blocks=100)
    with pytest.raises(ValueError, match="2 replicas"):
        shadow_replay(reqs, candidate="cacheroute", baseline="least_loaded", replicas=1, **kw)
    with pytest.raises(ValueError, match="unknown router"):
        shadow_replay(reqs, candidate="nope", baseline="least_loaded", replicas=2, **kw)


def test_the_command_line_exits_3_to_keep_and_0_to_enable(tmp_path, capsys):
    path = write_skv_trace(tmp_path / "burst.jsonl", burst_trace())
    args = ["shadow", str(path), "--candidate", "cacheroute", "--candidate-param", "period_s=5"]
    args += ["--slo-p99", "1.0", "--replicas", "4", "--capacity", "2000"]
    assert main(args) == KEEP_EXIT
    out = capsys.readouterr().out
    assert "KEEP least_loaded" in out and "SIMULATED" in out
    steady = write_skv_trace(
        tmp_path / "steady.jsonl", [r for r in burst_trace() if r.arrival_s < 30.0]
    )
    args = ["shadow", str(steady), "--candidate", "prefix_locality", "--time-scale", "10"]
    assert main([*args, "--slo-p99", "3.5", "--replicas", "4", "--capacity", "2000"]) == 0
    assert "ENABLE prefix_locality" in capsys.readouterr().out
