"""The binary cache of parsed traces (skv.traces.parsed_cache, issue 15).

What it must guarantee: a load from the cache equals the parse (every field of every request,
checked with the dataclasses' own equality), a repeated prefix shares its parent's id objects
as the Claude Code reader's do, any change to what the parse depends on is a miss, a damaged
entry is a miss and never an error, and nothing half-written stays behind. Synthetic traces
always; the real ones where ../shared/traces exists.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
from helpers import seg

from skv.model import Request, Segment, SemanticType
from skv.traces import load_trace, trace_dir, write_skv_trace
from skv.traces import parsed_cache as pc

T = SemanticType
DATA = Path(__file__).parent / "data"


def _sessions(seed: int = 3, sessions: int = 5, turns: int = 10) -> list[Request]:
    """Hash-id sessions whose turns extend, or (1 in 3) rewrite from a random block on, the last
    prompt; every optional field set on some requests and None on others; interleaved."""
    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        ids: list[int] = []
        for t in range(turns):
            if ids and rng.random() < 1 / 3:
                ids = ids[: rng.randrange(len(ids))]
            ids = ids + [rng.randrange(2**62) for _ in range(rng.randint(0, 4))]
            n = 4 * len(ids) + rng.randint(0, 3) or 1
            cut = rng.randint(0, n)
            out.append(
                Request(
                    f"s{s}:{t}",
                    t + s / 7,
                    [
                        seg(T.SYSTEM, cut, "sys"),
                        Segment(T.USER_QUERY, n - cut, None, reusable=True),
                    ],
                    output_tokens=rng.randint(0, 9),
                    session_id=f"s{s}" if s else None,  # session None: one chain of its own
                    tenant_id=f"t{s % 2}" if s % 3 else None,
                    turn=t,
                    parent_id=f"s{s}:{t - 1}" if t else None,
                    templated=bool(t % 2),
                    hash_ids=list(ids),
                    hash_block_size=4,
                    observed_ttft_ms=rng.random() * 100 if t % 3 else None,
                    observed_cached_tokens=rng.randint(0, n) if t % 4 else None,
                    output_hash="o" * (t % 2) or None,
                    extra={"file": f"f{s}.json", "api_time": 1.25, "types": ["a", "b"]},
                )
            )
    return sorted(out, key=lambda r: r.arrival_s)


def _content_keyed() -> list[Request]:
    """Requests without hash ids: text, token ids, an empty token-id list, big token ids."""
    return [
        Request("a", 0.0, [Segment(T.SYSTEM, 3, "h1", text="héllo", token_ids=[1, 2, 3])]),
        Request("b", 0.5, [Segment(T.USER_QUERY, 2, "h2", reusable=False, token_ids=[])]),
        Request("c", 1.0, [Segment(T.TOOL_OUTPUT, 2, None, token_ids=[2**63, 5])], hash_ids=None),
        Request("d", 2.0, []),
    ]


def _round_trip(requests: list[Request], tmp_path: Path) -> list[Request]:
    entry = tmp_path / "e.npz"
    pc.write_entry(entry, pc.encode(requests))
    return pc.read_entry(entry)


@pytest.mark.parametrize("make", [_sessions, _content_keyed, list])
def test_an_entry_reads_back_equal_to_the_parse(make, tmp_path):
    requests = make()
    back = _round_trip(requests, tmp_path)
    assert back == requests
    assert [type(r.arrival_s) for r in back] == [type(r.arrival_s) for r in requests]


def test_a_repeated_prefix_shares_its_parents_id_objects(tmp_path):
    """A turn's shared prefix reuses the previous turn's int objects (memory per block access
    is one list slot), and only a session's own previous turn is its parent."""
    requests = _sessions()
    back = _round_trip(requests, tmp_path)
    last: dict = {}
    checked = 0
    for r in back:
        prev = last.get(r.session_id)
        last[r.session_id] = r
        if prev is None:
            continue
        k = 0
        while k < min(len(prev.hash_ids), len(r.hash_ids)) and prev.hash_ids[k] == r.hash_ids[k]:
            assert prev.hash_ids[k] is r.hash_ids[k]
            k += 1
            checked += 1
    assert checked > 50


