"""The serving simulator's event loop (``skv.sim.engine``), pinned by small hand-worked runs.

Written against mutation-testing survivors of ``skv/sim/engine.py``: each test drives
``simulate`` with 1-5 requests, tiny caches and a linear latency model, and compares with values
worked out by hand in its docstring from the rules the simulator documents (module docstrings of
``skv.sim.engine``, ``skv.sim.replica``, ``skv.blocks`` and the policies used), or with a
documented invariant. No expected value is read off a run of the code under test.

Most tests use ``EXACT``: ``iteration_ms = 62.5 * prefill_tokens + 125 * decode_seqs`` (no
fixed cost), so a 4-token prefill lasts 1/4 s, one decoding request 1/8 s, and every event time
is a multiple of 1/16 s: exact in binary floating point, so ties between events are real ties.

What is pinned:

- input checks: empty prompts rejected with their ids (the message's exact text), one token is
  enough; requests are served by arrival, whatever the input order; ``block_size`` is used;
- event order: an arrival at an iteration's end joins the next iteration; simultaneous events
  on different replicas are handled in the order they were scheduled (FIFO);
- memory samples (times, fields, values) including the ones a decode run reports at its end;
- the decode-run pricing schedule (``LatencyModel.decode_run_ends`` calls): runs start capped at
  8 iterations, the cap doubles after a run that reached it, and after a cut it becomes twice
  the iterations the cut run kept (at least 8); a request arriving in a run's last iteration
  cuts nothing;
- policy metrics series (every n-th finish, its time and replica);
- the answer's blocks (``include_output_blocks``): keyed like the prompt (mode, tenant salt),
  appended after the blocks the prompt shares, with the request's own identity (saecache sees
  the same request, not a new one), stamped at the finish time;
- offline policies (belady) get next uses; policy parameters reach the policy;
- the progress bar: shown exactly when asked (``None``: when stderr is a terminal), counting
  finished requests out of the total, erased when done; ``config_dict``.
"""

from __future__ import annotations

import io
import sys
from typing import Any, ClassVar

import pytest

from skv.latency import Iteration, LatencyModel, LinearLatency
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, engine, simulate
from skv.sim.engine import config_dict

T = SemanticType
EXACT = LinearLatency(base_ttft_ms=0.0, token_latency_ms=62.5, decode_ms_per_seq=125.0)
LINEAR = LinearLatency(base_ttft_ms=10.0, token_latency_ms=0.1, decode_ms_per_seq=1.0)


def request(
    rid: str,
    arrival_s: float,
    *segs: tuple[T, int, str],
    out: int = 1,
    **kw: Any,
) -> Request:
    segments = [Segment(t, n, content_hash(name)) for t, n, name in segs]
    return Request(rid, arrival_s, segments, output_tokens=out, **kw)


def q(rid: str, arrival_s: float, tokens: int = 4, out: int = 1, **kw: Any) -> Request:
    """A request whose prompt is one user query of its own (``tokens`` long)."""
    return request(rid, arrival_s, (T.USER_QUERY, tokens, f"q-{rid}"), out=out, **kw)


def sim(requests: list[Request], latency: LatencyModel = EXACT, **config: Any):
    config.setdefault("block_size", 4)
    res = simulate(requests, SimConfig(**config), latency, progress=False)
    return res, {r["request_id"]: r for r in res.requests}


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-12, abs=1e-12)


# --- input checks -------------------------------------------------------------------------------


def test_empty_prompts_are_rejected_with_the_first_five_ids_and_a_count():
    """Ids are listed in input order, at most five, then " and N more"."""
    ok = q("fine", 0.0)

    def empties(n: int) -> list[Request]:
        return [Request(f"e{i}", float(i), []) for i in range(n)]

    tail = "; a serving engine needs at least one prompt token (drop or fix them in the trace)"
    cases = {
        5: "5 request(s) with an empty prompt (0 tokens): e0, e1, e2, e3, e4" + tail,
        6: "6 request(s) with an empty prompt (0 tokens): e0, e1, e2, e3, e4 and 1 more" + tail,
        7: "7 request(s) with an empty prompt (0 tokens): e0, e1, e2, e3, e4 and 2 more" + tail,
    }
    for n, message in cases.items():
        with pytest.raises(ValueError) as exc:
            simulate([ok, *empties(n)], SimConfig(), EXACT, progress=False)
        assert str(exc.value) == message


