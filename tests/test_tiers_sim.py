"""Tiered KV in the serving simulator: load time on the link (in series or overlapped), the
load-or-recompute choice by hand, agreement with the cache-only tiered replay when requests
do not overlap, and nothing changed when the lower tiers never serve."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import rb

from skv.blocks import compile_trace
from skv.latency.linear import LinearLatency
from skv.model import Request, Segment, SemanticType, content_hash
from skv.sim import SimConfig, simulate
from skv.sizing import get_model
from skv.tiers import LINKS, LoadPricer, TieredCache, TierSpec, TierStats

T = SemanticType
MODEL = "qwen2.5-1.5b"
PER_TOKEN = get_model(MODEL).kv_bytes_per_token


def doc_then_query(i: int, doc: str, at: float, out: int = 1) -> Request:
    """64 tokens of a shared document, then 16 of this request's own question."""
    segs = [
        Segment(T.RETRIEVED_CONTEXT, 64, content_hash(doc)),
        Segment(T.USER_QUERY, 16, content_hash(f"q{i}")),
    ]
    return Request(f"r{i}", at, segs, output_tokens=out)


#: r0 computes doc a; r1 (doc b) takes the whole 5-block GPU tier, so a goes to the cpu
#: tier; r2 loads a's 4 blocks from there and computes its question
THREE = [doc_then_query(0, "a", 0.0), doc_then_query(1, "b", 10.0), doc_then_query(2, "a", 20.0)]


def run(latency: LinearLatency, **kw) -> dict:
    config = SimConfig(
        capacity_blocks=5,
        block_size=16,
        include_output_blocks=False,
        tiers=["cpu=100"],
        tier_model=MODEL,
        **kw,
    )
    return simulate(THREE, config, latency, progress=False)


def test_a_load_costs_its_transfer_in_series_or_is_hidden_when_overlapped():
    lat = LinearLatency(base_ttft_ms=20.0, token_latency_ms=0.05)
    load_ms = (LINKS["pcie5"].latency_us * 1e-6 + 64 * PER_TOKEN / 50e9) * 1e3
    serial = run(lat)
    r2 = serial.requests[2]
    assert r2["cached_tokens"] == 64
    assert r2["ttft_ms"] == pytest.approx(20.0 + 0.05 * 16 + load_ms)
    assert serial.summary["tier_load_ms"] == pytest.approx(load_ms)
    cpu = serial.summary["tiers"][1]
    assert (cpu["loaded_segments"], cpu["recomputed_segments"], cpu["hit_tokens"]) == (1, 0, 64)
    overlapped = run(lat, tier_overlap=True)
    assert overlapped.requests[2]["ttft_ms"] == pytest.approx(20.0 + 0.05 * 16)  # load < compute
    # the first two computed everything: no load, no change
    for a, b in zip(serial.requests[:2], overlapped.requests[:2], strict=True):
        assert a["ttft_ms"] == b["ttft_ms"] == pytest.approx(20.0 + 0.05 * 80)


def test_a_load_dearer_than_recompute_is_recomputed_unless_told_to_load():
    lat = LinearLatency(base_ttft_ms=20.0, token_latency_ms=1e-5)  # 64 tokens: 0.00064 ms
    cheaper = run(lat)
    r2 = cheaper.requests[2]
    assert r2["cached_tokens"] == 0 and r2["ttft_ms"] == pytest.approx(20.0 + 1e-5 * 80)
    cpu = cheaper.summary["tiers"][1]
    assert (cpu["loaded_segments"], cpu["recomputed_segments"]) == (0, 1)
    assert cpu["recomputed_tokens"] == 64 and cheaper.summary["tier_load_ms"] == 0
    forced = run(lat, tier_choice="load")
    assert forced.requests[2]["cached_tokens"] == 64
    assert forced.requests[2]["ttft_ms"] > cheaper.requests[2]["ttft_ms"]


def pricer(token_ms: float, per_token: float) -> LoadPricer:
    return LoadPricer(
        LinearLatency(base_ttft_ms=1.0, token_latency_ms=token_ms),
        per_token,
        [LINKS["pcie5"], LINKS["nvme"]],
    )


@pytest.mark.parametrize(
    "tiers, tokens, want, loaded",
    [
        # 16 tokens from cpu: 0.0103 ms to load, 0.016 ms to compute: load
        ([1], [16], [1], 1),
        # 16 tokens from disk: 0.112 ms (two links' latency) against 0.016 ms: recompute
        ([2], [16], [-1], 0),
        # disk 16 then cpu 1600: alone the disk segment would be recomputed, and with it the
        # 1600 tokens after it (1.616 ms); loading both costs 0.154 ms: the cut loads both
        ([2, 1], [16, 1600], [2, 1], 2),
        # cpu 1600 then disk 16: load cpu (0.042 ms < 1.6 ms), recompute the disk tail
        ([1, 2], [1600, 16], [1, -1], 1),
    ],
)
def test_the_cut_minimises_load_plus_recompute(tiers, tokens, want, loaded):
    p = pricer(token_ms=0.001, per_token=1000.0)
    r = rb([1, 2], tokens=tokens)
    where = list(tiers)
    st = TierStats(["gpu", "cpu", "disk"])
    ms = p.decide(r, where, st)
    assert where == want
    assert sum(st.loaded_segments) == loaded
    assert sum(st.recomputed_segments) == len(tiers) - loaded
    want_ms = sum(p.load_ms(t, n) for t, n, w in zip(tiers, tokens, want, strict=True) if w > 0)
    assert ms == pytest.approx(want_ms) and st.load_ms == pytest.approx(want_ms)


