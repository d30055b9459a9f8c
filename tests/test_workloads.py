"""Synthetic workloads: determinism, arrivals, exact segmentation, and each one's reuse shape.

Reuse is measured as the replay's infinite-cache ceiling (``skv.replay.trace_totals``): a block
hits when its key was seen before, so these tests pin the structure a workload offers to a
cache, independent of any policy.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from itertools import pairwise

import numpy as np
import pytest

from skv.blocks import request_blocks
from skv.model import TYPES, Request, Segment, SemanticType
from skv.replay import compile_trace, trace_totals
from skv.segmenter import Segmenter
from skv.tokenize import SimpleTokenizer
from skv.traces import read_skv_trace, write_skv_trace
from skv.workloads import (
    VOCABULARY,
    WORKLOADS,
    Renderer,
    TextGen,
    ZipfSampler,
    make_chats,
    make_workload,
    plan_sessions,
    workload_params,
)
from skv.workloads.base import uniform_turns

T = SemanticType
BS = 16
NAMES = list(WORKLOADS)
SESSION_WORKLOADS = ["tool_agent", "legal_review", "multi_turn_chat", "reasoning"]


@cache
def _make(name: str, params_json: str) -> tuple[Request, ...]:
    return tuple(make_workload(name, **json.loads(params_json)))


def gen(name: str, **params) -> list[Request]:
    """Generated once per parameter set for the whole module (requests are not mutated)."""
    return list(_make(name, json.dumps(params, sort_keys=True)))


def fingerprint(reqs: list[Request]) -> list[tuple]:
    return [
        (
            r.request_id,
            r.arrival_s,
            r.output_tokens,
            r.output_hash,
            r.session_id,
            r.turn,
            r.parent_id,
            tuple((s.stype, s.num_tokens, s.content_hash) for s in r.segments),
        )
        for r in reqs
    ]


def ceiling(reqs: list[Request], mode: str) -> float:
    return trace_totals(compile_trace(reqs, BS, mode)).ceiling_token_hit_rate


def ceiling_hits_by_type(reqs: list[Request], mode: str) -> tuple[Counter, Counter]:
    """(hit tokens, all tokens) per type under the infinite-cache ceiling (as trace_totals)."""
    hits: Counter = Counter()
    total: Counter = Counter()
    seen: set[int] = set()
    for rb in compile_trace(reqs, BS, mode):
        in_run = False
        for key, parent, tok, st in zip(rb.keys, rb.parents, rb.tokens, rb.stypes, strict=True):
            total[TYPES[st]] += tok
            if parent is None:
                in_run = True
            if in_run and key in seen:
                hits[TYPES[st]] += tok
            else:
                in_run = False
                seen.add(key)
    return hits, total


def type_share(reqs: list[Request]) -> Counter:
    c: Counter = Counter()
    for r in reqs:
        for s in r.segments:
            c[s.stype] += s.num_tokens
    n = sum(c.values())
    return Counter({k: v / n for k, v in c.items()})


# ------------------------------------------------------------------------------ registry


def test_registry_has_every_workload() -> None:
    assert set(WORKLOADS) == {
        "shared_system_prompt",
        "rag",
        "tool_agent",
        "legal_review",
        "multi_turn_chat",
        "reasoning",
        "workload_shift",
        "zipf_rag",  # KV-Repurpose's Zipfian RAG (skv/workloads/zipf_rag.py)
        # SAE-style traffic (skv/workloads/sae_mix.py): dataset-likes and mixes
        "sharegpt_like",
        "lmsys_like",
        "arena_like",
        "tool_use",
        "multi_turn_dominant",
        "balanced",
        "single_turn_dominant",
    }


@pytest.mark.parametrize("name", NAMES)
def test_describe_lists_every_parameter(name: str) -> None:
    text = WORKLOADS[name].describe()
    for field in WORKLOADS[name].params_model.model_fields:
        assert f"  {field} = " in text


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_gives_identical_requests(name: str) -> None:
    a = make_workload(name, num_requests=120, seed=7)
    b = make_workload(name, num_requests=120, seed=7)
    assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize("name", NAMES)
def test_different_seed_gives_different_requests(name: str) -> None:
    a = {s.content_hash for r in make_workload(name, num_requests=120, seed=7) for s in r.segments}
    b = {s.content_hash for r in make_workload(name, num_requests=120, seed=8) for s in r.segments}
    assert a != b


def test_catalogue_text_is_a_pure_function_of_seed_kind_and_key() -> None:
    assert TextGen(3).text("doc", 5, 200) == TextGen(3).text("doc", 5, 200)
    assert TextGen(3).text("doc", 5, 200) != TextGen(3).text("doc", 6, 200)
    assert TextGen(3).text("doc", 5, 200) != TextGen(4).text("doc", 5, 200)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 15, 64, 1500])
def test_generated_prose_has_exactly_the_requested_tokens(n: int) -> None:
    text = TextGen(0).fresh(np.random.default_rng(n), n)
    assert SimpleTokenizer().count(text) == n
    assert "\n" not in text


def test_vocabulary_words_are_single_tokens() -> None:
    tok = SimpleTokenizer()
    assert all(tok.count(w) == 1 and tok.count(w.capitalize()) == 1 for w in VOCABULARY)


# ------------------------------------------------------------------------------ arrivals


@pytest.mark.parametrize("name", NAMES)
def test_exactly_num_requests_sorted_by_arrival_with_unique_ids(name: str) -> None:
    reqs = gen(name, num_requests=300)
    assert len(reqs) == 300
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(reqs))
    assert len({r.request_id for r in reqs}) == 300


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("legal_review", {"clauses_per_question": 0, "exhibits_per_question": 6}),
        ("rag", {"catalogue_size": 6, "docs_per_request": 6, "zipf_alpha": 5.0}),
        ("tool_agent", {"min_steps": 1, "max_steps": 1}),
        ("multi_turn_chat", {"single_turn_fraction": 1.0, "length_sigma": 0.0}),
        (
            "workload_shift",
            {"before": {"legal_review": 1.0}, "after": {"rag": 0.0, "reasoning": 1}},
        ),
    ],
)
def test_edge_parameters_still_give_exactly_num_requests(name: str, params: dict) -> None:
    for n in (1, 2, 40):
        assert len(make_workload(name, num_requests=n, **params)) == n


def test_single_request_arrivals_are_poisson_at_rate() -> None:
    reqs = gen("shared_system_prompt", num_requests=2000, rate_rps=20.0)
    gaps = np.diff([0.0] + [r.arrival_s for r in reqs])
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)  # exponential gaps


@pytest.mark.parametrize("name", SESSION_WORKLOADS)
def test_session_workloads_reach_the_request_rate(name: str) -> None:
    # short think times: sessions ramp up within seconds, so the whole trace is steady state
    # (a session brings several requests at once, so counts vary more than Poisson ones)
    reqs = gen(name, num_requests=1000, rate_rps=10.0, think_time_median_s=1.0)
    assert len(reqs) / reqs[-1].arrival_s == pytest.approx(10.0, rel=0.25)


def test_think_times_follow_the_gap_model() -> None:
    plans = plan_sessions(
        np.random.default_rng(3), 20000, 10.0, uniform_turns(2, 8), 5.0, 9.8, 1.34
    )
    early = [p for p in plans if p.arrivals[0] < 300.0]  # long finished when the trace ends
    gaps = [b - a for p in early for a, b in pairwise(p.arrivals)]
    assert np.median(gaps) == pytest.approx(9.8, rel=0.15)
    assert np.std(np.log(gaps)) == pytest.approx(1.34, rel=0.1)


def test_plan_sessions_keeps_the_earliest_requests_as_turn_prefixes() -> None:
    plans = plan_sessions(np.random.default_rng(1), 500, 5.0, uniform_turns(1, 6), 3.5, 10.0, 1.0)
    assert sum(len(p.arrivals) for p in plans) == 500
    cutoff = max(t for p in plans for t in p.arrivals)
    for p in plans:
        assert p.arrivals == sorted(p.arrivals)
        assert len(p.arrivals) <= p.planned_turns
        if len(p.arrivals) < p.planned_turns:  # cut short only by the end of the trace
            assert p.arrivals[-1] <= cutoff


def test_zipf_sampler_skews_toward_low_ids_and_draws_distinct() -> None:
    rng = np.random.default_rng(0)
    z = ZipfSampler(100, 1.2)
    draws = Counter(z.sample(rng, 20000))
    assert draws[0] > draws[10] > draws[90]
    picks = z.sample_distinct(rng, 30)
    assert len(set(picks)) == 30
    assert sorted(ZipfSampler(5, 3.0).sample_distinct(rng, 5)) == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------- exact segmentation


@pytest.mark.parametrize("name", NAMES)
def test_segments_equal_the_segmenter_on_the_whole_messages(name: str) -> None:
    """Section-wise rendering, the long-text shortcut and the recorded token counts agree with
    segmenting each request's full chat body with a fresh Segmenter."""
    chats = make_chats(name, num_requests=60, seed=2)
    reqs = make_workload(name, num_requests=60, seed=2)
    seg = Segmenter()
    for chat, req in zip(chats, reqs, strict=True):
        body = chat.openai_request()
        assert chat.request_id == req.request_id
        assert seg.messages(body["messages"], body.get("tools")) == req.segments