def test_one_prompt_token_is_enough_and_the_configured_block_size_is_used():
    """block_size 4: a 1-token prompt is one (partial) block, a 10-token prompt three (4+4+2).
    LINEAR: the 1-token request arrives at 0 and is alone: TTFT = 10 + 0.1 * 1 = 10.1 ms; the
    10-token one arrives at 1 s, idle replica: TTFT = 10 + 0.1 * 10 = 11 ms."""
    _, rows = sim([q("one", 0.0, tokens=1), q("ten", 1.0, tokens=10)], LINEAR)
    assert rows["one"]["ttft_ms"] == approx(10.1)
    assert rows["ten"]["ttft_ms"] == approx(11.0)
    assert (rows["one"]["blocks"], rows["ten"]["blocks"]) == (1, 3)


def test_requests_are_served_in_arrival_order_whatever_the_input_order():
    """Given [B (arrives at 1 s), A (arrives at 0)]: A is served at 0 (prefill 4 tokens =
    0.25 s, one output token: done at 0.25), B at 1 s on an idle replica. Both queue 0 ms,
    TTFT 250 ms; rows come in arrival order."""
    res, rows = sim([q("B", 1.0), q("A", 0.0)])
    assert [r["request_id"] for r in res.requests] == ["A", "B"]
    for rid in "AB":
        assert rows[rid]["queue_ms"] == 0.0
        assert rows[rid]["ttft_ms"] == approx(250.0)


def test_policy_parameters_reach_the_policy():
    """``policy_params`` are the policy's constructor arguments: an unknown one is an error."""
    with pytest.raises(ValueError, match="bad parameters"):
        sim([q("A", 0.0)], policy="lru", policy_params={"no_such_knob": 1})


def test_config_dict_is_every_field_of_the_config():
    cfg = SimConfig(policy="lfu", capacity_blocks=7, replicas=2)
    d = config_dict(cfg)
    assert d["policy"] == "lfu" and d["capacity_blocks"] == 7 and d["replicas"] == 2
    assert set(d) == set(SimConfig.__dataclass_fields__)


# --- event order --------------------------------------------------------------------------------


def test_an_arrival_at_an_iteration_end_joins_the_next_iteration():
    """A (4 tokens, 3 out) arrives at 0; B (4 tokens, 1 out) arrives at 0.25 s, exactly when
    A's prefill iteration ends. The arrival is handled first, so B is admitted at 0.25:

    it 1  0     -> 0.25   A prefill 4                     A's first token at 0.25
    it 2  0.25  -> 0.625  A decodes + B prefill 4 (0.125 + 0.25)   B first token = done
    it 3  0.625 -> 0.75   A decodes                       A done (3 tokens)

    B: queue 0, TTFT 375 ms. A: TTFT 250, E2E 750, TPOT (750 - 250) / 2 = 250 ms."""
    log: list[tuple[float, float, Iteration]] = []
    res = simulate(
        [q("A", 0.0, out=3), q("B", 0.25)],
        SimConfig(block_size=4),
        EXACT,
        progress=False,
        on_iteration=lambda k, s, e, it: log.append((s, e, it)),
    )
    rows = {r["request_id"]: r for r in res.requests}
    assert rows["B"]["queue_ms"] == 0.0
    assert rows["B"]["ttft_ms"] == approx(375.0)
    assert (rows["A"]["ttft_ms"], rows["A"]["e2e_ms"]) == (approx(250.0), approx(750.0))
    assert rows["A"]["tpot_ms"] == approx(250.0)
    assert [(s, e) for s, e, _ in log] == [(0.0, 0.25), (0.25, 0.625), (0.625, 0.75)]
    assert [(it.prefill_tokens, it.decode_seqs) for _, _, it in log] == [(4, 0), (4, 1), (0, 1)]