def test_an_entry_holds_each_sessions_new_ids_once(tmp_path):
    """Entry size follows unique blocks: one session that only ever extends stores each id
    once however many turns repeat it."""
    ids = list(range(1000, 1100))
    requests = [
        Request(f"r{t}", float(t), [seg(T.USER_QUERY, 4 * 10 * (t + 1), "q")], session_id="s",
                hash_ids=ids[: 10 * (t + 1)], hash_block_size=4)
        for t in range(10)
    ]  # fmt: skip
    cols = pc.encode(requests)
    assert cols["new_ids"].tolist() == ids  # 100 stored for 550 accesses
    assert cols["shared"].tolist() == [0, *range(10, 100, 10)]
    assert _round_trip(requests, tmp_path) == requests


def _counting(loader):
    calls = []

    def load(path, **options):
        calls.append(path)
        return loader(path, **options)

    return load, calls


def _trace(tmp_path: Path, requests: list[Request] | None = None) -> Path:
    path = tmp_path / "t.jsonl"
    write_skv_trace(path, requests or _sessions(), {"source": "test"})
    return path


def test_the_second_load_is_served_from_the_cache(tmp_path):
    from skv.traces.native import load_skv

    path = _trace(tmp_path)
    cache = tmp_path / "cache"
    load, calls = _counting(load_skv)
    first = pc.cached_load(path, "skv", load, {}, cache)
    second = pc.cached_load(path, "skv", load, {}, cache)
    assert len(calls) == 1 and second == first == load_skv(path)
    assert len(list(cache.glob("*.npz"))) == 1
    assert not list(cache.glob("*.tmp"))


def test_load_trace_caches_only_when_asked(tmp_path):
    path = _trace(tmp_path)
    cache = tmp_path / "cache"
    assert (
        load_trace(path) == load_trace(path, cache_dir=cache) == load_trace(path, cache_dir=cache)
    )
    assert len(list(cache.glob("*.npz"))) == 1