_PROSE = TextGen(0).fresh(np.random.default_rng(0), 900)
_MARKERS = [
    "Document 7:", "[Document 3] ", "[Document 3 ", "]", "Exhibit B", "Section 4.1", "Section 4",
    "Clause 9", "WHEREAS", "Question:", "CONTEXT:", "```", "~~~", "<think>", "</think>",
    "<document>", "<document ", ">", "</document>", "Article IV", "§ 12", " .", ":", "\n",
    "\n\n", "  ", "\t", "\nDocument 2:", "\nSection 4 ", "\n[Doc 2: a]", "\nQuestion: ",
]  # fmt: skip


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_long_section_shortcut_matches_the_segmenter(role: str) -> None:
    """Marker snippets spliced into long prose at random places (start, middle, end): the
    renderer's head-and-tail shortcut gives the segmenter's pieces, or steps aside."""
    rng = np.random.default_rng(11)
    renderer = Renderer()
    used = 0
    for _ in range(300):
        text = _PROSE
        for _ in range(int(rng.integers(0, 5))):
            marker = _MARKERS[int(rng.integers(0, len(_MARKERS)))]
            where = int(rng.choice([rng.integers(0, 600), len(text) - int(rng.integers(0, 600))]))
            if rng.random() < 0.5:  # somewhere in the middle
                where = int(rng.integers(600, len(text) - 600))
            text = f"{text[:where]}{marker}{text[where:]}"
        expected = renderer._pieces([{"role": role, "content": text}])
        fast = renderer._elided(role, text)
        used += fast is not None
        assert fast is None or fast == expected, text
    assert used > 25