def test_simultaneous_events_on_two_replicas_are_handled_in_scheduling_order():
    """round_robin over 2 replicas, every iteration sampled (sample_every_s = 0):

    R1 at 0     -> replica 0, prefill 4 tokens: ends 0.25 (1 output token: done)
    R2 at 0.125 -> replica 1, prefill 8 tokens: ends 0.125 + 0.5  = 0.625 (scheduled first)
    R3 at 0.375 -> replica 0, prefill 4 tokens: ends 0.375 + 0.25 = 0.625 (scheduled second)

    Both ends are at 0.625; replica 1's was scheduled first, so it is handled first and its
    sample comes first. Samples (time, replica): (0, 0), (0.125, 1), (0.25, 0), (0.375, 0),
    (0.625, 1), (0.625, 0)."""
    reqs = [q("R1", 0.0), q("R2", 0.125, tokens=8), q("R3", 0.375)]
    res, rows = sim(reqs, replicas=2, router="round_robin", sample_every_s=0.0)
    assert [rows[r]["replica"] for r in ("R1", "R2", "R3")] == [0, 1, 0]
    assert [(m["time_s"], m["replica"]) for m in res.memory] == [
        (0.0, 0),
        (0.125, 1),
        (0.25, 0),
        (0.375, 0),
        (0.625, 1),
        (0.625, 0),
    ]


# --- memory samples -----------------------------------------------------------------------------


def test_memory_samples_at_their_period_including_inside_a_decode_run():
    """One request A: 4 prompt tokens (one block of 4), 5 output tokens; capacity 8 blocks;
    a sample every 0.25 s, taken at an iteration start at or after the sample time.

    it 1  0     -> 0.25  prefill          sample at 0 (A admitted: 1 block, pinned, running)
    it 2-5  0.25 -> 0.75  4 decodes of 0.125 s, starting at 0.25, 0.375, 0.5, 0.625
          samples at 0.25 and 0.5 (the start of the 3rd decode: exactly the sample time)
    at 0.75 A is done: its answer (5 tokens: one full block of 4 + a block of 1) is cached
          after its prompt block -> 3 blocks, none pinned, nothing running; sample at 0.75.

    utilisation = cached blocks / 8."""
    res, _ = sim([q("A", 0.0, out=5)], capacity_blocks=8, sample_every_s=0.25)

    def row(t: float, cached: int, pinned: int, running: int) -> dict[str, float]:
        return {
            "time_s": t,
            "replica": 0,
            "cached_blocks": cached,
            "pinned_blocks": pinned,
            "utilisation": cached / 8,
            "waiting": 0,
            "running": running,
        }

    assert res.memory == [
        row(0.0, 1, 1, 1),
        row(0.25, 1, 1, 1),
        row(0.5, 1, 1, 1),
        row(0.75, 3, 0, 0),
    ]
    assert res.summary["memory_utilisation_mean"] == approx((3 * 0.125 + 0.375) / 4)


# --- decode-run pricing schedule ------------------------------------------------------------------


class Pricing(LatencyModel):
    """``EXACT``, logging how the simulator asked: ``"it"`` per single iteration priced,
    ``count`` per decode run priced at once (``decode_run_ends``)."""

    name: ClassVar[str] = "pricing"

    def __init__(self) -> None:
        self.calls: list[str | int] = []

    def iteration_ms(self, it: Iteration) -> float:
        self.calls.append("it")
        return EXACT.iteration_ms(it)

    def decode_run_ends(self, seqs: int, context_tokens: int, count: int, start_s: float) -> list:
        self.calls.append(count)
        return EXACT.decode_run_ends(seqs, context_tokens, count, start_s)

    def describe(self) -> dict[str, Any]:
        return EXACT.describe()


