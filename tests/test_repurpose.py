"""KV-Repurpose study (issue 13, simulated part): the zipf_rag workload, the analytic prefix
ceiling, prefix vs segment keying, and TTFT with recompute."""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cache

import pytest

from skv.experiments.plotstyle import save_figure
from skv.experiments.repurpose import study as S
from skv.latency import make_latency_model
from skv.model import Request, Segment, SemanticType, content_hash
from skv.replay import compile_trace, trace_totals
from skv.workloads import WORKLOADS, make_workload
from skv.workloads.zipf_rag import ZipfRagParams, prefix_ceiling

CONFIG = "experiments/repurpose/repurpose_capacity.yaml"


@cache
def _requests(seed: int = 0, n: int = 2000) -> list[Request]:
    return make_workload("zipf_rag", num_requests=n, seed=seed)


# ----------------------------------------------------------------------------------------
# workload structure


def test_fixed_prefix_share_within_binomial_spread():
    reqs = _requests()
    n, p = len(reqs), 0.2
    fixed = sum(r.extra["prefix"] == "fixed" for r in reqs)
    sd = math.sqrt(n * p * (1 - p))
    assert abs(fixed - n * p) <= 4 * sd, (fixed, n * p, sd)
    # the fixed prefix is one segment, the same in every such request
    heads = {r.segments[0].content_hash for r in reqs if r.extra["prefix"] == "fixed"}
    assert len(heads) == 1


def test_documents_are_identical_segments_behind_different_prefixes():
    reqs = _requests()
    by_doc: dict[int, set[str]] = defaultdict(set)
    prefixes: dict[int, set[str]] = defaultdict(set)
    for r in reqs:
        docs = [s for s in r.segments if s.stype is SemanticType.RETRIEVED_CONTEXT]
        assert len(docs) == 4
        for d, seg in zip(r.extra["doc_ids"], docs, strict=True):
            by_doc[d].add(seg.content_hash)
            prefixes[d].add(r.extra["prefix"])
    assert all(len(h) == 1 for h in by_doc.values())  # one content hash per document
    assert len(prefixes[0]) > 50  # the top document follows many different prefixes


def test_seeded_determinism():
    def sig(reqs):
        return [
            (r.request_id, [(s.stype, s.num_tokens, s.content_hash) for s in r.segments])
            for r in reqs
        ]

    a = make_workload("zipf_rag", num_requests=200, seed=3)
    b = make_workload("zipf_rag", num_requests=200, seed=3)
    c = make_workload("zipf_rag", num_requests=200, seed=4)
    assert sig(a) == sig(b)
    assert sig(a) != sig(c)
    assert "fixed_prefix_fraction" in WORKLOADS["zipf_rag"].describe()


# ----------------------------------------------------------------------------------------
# the analytic prefix ceiling

#: |analytic - infinite-cache replay|, in points, at the default 10,000 requests: the formula
#: leaves out paths of three or more documents and second documents outside the 256 most
#: popular, and prices the prompt by its expectation (measured: +0.02 (seed 0), -0.25 (seed 1);
#: leaving out the second documents too moves it by 0.44 points, which this catches)
CEILING_TOLERANCE_PTS = 0.35


@pytest.mark.parametrize("seed", [0, 1])
def test_analytic_prefix_ceiling_equals_infinite_prefix_replay(seed):
    params = ZipfRagParams(seed=seed)
    trace = compile_trace(WORKLOADS["zipf_rag"](params), block_size=16, mode="prefix")
    totals = trace_totals(trace)
    _, stats = S.chain_hits(trace, "lru", totals.block_accesses + 1)
    replay = stats.hit_tokens / stats.prompt_tokens
    assert replay == pytest.approx(totals.ceiling_token_hit_rate, abs=1e-12)
    analytic = prefix_ceiling(params)["prefix_ceiling"]
    assert abs(100 * (analytic - replay)) <= CEILING_TOLERANCE_PTS, (analytic, replay)


# ----------------------------------------------------------------------------------------
# prefix vs segment keying


@cache
def _small_sweep():
    cfg = S.RepurposeConfig(
        id="t",
        workload={"num_requests": 600, "corpus_size": 400},
        capacities=["1GB", "3GB", "10GB", "30GB", "inf"],
        seeds=[0],
    )
    return cfg, *S.sweep(cfg)


def test_segment_hit_rate_at_least_prefix_at_every_capacity():
    cfg, hits, _, _ = _small_sweep()
    for cap in cfg.capacities:
        seg = S.hit_rate(hits, "segment", cap)[0]
        pre = S.hit_rate(hits, "prefix", cap)[0]
        assert seg >= pre, (cap, seg, pre)
    prefix = [S.hit_rate(hits, "prefix", c)[0] for c in cfg.capacities]
    assert prefix == sorted(prefix)  # lru on one trace: more capacity never hits less here


