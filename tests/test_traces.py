"""Trace readers, the native format, format detection, libCacheSim export and trace_info.

Fixtures under tests/data are tiny hand-written files (no real trace content); the expected
numbers below are worked out by hand from them. Real-trace tests run only where the shared
traces exist (see skv.traces.trace_dir) and skip with a reason otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skv.blocks import request_blocks
from skv.model import Request, Segment, SemanticType
from skv.traces import (
    FORMATS,
    TraceFormatError,
    detect_format,
    find_trace,
    format_info,
    load_azure2023,
    load_bailian,
    load_claude_code,
    load_mooncake,
    load_trace,
    read_oracle_general,
    read_skv_header,
    read_skv_trace,
    trace_dir,
    trace_info,
    write_oracle_general,
    write_skv_trace,
)
from skv.traces.native import RequestRecord, SegmentRecord
from skv.traces.oracle_general import next_access_vtimes

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_tiny.jsonl"
AZURE = DATA / "azure_tiny.csv"
BAILIAN = DATA / "bailian_tiny.jsonl"
CLAUDE = DATA / "claude_code"

T = SemanticType


def types_of(req: Request) -> list[tuple[SemanticType, int]]:
    return [(s.stype, s.num_tokens) for s in req.segments]


def by_id(requests: list[Request]) -> dict[str, Request]:
    return {r.request_id: r for r in requests}


def full_request() -> Request:
    """A request with every field set to a non-default value."""
    return Request(
        request_id="r-1",
        arrival_s=1.25,
        segments=[
            Segment(T.SYSTEM, 7, content_hash="00ff", reusable=False, text="sys", token_ids=[1, 2]),
            Segment(T.USER_QUERY, 3, content_hash="abcd", reusable=True, text="hé ✓"),
        ],
        output_tokens=9,
        session_id="s",
        tenant_id="t",
        turn=2,
        parent_id="r-0",
        templated=True,
        hash_ids=[5, 6],
        hash_block_size=8,
        observed_ttft_ms=12.5,
        observed_cached_tokens=4,
        extra={"model": "m", "nested": {"a": [1, 2.5, None]}},
    )


# ---------------------------------------------------------------- native format


def test_native_models_cover_every_dataclass_field():
    assert set(RequestRecord.model_fields) == {f.name for f in dataclasses.fields(Request)}
    assert set(SegmentRecord.model_fields) == {f.name for f in dataclasses.fields(Segment)}


def test_native_round_trip_every_field(tmp_path):
    reqs = [full_request(), Request("r-2", 3.0, [Segment(T.UNKNOWN, 0)])]
    path = write_skv_trace(tmp_path / "t.jsonl", reqs, meta={"source": "unit"})
    assert read_skv_trace(path) == reqs


def test_native_header_records_version_count_and_meta(tmp_path):
    path = write_skv_trace(tmp_path / "t.jsonl", [full_request()], meta={"source": "unit"})
    header = read_skv_header(path)
    assert (header.skv_trace, header.num_requests, header.meta) == (1, 1, {"source": "unit"})


def test_native_omits_default_fields(tmp_path):
    path = write_skv_trace(tmp_path / "t.jsonl", [Request("r", 0.0, [Segment(T.CODE, 4)])])
    line = json.loads(path.read_text().splitlines()[1])
    assert line == {
        "request_id": "r",
        "arrival_s": 0.0,
        "segments": [{"stype": "code", "num_tokens": 4}],
    }


_segments = st.builds(
    Segment,
    stype=st.sampled_from(list(SemanticType)),
    num_tokens=st.integers(0, 10_000),
    content_hash=st.none() | st.text("0123456789abcdefABCDEF", min_size=1, max_size=16),
    reusable=st.none() | st.booleans(),
    text=st.none() | st.text(max_size=20),
    token_ids=st.none() | st.lists(st.integers(0, 2**31), max_size=5),
)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_requests = st.builds(
    Request,
    request_id=st.text(min_size=1, max_size=12),
    arrival_s=st.floats(0, 1e7, allow_nan=False),
    segments=st.lists(_segments, max_size=4),
    output_tokens=st.integers(0, 10_000),
    session_id=st.none() | st.text(max_size=8),
    tenant_id=st.none() | st.text(max_size=8),
    turn=st.none() | st.integers(0, 100),
    parent_id=st.none() | st.text(max_size=8),
    templated=st.booleans(),
    hash_ids=st.none() | st.lists(st.integers(0, 2**62), max_size=6),
    hash_block_size=st.none() | st.integers(1, 1024),
    observed_ttft_ms=st.none() | st.floats(0, 1e6, allow_nan=False),
    observed_cached_tokens=st.none() | st.integers(0, 10_000),
    extra=st.dictionaries(st.text(max_size=6), _json_values, max_size=3),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(reqs=st.lists(_requests, max_size=4))
def test_native_round_trip_property(tmp_path, reqs):
    reqs = sorted(reqs, key=lambda r: r.arrival_s)
    path = write_skv_trace(tmp_path / "p.jsonl", reqs)
    assert read_skv_trace(path) == reqs


def test_native_reader_sorts_by_arrival_stably(tmp_path):
    reqs = [Request(n, t, []) for n, t in [("a", 2.0), ("b", 1.0), ("c", 2.0), ("d", 1.0)]]
    path = write_skv_trace(tmp_path / "t.jsonl", reqs)
    assert [r.request_id for r in read_skv_trace(path)] == ["b", "d", "a", "c"]


def test_native_unknown_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"skv_trace": 1}\n{"request_id": "a", "arrival_s": 0, "segments": []}\n'
        '{"request_id": "b", "arrival_s": 1, "segments": [], "bogus": 1}\n'
    )
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:3: bogus: Extra inputs") as exc:
        read_skv_trace(path)
    assert (exc.value.line, exc.value.field) == (3, "bogus")


def test_native_is_strict_about_types(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"skv_trace": 1}\n{"request_id": "a", "arrival_s": "0", "segments": []}\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: arrival_s"):
        read_skv_trace(path)


def test_native_bad_segment_type_names_nested_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"skv_trace": 1}\n'
        '{"request_id": "a", "arrival_s": 0, "segments": [{"stype": "nope", "num_tokens": 1}]}\n'
    )
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: segments\.0\.stype"):
        read_skv_trace(path)


def test_native_rejects_unknown_version(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"skv_trace": 2}\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: skv_trace: unsupported version 2"):
        read_skv_trace(path)


def test_native_detects_truncated_file(tmp_path):
    path = write_skv_trace(tmp_path / "t.jsonl", [full_request(), full_request()])
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    with pytest.raises(TraceFormatError, match="header says 2 requests, file has 1"):
        read_skv_trace(path)


def test_native_invalid_json_names_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"skv_trace": 1}\n{"request_id": \n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: invalid JSON: EOF while parsing"):
        read_skv_trace(path)


def test_native_write_failure_leaves_no_file(tmp_path):
    bad = Request("bad", 0.0, [Segment(T.USER_QUERY, -1)])
    with pytest.raises(TraceFormatError, match=r"request 1 \('bad'\): segments\.0\.num_tokens"):
        write_skv_trace(tmp_path / "t.jsonl", [full_request(), bad])
    assert list(tmp_path.iterdir()) == []


def test_native_write_failure_keeps_existing_file(tmp_path):
    path = write_skv_trace(tmp_path / "t.jsonl", [full_request()])
    before = path.read_bytes()
    unserialisable = dataclasses.replace(full_request(), extra={"x": object()})
    with pytest.raises(TraceFormatError):
        write_skv_trace(path, [unserialisable])
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


# ---------------------------------------------------------------- Mooncake


def test_mooncake_counts_and_arrival_order():
    reqs = load_mooncake(MOONCAKE)
    assert [r.request_id for r in reqs] == [
        "mooncake_tiny:1",
        "mooncake_tiny:3",
        "mooncake_tiny:2",
        "mooncake_tiny:4",  # ties at 6 s keep file order
        "mooncake_tiny:5",
        "mooncake_tiny:6",
    ]
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 3.0, 6.0, 6.0, 9.0]
    assert [r.output_tokens for r in reqs] == [10, 30, 20, 5, 0, 1]


def test_mooncake_block_size_and_hash_ids():
    reqs = by_id(load_mooncake(MOONCAKE))
    assert {r.hash_block_size for r in reqs.values()} == {512}
    assert reqs["mooncake_tiny:5"].hash_ids == [0, 1, 2, 4]


def test_mooncake_typing_system_history_query():
    reqs = by_id(load_mooncake(MOONCAKE))
    assert types_of(reqs["mooncake_tiny:1"]) == [(T.SYSTEM, 512), (T.USER_QUERY, 512)]
    assert types_of(reqs["mooncake_tiny:3"]) == [(T.SYSTEM, 512), (T.USER_QUERY, 88)]
    # block 1 was seen in an earlier request: conversation history
    assert types_of(reqs["mooncake_tiny:2"]) == [
        (T.SYSTEM, 512),
        (T.ASSISTANT_HISTORY, 512),
        (T.USER_QUERY, 476),
    ]
    assert types_of(reqs["mooncake_tiny:4"]) == [(T.SYSTEM, 512)]
    assert types_of(reqs["mooncake_tiny:5"]) == [
        (T.SYSTEM, 512),
        (T.ASSISTANT_HISTORY, 1024),
        (T.USER_QUERY, 512),
    ]


def test_mooncake_history_off_gives_system_and_query_only():
    reqs = by_id(load_mooncake(MOONCAKE, history=False))
    assert types_of(reqs["mooncake_tiny:5"]) == [(T.SYSTEM, 512), (T.USER_QUERY, 1536)]


def test_mooncake_equal_block_ids_give_equal_segment_hashes():
    reqs = load_mooncake(MOONCAKE)
    system_hashes = {r.segments[0].content_hash for r in reqs}
    assert len(system_hashes) == 1


def test_mooncake_bad_hash_ids_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = MOONCAKE.read_text().splitlines()
    lines[2] = '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0, "x"]}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"bad\.jsonl:3: hash_ids\.1: .*integer") as exc:
        load_mooncake(path)
    assert exc.value.line == 3


def test_mooncake_too_many_hash_ids_is_an_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0, 1]}\n'
    )
    with pytest.raises(TraceFormatError, match=r"bad\.jsonl:1: hash_ids: 2 hash ids for 10 tokens"):
        load_mooncake(path)


def test_mooncake_missing_field_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 1, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(TraceFormatError, match=r"bad\.jsonl:1: input_length: Field required"):
        load_mooncake(path)


# ---------------------------------------------------------------- Azure 2023


def test_azure_arrivals_relative_and_sorted():
    reqs = load_azure2023(AZURE)
    assert [r.request_id for r in reqs] == [
        "azure_tiny:2",
        "azure_tiny:4",
        "azure_tiny:3",
        "azure_tiny:5",
    ]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.5, 1.25, 10.0000001], abs=1e-9)


def test_azure_single_unknown_segment_with_lengths():
    reqs = by_id(load_azure2023(AZURE))
    r = reqs["azure_tiny:3"]
    assert (types_of(r), r.output_tokens, r.hash_ids) == ([(T.UNKNOWN, 200)], 20, None)


def test_azure_content_hashes_are_unique_so_nothing_is_reused():
    reqs = load_azure2023(AZURE)
    assert len({r.segments[0].content_hash for r in reqs}) == len(reqs)
    info = trace_info(reqs, block_size=16)
    assert info["hit_ceiling_blocks"] == 0.0


def test_azure_bad_int_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,1\n2.0,five,1\n")
    with pytest.raises(TraceFormatError, match=r"bad\.csv:3: ContextTokens: .*'five'"):
        load_azure2023(path)


def test_azure_missing_column_is_an_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens\n1.0,5\n")
    with pytest.raises(TraceFormatError, match=r"bad\.csv:1: CSV header lacks GeneratedTokens"):
        load_azure2023(path)


# ---------------------------------------------------------------- Bailian


def test_bailian_order_sessions_turns_parents():
    reqs = load_bailian(BAILIAN)
    got = [(r.request_id, r.arrival_s, r.session_id, r.turn, r.parent_id) for r in reqs]
    assert got == [
        ("10", 0.5, "10", 1, None),
        ("20", 1.0, "20", 1, None),
        ("30", 2.0, "99", 4, "99"),  # parent missing from the file: it becomes the root
        ("31", 3.0, "99", 4, "99"),
        ("11", 5.0, "10", 2, "10"),
        ("12", 9.0, "10", 3, "11"),
    ]


def test_bailian_block_size_is_16():
    assert {r.hash_block_size for r in load_bailian(BAILIAN)} == {16}


def test_bailian_typing_system_history_and_request_type():
    reqs = by_id(load_bailian(BAILIAN))
    assert types_of(reqs["10"]) == [(T.SYSTEM, 16), (T.USER_QUERY, 24)]
    assert types_of(reqs["11"]) == [(T.SYSTEM, 16), (T.ASSISTANT_HISTORY, 16), (T.USER_QUERY, 48)]
    assert types_of(reqs["12"]) == [
        (T.SYSTEM, 16),
        (T.ASSISTANT_HISTORY, 64),
        (T.RETRIEVED_CONTEXT, 20),
    ]
    assert types_of(reqs["20"]) == [(T.SYSTEM, 16), (T.RETRIEVED_CONTEXT, 4)]
    assert types_of(reqs["31"]) == [(T.SYSTEM, 16), (T.UNKNOWN, 16)]


def test_bailian_duplicate_chat_id_is_an_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    line = BAILIAN.read_text().splitlines()[0]
    path.write_text(line + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=r"bad\.jsonl:2: chat_id: duplicate chat_id 11"):
        load_bailian(path)


# ---------------------------------------------------------------- Claude Code


def test_claude_code_order_sessions_and_subagent_offsets():
    reqs = load_claude_code(CLAUDE, session_interval_s=0.0)
    got = [(r.request_id, r.arrival_s, r.session_id) for r in reqs]
    assert got == [
        ("sess_a:1", 0.0, "sess_a"),
        ("sess_b:1", 2.0, "sess_b"),
        ("sess_a:2", 5.0, "sess_a"),
        ("sess_a/agent_001:1", 6.0, "sess_a/agent_001"),  # subagent t=6 + request t=0
        ("sess_a:3", 7.0, "sess_a"),
        ("sess_a/agent_001:2", 7.5, "sess_a/agent_001"),  # 6 + 1.5
    ]


def test_claude_code_block_size_from_file():
    assert {r.hash_block_size for r in load_claude_code(CLAUDE)} == {4}


def test_claude_code_typing_prefix_history_and_input_types():
    reqs = by_id(load_claude_code(CLAUDE))
    assert types_of(reqs["sess_a:1"]) == [(T.TOOL_SCHEMA, 6), (T.SYSTEM, 2), (T.USER_QUERY, 2)]
    # text + tool_result listed: tool_result wins
    assert types_of(reqs["sess_a:2"]) == [(T.TOOL_SCHEMA, 6), (T.SYSTEM, 2), (T.TOOL_OUTPUT, 9)]
    # 4 blocks (16 tokens) shared with sess_a:2, 8 of them beyond the fixed prefix
    assert types_of(reqs["sess_a:3"]) == [
        (T.TOOL_SCHEMA, 6),
        (T.SYSTEM, 2),
        (T.ASSISTANT_HISTORY, 8),
        (T.REASONING, 6),
    ]
    assert types_of(reqs["sess_b:1"]) == [(T.TOOL_SCHEMA, 4)]


def test_claude_code_subagent_has_own_prefix_and_history():
    reqs = by_id(load_claude_code(CLAUDE))
    assert types_of(reqs["sess_a/agent_001:1"]) == [
        (T.TOOL_SCHEMA, 3),
        (T.SYSTEM, 1),
        (T.USER_QUERY, 4),
    ]
    assert types_of(reqs["sess_a/agent_001:2"]) == [
        (T.TOOL_SCHEMA, 3),
        (T.SYSTEM, 1),
        (T.ASSISTANT_HISTORY, 4),
        (T.TOOL_OUTPUT, 5),
    ]
    assert reqs["sess_a/agent_001:2"].extra["subagent_type"] == "Explore"


def test_claude_code_turns_parents_and_observed_fields():
    reqs = by_id(load_claude_code(CLAUDE))
    r1, r3 = reqs["sess_a:1"], reqs["sess_a:3"]
    assert (r1.turn, r1.parent_id, r1.observed_ttft_ms, r1.output_tokens) == (1, None, 500.0, 3)
    assert (r3.turn, r3.parent_id, r3.observed_ttft_ms) == (3, "sess_a:2", None)
    assert r1.extra["api_time"] == 1.0 and r1.extra["model"] == "model-x"


def test_claude_code_local_ids_are_made_unique_per_file():
    reqs = by_id(load_claude_code(CLAUDE))
    a, b = reqs["sess_a:1"].hash_ids, reqs["sess_b:1"].hash_ids
    assert a is not None and b is not None
    assert a[0] != b[0]  # both are local id 1
    assert a[0] & 0xFFFFFFFF == b[0] & 0xFFFFFFFF == 1
    assert max(a + b) < 2**62


def test_claude_code_ids_do_not_depend_on_which_files_are_loaded():
    alone = by_id(load_claude_code(CLAUDE / "trace_a.json"))
    both = by_id(load_claude_code(CLAUDE))
    assert alone["sess_a:3"].hash_ids == both["sess_a:3"].hash_ids


def test_claude_code_session_starts_are_seeded_poisson():
    def start_b(seed: int) -> float:
        return by_id(load_claude_code(CLAUDE, seed=seed))["sess_b:1"].arrival_s - 2.0

    assert start_b(0) == start_b(0)
    assert start_b(0) != start_b(1)
    assert start_b(0) > 0.0


def test_claude_code_missing_field_names_json_path(tmp_path):
    doc = json.loads((CLAUDE / "trace_b.json").read_text())
    del doc["requests"][0]["in"]
    path = tmp_path / "trace_x.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=r"trace_x\.json: requests\.0: .*request lacks in"):
        load_claude_code(path)


# ---------------------------------------------------------------- registry


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        (MOONCAKE, "mooncake"),
        (AZURE, "azure2023"),
        (BAILIAN, "bailian"),
        (CLAUDE, "claude_code"),
        (CLAUDE / "trace_a.json", "claude_code"),
    ],
)
def test_detect_format(path, fmt):
    assert detect_format(path) == fmt


def test_detect_format_native(tmp_path):
    path = write_skv_trace(tmp_path / "t.jsonl", [full_request()])
    assert detect_format(path) == "skv"


def test_detect_format_single_line_claude_code_document(tmp_path):
    doc = json.loads((CLAUDE / "trace_a.json").read_text())
    doc["requests"] = doc["requests"] * 3000  # one long line, longer than the sniffed head
    path = tmp_path / "trace_big.json"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    assert path.stat().st_size > 1 << 16
    assert detect_format(path) == "claude_code"


def test_detect_format_pretty_printed_claude_code_document(tmp_path):
    path = tmp_path / "trace_p.json"
    path.write_text(json.dumps(json.loads((CLAUDE / "trace_b.json").read_text()), indent=2))
    assert path.read_text().splitlines()[0] == "{"
    assert detect_format(path) == "claude_code"


def test_detect_format_unknown_is_an_error(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    with pytest.raises(TraceFormatError, match="cannot detect trace format"):
        detect_format(path)


def test_registry_lists_all_formats():
    assert set(FORMATS) == {"skv", "mooncake", "claude_code", "azure2023", "bailian"}


def test_load_trace_detects_and_passes_options():
    reqs = load_trace(CLAUDE, session_interval_s=0.0)
    assert by_id(reqs)["sess_b:1"].arrival_s == 2.0


def test_load_trace_round_trips_through_native(tmp_path):
    reqs = load_trace(BAILIAN)
    path = write_skv_trace(tmp_path / "b.jsonl", reqs, meta={"from": "bailian"})
    assert load_trace(path) == reqs


def test_trace_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    assert trace_dir() == tmp_path


def test_find_trace_resolves_under_trace_dir(monkeypatch, tmp_path):
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "t.jsonl").write_text(MOONCAKE.read_text())
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    assert find_trace("mooncake/t.jsonl") == tmp_path / "mooncake" / "t.jsonl"
    assert len(load_trace("mooncake/t.jsonl")) == 6


def test_find_trace_missing_says_where_to_download(monkeypatch, tmp_path):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"kvcache-ai/Mooncake.*place it at"):
        find_trace("mooncake/conversation_trace.jsonl")


def test_load_trace_missing_relative_path_says_no_such_file_first(monkeypatch, tmp_path):
    """A typo in a path is the common case: name the path as typed before the trace directory."""
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path / "traces"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as exc:
        load_trace("mooncake/conversaton_trace.jsonl")
    msg = str(exc.value)
    typed = "no such file: mooncake/conversaton_trace.jsonl"
    assert msg.startswith(f"{typed} (relative to {tmp_path})")
    assert msg.index("no such file") < msg.index("trace directory") < msg.index("kvcache-ai")
    with pytest.raises(FileNotFoundError, match=r"^no such file: /nowhere/t\.jsonl$"):
        load_trace("/nowhere/t.jsonl")


def test_trace_info_has_no_session_count_without_session_ids():
    assert trace_info(load_mooncake(MOONCAKE))["sessions"] is None  # Mooncake has no sessions
    info = trace_info(load_bailian(DATA / "bailian_tiny.jsonl"))
    assert isinstance(info["sessions"], int) and info["sessions"] > 0
    assert "sessions          -\n" in format_info({**info, "sessions": None})


# ---------------------------------------------------------------- trace_info


def test_trace_info_hand_computed_on_mooncake_fixture():
    info = trace_info(load_mooncake(MOONCAKE))
    assert info["requests"] == 6
    assert info["span_s"] == 9.0
    assert info["prompt_tokens"] == 6384
    assert info["block_size"] == [512]
    assert (info["block_accesses"], info["unique_blocks"]) == (14, 6)
    assert info["hit_ceiling_blocks"] == pytest.approx(8 / 14)
    assert info["hit_ceiling_tokens"] == pytest.approx(4096 / 6384)


def test_trace_info_type_mix_fractions():
    mix = trace_info(load_mooncake(MOONCAKE))["type_mix"]
    assert mix == pytest.approx(
        {"system": 3072 / 6384, "assistant_history": 1536 / 6384, "user_query": 1776 / 6384}
    )


def test_trace_info_content_keyed_requests_use_block_size():
    seg = Segment(T.SYSTEM, 10, content_hash="aa")
    reqs = [Request("a", 0.0, [seg]), Request("b", 1.0, [seg])]
    info = trace_info(reqs, block_size=4)
    # blocks of 4, 4, 2 tokens; the second request hits all three
    assert (info["block_accesses"], info["unique_blocks"]) == (6, 3)
    assert info["hit_ceiling_tokens"] == pytest.approx(0.5)


def test_format_info_mentions_key_numbers():
    text = format_info(trace_info(load_mooncake(MOONCAKE)))
    assert "block accesses    14" in text and "57.1% of blocks" in text


# ---------------------------------------------------------------- libCacheSim oracleGeneral


def test_oracle_record_layout_is_libcachesim_struct(tmp_path):
    reqs = load_mooncake(MOONCAKE)
    path = tmp_path / "t.oracleGeneral"
    n = write_oracle_general(path, reqs)
    raw = path.read_bytes()
    rec = struct.Struct("<IQIq")
    assert n == 14 and len(raw) == 14 * rec.size == 14 * 24
    first = rec.unpack_from(raw, 0)
    keys = request_blocks(reqs[0], 512).keys
    # request 0, block 0 (the system block): next use is request 1's block 0, record 2 -> vtime 3
    assert first == (0, keys[0], 512, 3)


def test_oracle_next_access_matches_libcachesim_converter(tmp_path):
    lcs = pytest.importorskip("libcachesim")
    import numpy as np

    ids = [1, 2, 1, 3, 2, 1]
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("time,id,size\n" + "".join(f"{i},{x},10\n" for i, x in enumerate(ids)))
    params = lcs.ReaderInitParam()
    params.has_header = True
    params.delimiter = ","
    params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
    params.obj_id_is_num = True
    reader = lcs.TraceReader(str(csv_path), lcs.TraceType.CSV_TRACE, params)
    out = tmp_path / "conv.oracleGeneral"
    lcs.Util.convert_to_oracleGeneral(reader._reader, str(out))
    theirs = read_oracle_general(out)["next_access_vtime"].tolist()
    assert next_access_vtimes(np.array(ids, dtype=np.uint64)).tolist() == theirs


def test_oracle_file_reads_back_in_libcachesim(tmp_path):
    lcs = pytest.importorskip("libcachesim")
    reqs = load_mooncake(MOONCAKE)
    path = tmp_path / "t.oracleGeneral"
    write_oracle_general(path, reqs)
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    got = [(r.obj_id, r.obj_size) for r in reader]
    ours = read_oracle_general(path)
    assert got == list(zip(ours["obj_id"].tolist(), ours["obj_size"].tolist(), strict=True))


def test_oracle_infinite_cache_miss_ratio_in_libcachesim(tmp_path):
    lcs = pytest.importorskip("libcachesim")
    path = tmp_path / "t.oracleGeneral"
    write_oracle_general(path, load_mooncake(MOONCAKE))
    cache = lcs.LRU(cache_size=10**9)
    obj_miss, _byte_miss = cache.process_trace(
        lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    )
    assert obj_miss == pytest.approx(6 / 14)  # = 1 - trace_info's hit ceiling


def test_oracle_accepts_compiled_request_blocks(tmp_path):
    reqs = load_mooncake(MOONCAKE)
    compiled = [request_blocks(r, 512, index=i) for i, r in enumerate(reqs)]
    write_oracle_general(tmp_path / "a", reqs)
    write_oracle_general(tmp_path / "b", compiled)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_oracle_bytes_per_token_scales_sizes(tmp_path):
    path = tmp_path / "t.oracleGeneral"
    write_oracle_general(path, load_mooncake(MOONCAKE), bytes_per_token=1000)
    assert read_oracle_general(path)["obj_size"][0] == 512_000


def test_oracle_size_overflow_leaves_no_file(tmp_path):
    path = tmp_path / "t.oracleGeneral"
    with pytest.raises(ValueError, match="does not fit uint32"):
        write_oracle_general(path, load_mooncake(MOONCAKE), bytes_per_token=2**24)
    assert not path.exists()


# ---------------------------------------------------------------- real traces (skip if absent)


def _real(name: str) -> Path:
    try:
        return find_trace(name)
    except FileNotFoundError as err:
        pytest.skip(f"real trace not available: {err}")


def test_real_mooncake_matches_published_counts():
    reqs = load_trace(_real("mooncake/conversation_trace.jsonl"))
    info = trace_info(reqs)
    assert info["requests"] == 12_031
    assert (info["block_accesses"], info["unique_blocks"]) == (288_500, 182_790)
    assert info["hit_ceiling_blocks"] == pytest.approx(0.366, abs=5e-4)
    assert info["type_mix"]["system"] == pytest.approx(12_031 * 512 / info["prompt_tokens"])


def test_real_weka_sessions_load_with_block_size_64():
    reqs = load_trace(_real("weka_cc"))
    assert {r.hash_block_size for r in reqs} == {64}
    top = {r.session_id for r in reqs if r.session_id and "/" not in r.session_id}
    assert len(top) == len(list(_real("weka_cc").glob("trace_*.json")))
    assert any("/" in (r.session_id or "") for r in reqs)  # subagents become their own sessions
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals)


def test_real_azure_conv_loads_every_row():
    path = _real("azure2023/AzureLLMInferenceTrace_conv.csv")
    reqs = load_trace(path)
    with open(path) as f:
        rows = sum(1 for _ in f) - 1
    assert len(reqs) == rows and reqs[0].arrival_s == 0.0


def test_claude_code_turns_hold_their_predecessors_ids_not_copies():
    """Memory (issue 15): a turn repeating the previous prompt shares that prompt's id objects,
    so the repeated prefix costs one list slot per block; the values are the remapped ids."""
    reqs = by_id(load_claude_code(CLAUDE))
    a2, a3 = reqs["sess_a:2"].hash_ids, reqs["sess_a:3"].hash_ids
    assert len(a2) == 4 and a3[:4] == a2  # sess_a:3 extends sess_a:2
    assert all(x is y for x, y in zip(a2, a3[:4], strict=True))
    tag = a3[0] >> 32
    raw = json.loads((CLAUDE / "trace_a.json").read_text())["requests"]
    ids = [r for r in raw if r.get("type") != "subagent"][2]["hash_ids"]
    assert a3 == [tag << 32 | h for h in ids]
