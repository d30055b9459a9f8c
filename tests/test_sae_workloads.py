"""SAECache's workloads (``skv/workloads/sae_mix.py``): shares, timing, classes, presets.

Tolerances. Class shares are counted over conversations, each an independent draw, so a
class's count is binomial: the measured share must lie within 4 standard deviations,
``4 * sqrt(p (1 - p) / K)`` for K conversations (a false alarm has probability ~6e-5 per check;
the seeds are fixed, so a pass is reproducible). Steady-state request shares are ratios of
sums over conversations (turns of class c / all turns); their spread comes from the delta
method on the per-conversation terms, 4 standard deviations again. Log-normal fits: on n gaps
the MLE has sd ``sigma / sqrt(n)`` for mu and ``sigma / sqrt(2 n)`` for sigma; the check allows
4 of each.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from functools import cache
from itertools import pairwise

import numpy as np
import pytest
from scipy import stats

from skv.blocks import request_blocks
from skv.latency.gpus import get_gpu
from skv.model import Request, SemanticType
from skv.policies.saecache import QUEUES, request_queue
from skv.sizing import get_model
from skv.workloads import WORKLOADS, make_workload, workload_params
from skv.workloads.sae_mix import CLASSES, GAP_MU, GAP_SIGMA, SaeMixParams, plan_conversations

T = SemanticType
BS = 16
PRESETS = [
    "sharegpt_like",
    "lmsys_like",
    "arena_like",
    "tool_use",
    "multi_turn_dominant",
    "balanced",
    "single_turn_dominant",
]
#: (multi_turn_share, tool_use_share, template_share): the module docstring's table, by hand
PRESET_SHARES = {
    "sharegpt_like": (0.74, 0.0, 0.5),
    "lmsys_like": (0.33, 0.0, 0.5),
    "arena_like": (0.12, 0.0, 0.5),
    "tool_use": (0.5, 0.8, 0.5),
    "multi_turn_dominant": (0.5, 0.2, 0.5),
    "balanced": (0.2, 0.5, 0.5),
    "single_turn_dominant": (1 / 17, 0.5, 0.5),
}
#: short texts: shares and timing do not depend on lengths (the plan has its own stream)
TINY = {
    "system_tokens": 8,
    "template_tokens": 8,
    "user_tokens": 4,
    "answer_tokens": 4,
    "tool_output_tokens": 4,
    "tool_description_tokens": 4,
    "length_sigma": 0.0,
}


@cache
def _make(name: str, params_json: str) -> tuple[Request, ...]:
    return tuple(make_workload(name, **json.loads(params_json)))


def gen(name: str, **params) -> list[Request]:
    return list(_make(name, json.dumps(params, sort_keys=True)))


def conversation(r: Request) -> str:
    return r.session_id or r.request_id.rsplit("-t", 1)[0]


def queue_of(r: Request) -> str:
    """The saecache policy's own classification of the request's prefill blocks."""
    return QUEUES[request_queue(request_blocks(r, BS))]


def binomial_tol(p: float, k: int) -> float:
    return 4 * math.sqrt(p * (1 - p) / k)


# ------------------------------------------------------------------------------ registry


def test_every_preset_is_registered_under_its_own_name() -> None:
    for name in PRESETS:
        model = WORKLOADS[name].params_model
        assert issubclass(model, SaeMixParams)
        assert model.NAME == name  # noqa: SIM300
        assert WORKLOADS[name].build is WORKLOADS["sharegpt_like"].build  # one generator


@pytest.mark.parametrize("name", PRESETS)
def test_preset_shares_and_paper_timing(name: str) -> None:
    p = workload_params(name)
    assert (p.multi_turn_share, p.tool_use_share, p.template_share) == PRESET_SHARES[name]
    assert (p.gap_mu, p.gap_sigma) == (2.28, 1.34)
    assert (p.arrival_min_s, p.arrival_max_s) == (0.02, 0.08)
    m, u, t = PRESET_SHARES[name]
    hand = [m * (1 - u), m * u, (1 - m) * t, (1 - m) * (1 - t)]
    assert p.class_shares() == pytest.approx(hand)


def test_mixes_have_the_documented_request_shares() -> None:
    """The mixes are defined in request terms (module docstring table)."""
    expect = {
        "tool_use": [0.16, 0.64, 0.10, 0.10],
        "multi_turn_dominant": [0.64, 0.16, 0.10, 0.10],
        "balanced": [0.25, 0.25, 0.25, 0.25],
        "single_turn_dominant": [0.10, 0.10, 0.40, 0.40],
    }
    for name, shares in expect.items():
        assert workload_params(name).request_shares() == pytest.approx(shares)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"rate_rps": 5.0}, "rate_rps"),
        ({"arrival_min_s": 0.1, "arrival_max_s": 0.05}, "arrival_min_s"),
        ({"mean_turns": 8.0, "max_turns": 4}, "mean_turns"),
        ({"multi_turn_share": 1.2}, "multi_turn_share"),
        ({"mean_turns": 1.5}, "mean_turns"),
    ],
)
def test_bad_params_raise_naming_the_field(params: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        workload_params("lmsys_like", **params)


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", PRESETS)
def test_seeded_and_deterministic(name: str) -> None:
    def fp(reqs: list[Request]) -> list[tuple]:
        return [
            (
                r.request_id,
                r.arrival_s,
                r.session_id,
                r.turn,
                r.parent_id,
                r.output_tokens,
                r.output_hash,
                tuple((s.stype, s.num_tokens, s.content_hash) for s in r.segments),
            )
            for r in reqs
        ]

    a = make_workload(name, num_requests=150, seed=5)
    b = make_workload(name, num_requests=150, seed=6)
    assert fp(a) == fp(make_workload(name, num_requests=150, seed=5))
    assert fp(a) != fp(b)
    # every random choice follows the seed: fresh user texts never repeat across seeds
    queries = [
        {s.content_hash for r in x for s in r.segments if s.stype is T.USER_QUERY} for x in (a, b)
    ]
    assert queries[0] and not queries[0] & queries[1]


# ------------------------------------------------------------------- shares and classes


@pytest.mark.parametrize("name", PRESETS)
def test_each_class_appears_with_its_expected_share(name: str) -> None:
    """saecache's classification of every request is the class the generator planned; the
    conversations of each class are binomially close to the preset's share; the steady-state
    request shares (planned turns) are close to the module docstring's table."""
    m, u, t = PRESET_SHARES[name]
    conv_shares = [m * (1 - u), m * u, (1 - m) * t, (1 - m) * (1 - t)]
    per = [c * n for c, n in zip(conv_shares, [4, 4, 1, 1], strict=True)]
    req_shares = [x / sum(per) for x in per]
    reqs = gen(name, num_requests=8000, seed=11, **TINY)
    by_conv: dict[str, set[str]] = defaultdict(set)
    turns: dict[str, int] = {}
    for r in reqs:
        assert queue_of(r) == r.extra["sae_class"], r.request_id
        by_conv[conversation(r)].add(queue_of(r))
        turns[conversation(r)] = int(r.extra["planned_turns"])
    assert all(len(v) == 1 for v in by_conv.values())  # one class per conversation
    kind = {c: next(iter(v)) for c, v in by_conv.items()}
    k = len(kind)
    counts = Counter(kind.values())
    for cls, share in zip(CLASSES, conv_shares, strict=True):
        if share == 0:
            assert counts[cls] == 0, cls
            continue
        assert counts[cls] > 0, cls
        assert counts[cls] / k == pytest.approx(share, abs=binomial_tol(share, k)), cls
    # steady-state request shares: sum of planned turns per class (ratio, delta-method spread)
    y = np.array([turns[c] for c in kind], dtype=float)
    for cls, share in zip(CLASSES, req_shares, strict=True):
        x = np.array([turns[c] * (kind[c] == cls) for c in kind], dtype=float)
        ratio = x.sum() / y.sum()
        sd = math.sqrt(((x - ratio * y) ** 2).sum()) / y.sum()
        assert ratio == pytest.approx(share, abs=4 * sd + 1e-12), cls