def test_config_loads_and_quick_overrides():
    full = S.load_config(CONFIG, quick=False)
    quick = S.load_config(CONFIG, quick=True)
    assert full.capacities == ["10GB", "30GB", "100GB", "300GB", "1TB", "inf"]
    assert len(full.seeds) == 5 and len(quick.seeds) == 2
    assert quick.workload_params(0).num_requests < full.workload_params(0).num_requests


# ----------------------------------------------------------------------------------------
# TTFT with recompute


def _req(i: int, system: str, system_tokens: int) -> Request:
    return Request(
        request_id=f"r{i}",
        arrival_s=float(i),
        segments=[
            Segment(SemanticType.SYSTEM, system_tokens, content_hash(system)),
            Segment(SemanticType.RETRIEVED_CONTEXT, 40, content_hash("doc X")),
            Segment(SemanticType.RETRIEVED_CONTEXT, 20, content_hash("doc Y")),
            Segment(SemanticType.USER_QUERY, 8, content_hash(f"question {i}")),
        ],
    )


def test_recompute_effective_tokens_by_hand():
    # request 0: system A (32) + X (40) + Y (20) + query (8); request 1: system B (24), same
    # documents. Segment keying, blocks of 16, unbounded cache: request 1 finds X (40 tokens,
    # blocks 16 + 16 + 8) and Y (20: 16 + 4) behind a prefix it does not share; its system
    # prompt and question miss. Prefix keying finds nothing.
    reqs = [_req(0, "system A", 32), _req(1, "system B", 24)]
    seg = compile_trace(reqs, block_size=16, mode="segment")
    chains, _ = S.chain_hits(seg, "lru", 1000)
    assert chains == [[0, 0, 0], [0, 40, 20]]
    prompt = 24 + 40 + 20 + 8
    assert S.effective_prefill(prompt, chains[1], "naive", 16, 0.15) == (32, 60)
    # EPIC-like: the first 16 tokens of each reused segment: 16 + 16
    assert S.effective_prefill(prompt, chains[1], "epic", 16, 0.15) == (64, 28)
    assert S.effective_prefill(prompt, chains[1], "epic", 30, 0.15) == (32 + 30 + 20, 10)
    # CacheBlend-like: ceil(15% of 60) = 9
    assert S.effective_prefill(prompt, chains[1], "cacheblend", 16, 0.15) == (41, 51)
    pre = compile_trace(reqs, block_size=16, mode="prefix")
    chains_p, _ = S.chain_hits(pre, "lru", 1000)
    assert chains_p == [[0], [0]]
    # a true prefix hit (first chain) is never recomputed
    assert S.effective_prefill(100, [48, 0], "epic", 16, 0.15) == (52, 48)
    assert S.effective_prefill(100, [48, 10], "cacheblend", 16, 0.5) == (47, 53)


def test_recompute_orders_ttft():
    lat = make_latency_model("roofline", model="llama-3.1-8b", gpu="H100")
    chains = [0, 40, 20]
    naive = lat.ttft_ms(*S.effective_prefill(92, chains, "naive", 16, 0.15))
    epic = lat.ttft_ms(*S.effective_prefill(92, chains, "epic", 16, 0.15))
    blend = lat.ttft_ms(*S.effective_prefill(92, chains, "cacheblend", 16, 0.15))
    assert naive <= epic and naive <= blend
    _, _, ttfts, _ = _small_sweep()
    for cap, d in ttfts.groupby("capacity"):
        t = dict(zip(d["scheme"], d["mean_ttft_ms"], strict=True))
        assert t["naive"] <= t["epic"] and t["naive"] <= t["cacheblend"], cap


def test_unknown_scheme_refused():
    with pytest.raises(ValueError, match="unknown recompute scheme"):
        S.recompute_tokens([0, 5], "magic", 16, 0.15)


# ----------------------------------------------------------------------------------------
# figures


def test_figures_pass_the_check(tmp_path):
    cfg, hits, ttfts, meta = _small_sweep()
    save_figure(S.hit_rate_figure(hits, meta, "test"), tmp_path, "hit_rate_figure")
    save_figure(S.ttft_figure(ttfts, meta, "test"), tmp_path, "ttft_figure")
    values = S.claim_values(cfg, hits, ttfts, meta)
    assert (
        values["segment_hit_pct_claim_cap"]["value"] > values["prefix_hit_pct_claim_cap"]["value"]
    )