def test_keep_text_keeps_segment_texts() -> None:
    req = make_workload("rag", num_requests=1, keep_text=True)[0]
    assert any(s.text and s.text.startswith("Document ") for s in req.segments)


def test_traces_round_trip_through_the_native_format(tmp_path) -> None:
    reqs = gen("tool_agent", num_requests=300)
    path = write_skv_trace(tmp_path / "w.jsonl", reqs)
    assert fingerprint(read_skv_trace(path)) == fingerprint(reqs)


# ---------------------------------------------------------------- shared_system_prompt


def test_shared_system_prompt_has_a_high_ceiling_from_system_tokens() -> None:
    reqs = gen("shared_system_prompt", num_requests=1000)
    assert ceiling(reqs, "prefix") > 0.9
    hits, _ = ceiling_hits_by_type(reqs, "prefix")
    assert hits[T.SYSTEM] / sum(hits.values()) > 0.97


def test_shared_system_prompt_dominant_prompt_share() -> None:
    reqs = gen("shared_system_prompt", num_requests=1000)
    share = Counter(r.segments[0].content_hash for r in reqs).most_common(1)[0][1] / len(reqs)
    assert share == pytest.approx(0.7, abs=0.05)


# ---------------------------------------------------------------------------------- rag


def test_rag_documents_are_found_after_different_system_prompts() -> None:
    reqs = gen("rag", num_requests=1000)
    prompts_by_doc: dict[str, set[str]] = {}
    for r in reqs:
        for s in r.segments:
            if s.stype is T.RETRIEVED_CONTEXT and s.num_tokens > 10:
                prompts_by_doc.setdefault(s.content_hash, set()).add(r.segments[0].content_hash)
    assert max(len(v) for v in prompts_by_doc.values()) > 3
    hits, total = ceiling_hits_by_type(reqs, "segment")
    assert hits[T.RETRIEVED_CONTEXT] / total[T.RETRIEVED_CONTEXT] > 0.6