def priced(requests: list[Request]) -> tuple[list[str | int], dict[str, dict[str, Any]]]:
    model = Pricing()
    _, rows = sim(requests, model)
    return model.calls, rows


def test_a_two_iteration_decode_is_one_run():
    """A: 4 prompt tokens, 3 output tokens: one prefill iteration, then 2 decode-only
    iterations with nothing else happening: priced as one run of 2. Done at 0.25 + 2/8."""
    calls, rows = priced([q("A", 0.0, out=3)])
    assert calls == ["it", 2]
    assert rows["A"]["e2e_ms"] == approx(500.0)


def test_run_caps_double_while_runs_reach_them():
    """A: 101 output tokens = 100 decode iterations after the prefill. Runs of at most the cap
    (8 at first), doubling after each run that reached it: 8, 16, 32, then the 44 left (under
    the cap of 64). A is done at 0.25 + 100/8 = 12.75 s."""
    calls, rows = priced([q("A", 0.0, out=101)])
    assert calls == ["it", 8, 16, 32, 44]
    assert rows["A"]["e2e_ms"] == approx(12750.0)


def test_a_cut_run_sets_the_cap_to_twice_the_iterations_it_kept():
    """A: 101 output tokens (iteration 1 prefill, decodes in iterations 2..101).

    run 1  iterations 2-9   (cap 8)  0.25 -> 1.25       cap -> 16
    run 2  priced for 16 from 1.25: ends 1.375, 1.5, ..., 3.25
           B (4 tokens, 1 out) arrives at 2.4375: the first end at or after it is the 10th
           (1.25 + 10/8 = 2.5), so the run is cut there (iterations 10-19); cap -> 2 * 10 = 20
    it 20  2.5 -> 2.875  A decodes + B prefill 4 (0.125 + 0.25); B is done at 2.875
    then A alone: 101 - 20 = 81 left: runs of 20 (reaches the cap -> 40), 40 (-> 80), 21.
    A is done at 2.875 + 81/8 = 13 s; B's queue is 2.5 - 2.4375 = 62.5 ms."""
    calls, rows = priced([q("A", 0.0, out=101), q("B", 2.4375)])
    assert calls == ["it", 8, 16, "it", 20, 40, 21]
    assert rows["B"]["queue_ms"] == approx(62.5)
    assert rows["A"]["e2e_ms"] == approx(13000.0)


def test_an_arrival_in_a_runs_last_iteration_cuts_nothing():
    """A (41 output tokens) and C (7) arrive at 0; A starts the replica alone, C joins the next
    iteration (an iteration starts when work arrives at an idle replica):

    it 1   0     -> 0.25   A prefill 4                      A decodes in it 2..41
    it 2   0.25  -> 0.625  A decodes + C prefill 4          C decodes in it 3..8
    run    iterations 3-8 (6 < cap 8, C's finish ends it), 1/4 s each: ends 0.875 .. 2.125
           B arrives at 2.0, inside the last iteration: nothing to cut, and the cap stays 8
           (the run did not reach it)
    it 9   2.125 -> 2.5    C done at 2.125; B admitted: A decodes + B prefill 4 (B done)
    then A alone, 41 - 9 = 32 left: runs of 8 (-> cap 16), 16 (-> 32), 8.
    A is done at 2.5 + 32/8 = 6.5 s; B queues 2.125 - 2.0 = 125 ms."""
    calls, rows = priced([q("A", 0.0, out=41), q("C", 0.0, out=7), q("B", 2.0)])
    assert calls == ["it", "it", 6, "it", 8, 16, 8]
    assert rows["B"]["queue_ms"] == approx(125.0)
    assert rows["C"]["e2e_ms"] == approx(2125.0)
    assert rows["A"]["e2e_ms"] == approx(6500.0)


# --- policy metrics series ----------------------------------------------------------------------


