"""Rule-based segmentation of chat requests into typed, hashed segments."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import skv.segmenter as segmenter_module
from skv.blocks import KeyingMode, request_blocks
from skv.model import SemanticType, content_hash
from skv.segmenter import (
    RULES,
    Segmenter,
    build_request,
    segment_messages,
    segment_text,
    split_text,
)
from skv.tokenize import SimpleTokenizer

T = SemanticType
DATA = Path(__file__).parent / "data" / "segmenter"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def types_and_texts(messages: list[dict[str, Any]], **kw: Any) -> list[tuple[T, str]]:
    return [(s.stype, s.text or "") for s in segment_messages(messages, redact=False, **kw)]


def non_ws(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- message roles -----------------------------------------------------------------------


def test_system_message_is_one_system_segment() -> None:
    msgs = [{"role": "system", "content": "You are terse.\n\nCONTEXT: not split here."}]
    assert types_and_texts(msgs) == [(T.SYSTEM, "You are terse.\n\nCONTEXT: not split here.")]


def test_developer_message_is_system() -> None:
    assert types_and_texts([{"role": "developer", "content": "rules"}]) == [(T.SYSTEM, "rules")]


def test_tools_become_one_tool_schema_segment_placed_first() -> None:
    msgs = [{"role": "system", "content": "sys"}, user("hi")]
    segs = segment_messages(msgs, tools=TOOLS, redact=False)
    assert [s.stype for s in segs] == [T.TOOL_SCHEMA, T.SYSTEM, T.USER_QUERY]
    assert json.loads(segs[0].text or "") == TOOLS


def test_tool_schema_hash_ignores_dict_key_order() -> None:
    reordered = [{"function": dict(reversed(TOOLS[0]["function"].items())), "type": "function"}]
    a = segment_messages([user("hi")], tools=TOOLS)[0]
    b = segment_messages([user("hi")], tools=reordered)[0]
    assert a.content_hash == b.content_hash


def test_tool_role_is_tool_output() -> None:
    msgs = [{"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'}]
    assert types_and_texts(msgs) == [(T.TOOL_OUTPUT, '{"temp": 21}')]


def test_think_span_in_assistant_is_reasoning_and_rest_is_history() -> None:
    msgs = [{"role": "assistant", "content": "<think>plan steps</think>\nThe answer is 4."}]
    assert types_and_texts(msgs) == [
        (T.REASONING, "<think>plan steps</think>"),
        (T.ASSISTANT_HISTORY, "The answer is 4."),
    ]


def test_reasoning_before_bare_close_tag_is_reasoning() -> None:
    msgs = [{"role": "assistant", "content": "pre-opened thoughts</think>Final."}]
    assert types_and_texts(msgs) == [
        (T.REASONING, "pre-opened thoughts</think>"),
        (T.ASSISTANT_HISTORY, "Final."),
    ]


def test_think_tags_in_user_messages_are_not_reasoning() -> None:
    assert types_and_texts([user("<think>x</think> why?")]) == [
        (T.USER_QUERY, "<think>x</think> why?")
    ]


def test_reasoning_content_field_is_reasoning_before_the_answer() -> None:
    msgs = [{"role": "assistant", "reasoning_content": "thinking", "content": "Answer."}]
    assert types_and_texts(msgs) == [(T.REASONING, "thinking"), (T.ASSISTANT_HISTORY, "Answer.")]


def test_assistant_tool_calls_are_serialised_history() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    segs = types_and_texts([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert len(segs) == 1
    assert segs[0][0] is T.ASSISTANT_HISTORY
    assert json.loads(segs[0][1]) == [call]


def test_unknown_role_is_unknown() -> None:
    assert types_and_texts([{"role": "narrator", "content": "once"}]) == [(T.UNKNOWN, "once")]


# --- user content rules ------------------------------------------------------------------


def test_plain_user_text_is_one_user_query() -> None:
    assert types_and_texts([user("  What is a KV cache?\n")]) == [
        (T.USER_QUERY, "What is a KV cache?")
    ]


def test_context_marker_opens_retrieved_context_until_user_marker() -> None:
    text = "CONTEXT: shared document\n\nUSER: summarize it"
    assert types_and_texts([user(text)]) == [
        (T.RETRIEVED_CONTEXT, "CONTEXT: shared document"),
        (T.USER_QUERY, "USER: summarize it"),
    ]


def test_each_numbered_document_is_its_own_segment() -> None:
    text = "Context:\nDocument 1: alpha\nDocument 2: beta\nQuestion: which?"
    assert types_and_texts([user(text)]) == [
        (T.RETRIEVED_CONTEXT, "Context:"),
        (T.RETRIEVED_CONTEXT, "Document 1: alpha"),
        (T.RETRIEVED_CONTEXT, "Document 2: beta"),
        (T.USER_QUERY, "Question: which?"),
    ]


def test_unnumbered_document_marker_is_retrieved_context() -> None:
    assert types_and_texts([user("Document: the policy")]) == [
        (T.RETRIEVED_CONTEXT, "Document: the policy")
    ]


def test_bracketed_document_header_is_retrieved_context() -> None:
    text = "Answer from these.\n[Document 3: FAQ] refunds take 5 days\n[Document 4] shipping"
    assert types_and_texts([user(text)]) == [
        (T.USER_QUERY, "Answer from these."),
        (T.RETRIEVED_CONTEXT, "[Document 3: FAQ] refunds take 5 days"),
        (T.RETRIEVED_CONTEXT, "[Document 4] shipping"),
    ]


def test_document_tags_are_spans_and_query_resumes_after_them() -> None:
    text = "Read:\n<document id='a'>first</document>\n<document>second</document>\nthen answer"
    assert types_and_texts([user(text)]) == [
        (T.USER_QUERY, "Read:"),
        (T.RETRIEVED_CONTEXT, "<document id='a'>first</document>"),
        (T.RETRIEVED_CONTEXT, "<document>second</document>"),
        (T.USER_QUERY, "then answer"),
    ]


def test_document_marker_mid_line_does_not_split() -> None:
    assert types_and_texts([user("See Document 2: it is short.")]) == [
        (T.USER_QUERY, "See Document 2: it is short.")
    ]


def test_code_fence_is_code() -> None:
    text = "Fix this:\n```python\nprint('x')\n```\nthanks"
    assert types_and_texts([user(text)]) == [
        (T.USER_QUERY, "Fix this:"),
        (T.CODE, "```python\nprint('x')\n```"),
        (T.USER_QUERY, "thanks"),
    ]


def test_markers_inside_a_code_fence_are_ignored() -> None:
    text = "```\nUSER: not a query\nDocument 1: not a doc\n```"
    assert types_and_texts([user(text)]) == [(T.CODE, text)]


def test_unclosed_code_fence_runs_to_the_end() -> None:
    assert types_and_texts([user("look\n~~~\nx = 1\nUSER: hi")]) == [
        (T.USER_QUERY, "look"),
        (T.CODE, "~~~\nx = 1\nUSER: hi"),
    ]


@pytest.mark.parametrize(
    "marker",
    [
        "EXHIBIT A",
        "EXHIBIT",
        "Exhibit 10.1",
        "Clause 7",
        "CLAUSE 7.2:",
        "Section 4.1 Definitions",
        "Section 4:",
        "§ 12.3",
        "WHEREAS",
        "Whereas,",
        "Article 5",
        "ARTICLE IV",
    ],
)
def test_legal_marker_opens_legal_evidence_section(marker: str) -> None:
    text = f"Review these terms.\n{marker} the lessee shall pay rent.\nQuestion: is it fair?"
    assert types_and_texts([user(text)]) == [
        (T.USER_QUERY, "Review these terms."),
        (T.LEGAL_EVIDENCE, f"{marker} the lessee shall pay rent."),
        (T.USER_QUERY, "Question: is it fair?"),
    ]


@pytest.mark.parametrize(
    "line",
    ["Exhibits are attached.", "Section three covers fees.", "Article about cats", "Exhibit here"],
)
def test_prose_that_merely_starts_with_a_legal_word_stays_a_query(line: str) -> None:
    assert types_and_texts([user(f"Hello.\n{line}")]) == [(T.USER_QUERY, f"Hello.\n{line}")]


def test_each_legal_clause_is_its_own_segment() -> None:
    text = "Clause 1 pay rent.\nClause 2 keep quiet."
    assert [t for _, t in types_and_texts([user(text)])] == [
        "Clause 1 pay rent.",
        "Clause 2 keep quiet.",
    ]


def test_template_header_is_template() -> None:
    text = "TEMPLATE: Answer in one sentence.\nUSER: what is 2+2?"
    assert types_and_texts([user(text)]) == [
        (T.TEMPLATE, "TEMPLATE: Answer in one sentence."),
        (T.USER_QUERY, "USER: what is 2+2?"),
    ]


def test_caller_supplied_template_string_is_template() -> None:
    tmpl = "Summarize the following text in three bullet points:"
    text = f"{tmpl}\nThe meeting moved to Friday."
    assert types_and_texts([user(text)], templates=[tmpl]) == [
        (T.TEMPLATE, tmpl),
        (T.USER_QUERY, "The meeting moved to Friday."),
    ]


def test_longer_caller_template_wins_over_its_prefix() -> None:
    short, long = "Translate:", "Translate: to French"
    segs = types_and_texts([user(f"{long} hello")], templates=[short, long])
    assert segs[0] == (T.TEMPLATE, long)


def test_content_parts_are_joined_and_non_text_parts_skipped() -> None:
    parts = [
        {"type": "text", "text": "Document 1: alpha"},
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": "Question: what?"},
    ]
    assert types_and_texts([user(parts)]) == [
        (T.RETRIEVED_CONTEXT, "Document 1: alpha"),
        (T.USER_QUERY, "Question: what?"),
    ]


def test_empty_pieces_are_dropped() -> None:
    msgs = [{"role": "system", "content": "   "}, user("CONTEXT:\n\nUSER: hi"), user([])]
    assert types_and_texts(msgs) == [(T.RETRIEVED_CONTEXT, "CONTEXT:"), (T.USER_QUERY, "USER: hi")]


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        (["not a dict"], "message 0: expected a dict"),
        ([{"content": "x"}], "message 0: missing or non-string 'role'"),
        ([{"role": "user", "content": 3}], "message 0: content must be"),
        ([{"role": "user", "content": [3]}], "message 0 part 0"),
    ],
)
def test_malformed_messages_raise_with_position(messages: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=re.escape(match)):
        segment_messages(messages)


def test_split_text_with_other_role_has_no_rules() -> None:
    assert split_text(" a\n```x``` ", role="system", default=T.SYSTEM) == [(T.SYSTEM, "a\n```x```")]


# --- hashing, redaction, tokens, determinism ---------------------------------------------


def test_same_document_hashes_identically_after_different_system_prompts() -> None:
    doc = "Document: Refunds are accepted within 30 days of delivery."
    a = segment_messages(
        [{"role": "system", "content": "You are a support bot."}, user(f"{doc}\nUSER: how long?")]
    )
    b = segment_messages(
        [
            {"role": "system", "content": "You are a lawyer. Be precise."},
            user(f"Please read.\n{doc}\nQuestion: can I return it?"),
        ]
    )
    doc_a = [s for s in a if s.stype is T.RETRIEVED_CONTEXT]
    doc_b = [s for s in b if s.stype is T.RETRIEVED_CONTEXT]
    assert len(doc_a) == len(doc_b) == 1
    assert doc_a[0].content_hash == doc_b[0].content_hash == content_hash(doc)
    assert a[0].content_hash != b[0].content_hash


def test_same_document_shares_blocks_in_segment_keying_mode() -> None:
    doc = "Document: " + "Refunds are accepted within thirty days. " * 20
    a = build_request("a", 0.0, [{"role": "system", "content": "Bot A."}, user(doc)])
    b = build_request("b", 1.0, [{"role": "system", "content": "Bot B, longer."}, user(doc)])
    keys_a = set(request_blocks(a, 16, KeyingMode.SEGMENT).keys)
    keys_b = set(request_blocks(b, 16, KeyingMode.SEGMENT).keys)
    assert len(keys_a & keys_b) == a.segments[1].num_tokens // 16 + 1


def test_redact_drops_text_but_keeps_hash_and_count() -> None:
    msgs = [user("CONTEXT: doc\nUSER: q")]
    redacted = segment_messages(msgs)
    full = segment_messages(msgs, redact=False)
    assert all(s.text is None for s in redacted)
    assert [(s.stype, s.num_tokens, s.content_hash) for s in redacted] == [
        (s.stype, s.num_tokens, s.content_hash) for s in full
    ]


def test_unredacted_segments_keep_their_text() -> None:
    assert [s.text for s in segment_messages([user("hi there")], redact=False)] == ["hi there"]


def test_token_ids_are_kept_only_when_asked() -> None:
    assert segment_messages([user("hello world")])[0].token_ids is None
    seg = segment_messages([user("hello world")], keep_token_ids=True)[0]
    assert seg.token_ids == SimpleTokenizer().encode("hello world")
    assert seg.num_tokens == len(seg.token_ids)


def test_num_tokens_come_from_the_given_tokenizer() -> None:
    class CharTokenizer:
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

        def count(self, text: str) -> int:
            return len(text)

    seg = segment_messages([user("abcde")], tokenizer=CharTokenizer())[0]
    assert seg.num_tokens == 5


def test_segmentation_is_deterministic() -> None:
    fixture = json.loads((DATA / "rag_chat.json").read_text())
    first = segment_messages(fixture["messages"], fixture["tools"], redact=False)
    second = segment_messages(json.loads(json.dumps(fixture["messages"])), fixture["tools"])
    assert [(s.stype, s.num_tokens, s.content_hash) for s in first] == [
        (s.stype, s.num_tokens, s.content_hash) for s in second
    ]


def test_fixture_chat_request_gets_expected_types() -> None:
    fixture = json.loads((DATA / "rag_chat.json").read_text())
    segs = segment_messages(fixture["messages"], fixture["tools"])
    assert [s.stype.value for s in segs] == fixture["expected_types"]
    assert all(s.num_tokens > 0 and s.content_hash for s in segs)


# --- convenience entry points ------------------------------------------------------------


def test_build_request_fills_request_fields() -> None:
    req = build_request(
        "r1",
        2.5,
        [{"role": "system", "content": "sys"}, user("TEMPLATE: be brief\nUSER: hi")],
        tools=TOOLS,
        output_tokens=40,
        session_id="s",
        tenant_id="t",
        turn=3,
    )
    assert (req.request_id, req.arrival_s, req.output_tokens) == ("r1", 2.5, 40)
    assert (req.session_id, req.tenant_id, req.turn) == ("s", "t", 3)
    assert [s.stype for s in req.segments] == [T.TOOL_SCHEMA, T.SYSTEM, T.TEMPLATE, T.USER_QUERY]
    assert req.templated is True
    assert req.prompt_tokens == sum(s.num_tokens for s in req.segments)


def test_build_request_without_template_is_not_templated() -> None:
    assert build_request("r", 0.0, [user("hi")]).templated is False


def test_segment_text_treats_a_raw_prompt_as_a_user_message() -> None:
    prompt = "Context: doc body\nQuestion: why?"
    assert [(s.stype, s.content_hash) for s in segment_text(prompt)] == [
        (s.stype, s.content_hash) for s in segment_messages([user(prompt)])
    ]


def test_segmenter_object_matches_function_api() -> None:
    seg = Segmenter(redact=False)
    msgs = [user("Document 1: a\nUSER: b")]
    assert seg.messages(msgs) == segment_messages(msgs, redact=False)


def test_every_rule_is_documented_in_the_module_table() -> None:
    doc = segmenter_module.__doc__ or ""
    for rule in RULES:
        assert re.search(rf"^{rule.name}\s+{rule.kind.value}\s", doc, re.MULTILINE), rule.name


# --- properties ----------------------------------------------------------------------------

MARKERS = [
    "CONTEXT:",
    "Context: ",
    "Document 2:",
    "[Document 1]",
    "<document>",
    "</document>",
    "```",
    "~~~",
    "<think>",
    "</think>",
    "EXHIBIT A",
    "Clause 3",
    "Section 4.1",
    "WHEREAS",
    "Article IV",
    "USER:",
    "Question:",
    "TEMPLATE:",
    "\n",
    "  ",
]
marker_text = st.lists(st.one_of(st.sampled_from(MARKERS), st.text(max_size=12)), max_size=25).map(
    "".join
)
any_text = st.one_of(st.text(), marker_text)


@settings(max_examples=300)
@given(any_text)
def test_segmentation_never_loses_non_whitespace_characters(text: str) -> None:
    segs = segment_text(text, redact=False, templates=["Summarize:"])
    assert non_ws("".join(s.text or "" for s in segs)) == non_ws(text)
    assert all((s.text or "").strip() == s.text and s.text for s in segs)


@settings(max_examples=150)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), any_text)))
def test_chat_segmentation_never_loses_non_whitespace_characters(
    messages: list[tuple[str, str]],
) -> None:
    segs = segment_messages([{"role": r, "content": c} for r, c in messages], redact=False)
    assert non_ws("".join(s.text or "" for s in segs)) == non_ws("".join(c for _, c in messages))
