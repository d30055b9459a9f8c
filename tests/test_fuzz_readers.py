"""Fuzz every trace reader (``skv.traces.FORMATS``) with random and mutated file contents.

A reader given any bytes either returns requests or raises a ``ValueError`` (the readers'
``TraceFormatError``) whose message names the file; never another exception type, never a
hang (hypothesis' deadline bounds each example). Inputs: a small valid file per format
mutated (bytes flipped, cut, spliced, lines duplicated or dropped), the same file with one
field of one record replaced by any JSON value, and random text. Each format is read as
itself (``fmt=``) and through format detection. Bounded and derandomized: the same examples in
every run, a few seconds per format.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import json_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skv.traces import FORMATS, load_trace

DATA = Path(__file__).parent / "data"
FUZZ = settings(
    max_examples=int(os.environ.get("SKV_FUZZ_EXAMPLES", "120")),  # deeper runs: raise it
    deadline=timedelta(seconds=5),  # a hang or a blow-up fails; generous for a loaded machine
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_NATIVE = "\n".join(
    json.dumps(x)
    for x in (
        {"skv_trace": 1, "num_requests": 2, "meta": {"source": "fuzz seed"}},
        {"request_id": "r0", "arrival_s": 0.5, "output_tokens": 3, "session_id": "s0",
         "segments": [{"stype": "system", "num_tokens": 40, "content_hash": "78bc639450c37d48"},
                      {"stype": "user_query", "num_tokens": 9, "content_hash": "99c5d55fb4"}]},
        {"request_id": "r1", "arrival_s": 1.0, "output_tokens": 2, "session_id": "s0", "turn": 1,
         "parent_id": "r0", "hash_ids": [1, 2], "hash_block_size": 16,
         "segments": [{"stype": "system", "num_tokens": 32}]},
    )
)  # fmt: skip

#: one small valid file per format (what the mutations start from) and its file name
SEEDS: dict[str, tuple[str, str]] = {
    "skv": ("trace.jsonl", _NATIVE + "\n"),
    "mooncake": ("trace.jsonl", (DATA / "mooncake_tiny.jsonl").read_text()),
    "claude_code": ("trace_fuzz.json", (DATA / "claude_code" / "trace_a.json").read_text()),
    "azure2023": ("trace.csv", (DATA / "azure_tiny.csv").read_text()),
    "bailian": ("trace.jsonl", (DATA / "bailian_tiny.jsonl").read_text()),
}


def test_every_format_has_a_seed_that_loads():
    assert set(SEEDS) == set(FORMATS)
    with _scratch() as d:
        for fmt, (name, text) in SEEDS.items():
            path = d / name
            path.write_text(text)
            assert FORMATS[fmt](path), fmt
            assert load_trace(path) == FORMATS[fmt](path)


# --------------------------------------------------------------------------- inputs

SPECIAL = ["{", "}", "[", "]", ",", ":", '"', "\n", "\r\n", "-1", "1e400", "NaN", "Infinity",
           "null", "true", "4294967296", "18446744073709551616", "\x00", "\ufeff", "\ud800",
           "é", '"hash_ids"', '"requests"', '"skv_trace"', "9" * 30]  # fmt: skip
text = st.lists(st.one_of(st.characters(), st.sampled_from(SPECIAL)), max_size=10).map("".join)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        text,
    ),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn, seed: str) -> bytes:
    """The seed with a few random edits: flip, cut, splice, duplicate or drop lines."""
    data = bytearray(seed.encode())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "truncate", "dup", "drop"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[pos : pos + draw(st.integers(1, 40))]
        elif kind == "insert":
            data[pos:pos] = draw(text).encode("utf-8", "surrogatepass")
        elif kind == "truncate":
            del data[pos:]
        else:
            lines = bytes(data).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i] = [lines[i]] if kind == "dup" else []
            if kind == "drop":
                del lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


@st.composite
def field_replaced(draw: st.DrawFn, fmt: str, seed: str) -> bytes:
    """The seed with one field (any depth) of one record set to any JSON value."""
    if fmt == "azure2023":  # CSV: one cell replaced
        rows = [line.split(",") for line in seed.splitlines()]
        r = draw(st.integers(0, len(rows) - 1))
        c = draw(st.integers(0, len(rows[r]) - 1))
        rows[r][c] = draw(text | json_values.map(json.dumps))
        return "\n".join(",".join(row) for row in rows).encode("utf-8", "surrogatepass")
    if fmt == "claude_code":
        docs = [json.loads(seed)]
    else:
        docs = [json.loads(line) for line in seed.splitlines() if line.strip()]
    i = draw(st.integers(0, len(docs) - 1))
    paths = list(json_paths(docs[i]))
    path = draw(st.sampled_from(paths)) if paths else ()
    docs[i] = _set(docs[i], path, draw(json_values))
    out = "\n".join(json.dumps(d, allow_nan=True) for d in docs)
    return out.encode("utf-8", "surrogatepass")


def contents(fmt: str) -> st.SearchStrategy[bytes]:
    seed = SEEDS[fmt][1]
    return st.one_of(
        mutated(seed),
        field_replaced(fmt, seed),
        st.binary(max_size=200),
        text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


# --------------------------------------------------------------------------- the check


@contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh temporary directory (hypothesis examples cannot share pytest's tmp_path)."""
    with tempfile.TemporaryDirectory(prefix="skv-fuzz-") as d:
        yield Path(d)


def read_cleanly(fmt: str, data: bytes) -> None:
    """Load ``data`` as ``fmt`` and by detection: a list, or a ValueError naming the file."""
    with _scratch() as d:
        path = d / SEEDS[fmt][0]
        path.write_bytes(data)
        for load in (lambda: FORMATS[fmt](path), lambda: load_trace(path)):
            try:
                out = load()
            except ValueError as exc:
                assert str(path) in str(exc) or path.name in str(exc), (
                    f"{fmt}: error does not name the file: {type(exc).__name__}: {exc}"
                )
            else:
                assert isinstance(out, list)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_fuzz_reader(fmt):
    @FUZZ
    @given(data=contents(fmt))
    def run(data: bytes) -> None:
        read_cleanly(fmt, data)

    run()


# --------------------------------------------------------------------------- found by the fuzz


@pytest.mark.parametrize("data", [b"\x80", b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff,1,1\n"])
def test_azure_non_utf8_bytes_name_the_file(tmp_path, data):
    path = tmp_path / "trace.csv"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"trace\.csv"):
        FORMATS["azure2023"](path)