@pytest.mark.parametrize("every, times", [(1, [0.25, 1.25, 2.25]), (2, [1.25]), (0, [])])
def test_policy_metrics_are_logged_at_every_nth_finish(every, times):
    """Three requests at 0, 1 and 2 s, each done 0.25 s later (4-token prefill, 1 token out).
    The policy's metrics are logged when the n-th, 2n-th, ... request finishes, stamped with
    that time and the replica (n = 0: never)."""
    res, _ = sim(
        [q("A", 0.0), q("B", 1.0), q("C", 2.0)],
        policy="adaptive_semantic",
        policy_metrics_every=every,
    )
    assert [row["time_s"] for row in res.policy_series] == times
    assert all(row["replica"] == 0 for row in res.policy_series)
    assert all("w_retrieved_context" in row for row in res.policy_series)


# --- the answer's blocks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, params", [("lfu", {}), ("sglang_lru", {"touch_on_release": False})]
)
def test_the_answer_continues_the_prompt_after_its_shared_blocks(policy, params):
    """block_size 16, capacity 4, requests far apart (each finishes before the next arrives).

    A: 36 prompt tokens -> a0, a1 full, a2p (4 tokens); 12 output tokens -> prompt + answer =
       48 tokens = a0, a1, a2f (a2p completed by the answer): a2f is added after the 2 shared
       blocks (a1 is not touched again). Cache a0, a1, a2p, a2f (all user_query blocks).
    B: 16 tokens (b0) + 1 output token (b1p, an output block). C: the same shape (c0, c1p).

    lfu (fewest hits, then least recently released; a request releases tail first); no block
    is ever hit, so it evicts in release order:
      B admitted: evict a2f (released before a2p);  B done: evict a2p -> a1 is a leaf
      C admitted: evict a1 (released at A's end, before B's b1p);  C done: evict a0.
    sglang_lru without touch on release (priority = last hit or insert time): A's prompt
    blocks are stamped 0 (admission), a2f A's finish time:
      B admitted: evict a2p (0 < a2f's stamp);  B done: evict a2f -> a1 is a leaf
      C admitted: evict a1 (0);  C done: evict a0 (0, older than b1p's stamp).
    Either way 4 evictions, all user_query blocks."""
    reqs = [
        request("A", 0.0, (T.USER_QUERY, 36, "a"), out=12),
        request("B", 10.0, (T.USER_QUERY, 16, "b"), out=1),
        request("C", 20.0, (T.USER_QUERY, 16, "c"), out=1),
    ]
    res, _ = sim(reqs, block_size=16, capacity_blocks=4, policy=policy, policy_params=params)
    assert res.summary["evictions_by_type"] == {"user_query": 4}


def test_the_answer_is_keyed_with_the_prompts_tenant_salt():
    """salt_by_tenant: tenants never share blocks. block_size 16.

    A (tenant t1): 20 prompt tokens (a0, a1p), answer of 12 tokens "ans" -> a1f cached.
    B (tenant t2): the same prompt: no hit (another tenant's salt) -> 0 cached tokens.
    C (tenant t1): A's prompt + the answer as history + 16 new tokens: hits a0 and a1f
      (the answer is keyed under t1's salt, after the prompt) -> 32 cached tokens."""
    ans = content_hash("ans")
    prompt = (T.USER_QUERY, 20, "p")
    reqs = [
        request("A", 0.0, prompt, out=12, tenant_id="t1", output_hash=ans),
        request("B", 10.0, prompt, out=1, tenant_id="t2"),
        request(
            "C",
            20.0,
            prompt,
            (T.ASSISTANT_HISTORY, 12, "ans"),
            (T.USER_QUERY, 16, "c"),
            tenant_id="t1",
        ),
    ]
    _, rows = sim(reqs, block_size=16, salt_by_tenant=True)
    assert rows["B"]["cached_tokens"] == 0
    assert (rows["C"]["hit_blocks"], rows["C"]["cached_tokens"]) == (2, 32)