def test_gpu_hits_and_misses_around_a_segment_are_left_alone():
    """[gpu, cpu, miss | new run: cpu]: each run decided on its own; tier 0 hits kept."""
    p = pricer(token_ms=0.001, per_token=1000.0)
    r = rb([1, 2, 3, 4], parents=[None, 1, 2, None], tokens=[16, 16, 16, 16])
    where = [0, 1, -1, 1]
    p.decide(r, where, TierStats(["gpu", "cpu", "disk"]))
    assert where == [0, 1, -1, 1]


def test_load_time_follows_the_slowest_link_and_sums_latencies():
    p = pricer(token_ms=0.001, per_token=1000.0)
    assert p.load_ms(1, 1000) == pytest.approx((10e-6 + 1e6 / 50e9) * 1e3)
    assert p.load_ms(2, 1000) == pytest.approx((110e-6 + 1e6 / 7e9) * 1e3)


def test_requests_that_never_overlap_see_the_cache_only_replays_hits():
    """At an arrival every 100 s no two requests are in flight: each request's cached tokens
    are what the tiered replay (always loading) serves it, capped at prompt - 1."""
    import random

    rng = random.Random(4)
    reqs = []
    for i in range(120):
        segs = [
            Segment(T.SYSTEM, 48, content_hash("sys")),
            Segment(T.RETRIEVED_CONTEXT, 96, content_hash(f"d{rng.randrange(12)}")),
            Segment(T.USER_QUERY, 20, content_hash(f"q{i}")),
        ]
        reqs.append(Request(f"r{i}", 100.0 * i, segs, output_tokens=3))
    config = SimConfig(
        capacity_blocks=20,
        block_size=16,
        include_output_blocks=False,
        tiers=["cpu=40"],
        tier_choice="load",
        tier_model=MODEL,
    )
    sim = simulate(reqs, config, LinearLatency(), progress=False)
    trace = compile_trace(reqs, 16, "prefix")
    tc = TieredCache("lru", 20, [(TierSpec("cpu", "40"), 40)])
    want = []
    for r in trace:
        where = tc.access(r, r.arrival_s)
        hit = sum(r.tokens[i] for i, t in enumerate(where) if t >= 0)
        want.append(min(hit, r.prompt_tokens - 1))
    assert [row["cached_tokens"] for row in sim.requests] == want
    assert sim.summary["tiers"][1]["hit_tokens"] > 0


def test_tiers_that_never_serve_change_nothing():
    """A GPU tier that holds everything: the lower tier never serves, so every request's
    timing equals the simulation without tiers."""
    reqs = [doc_then_query(i, f"d{i % 3}", 0.05 * i, out=1 + i % 7) for i in range(60)]
    base = SimConfig(capacity_blocks=4000, block_size=16)
    plain = simulate(reqs, base, LinearLatency(), progress=False)
    base.tiers, base.tier_model = ["cpu=100"], MODEL
    tiered = simulate(reqs, base, LinearLatency(), progress=False)
    assert tiered.requests == plain.requests
    assert tiered.summary["tiers"][1]["hit_tokens"] == 0
    assert {k: v for k, v in tiered.summary.items() if not k.startswith("tier")} == plain.summary


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"tiers": ["cpu"]}, "expected NAME=SIZE"),
        ({"tiers": ["cpu=10"], "tier_write": "back"}, "tier_write 'back'"),
        ({"tiers": ["cpu=10"], "tier_choice": "never"}, "tier_choice 'never'"),
        ({"tiers": ["cpu=10"], "tier_overlap": "yes"}, "tier_overlap"),
    ],
)
def test_bad_tier_settings_are_refused_by_the_config(kw, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**kw)


def test_tiers_need_a_kv_size_and_an_online_policy():
    reqs = THREE
    with pytest.raises(ValueError, match="set tier_model"):
        simulate(reqs, SimConfig(tiers=["cpu=10"]), LinearLatency(), progress=False)
    with pytest.raises(ValueError, match="cannot run a tier"):
        config = SimConfig(policy="belady", tiers=["cpu=10"], tier_model=MODEL)
        simulate(reqs, config, LinearLatency(), progress=False)