def test_rag_segment_ceiling_exceeds_prefix_ceiling() -> None:
    reqs = gen("rag", num_requests=1000)
    assert ceiling(reqs, "segment") > ceiling(reqs, "prefix") + 0.3


def test_rag_metadata_removes_prefix_reuse_of_documents() -> None:
    reqs = gen("rag", num_requests=600, metadata_tokens=24)
    hits, _ = ceiling_hits_by_type(reqs, "prefix")
    assert hits[T.RETRIEVED_CONTEXT] < 100  # only the "CONTEXT:" marker chains past metadata


def test_rag_zipf_skew_raises_reuse() -> None:
    def doc_hit_rate(alpha: float) -> float:
        reqs = gen("rag", num_requests=400, catalogue_size=20000, zipf_alpha=alpha)
        hits, total = ceiling_hits_by_type(reqs, "segment")
        return hits[T.RETRIEVED_CONTEXT] / total[T.RETRIEVED_CONTEXT]

    assert doc_hit_rate(1.2) > doc_hit_rate(0.0) + 0.3


def test_rag_shared_prefix_fraction() -> None:
    reqs = gen("rag", num_requests=1000)  # default shared_prefix_fraction: 0.2
    shared = sum(r.extra["system_prompt"] == "shared" for r in reqs) / len(reqs)
    assert shared == pytest.approx(0.2, abs=0.04)
    shared_hashes = {
        r.segments[0].content_hash for r in reqs if r.extra["system_prompt"] == "shared"
    }
    assert len(shared_hashes) == 1
    none = gen("rag", num_requests=200, shared_prefix_fraction=0.0)
    assert not any(r.extra["system_prompt"] == "shared" for r in none)


# --------------------------------------------------------------------------- tool_agent


def test_tool_agent_sessions_reuse_tool_schemas() -> None:
    reqs = gen("tool_agent", num_requests=1000)
    assert all(r.segments[0].stype is T.TOOL_SCHEMA for r in reqs)
    assert len({r.segments[0].content_hash for r in reqs}) <= 4
    hits, total = ceiling_hits_by_type(reqs, "prefix")
    assert hits[T.TOOL_SCHEMA] / total[T.TOOL_SCHEMA] > 0.95


def test_tool_agent_history_grows_with_calls_and_outputs() -> None:
    reqs = {r.request_id: r for r in gen("tool_agent", num_requests=1000)}
    children = [r for r in reqs.values() if r.parent_id is not None]
    assert children
    for child in children:
        parent = reqs[child.parent_id]
        n = len(parent.segments)
        assert child.segments[:n] == parent.segments
        call, output = child.segments[n], child.segments[n + 1]
        assert (call.stype, call.content_hash, call.num_tokens) == (
            T.ASSISTANT_HISTORY,
            parent.output_hash,
            parent.output_tokens,
        )
        assert output.stype is T.TOOL_OUTPUT