def test_segment_keying_covers_the_answer_and_reuses_by_position():
    """mode "segment", block_size 16: a reusable segment (system) restarts its chain from the
    root; user queries, history and outputs stay chained to what precedes them.

    A: system "s" (16) + query "q1" (16), answer "ans" (16) -> blocks s, q1 and the answer
       chained after q1.
    D: s + q1 + history "ans" (16) + q2 (16): hits s, q1 and the answer: 48 cached tokens.
    E: query "q3" (16) + system "s" (16): s restarts from the root wherever it is: hit, 16."""
    ans = content_hash("ans")
    sys_, q1 = (T.SYSTEM, 16, "s"), (T.USER_QUERY, 16, "q1")
    reqs = [
        request("A", 0.0, sys_, q1, out=16, output_hash=ans),
        request("D", 10.0, sys_, q1, (T.ASSISTANT_HISTORY, 16, "ans"), (T.USER_QUERY, 16, "q2")),
        request("E", 20.0, (T.USER_QUERY, 16, "q3"), sys_),
    ]
    _, rows = sim(reqs, block_size=16, mode="segment")
    assert (rows["D"]["hit_blocks"], rows["D"]["cached_tokens"]) == (3, 48)
    assert (rows["E"]["hit_blocks"], rows["E"]["cached_tokens"]) == (1, 16)


def test_saecache_sees_the_answer_as_the_same_request():
    """saecache learns gamma from one depth sample per single-turn request, pushed when the
    next request starts; caching a request's answer is the same request again, not a sample.
    Three single-turn requests, one after the other, each with an answer that adds a block;
    metrics after every finish: gamma_samples 0, 1, 2."""
    res, _ = sim(
        [q("A", 0.0, out=4), q("B", 1.0, out=4), q("C", 2.0, out=4)],
        policy="saecache",
        policy_metrics_every=1,
    )
    assert [row["gamma_samples"] for row in res.policy_series] == [0.0, 1.0, 2.0]


def test_saecache_sees_an_answer_as_its_request_while_others_are_in_flight():
    """The same three requests, B arriving at 0.0625 s while A is still running: B is admitted
    before A's answer is cached, so the answer does not follow its own request. It is still
    A's (``Policy.on_extend``), not a new request. A sample is pushed when the next request
    starts: B's start pushes A's (1 at A's finish, 1 at B's), C's start at 2 s pushes B's (2
    at C's finish): 1, 1, 2. (Found by the mutation review, issue 11: recognising the answer
    by "same index as the last request" counted each answer after the overlap as a request
    too: 2, 3, 4.)"""
    res, _ = sim(
        [q("A", 0.0, out=4), q("B", 0.0625, out=4), q("C", 2.0, out=4)],
        policy="saecache",
        policy_metrics_every=1,
    )
    assert [row["gamma_samples"] for row in res.policy_series] == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("kind", [{"session_id": "s"}, {"templated": True}])