class RecordingLatency:
    """ttft_ms(n, before) = n ms, every call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def ttft_ms(self, n: int, before: int) -> float:
        self.calls.append((n, before))
        return float(n)


class FlatPricer(LoadPricer):
    """Every segment costs 1 ms to load; recompute as the base class prices it."""

    def load_ms(self, tier: int, tokens: int) -> float:
        return 1.0


def test_a_tie_loads():
    p = FlatPricer(RecordingLatency(), 1000.0, [LINKS["pcie5"]])
    r = rb([1, 2], tokens=[1, 16])  # recompute the 1-token segment: 1 ms, as loading it
    where = [1, -1]
    p.decide(r, where, TierStats(["gpu", "cpu"]))
    assert where == [1, -1]


def test_recompute_is_priced_inside_the_prefill_the_request_runs_anyway():
    """[gpu 16 | cpu 16 | miss 32]: recomputing the cpu segment costs computing 16 + 32 tokens
    after 16 against 32 after 32, not 16 tokens alone."""
    lat = RecordingLatency()
    p = LoadPricer(lat, 1000.0, [LINKS["pcie5"]])
    r = rb([1, 2, 3], tokens=[16, 16, 32])
    p.decide(r, [0, 1, -1], TierStats(["gpu", "cpu"]))
    assert (48, 16) in lat.calls and (32, 32) in lat.calls
    assert p.recompute_ms(16, 0, 0) == 16.0  # nothing after: the last token still counts
    assert lat.calls[-2:] == [(17, 0), (1, 16)]


def test_a_short_segment_is_not_free_to_recompute_on_a_roofline():
    """On the roofline a 64-token prefill alone sits under the weight-read floor (about
    free), but inside a 4000-token prefill it costs its FLOPs: the pricer loads it."""
    from skv.latency.roofline import RooflineLatency

    lat = RooflineLatency(model="llama-3.1-8b", gpu="H100")
    p = LoadPricer(lat, get_model("llama-3.1-8b").kv_bytes_per_token, [LINKS["pcie5"]])
    r = rb([1, 2, 3], tokens=[1000, 64, 4000])
    where = [0, 1, -1]
    p.decide(r, where, TierStats(["gpu", "cpu"]))
    assert where == [0, 1, -1]  # loaded: 0.18 ms against about 2 ms of prefill
    assert p.recompute_ms(64, 4000, 1000) > p.load_ms(1, 64)


def test_load_time_is_taken_once():
    p = pricer(token_ms=1.0, per_token=1000.0)
    tc = TieredCache("lru", 4, [(TierSpec("cpu", "8"), 8)], pricer=p)
    tc.access(rb([1, 2], index=0), 0.0)
    tc.access(rb([3, 4, 5, 6], index=1), 1.0)  # 1 and 2 go to the cpu tier only
    assert tc.take_load_ms() == 0.0
    lease = tc.acquire(rb([1, 2], index=2), 2.0)
    assert lease.where == [1, 1] and lease.load_ms > 0
    assert tc.take_load_ms() == pytest.approx(lease.load_ms)
    assert tc.take_load_ms() == 0.0


@pytest.mark.parametrize("write, stored", [("through", True), ("evict", False)])
def test_an_answer_is_written_down_under_write_through(write, stored):
    tc = TieredCache("lru", 8, [(TierSpec("cpu", "8"), 8)], write=write)
    lease = tc.acquire(rb([1, 2], index=0), 0.0)
    tc.extend(lease, rb([1, 2, 3]), 2, 0.5)
    tc.release(lease, 1.0)
    assert 3 in tc.top.blocks and (3 in tc.tiers[0]) is stored


# ------------------------------------------------------------------ experiment configs


def _smoke_with(**over) -> dict:
    import yaml

    data = yaml.safe_load(Path("experiments/semantickv/smoke.yaml").read_text())
    data.update({"capacities": ["10%"], "seeds": [0], "model": MODEL, **over})
    return data


def test_an_experiment_config_runs_with_tiers():
    """``tiers:`` in an ``skv run`` config reaches the simulator: a cpu tier under a 10% GPU
    cache serves hits, the run rows say so, and the hit rate beats the same run without it."""
    from skv.experiments.config import config_from_dict
    from skv.experiments.runner import simulate_experiment

    plain = simulate_experiment(config_from_dict(_smoke_with()))
    tiered = simulate_experiment(
        config_from_dict(_smoke_with(tiers={"lower": ["cpu=50%"], "overlap": True}))
    )
    for a, b in zip(plain["runs"], tiered["runs"], strict=True):
        assert b["tiers"][1]["hit_tokens"] > 0 and "tiers" not in a
        assert b["token_hit_rate"] > a["token_hit_rate"]


@pytest.mark.parametrize(
    "over, message",
    [
        ({"tiers": {"lower": ["cpu"]}}, "tiers.lower: entry 0: tier 'cpu'"),
        ({"tiers": {"lower": ["cpu=5%"], "write": "back"}}, "tiers.write"),
        ({"tiers": {"lower": ["cpu=5%"]}, "model": None}, "tiers: set 'model'"),
        ({"tiers": {"lower": ["cpu=5%"]}, "policies": ["vllm"]}, "cannot run a GPU tier"),
    ],
)
def test_experiment_tier_errors_name_the_field(over, message):
    from skv.experiments.config import config_from_dict

    with pytest.raises(ValueError, match=message):
        config_from_dict(_smoke_with(**over))
