"""CompactTrace (skv.compact_trace, issue 15): a compiled trace stored per unique block and
rebuilt a part at a time must be indistinguishable from ``compile_trace``'s list, request by
request (RequestBlocks equality: keys, parents, tokens, types, segment sizes and every scalar)
and replay by replay (every result field), while holding each session's repeated prefix once.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from helpers import seg

from skv.blocks import RequestBlocks, compile_trace, iter_blocks
from skv.compact_trace import CompactTrace
from skv.model import Request, Segment, SemanticType
from skv.policies.registry import OFFLINE, POLICIES
from skv.replay import replay_one, trace_totals
from skv.traces import load_trace, trace_dir

T = SemanticType


def _hash_id_sessions(seed: int = 7, sessions: int = 5, turns: int = 14) -> list[Request]:
    """Sessions whose turns extend, or (1 in 4) rewrite from a random block on, the previous
    prompt; some share a system prefix across sessions; three tenants; one session-less
    request stream; interleaved by arrival."""
    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        ids: list[int] = [1, 2, 3] if s % 2 else []
        for t in range(turns):
            if len(ids) > 1 and rng.random() < 0.25:
                ids = ids[: rng.randrange(1, len(ids))]
            ids = ids + [rng.randrange(10**6) for _ in range(rng.randint(0, 6))]
            n = 4 * len(ids) + rng.randint(0, 3) or 1
            cut = rng.randint(0, n)
            segs = [seg(T.SYSTEM, cut, "sys"), seg(T.TOOL_OUTPUT, n - cut, f"d{s}-{t}")]
            out.append(
                Request(f"s{s}:{t}", t + s / 10, segs, hash_ids=list(ids), hash_block_size=4,
                        session_id=f"s{s}" if s else None, tenant_id=f"t{s % 3}", turn=t,
                        templated=bool(s % 2))
            )  # fmt: skip
    return sorted(out, key=lambda r: r.arrival_s)


def _content_keyed(seed: int = 3, n: int = 40) -> list[Request]:
    """Content-keyed requests: shared documents at different offsets (segment keying restarts
    chains inside a request), partial last blocks, an empty prompt."""
    rng = random.Random(seed)
    out = [Request("empty", 0.0, [Segment(T.USER_QUERY, 0, "e")], session_id="a")]
    for i in range(n):
        segs = [seg(T.SYSTEM, rng.choice([16, 20, 33]), f"sys{rng.randint(0, 1)}")]
        for _ in range(rng.randint(0, 3)):
            segs.append(seg(T.RETRIEVED_CONTEXT, rng.randint(1, 50), f"doc{rng.randint(0, 4)}"))
        segs.append(seg(T.USER_QUERY, rng.randint(1, 9), f"q{i}"))
        out.append(Request(f"r{i}", 1.0 + i, segs, session_id=f"u{i % 3}", turn=i // 3))
    return out


CASES = [
    ("hash ids, prefix", _hash_id_sessions, "prefix", False),
    ("hash ids, prefix, salted", _hash_id_sessions, "prefix", True),
    ("hash ids, segment", _hash_id_sessions, "segment", False),
    ("content, prefix", _content_keyed, "prefix", False),
    ("content, segment", _content_keyed, "segment", True),
]


def _both(make, mode, salt, block_size=None):
    requests = make()
    full = compile_trace(requests, block_size, mode, salt_by_tenant=salt)
    ct = CompactTrace(iter_blocks(requests, block_size, mode, salt_by_tenant=salt))
    return full, ct


@pytest.mark.parametrize(("name", "make", "mode", "salt"), CASES, ids=[c[0] for c in CASES])
def test_every_rebuilt_request_equals_the_compiled_one(name, make, mode, salt):
    full, ct = _both(make, mode, salt)
    assert len(ct) == len(full) and ct.block_accesses == sum(len(rb.keys) for rb in full)
    assert list(ct) == full
    assert ct[:] == full and ct[3:17] == full[3:17] and ct[17:40] == full[17:40]
    assert ct[::3] == full[::3]
    order = list(range(len(full)))
    random.Random(1).shuffle(order)
    for i in order[:25]:  # out of order: rebuilt from the session's first request
        assert ct[i] == full[i]
    assert ct[-1] == full[-1]
    with pytest.raises(IndexError):
        ct[len(full)]
    assert [ct.arrival_s(i) for i in range(len(ct))] == [rb.arrival_s for rb in full]


@pytest.mark.parametrize("budget", [1, 7, 50, 10**9])
def test_parts_cover_the_range_within_the_access_budget(budget):
    full, ct = _both(_hash_id_sessions, "prefix", False)
    parts = list(ct.parts(5, 60, max_accesses=budget))
    assert [rb for part in parts for rb in part] == full[5:60]
    for part in parts:
        assert len(part) == 1 or sum(len(rb.keys) for rb in part) <= budget
    if budget == 10**9:
        assert len(parts) == 1


def test_a_sessions_repeated_prefix_is_stored_once():
    """Ten turns, each extending the last by ten blocks: 550 block accesses, 100 keys stored."""
    ids = list(range(1000, 1100))
    requests = [
        Request(f"r{t}", float(t), [seg(T.USER_QUERY, 40 * (t + 1), "q")], session_id="s",
                hash_ids=ids[: 10 * (t + 1)], hash_block_size=4)
        for t in range(10)
    ]  # fmt: skip
    ct = CompactTrace(iter_blocks(requests))
    assert ct.block_accesses == 550 and ct.stored_keys == 100
    assert list(ct) == compile_trace(requests)
    rebuilt = list(ct)
    for prev, cur in itertools.pairwise(rebuilt):  # the prefix shares int objects
        assert all(a is b for a, b in zip(prev.keys, cur.keys, strict=False))


def test_what_compact_cannot_hold_is_refused():
    rb = compile_trace(_hash_id_sessions()[:1])[0]
    odd = RequestBlocks(0, 0.0, [5, 6], [None, 7], [4, 4], [0, 0], [8, 8], None, 0, False, 4)
    with pytest.raises(ValueError, match="not the previous key"):
        CompactTrace([odd])
    longer = RequestBlocks(0, 0.0, [], [None], [], [], [], None, 0, False, 4)
    with pytest.raises(ValueError, match="not the previous key"):
        CompactTrace([longer])  # more parents than keys
    for key in (-5, 2**64, b"\x01h"):  # a negative int, one past 64 bits, vLLM's bytes hash
        bad = RequestBlocks(3, 0.0, [key], [None], [4], [0], [4], None, 0, False, 4)
        with pytest.raises(
            ValueError, match=r"request 3: block keys must be ints in \[0, 2\*\*64\)"
        ):
            CompactTrace([bad])
    rb.next_use = [1] * len(rb.keys)
    with pytest.raises(ValueError, match="next_use"):
        CompactTrace([rb])
    kept = CompactTrace([rb], drop_next_use=True)  # a sample's use: the annotations go
    assert kept[0].next_use is None and kept[0].keys == rb.keys


def _cut_block_by_block(full: list[RequestBlocks], keep_key) -> list[RequestBlocks]:
    """The reference per-key cut: every block of every request looked at, kept iff its key is,
    re-chained to the nearest kept block before it in its chain."""
    out = []
    for rb in full:
        idx, parents, prev = [], [], None
        for i, (key, parent) in enumerate(zip(rb.keys, rb.parents, strict=True)):
            if parent is None:
                prev = None
            if keep_key(key):
                idx.append(i)
                parents.append(prev)
                prev = key
        if not idx:
            continue
        tokens = [rb.tokens[i] for i in idx]
        whole = len(idx) == len(rb.keys)
        out.append(
            RequestBlocks(
                index=len(out), arrival_s=rb.arrival_s, keys=[rb.keys[i] for i in idx],
                parents=parents, tokens=tokens, stypes=[rb.stypes[i] for i in idx],
                seg_tokens=[rb.seg_tokens[i] for i in idx], session=rb.session, turn=rb.turn,
                templated=rb.templated, block_size=rb.block_size,
                prompt_tokens=rb.prompt_tokens if whole else sum(tokens),
            )
        )  # fmt: skip
    return out


def _keep_share(share: float):
    """A verdict that depends on the key alone (as per-key sampling's does)."""
    return lambda key: (key * 0x9E3779B97F4A7C15 >> 17) % 1000 < share * 1000


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize(("name", "make", "mode", "salt"), CASES, ids=[c[0] for c in CASES])
def test_a_per_key_cut_equals_cutting_every_block(name, make, mode, salt, share):
    """``cut`` looks only at the stored keys (a turn's shared prefix inherits its
    predecessor's cut) and gives what cutting every block of every request gives. Its key store
    chains each request to the previous kept request of its session, as encoding the cut
    requests would, so reading it keeps one key list per session."""
    full, ct = _both(make, mode, salt)
    keep_key = _keep_share(share)
    keep = np.array([keep_key(k) for k in ct.new_keys.tolist()], dtype=bool)
    compact_cut = ct.cut(keep)
    cut = list(compact_cut)
    assert cut == _cut_block_by_block(full, keep_key)
    pred, shared, *_ = compact_cut.key_deltas()
    encoded_pred, encoded_shared, *_ = CompactTrace(cut).key_deltas()
    assert pred.tolist() == encoded_pred.tolist()
    # a shared prefix, at most the common one (less where a dropped request came between)
    assert np.all(shared <= encoded_shared)
    if share == 1.0:  # every request with a block, whole
        assert [(r.keys, r.parents) for r in cut] == [(r.keys, r.parents) for r in full if r.keys]
    if share == 0.0:
        assert cut == []
    with pytest.raises(ValueError, match="verdicts"):
        ct.cut(keep[:-1])


def test_a_cut_request_counts_its_kept_tokens_and_a_whole_one_keeps_its_prompt():
    rb = RequestBlocks(index=0, arrival_s=0.0, keys=[5, 6], parents=[None, 5], tokens=[4, 4],
                       stypes=[0, 0], seg_tokens=[8, 8], session=None, turn=0, templated=False,
                       block_size=4, prompt_tokens=10)  # fmt: skip
    ct = CompactTrace([rb])
    assert [r.prompt_tokens for r in ct.cut(np.array([True, True]))] == [10]
    (cut,) = ct.cut(np.array([False, True]))
    assert (cut.keys, cut.parents, cut.prompt_tokens) == ([6], [None], 4)


ONLINE = sorted(p for p in POLICIES if p not in OFFLINE)


@pytest.mark.parametrize("policy", ONLINE)
def test_replaying_a_compact_trace_gives_every_result_of_the_list(policy):
    """Capacity a third of the unique blocks (evictions happen), parts of 40 accesses (many
    boundaries), the metrics series sampled every 9 requests."""
    full, ct = _both(_hash_id_sessions, "prefix", False)
    totals = trace_totals(full)
    assert trace_totals(ct) == totals
    cap = max(4, totals.unique_blocks // 3)
    ref = replay_one(full, policy, cap, totals=totals, metrics_every=9, progress=False)
    import skv.compact_trace as compact_module

    old = compact_module.PART_ACCESSES
    compact_module.PART_ACCESSES = 40
    try:
        ct2 = CompactTrace(iter(full))
        got = replay_one(ct2, policy, cap, totals=totals, metrics_every=9, progress=False)
    finally:
        compact_module.PART_ACCESSES = old
    ref.pop("replay_seconds"), got.pop("replay_seconds")
    assert ref["evictions"] > 0
    assert got == ref


def test_an_offline_policy_asks_for_the_list():
    _, ct = _both(_hash_id_sessions, "prefix", False)
    with pytest.raises(ValueError, match="offline"):
        replay_one(ct, sorted(OFFLINE)[0], 10, progress=False)


def test_the_replay_cli_gives_the_same_rows_either_way(tmp_path, capsys):
    """``skv replay`` compacts when every policy is online, not when belady is asked for: the
    lru rows of both runs are equal."""
    import json

    from skv.cli import main

    trace = "examples/traces/rag_serving_trace.jsonl"
    for out, pols in (("a", ["lru", "vllm"]), ("b", ["lru", "vllm", "belady"])):
        assert main(["replay", trace, "--policies", *pols, "--capacity", "10%", "25%",
                     "--output", str(tmp_path / out), "--quiet"]) == 0  # fmt: skip
    a = json.loads((tmp_path / "a" / "replay_results.json").read_text())["results"]
    b = json.loads((tmp_path / "b" / "replay_results.json").read_text())["results"]
    assert a == [r for r in b if r["policy"] != "belady"] and len(a) == 4


REAL = ["weka_cc", "mooncake/conversation_trace.jsonl"]


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("mode", ["prefix", "segment"])
def test_real_traces_rebuild_and_cut_per_key_exactly(name, mode):
    root = trace_dir()
    if root is None or not (root / name).exists():
        pytest.skip(f"real trace {name} not present (see skv.traces.trace_dir)")
    requests = load_trace(root / name)
    full = compile_trace(requests, None, mode)
    ct = CompactTrace(iter_blocks(requests, None, mode))
    assert list(ct) == full
    assert ct.stored_keys < ct.block_accesses / 10 or name.startswith("mooncake")
    keep_key = _keep_share(0.1)
    keep = np.array([keep_key(k) for k in ct.new_keys.tolist()], dtype=bool)
    assert list(ct.cut(keep)) == _cut_block_by_block(full, keep_key)
    assert trace_totals(ct) == trace_totals(full)


@pytest.mark.parametrize(("name", "make", "mode", "salt"), CASES, ids=[c[0] for c in CASES])
def test_the_totals_of_a_compact_trace_equal_those_of_its_list(name, make, mode, salt):
    """A single-chain CompactTrace's totals and ceiling come from its columns (no request is
    rebuilt); any other is tallied request by request. Either way: the list's totals."""
    full, ct = _both(make, mode, salt)
    assert ct.one_chain == (mode == "prefix")  # prefix keying: the column path
    assert trace_totals(ct) == trace_totals(full)
    for share in (0.1, 0.5):  # cut traces too (short requests, a partial block anywhere)
        keep_key = _keep_share(share)
        cut = ct.cut(np.array([keep_key(k) for k in ct.new_keys.tolist()], dtype=bool))
        assert trace_totals(cut) == trace_totals(list(cut))


def test_column_totals_count_a_hit_inside_a_run_and_a_key_new_to_its_session():
    def rb(i: int, session: str, keys: list[int], tokens: list[int]) -> RequestBlocks:
        return RequestBlocks(index=i, arrival_s=float(i), keys=keys, parents=[None, *keys[:-1]],
                             tokens=tokens, stypes=[0] * len(keys), seg_tokens=tokens,
                             session=session, turn=0, templated=False, block_size=4)  # fmt: skip

    # a short first block; key 5 stored again as new to session b; hits end inside a run of 4s
    trace = [rb(0, "a", [5], [3]), rb(1, "b", [5, 6, 10], [4, 4, 4]),
             rb(2, "c", [5, 6, 11], [4, 4, 4])]  # fmt: skip
    totals = trace_totals(CompactTrace(trace))
    assert totals == trace_totals(trace)
    assert (totals.unique_blocks, totals.ceiling_hit_blocks, totals.ceiling_hit_tokens) == (
        4,
        3,
        12,
    )
