"""Serving-simulator timelines worked out by hand, iteration by iteration.

Each test serves 2-3 requests through one replica and compares every request's queue time, TTFT,
TPOT and E2E, and every iteration the latency model was asked to price, with values derived in
its docstring from the rules the simulator documents (skv/sim/replica.py, skv/sim/results.py):

- an iteration starts when the replica is idle and work arrives, or when the previous one ends;
  at its start, waiting requests are admitted FCFS while fewer than ``max_running`` run;
- per iteration, every running request past its prefill decodes one token (one token of the
  budget each), then the rest of ``max_batch_tokens`` goes to prefill chunks in admission order;
- the iteration that computes a request's last prompt token yields its first output token;
  a request finishes when it has ``max(1, output_tokens)`` tokens;
- a prefix-cache hit covers at most ``prompt_tokens - 1`` tokens (the last is always computed);
  a chunk's ``context_before`` is the cached tokens plus the tokens prefilled earlier; a decode
  attends ``prompt_tokens + generated`` tokens;
- queue = admitted - arrival, TTFT = first token - arrival, TPOT = (finished - first token) /
  (output tokens - 1), E2E = finished - arrival.

The latency model is ``linear`` with round constants: ``iteration_ms = 10 + 0.1 * prefill_tokens
+ 1 * decode_seqs``. Times below are in ms from t = 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from skv.latency import CalibratedLatency, Iteration, LatencyModel, LinearLatency, PrefillChunk
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, simulate

T = SemanticType
LINEAR = LinearLatency(base_ttft_ms=10.0, token_latency_ms=0.1, decode_ms_per_seq=1.0)


@dataclass
class Recorder(LatencyModel):
    """Prices iterations with ``inner``; ``run`` logs every iteration the simulator ran (its
    ``on_iteration`` hook) into ``log``, with its start and end in ``times`` (ms)."""

    name: ClassVar[str] = "recorder"
    inner: LatencyModel
    log: list[Iteration] = field(default_factory=list)
    times: list[tuple[float, float]] = field(default_factory=list)

    def iteration_ms(self, it: Iteration) -> float:
        return self.inner.iteration_ms(it)

    def record(self, replica: int, start_s: float, end_s: float, it: Iteration) -> None:
        self.log.append(it)
        self.times.append((start_s * 1e3, end_s * 1e3))

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def request(rid: str, arrival_ms: float, *segments: tuple[T, int, str], out: int) -> Request:
    segs = [Segment(t, n, content_hash(name)) for t, n, name in segments]
    return Request(rid, arrival_ms / 1e3, segs, output_tokens=out)


def run(requests: list[Request], model: LatencyModel, **config: Any):
    cfg = SimConfig(policy="lru", capacity_blocks=64, block_size=16, **config)
    hook = model.record if isinstance(model, Recorder) else None
    res = simulate(requests, cfg, model, progress=False, on_iteration=hook)
    return {r["request_id"]: r for r in res.requests}, res.summary


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def check(row: dict[str, Any], queue: float, ttft: float, tpot: float | None, e2e: float):
    got = (row["queue_ms"], row["ttft_ms"], row["tpot_ms"], row["e2e_ms"])
    want = (queue, ttft, tpot, e2e)
    assert got == tuple(None if w is None else approx(w) for w in want), row["request_id"]


def it(prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = ()) -> Iteration:
    """An iteration from (tokens, context_before) chunks and decode contexts."""
    return Iteration.with_decodes(tuple(PrefillChunk(t, c) for t, c in prefill), tuple(decode))


def test_fcfs_queues_behind_max_running_and_chunks_under_the_budget():
    """max_running = 1, max_batch_tokens = 64. A (100 prompt tokens, 3 output) arrives at 0,
    B (50, 2) at 5, C (20, 1) at 6; no shared content.

    it 1  t=0     admit A (queue 0). A chunk 64 (budget 64)      10 + 6.4      = 16.4 -> 16.4
          t=5, 6  B, C arrive while the replica is busy: they wait.
    it 2  t=16.4  running is full (1): nobody admitted. A chunk 36 -> 10 + 3.6 = 13.6 -> 30.0
                  A's prefill ends: first token at 30.0 (generated 1).
    it 3  t=30    A decodes (context 100 + 1 = 101)               10 + 1       = 11   -> 41
    it 4  t=41    A decodes (context 102)                                        11   -> 52
                  A has 3 tokens: finished at 52.
    it 5  t=52    admit B (queue 52 - 5 = 47). B chunk 50         10 + 5       = 15   -> 67
                  B's first token at 67.
    it 6  t=67    B decodes (context 51)                                         11   -> 78
                  B finished at 78.
    it 7  t=78    admit C (queue 78 - 6 = 72). C chunk 20         10 + 2       = 12   -> 90
                  C's first token at 90 and, with 1 output token, finished at 90.

    A: queue 0,  TTFT 30,        TPOT (52 - 30) / 2 = 11, E2E 52
    B: queue 47, TTFT 67 - 5 = 62, TPOT (78 - 67) / 1 = 11, E2E 73
    C: queue 72, TTFT 90 - 6 = 84, TPOT none (one token),  E2E 84
    """
    reqs = [
        request("A", 0, (T.USER_QUERY, 100, "a"), out=3),
        request("B", 5, (T.USER_QUERY, 50, "b"), out=2),
        request("C", 6, (T.USER_QUERY, 20, "c"), out=1),
    ]
    rec = Recorder(LINEAR)
    rows, summary = run(reqs, rec, max_batch_tokens=64, max_running=1)
    check(rows["A"], 0, 30, 11, 52)
    check(rows["B"], 47, 62, 11, 73)
    check(rows["C"], 72, 84, None, 84)
    assert rec.log == [
        it([(64, 0)]),
        it([(36, 64)]),
        it(decode=[101]),
        it(decode=[102]),
        it([(50, 0)]),
        it(decode=[51]),
        it([(20, 0)]),
    ]
    assert [rows[k]["output_tokens"] for k in "ABC"] == [3, 2, 1]
    assert summary["iterations"] == 7
    assert summary["queue_ms_mean"] == approx((0 + 47 + 72) / 3)
    assert summary["ttft_ms_mean"] == approx((30 + 62 + 84) / 3)
    assert summary["tpot_ms_mean"] == approx(11)  # C has no TPOT and is left out
    assert summary["duration_s"] == approx(0.090)


# A and C share the whole prompt; B shares A's 64-token system prompt (4 blocks of 16)
SYS = (T.SYSTEM, 64, "system prompt")
PREFIX_REQUESTS = [
    ("A", 0, [SYS, (T.USER_QUERY, 16, "qa")], 2),  # 80 tokens = 5 full blocks
    ("B", 100, [SYS, (T.USER_QUERY, 40, "qb")], 2),  # 104 tokens = 6 full blocks + 8 tokens
    ("C", 200, [SYS, (T.USER_QUERY, 16, "qa")], 1),  # A's prompt again
]


def prefix_requests() -> list[Request]:
    return [request(rid, t, *segs, out=out) for rid, t, segs, out in PREFIX_REQUESTS]


PREFIX_ITERATIONS = [
    it([(32, 0)]),
    it([(32, 32)]),
    it([(16, 64)]),
    it(decode=[81]),
    it([(32, 64)]),
    it([(8, 96)]),
    it(decode=[105]),
    it([(1, 79)]),
]


def test_chunked_prefill_after_a_cached_prefix_computes_only_the_uncached_tokens():
    """max_batch_tokens = 32, block size 16, cache 64 blocks (nothing is evicted).

    A (80 tokens: the 64-token system prompt + 16, 2 output) arrives at 0 to a cold cache:
    it 1  t=0     A chunk 32, context 0                  10 + 3.2 = 13.2 -> 13.2
    it 2  t=13.2  A chunk 32, context 32                 10 + 3.2 = 13.2 -> 26.4
    it 3  t=26.4  A chunk 16, context 64                 10 + 1.6 = 11.6 -> 38.0  first token
    it 4  t=38    A decodes (context 81)                 10 + 1   = 11   -> 49.0  finished
    B (the same system prompt + 40 other tokens = 104, 2 output) arrives at 100, replica idle:
    its 4 system blocks are cached (64 tokens), so it computes only 104 - 64 = 40 tokens:
    it 5  t=100   B chunk 32, context 64 (cached)        10 + 3.2 = 13.2 -> 113.2
    it 6  t=113.2 B chunk 8, context 64 + 32 = 96        10 + 0.8 = 10.8 -> 124.0 first token
    it 7  t=124   B decodes (context 104 + 1 = 105)      10 + 1   = 11   -> 135.0 finished
    C (A's 80-token prompt again, 1 output) arrives at 200: all 5 blocks hit (80 tokens), but
    the last prompt token is always computed: cached min(80, 80 - 1) = 79, computed 1:
    it 8  t=200   C chunk 1, context 79                  10 + 0.1 = 10.1 -> 210.1 first token,
                  finished (1 output token).

    A: queue 0, TTFT 38,   TPOT 11, E2E 49;  cached 0,  hit blocks 0
    B: queue 0, TTFT 24,   TPOT 11, E2E 35;  cached 64, hit blocks 4, computed 40
    C: queue 0, TTFT 10.1, TPOT -,  E2E 10.1; cached 79, hit blocks 5, computed 1
    The linear model prices no context, so the cached context shows only in the iterations the
    model was given (``context_before`` 64 and 96 for B, 79 for C, decode contexts counting
    the cached tokens).
    """
    rec = Recorder(LINEAR)
    rows, summary = run(prefix_requests(), rec, max_batch_tokens=32, max_running=4)
    check(rows["A"], 0, 38, 11, 49)
    check(rows["B"], 0, 24, 11, 35)
    check(rows["C"], 0, 10.1, None, 10.1)
    got = {
        k: (rows[k]["cached_tokens"], rows[k]["computed_tokens"], rows[k]["hit_blocks"])
        for k in "ABC"
    }
    assert got == {"A": (0, 80, 0), "B": (64, 40, 4), "C": (79, 1, 5)}
    assert rec.log == PREFIX_ITERATIONS
    assert summary["cached_tokens"] == 64 + 79
    assert summary["token_hit_rate"] == approx((64 + 79) / (80 + 104 + 80))


def test_a_model_that_prices_cached_context_charges_it_in_the_timeline():
    """The same three requests under ``calibrated`` with a cached-context term:
    ``iteration_ms = 10 + 0.1 * prefill_tokens + 0.01 * sum(context_before) + 1 * decode_seqs``
    (the same iterations as the linear test above, so only the prices change):

    A: 13.2 + (13.2 + 0.32) + (11.6 + 0.64) = 38.96 first token; + 11 -> 49.96 finished
       (arrival 0): TTFT 38.96, TPOT 11, E2E 49.96
    B: (13.2 + 0.64) + (10.8 + 0.96) = 25.6 first token; + 11 -> 36.6 (arrival 100)
    C: 10.1 + 0.79 = 10.89
    """
    model = CalibratedLatency(
        base_ms=10.0, ms_per_uncached_token=0.1, ms_per_cached_token=0.01, decode_ms_per_seq=1.0
    )
    rec = Recorder(model)
    rows, _ = run(prefix_requests(), rec, max_batch_tokens=32, max_running=4)
    assert rec.log == PREFIX_ITERATIONS
    check(rows["A"], 0, 38.96, 11, 49.96)
    check(rows["B"], 0, 25.6, 11, 36.6)
    check(rows["C"], 0, 10.89, None, 10.89)


def test_a_decoding_request_interleaves_with_anothers_chunked_prefill():
    """max_running = 2, max_batch_tokens = 32. A (20 tokens, 4 output) arrives at 0, B (60
    tokens, 2 output) at 15; no shared content. Decodes take their token of the budget first.

    it 1  t=0     admit A. A chunk 20                        10 + 2          = 12   -> 12
                  A's first token at 12.
    it 2  t=12    A decodes (context 21), budget left 31     10 + 1          = 11   -> 23
          t=15    B arrives while the replica is busy: waits.
    it 3  t=23    admit B (queue 23 - 15 = 8). A decodes (context 22, budget 32 - 1 = 31),
                  B chunk 31 (context 0)                     10 + 3.1 + 1    = 14.1 -> 37.1
    it 4  t=37.1  A decodes (context 23), B chunk 29 (context 31)
                                                             10 + 2.9 + 1    = 13.9 -> 51.0
                  A has 4 tokens: finished at 51. B's prefill ends: first token at 51.
    it 5  t=51    B decodes (context 61)                     10 + 1          = 11   -> 62
                  B finished at 62.

    A: queue 0, TTFT 12,          TPOT (51 - 12) / 3 = 13, E2E 51
    B: queue 8, TTFT 51 - 15 = 36, TPOT 62 - 51 = 11,      E2E 62 - 15 = 47
    """
    reqs = [
        request("A", 0, (T.USER_QUERY, 20, "a"), out=4),
        request("B", 15, (T.USER_QUERY, 60, "b"), out=2),
    ]
    rec = Recorder(LINEAR)
    rows, summary = run(reqs, rec, max_batch_tokens=32, max_running=2)
    check(rows["A"], 0, 12, 13, 51)
    check(rows["B"], 8, 36, 11, 47)
    assert rec.log == [
        it([(20, 0)]),
        it(decode=[21]),
        it([(31, 0)], decode=[22]),
        it([(29, 31)], decode=[23]),
        it(decode=[61]),
    ]
    assert all(x.batch_tokens <= 32 for x in rec.log)
    assert summary["iterations"] == 5


ZERO_TOKEN_PROMPT = """
import signal, sys
from skv.latency import LinearLatency
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, simulate
signal.alarm(5)  # SIGALRM kills the process: exit status -14
req = Request("Z", 0.0, [Segment(SemanticType.UNKNOWN, 0, content_hash("empty"))], output_tokens=2)
try:
    rows = simulate([req], SimConfig(), LinearLatency(), progress=False).requests
except ValueError as err:  # rejecting the request is fine
    print("rejected:", err)
    sys.exit(0)
assert rows[0]["output_tokens"] == 2, rows
"""


def test_a_zero_token_prompt_does_not_hang_the_simulator():
    """A zero-token prompt never got a first token (prefill_total 0: it 'decoded' forever and
    simulate() never returned; the Azure, Mooncake and Bailian loaders accept a 0 length).
    Now it is rejected. Run in a child process that an alarm stops after 5 s, so a regression
    to the hang cannot stall the suite."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", ZERO_TOKEN_PROMPT], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr.decode()[-500:]}"


def test_an_empty_prompt_is_rejected_with_its_request_id():
    ok = Request("A", 0.0, [Segment(SemanticType.UNKNOWN, 8, content_hash("a"))], output_tokens=1)
    empty = Request("Z", 1.0, [Segment(SemanticType.UNKNOWN, 0, content_hash("z"))])
    with pytest.raises(ValueError, match=r"1 request\(s\) with an empty prompt .*: Z;"):
        simulate([ok, empty], SimConfig(), LinearLatency(), progress=False)