def test_tool_agent_re_reads_tool_outputs_within_sessions() -> None:
    reqs = gen("tool_agent", num_requests=1000)
    repeated = [
        r
        for r in reqs
        if max(Counter(s.content_hash for s in r.segments if s.stype is T.TOOL_OUTPUT).values(),
               default=0) > 1
    ]  # fmt: skip
    assert repeated
    hits, _ = ceiling_hits_by_type(reqs, "segment")
    prefix_hits, _ = ceiling_hits_by_type(reqs, "prefix")
    assert hits[T.TOOL_OUTPUT] > prefix_hits[T.TOOL_OUTPUT]


# ------------------------------------------------------------------------ legal_review


def test_legal_review_reuses_evidence_across_a_cases_questions() -> None:
    # short reviewer gaps, so most cases finish within the trace
    reqs = gen("legal_review", num_requests=600, think_time_median_s=2.0)
    by_case: dict[str, Counter] = {}
    for r in reqs:
        assert any(s.stype is T.LEGAL_EVIDENCE for s in r.segments)
        c = by_case.setdefault(r.session_id, Counter())
        c.update(s.content_hash for s in r.segments if s.stype is T.LEGAL_EVIDENCE)
    assert sum(any(n > 1 for n in c.values()) for c in by_case.values()) > len(by_case) / 2
    hits, total = ceiling_hits_by_type(reqs, "segment")
    assert hits[T.LEGAL_EVIDENCE] / total[T.LEGAL_EVIDENCE] > 0.5
    assert sum(r.prompt_tokens for r in reqs) / len(reqs) > 4000  # long context


# --------------------------------------------------------------------- multi_turn_chat


def test_multi_turn_chat_turn_extends_the_previous_turns_blocks() -> None:
    reqs = {r.request_id: r for r in gen("multi_turn_chat", num_requests=800)}
    children = [r for r in reqs.values() if r.parent_id is not None]
    assert len(children) > 200
    for child in children:
        parent = reqs[child.parent_id]
        assert child.turn == parent.turn + 1 and child.session_id == parent.session_id
        n = len(parent.segments)
        answer = child.segments[n]
        assert child.segments[:n] == parent.segments
        assert (answer.stype, answer.content_hash, answer.num_tokens) == (
            T.ASSISTANT_HISTORY,
            parent.output_hash,
            parent.output_tokens,
        )
        # prefix keying: the child starts with every full block of (parent prompt + answer)
        extended = Request(
            "x",
            0.0,
            [
                *parent.segments,
                Segment(T.ASSISTANT_HISTORY, parent.output_tokens, parent.output_hash),
            ],
        )
        full = extended.prompt_tokens // BS
        ext_keys = request_blocks(extended, BS, "prefix").keys[:full]
        child_keys = request_blocks(child, BS, "prefix").keys
        assert child_keys[:full] == ext_keys
        parent_full = parent.prompt_tokens // BS
        assert request_blocks(parent, BS, "prefix").keys[:parent_full] == child_keys[:parent_full]


def test_multi_turn_chat_session_shape() -> None:
    reqs = gen("multi_turn_chat", num_requests=1500)
    turns: dict[str, list[Request]] = {}
    for r in reqs:
        turns.setdefault(r.session_id, []).append(r)
    for session in turns.values():
        assert [r.turn for r in session] == list(range(len(session)))
        assert len(session) <= 8
    planned = Counter(s[0].extra["planned_turns"] for s in turns.values())
    assert planned[1] / sum(planned.values()) == pytest.approx(0.26, abs=0.06)


# --------------------------------------------------------------------------- reasoning


def test_reasoning_kept_in_history_gives_reasoning_segments() -> None:
    reqs = gen("reasoning", num_requests=400, keep_reasoning=1.0)
    later = [r for r in reqs if r.turn]
    assert later
    assert all(any(s.stype is T.REASONING for s in r.segments) for r in later)
    hits, _ = ceiling_hits_by_type(reqs, "prefix")
    assert hits[T.REASONING] > 0


def test_reasoning_stripped_from_history_leaves_none() -> None:
    reqs = gen("reasoning", num_requests=400, keep_reasoning=0.0)
    assert not any(s.stype is T.REASONING for r in reqs for s in r.segments)
    # the model still generated it: the output holds a REASONING segment
    assert all(r.extra["output_segments"][0][0] == "reasoning" for r in reqs)