def test_anything_the_parse_depends_on_changes_the_key(tmp_path):
    """Content (same size, same mtime), an added file, options and format change the key; a
    touched file (time only) does not."""
    d = tmp_path / "dir"
    d.mkdir()
    (d / "a.json").write_text("0123456789")
    key = pc.cache_key(d, "claude_code", {})
    assert pc.cache_key(d, "claude_code", {}) == key
    st = (d / "a.json").stat()
    os.utime(d / "a.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert pc.cache_key(d, "claude_code", {}) == key
    (d / "a.json").write_text("0123456788")
    os.utime(d / "a.json", ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = pc.cache_key(d, "claude_code", {})
    assert edited != key
    (d / "b.json").write_text("")
    added = pc.cache_key(d, "claude_code", {})
    assert len({key, edited, added}) == 3
    assert pc.cache_key(d, "claude_code", {"seed": 1}) != added
    assert pc.cache_key(d, "claude_code", {"seed": 1}) != pc.cache_key(
        d, "claude_code", {"seed": 2}
    )
    assert pc.cache_key(d, "skv", {}) != added


def test_a_changed_reader_changes_the_key(tmp_path, monkeypatch):
    path = _trace(tmp_path)
    key = pc.cache_key(path, "skv", {})
    monkeypatch.setattr(pc, "_reader_digest", "another parser")
    assert pc.cache_key(path, "skv", {}) != key


def test_what_json_cannot_keep_is_not_cached(tmp_path, caplog):
    """A tuple would come back a list: such a trace loads, uncached."""
    requests = _sessions()[:3]
    requests[1].extra = {"pair": (1, 2)}
    cache = tmp_path / "cache"
    got = pc.cached_load(tmp_path, "x", lambda p: requests, {}, cache)
    assert got is requests and not cache.exists()
    with pytest.raises(pc._NotCacheable):
        pc.encode(
            [Request("r", 0.0, [seg(T.USER_QUERY, 4, "q")], hash_ids=[2**64], hash_block_size=4)]
        )


def test_a_damaged_entry_is_a_miss_and_is_rewritten(tmp_path, caplog):
    path = _trace(tmp_path)
    cache = tmp_path / "cache"
    expected = load_trace(path, cache_dir=cache)
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    with caplog.at_level("WARNING", logger="skv.traces.parsed_cache"):
        assert load_trace(path, cache_dir=cache) == expected
    assert "unreadable trace cache entry" in caplog.text
    assert pc.read_entry(entry) == expected


def test_an_entry_appears_only_whole(tmp_path, monkeypatch):
    """The entry is written under a temporary name and renamed: while it is being written (and
    after an interrupted write) no file has the entry's name, and nothing is left behind."""
    entry = tmp_path / "cache" / "k.npz"
    seen = []

    def interrupted(f, **columns):
        seen.append(entry.exists())
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pc.write_entry(entry, pc.encode(_sessions()))
    assert seen == [False]
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unwritable_cache_costs_the_cache_not_the_load(tmp_path, caplog):
    path = _trace(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level("WARNING", logger="skv.traces.parsed_cache"):
        assert load_trace(path, cache_dir=blocker / "cache") == load_trace(path)
    assert "could not write" in caplog.text


def test_the_cache_directory_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SKV_TRACE_CACHE", str(tmp_path))
    assert pc.default_cache_dir() == tmp_path
    for off in ("off", "OFF", "0", "none"):
        monkeypatch.setenv("SKV_TRACE_CACHE", off)
        assert pc.default_cache_dir() is None
    monkeypatch.delenv("SKV_TRACE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pc.default_cache_dir() == tmp_path / "xdg" / "skv" / "traces"


def test_the_cli_caches_by_default_and_not_when_told(tmp_path, monkeypatch, capsys):
    from skv.cli import main

    path = _trace(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv("SKV_TRACE_CACHE", str(cache))
    assert main(["traces", "info", str(path), "--no-trace-cache"]) == 0
    plain = capsys.readouterr().out
    assert not cache.exists()
    assert main(["traces", "info", str(path)]) == 0
    assert main(["traces", "info", str(path)]) == 0
    assert capsys.readouterr().out == plain * 2
    assert len(list(cache.glob("*.npz"))) == 1
    monkeypatch.setenv("SKV_TRACE_CACHE", "off")
    (tmp_path / "other").mkdir()
    other = _trace(tmp_path / "other")
    assert main(["traces", "info", str(other)]) == 0
    assert len(list(cache.glob("*.npz"))) == 1


REAL = [
    ("weka_cc", {}),
    ("weka_cc", {"seed": 1, "session_interval_s": 5.0}),
    ("mooncake/conversation_trace.jsonl", {}),
    ("azure2023/AzureLLMInferenceTrace_code.csv", {}),
]


@pytest.mark.parametrize(("name", "options"), REAL)
def test_real_traces_read_back_equal(name, options, tmp_path):
    root = trace_dir()
    if root is None or not (root / name).exists():
        pytest.skip(f"real trace {name} not present (see skv.traces.trace_dir)")
    parsed = load_trace(root / name, **options)
    assert load_trace(root / name, cache_dir=tmp_path, **options) == parsed
    assert load_trace(root / name, cache_dir=tmp_path, **options) == parsed
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_a_loaded_trace_is_frozen_out_of_the_collector(tmp_path):
    """The CLI loads under ``long_lived``: no collection runs while the trace is built, its
    objects end in the permanent generation, and the collector comes back on as it was."""
    import gc

    from skv.runtime import long_lived
    from skv.traces.cli import load_requests

    path = _trace(tmp_path)
    gc.unfreeze()
    before = gc.get_freeze_count()
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(phase))
    try:
        assert gc.isenabled()
        requests = load_requests(path, None, None, cache=False)
        assert collections == [] and gc.isenabled()
        assert gc.get_freeze_count() >= before + len(requests)
        gc.disable()
        with long_lived():
            pass
        assert not gc.isenabled()
    finally:
        gc.callbacks.pop()
        gc.enable()
        gc.unfreeze()