def test_saecache_queues_the_answer_block_by_its_requests_class(kind):
    """saecache, block_size 16, capacity 6 blocks, EXACT latency.

    A (a chat turn: session id; or a templated single-turn request): 20 prompt tokens "a"
      (a0, a1p), 12 output tokens -> a1f (user_query: a1p completed by the answer). Served
      0 -> 1.25 (prefill 20 tokens) -> 2.625 (11 decodes): its blocks go to A's queue, Chat
      (or Structural), a1f too: it is A's block.
    B (untemplated single-turn): the same shape at 3 s, done at 5.625: Evict-First
      (alpha 0.1) blocks b0, b1p, b1f. Cache now 6 blocks, full.
    C at 8 s (16 tokens, 1 out) needs one block, and one more for its answer at 9 s:
      P = alpha * w * p / dt, same type everywhere: A's leaves a1p, a1f have dt = 8 - 2.625
      = 5.375 and p = 0.67 (Chat: lognormal survival with the seed mu 2.28, sigma 1.34) or
      0.5 (Structural, position level 1/2): P >= 0.09; B's have 0.1 / 2.375 = 0.042: B's
      two leaves are evicted, a1f survives.
    D at 10 s: A's prompt + the answer as history + 16 tokens: hits a0 and a1f (32 tokens)."""
    ans = content_hash("ans-A")
    reqs = [
        request("A", 0.0, (T.USER_QUERY, 20, "a"), out=12, output_hash=ans, **kind),
        request("B", 3.0, (T.USER_QUERY, 20, "b"), out=12),
        request("C", 8.0, (T.USER_QUERY, 16, "c"), out=1),
        request(
            "D",
            10.0,
            (T.USER_QUERY, 20, "a"),
            (T.ASSISTANT_HISTORY, 12, "ans-A"),
            (T.USER_QUERY, 16, "d"),
        ),
    ]
    _, rows = sim(reqs, block_size=16, capacity_blocks=6, policy="saecache")
    assert rows["A"]["e2e_ms"] == approx(2625.0)
    assert (rows["D"]["hit_blocks"], rows["D"]["cached_tokens"]) == (2, 32)


# --- offline policies ---------------------------------------------------------------------------


def test_belady_is_told_each_blocks_next_use():
    """capacity 2 blocks, one-block prompts a, b, c, a, b (1 s apart, answers not cached).
    Belady at c: a is next used by request 3, b by request 4: evict b, so request 3 hits a.
    (lru would evict a, the least recently released, and miss it.)"""
    reqs = [
        request(rid, float(i), (T.USER_QUERY, 4, rid[0]))
        for i, rid in enumerate(["a1", "b1", "c", "a2", "b2"])
    ]
    hits = {}
    for policy in ("belady", "lru"):
        res, _ = sim(reqs, capacity_blocks=2, policy=policy, include_output_blocks=False)
        hits[policy] = [r["hit_blocks"] for r in res.requests]
    assert hits == {"belady": [0, 0, 0, 1, 0], "lru": [0, 0, 0, 0, 0]}


# --- progress bar -------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stderr_of(progress: bool | None, stream: io.StringIO, monkeypatch) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    simulate([q("A", 0.0), q("B", 1.0)], SimConfig(block_size=4), EXACT, progress=progress)
    return stream.getvalue()


@pytest.mark.parametrize(
    "progress, terminal, shown",
    [
        (True, False, True),
        (True, True, True),
        (False, False, False),
        (False, True, False),
        (None, False, False),  # None: tqdm decides, and shows no bar when stderr is not a tty
        (None, True, True),
    ],
)
def test_the_progress_bar_is_shown_exactly_when_asked(progress, terminal, shown, monkeypatch):
    """When shown: "simulate <policy>", a count out of the 2 requests in "req" units, erased
    when the run ends (no newline left behind)."""
    out = _stderr_of(progress, _Terminal() if terminal else io.StringIO(), monkeypatch)
    if not shown:
        assert out == ""
        return
    assert "simulate lru" in out and "0/2" in out and "req/s" in out
    assert "\n" not in out and out.endswith("\r")


def test_the_progress_bar_counts_each_finished_request_once_and_is_throttled(monkeypatch):
    """The bar ends at n = total = 3 requests. Its clock is frozen after it opens, so no time
    passes between updates: a throttled bar (tqdm's ``mininterval`` > 0) draws only its
    opening "0/3" and never an intermediate "1/3" or "2/3"."""
    bars: list[Any] = []

    class Bar(engine.tqdm):  # type: ignore[misc, name-defined]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            start = self._time()
            self._time = lambda: start
            bars.append(self)

    monkeypatch.setattr(engine, "tqdm", Bar)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    simulate([q("A", 0.0), q("B", 1.0), q("C", 1.0)], SimConfig(block_size=4), EXACT, progress=True)
    assert [(bar.n, bar.total) for bar in bars] == [(3, 3)]
    out = err.getvalue()
    assert "0/3" in out and "1/3" not in out and "2/3" not in out