def test_reasoning_outputs_describe_what_the_next_turn_quotes() -> None:
    reqs = {r.request_id: r for r in gen("reasoning", num_requests=400, keep_reasoning=1.0)}
    for child in (r for r in reqs.values() if r.parent_id is not None):
        parent = reqs[child.parent_id]
        out = parent.extra["output_segments"]
        quoted = child.segments[len(parent.segments) : len(parent.segments) + len(out)]
        assert [[s.stype.value, s.num_tokens, s.content_hash] for s in quoted] == out
        assert sum(n for _, n, _ in out) == parent.output_tokens


def test_reasoning_mix_follows_keep_reasoning() -> None:
    reqs = gen("reasoning", num_requests=1000, keep_reasoning=0.5)
    sessions = {r.session_id: r.extra["keeps_reasoning"] for r in reqs}
    assert sum(sessions.values()) / len(sessions) == pytest.approx(0.5, abs=0.1)


# ----------------------------------------------------------------------- workload_shift


def test_workload_shift_changes_the_type_mix_between_halves() -> None:
    reqs = gen("workload_shift", num_requests=1200)
    half = len(reqs) // 2
    first, second = type_share(reqs[:half]), type_share(reqs[half:])
    assert first[T.RETRIEVED_CONTEXT] > second[T.RETRIEVED_CONTEXT] + 0.2
    tool = (T.TOOL_SCHEMA, T.TOOL_OUTPUT)
    assert sum(second[t] for t in tool) > sum(first[t] for t in tool) + 0.2


def test_workload_shift_splits_requests_by_phase_shares() -> None:
    reqs = gen("workload_shift", num_requests=1200)  # shift_at 0.5, rag 0.6 / tool_agent 0.5
    phases = Counter((r.extra["phase"], r.extra["component"]) for r in reqs)
    assert sum(n for (ph, _), n in phases.items() if ph == 0) == 600
    assert phases[(0, "rag")] == 360 and phases[(1, "tool_agent")] == 300


def test_workload_shift_component_params_reach_the_component() -> None:
    reqs = gen(
        "workload_shift",
        num_requests=400,
        before={"rag": 1.0},
        after={"rag": 1.0},
        component_params={"rag": {"docs_per_request": 1}},
    )
    docs = [
        sum(s.stype is T.RETRIEVED_CONTEXT and s.num_tokens > 10 for s in r.segments) for r in reqs
    ]
    assert set(docs) == {1}


# --------------------------------------------------------------------------- bad params


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("rag", {"zipf_alpah": 1.0}, "zipf_alpah"),
        ("rag", {"zipf_alpha": -1.0}, "zipf_alpha"),
        ("rag", {"catalogue_size": 3, "docs_per_request": 5}, "docs_per_request"),
        ("shared_system_prompt", {"num_requests": 0}, "num_requests"),
        ("multi_turn_chat", {"min_turns": 5, "max_turns": 2}, "min_turns"),
        ("tool_agent", {"reread_prob": 1.5}, "reread_prob"),
        ("legal_review", {"exhibits_per_question": 9}, "exhibits_per_question"),
        ("workload_shift", {"before": {"nope": 1.0}}, "nope"),
        ("workload_shift", {"component_params": {"rag": {"zipf_alpah": 1}}}, "zipf_alpah"),
        ("workload_shift", {"component_params": {"rag": {"seed": 1}}}, "seed"),
    ],
)
def test_bad_params_raise_naming_the_field(name: str, params: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_workload(name, **params)


def test_unknown_workload_raises_listing_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown workload 'nope'.*rag"):
        make_workload("nope")


def test_params_are_validated_without_generating() -> None:
    p = workload_params("rag", zipf_alpha=0.5)
    assert p.zipf_alpha == 0.5
    assert WORKLOADS["rag"](p, num_requests=3)[0].request_id == "rag-000000"