@pytest.mark.parametrize(("name", "m"), [("sharegpt_like", 0.74), ("lmsys_like", 0.33)])
def test_multi_turn_share_of_conversations(name: str, m: float) -> None:
    reqs = gen(name, num_requests=8000, seed=11, **TINY)
    multi: dict[str, bool] = {}
    for r in reqs:
        multi[conversation(r)] = r.session_id is not None
    k = len(multi)
    measured = sum(multi.values()) / k
    assert measured == pytest.approx(m, abs=binomial_tol(m, k))


def test_arena_like_multi_turn_share_on_a_large_plan() -> None:
    """12%: the smallest share, checked on 100k conversations' plan (tight binomial bound)."""
    plans = plan_conversations(workload_params("arena_like", num_requests=140_000, seed=2))
    k = len(plans)
    measured = sum(c.kind in (0, 1) for c in plans) / k
    assert k > 90_000
    assert measured == pytest.approx(0.12, abs=binomial_tol(0.12, k))


@pytest.mark.parametrize("name", PRESETS)
def test_classification_at_default_lengths(name: str) -> None:
    reqs = gen(name, num_requests=1200, seed=4)
    assert {queue_of(r) == r.extra["sae_class"] for r in reqs} == {True}
    single = [r for r in reqs if r.extra["sae_class"] in ("structural", "evict_first")]
    assert all(r.session_id is None and r.turn == 0 and r.parent_id is None for r in single)
    assert all(r.templated == (r.extra["sae_class"] == "structural") for r in reqs)


