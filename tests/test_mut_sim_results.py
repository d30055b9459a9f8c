"""The run summary of skv/sim/results.py at its edges: the cases the mutation run found unpinned.

Pinned here, each through ``simulate`` (the only caller of ``summarize``):

- an EMPTY run (``simulate([])``, e.g. a trace filtered down to nothing) summarises without an
  error or a numpy warning: 0 requests, 0 throughput, a duration at the 1 ns floor (not a second),
  nan for every latency mean/percentile and the memory mean, 0.0 hit rates, empty by-type maps;
- a run whose answers are all ONE token has no TPOT: the rows say None and the mean is nan,
  again without a numpy "mean of empty slice" warning;
- ``duration_s`` runs from the first arrival to the last finish, also when the trace does not
  start at t = 0 (first arrival 10 s) and when the last request finishes exactly at t = 0.0
  (arrivals before 0, or a zero-cost latency model); ``throughput_rps`` and
  ``output_tokens_per_s`` divide by it; ``requests`` counts the rows.

Expected values are worked by hand in each docstring from the linear latency model's formula
``iteration_ms = base + per_token * prefill_tokens + per_seq * decode_seqs`` (one replica, no
shared content, so every request is served alone), or recomputed with numpy from the rows.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from skv.latency import LinearLatency
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, simulate

LINEAR = LinearLatency(base_ttft_ms=10.0, token_latency_ms=0.1, decode_ms_per_seq=1.0)
NAN_FIELDS = (
    "ttft_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "tpot_ms_mean",
    "e2e_ms_mean",
    "e2e_ms_p99",
    "queue_ms_mean",
    "memory_utilisation_mean",
)


def req(rid: str, arrival_s: float, tokens: int, out: int) -> Request:
    seg = Segment(SemanticType.USER_QUERY, tokens, content_hash(f"prompt:{rid}"))
    return Request(rid, arrival_s, [seg], output_tokens=out)


def run(requests: list[Request], model=LINEAR, **config):
    """simulate with every warning raised as an error (numpy's empty-slice warnings included)."""
    cfg = SimConfig(policy="lru", capacity_blocks=64, block_size=16, **config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return simulate(requests, cfg, model, progress=False)


# --- an empty run -------------------------------------------------------------------------------


def test_an_empty_run_summarises_to_zero_counts_and_nan_latencies_without_warnings():
    res = run([])
    s = res.summary
    assert res.requests == [] and res.memory == []
    assert s["requests"] == 0
    assert 0 < s["duration_s"] <= 1e-6  # the floor that keeps the rates finite, not a second
    assert s["throughput_rps"] == 0.0 and s["output_tokens_per_s"] == 0.0
    for key in NAN_FIELDS:
        assert isinstance(s[key], float) and math.isnan(s[key]), key
    assert (s["prompt_tokens"], s["cached_tokens"], s["computed_tokens"]) == (0, 0, 0)
    assert s["token_hit_rate"] == 0.0 and s["block_hit_rate"] == 0.0
    assert s["hit_rate_by_type"] == s["prompt_tokens_by_type"] == {}
    assert s["block_hit_rate_by_type"] == s["evictions_by_type"] == {}
    assert (s["evictions"], s["iterations"]) == (0, 0)


# --- one-token answers: no TPOT -----------------------------------------------------------------


def test_one_token_answers_have_no_tpot_and_a_nan_mean_without_warnings():
    """A (100 tokens) at 0 s and B (50 tokens) at 1 s, one output token each, served alone:
    TTFT = E2E = 10 + 0.1 * 100 = 20 ms for A and 10 + 0.1 * 50 = 15 ms for B; no TPOT."""
    res = run([req("A", 0.0, 100, 1), req("B", 1.0, 50, 1)])
    rows, s = {r["request_id"]: r for r in res.requests}, res.summary
    assert [rows[k]["tpot_ms"] for k in "AB"] == [None, None]
    assert isinstance(s["tpot_ms_mean"], float) and math.isnan(s["tpot_ms_mean"])
    ttft = [rows["A"]["ttft_ms"], rows["B"]["ttft_ms"]]
    assert ttft == [pytest.approx(20.0), pytest.approx(15.0)]
    assert s["ttft_ms_mean"] == pytest.approx(17.5)
    assert s["ttft_ms_p90"] == pytest.approx(float(np.percentile(ttft, 90)))  # 19.5
    assert s["e2e_ms_mean"] == pytest.approx(17.5) and s["queue_ms_mean"] == 0.0
    assert s["requests"] == 2


# --- the run's duration -------------------------------------------------------------------------


def test_duration_runs_from_the_first_arrival_when_the_trace_starts_late():
    """A (100 tokens, 1 out) at 10.0 s finishes at 10.020 s; B (100 tokens, 2 out) at 10.1 s:
    prefill 20 ms -> first token at 10.120, one decode 10 + 1 = 11 ms -> finished at 10.131.
    Duration 10.131 - 10.0 = 0.131 s (not 10.131 + 10.0); 2 requests, 3 output tokens."""
    res = run([req("A", 10.0, 100, 1), req("B", 10.1, 100, 2)])
    s = res.summary
    assert s["requests"] == len(res.requests) == 2
    assert s["duration_s"] == pytest.approx(0.131)
    assert s["throughput_rps"] == pytest.approx(2 / 0.131)
    assert s["output_tokens_per_s"] == pytest.approx(3 / 0.131)
    assert s["tpot_ms_mean"] == pytest.approx(11.0)


def test_a_last_finish_exactly_at_time_zero_ends_the_run_there():
    """The time origin is arbitrary: A (100 tokens, 1 out) arrives at -0.02 s and its one
    iteration takes 10 + 0.1 * 100 = 20 ms, so it finishes at exactly 0.0 s. The run lasts
    0.02 s (a finish at t = 0.0 is a finish, not a missing one)."""
    res = run([req("A", -0.02, 100, 1)])
    assert res.requests[0]["e2e_ms"] == pytest.approx(20.0)
    assert -0.02 + res.requests[0]["e2e_ms"] / 1e3 == 0.0
    s = res.summary
    assert s["duration_s"] == pytest.approx(0.02)
    assert s["throughput_rps"] == pytest.approx(50.0)


def test_a_zero_cost_latency_model_gives_a_run_of_no_duration():
    """LinearLatency(0, 0, 0) is allowed (constants >= 0): both requests arrive at 0 s and
    finish there, so the run lasts no time (the 1 ns floor), not a second."""
    free = LinearLatency(base_ttft_ms=0.0, token_latency_ms=0.0, decode_ms_per_seq=0.0)
    res = run([req("A", 0.0, 40, 1), req("B", 0.0, 40, 1)], model=free)
    assert [r["e2e_ms"] for r in res.requests] == [0.0, 0.0]
    s = res.summary
    assert s["requests"] == 2
    assert 0 < s["duration_s"] <= 1e-6


def test_a_block_type_outside_the_type_index_is_an_error():
    """Compiled, the per-type totals are indexed unchecked: a bad type must not reach them."""
    from helpers import rb

    from skv.sim.replica import RequestState
    from skv.sim.results import _type_totals

    st = RequestState(0, req("a", 0.0, 8, 1), rb([1, 2]), 0.0)
    assert sum(_type_totals([st])[1]) == 2  # two blocks, each of its type
    st.rb.stypes[0] = 99
    with pytest.raises(ValueError, match="block type 99"):
        _type_totals([st])
