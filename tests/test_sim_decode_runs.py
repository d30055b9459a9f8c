"""The simulator's decode-run fast path gives exactly the iteration-by-iteration results.

``skv.sim.engine`` prices a replica's decode-only iterations as one run and cuts the run where a
new request is routed to the replica. With the run cap at 1 every iteration is its own event
(the plain loop), so comparing both settings on traffic that cuts runs often (several replicas,
bursts, long and short answers, chunked prefill, a full cache) checks the fast path changes
nothing: every request's times, the summary, the memory samples and every iteration priced.
"""

from __future__ import annotations

import random

import pytest

from skv.latency import Iteration, make_latency_model
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, engine, simulate


def traffic(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(40.0) if rng.random() < 0.8 else 0.0  # bursts at equal times
        doc = f"d{rng.randrange(6)}"
        segs = [
            Segment(SemanticType.SYSTEM, 64, content_hash("sys")),
            Segment(SemanticType.RETRIEVED_CONTEXT, rng.choice([32, 200, 900]), content_hash(doc)),
            Segment(SemanticType.USER_QUERY, rng.randint(1, 40), content_hash(f"q{i}")),
        ]
        out.append(Request(f"r{i}", t, segs, output_tokens=rng.choice([0, 1, 2, 7, 60, 300])))
    return out


def run(cap: int | None, monkeypatch, config: SimConfig, latency: str, params: dict):
    with monkeypatch.context() as m:
        if cap is not None:
            m.setattr(engine, "_RUN_CAP_START", cap)
            m.setattr(engine, "_RUN_CAP_MAX", cap)
        log: list[tuple[int, float, float, Iteration]] = []
        res = simulate(
            traffic(400, 5),
            config,
            make_latency_model(latency, **params),
            progress=False,
            on_iteration=lambda *a: log.append(a),
        )
    return res, log


CASES = {
    "roofline-3-prefix": (
        SimConfig(capacity_blocks=300, block_size=16, replicas=3, router="prefix_locality"),
        "roofline",
        {},
    ),
    "linear-2-least-loaded-small-batch": (
        SimConfig(
            capacity_blocks=120,
            block_size=16,
            replicas=2,
            router="least_loaded",
            max_batch_tokens=256,
            max_running=8,
            sample_every_s=0.05,
        ),
        "linear",
        {},
    ),
    "roofline-70b-4-round-robin": (
        SimConfig(capacity_blocks=2000, block_size=16, replicas=4, router="round_robin"),
        "roofline",
        {"model": "llama-3.3-70b-fp8", "gpu": "H100", "tp": 4},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_decode_runs_change_no_result(case, monkeypatch):
    config, model, params = CASES[case]
    plain, plain_log = run(1, monkeypatch, config, model, params)
    fast, fast_log = run(None, monkeypatch, config, model, params)
    assert fast.requests == plain.requests
    assert fast.summary == plain.summary
    assert fast.memory == plain.memory
    assert fast.policy_series == plain.policy_series
    # every replica ran the same iterations at the same times
    for k in range(config.replicas):
        assert [a for a in fast_log if a[0] == k] == [a for a in plain_log if a[0] == k]
    assert len(fast_log) == fast.summary["iterations"]


@pytest.mark.parametrize("case", CASES)
def test_prefill_iterations_priced_without_iteration_objects_change_no_result(case, monkeypatch):
    """Without an ``on_iteration`` hook the loop prices an iteration with prefill by
    ``prefill_ms`` from the chunks' numbers (``Replica.chunk_lists``) and builds no
    ``Iteration``: the same results as the hooked run, which prices the ``Iteration``. Only a
    model that overrides ``prefill_ms`` (the roofline) is asked: the others keep pricing the
    ``Iteration`` the replica builds."""
    config, model, params = CASES[case]
    hooked, _ = run(None, monkeypatch, config, model, params)
    latency = make_latency_model(model, **params)
    calls, prefill_ms = [], latency.prefill_ms
    object.__setattr__(latency, "prefill_ms", lambda *a: calls.append(a) or prefill_ms(*a))
    plain = simulate(traffic(400, 5), config, latency, progress=False)
    assert bool(calls) == (model == "roofline")
    assert plain.requests == hooked.requests
    assert plain.summary == hooked.summary
    assert plain.memory == hooked.memory


def test_decode_runs_are_priced_in_bulk(monkeypatch):
    """The fast path is taken: most decode iterations are priced by ``decode_run_ends`` runs,
    not one event each (counted by the latency model's calls)."""
    config, model, params = CASES["roofline-70b-4-round-robin"]
    latency = make_latency_model(model, **params)
    calls = {"iteration": 0, "runs": 0}
    iteration_ms, decode_run_ends = latency.iteration_ms, latency.decode_run_ends
    prefill_ms = latency.prefill_ms

    def count_iteration(it):
        calls["iteration"] += 1
        return iteration_ms(it)

    def count_prefill(*a):
        calls["iteration"] += 1
        return prefill_ms(*a)

    def count_runs(*a):
        calls["runs"] += 1
        return decode_run_ends(*a)

    object.__setattr__(latency, "iteration_ms", count_iteration)
    object.__setattr__(latency, "prefill_ms", count_prefill)
    object.__setattr__(latency, "decode_run_ends", count_runs)
    res = simulate(traffic(400, 5), config, latency, progress=False)
    iterations = res.summary["iterations"]
    assert calls["iteration"] + calls["runs"] < iterations / 3, (calls, iterations)


def test_max_running_above_the_token_budget_is_rejected():
    with pytest.raises(ValueError, match="max_running <= max_batch_tokens"):
        simulate(
            traffic(3, 0),
            SimConfig(max_batch_tokens=16, max_running=32),
            make_latency_model("linear"),
            progress=False,
        )


@pytest.mark.parametrize("case", CASES)
def test_columns_are_the_rows_fields(case, monkeypatch):
    """``simulate(..., columns=True)``: no rows, no summary, and per request the rows' own
    floats as arrays (in the rows' order); the run itself is the same (memory samples)."""
    config, model, params = CASES[case]
    full, _ = run(None, monkeypatch, config, model, params)
    lean = simulate(
        traffic(400, 5), config, make_latency_model(model, **params), progress=False,
        columns=True,
    )  # fmt: skip
    assert lean.requests == [] and lean.summary["requests"] == len(full.requests)
    assert lean.memory == full.memory
    for name, values in lean.columns.items():
        assert values.tolist() == [r[name] for r in full.requests], name
    assert set(lean.columns) == {"arrival_s", "ttft_ms", "e2e_ms", "prompt_tokens",
                                 "cached_tokens", "replica"}  # fmt: skip