# ------------------------------------------------------------------------------ timing


def test_new_conversations_arrive_every_20_to_80_ms() -> None:
    reqs = gen("balanced", num_requests=8000, seed=11, **TINY)
    starts = sorted(r.arrival_s for r in reqs if r.turn == 0)
    gaps = np.diff([0.0, *starts])
    assert gaps.min() >= 0.02 - 1e-9 and gaps.max() <= 0.08 + 1e-9
    assert stats.kstest(gaps, "uniform", args=(0.02, 0.06)).pvalue > 1e-3
    # kept conversations are the first ones: their indices have no holes
    idx = sorted({int(conversation(r).rsplit("-c", 1)[1]) for r in reqs})
    assert idx == list(range(len(idx)))


def _session_gaps(reqs: list[Request], cls: str, horizon_s: float) -> np.ndarray:
    """Gaps between consecutive turns whose earlier turn came ``horizon_s`` before the trace
    ended: the next turn is missing only if its gap exceeds the horizon."""
    end = reqs[-1].arrival_s
    by: dict[str, list[float]] = defaultdict(list)
    for r in reqs:
        if r.extra["sae_class"] == cls:
            by[r.session_id].append(r.arrival_s)
    return np.array([b - a for ts in by.values() for a, b in pairwise(ts) if a <= end - horizon_s])


def _check_lognormal_fit(gaps: np.ndarray, mu: float, sigma: float) -> tuple[float, float]:
    shape, loc, scale = stats.lognorm.fit(gaps, floc=0)
    n = len(gaps)
    assert loc == 0
    assert math.log(scale) == pytest.approx(mu, abs=4 * sigma / math.sqrt(n))
    assert shape == pytest.approx(sigma, abs=4 * sigma / math.sqrt(2 * n))
    return math.log(scale), shape


def test_inter_turn_gaps_fit_the_papers_log_normal() -> None:
    """One conversation per second over ~6000 s; gaps whose turn came >= 2000 s before the end
    (P(gap > 2000 s) = 1 - Phi((ln 2000 - 2.28) / 1.34) ~ 4e-5: truncation is negligible)."""
    reqs = gen(
        "sharegpt_like", num_requests=20000, seed=3, arrival_min_s=1.0, arrival_max_s=1.0, **TINY
    )
    gaps = _session_gaps(reqs, "chat", 2000.0)
    assert len(gaps) > 5000
    _check_lognormal_fit(gaps, GAP_MU, GAP_SIGMA)


def test_agent_steps_use_their_own_gap_distribution() -> None:
    reqs = gen(
        "tool_use",
        num_requests=12000,
        seed=3,
        arrival_min_s=1.0,
        arrival_max_s=1.0,
        tool_gap_mu=0.7,
        tool_gap_sigma=0.6,
        **TINY,
    )
    agent = _session_gaps(reqs, "agentic", 100.0)  # P(gap > 100 s) ~ 4e-11
    chat = _session_gaps(reqs, "chat", 2000.0)
    assert len(agent) > 5000 and len(chat) > 500
    _check_lognormal_fit(agent, 0.7, 0.6)
    _check_lognormal_fit(chat, GAP_MU, GAP_SIGMA)


# -------------------------------------------------------------------- content and blocks


def test_templated_requests_share_their_template_prefix_blocks() -> None:
    reqs = [r for r in gen("balanced", num_requests=2500, seed=4) if r.templated]
    by_template: dict[int, list[Request]] = defaultdict(list)
    for r in reqs:
        by_template[int(r.extra["template"])].append(r)
    shared_templates = 0
    first_keys: dict[int, tuple[int, int]] = {}
    for k, group in by_template.items():
        # the prefix: system prompt + template; every full block inside it is shared
        prefix = [(s.stype, s.num_tokens) for s in group[0].segments[:2]]
        assert [t for t, _ in prefix] == [T.SYSTEM, T.TEMPLATE]
        full = sum(n for _, n in prefix) // BS
        keys = [request_blocks(r, BS).keys for r in group]
        assert all(ks[:full] == keys[0][:full] for ks in keys)
        if len(group) > 1:
            shared_templates += 1
            assert len({ks[full + 1] for ks in keys}) == len(keys)  # fresh fill: unique
        first_keys[k] = (keys[0][0], keys[0][full - 1])
    assert shared_templates >= 8
    # different templates differ by the end of their prefix (same system prompt or not)
    assert len({last for _, last in first_keys.values()}) == len(first_keys)


@pytest.mark.parametrize("name", ["sharegpt_like", "tool_use"])
def test_answers_are_output_blocks_the_next_turn_quotes(name: str) -> None:
    reqs = gen(name, num_requests=1200, seed=4)
    by_id = {r.request_id: r for r in reqs}
    quoted = 0
    for r in reqs:
        assert r.output_tokens > 0 and r.output_hash is not None
        if r.parent_id is None:
            continue
        prev = by_id[r.parent_id]
        assert prev.session_id == r.session_id and prev.turn == r.turn - 1
        hist = [s for s in r.segments if s.stype is T.ASSISTANT_HISTORY and s.content_hash]
        assert hist[-1].content_hash == prev.output_hash
        assert hist[-1].num_tokens == prev.output_tokens
        quoted += 1
    assert quoted > 200


def test_agentic_sessions_carry_tool_schemas_and_outputs() -> None:
    reqs = [r for r in gen("tool_use", num_requests=1200, seed=4) if r.session_id]
    agentic = [r for r in reqs if r.extra["sae_class"] == "agentic"]
    assert all(r.segments[0].stype is T.TOOL_SCHEMA for r in agentic)
    assert all(any(s.stype is T.TOOL_OUTPUT for s in r.segments) for r in agentic if r.turn > 0)
    chat = [r for r in reqs if r.extra["sae_class"] == "chat"]
    assert not any(s.stype in (T.TOOL_SCHEMA, T.TOOL_OUTPUT) for r in chat for s in r.segments)


# ------------------------------------------------------------------------------ presets


def test_qwen2_5_1_5b_kv_bytes_per_token_from_its_config() -> None:
    """Qwen2.5-1.5B(-Instruct) config.json: num_hidden_layers 28, num_key_value_heads 2,
    hidden_size 1536 / num_attention_heads 12 = head dim 128, torch_dtype bfloat16 (2 bytes):
    K and V, 2 * 28 * 2 * 128 * 2 = 28,672 bytes per token."""
    m = get_model("qwen2.5-1.5b")
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.kv_dtype_bytes) == (28, 2, 128, 2)
    assert m.hidden_size // 12 == m.head_dim
    assert m.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2 == 28_672


def test_a40_roofline_preset_is_the_datasheets_dense_numbers() -> None:
    """NVIDIA A40 datasheet: BF16 tensor 149.7 TFLOPS dense (299.4 with sparsity), 696 GB/s,
    48 GB; the project's presets all use the dense figure."""
    g = get_gpu("A40")
    assert (g.bf16_tflops, g.hbm_gbs, g.memory_gb) == (149.7, 696.0, 48.0)
    assert g.peak_tflops(2) == 149.7
