"""Cutting prompts into blocks and keying them: prefix chains, segment chains, salts, hash ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import req, seg

from skv.blocks import KeyingMode, request_blocks
from skv.model import TYPE_INDEX, Request, Segment, SemanticType

T = SemanticType
ROOT = Path(__file__).resolve().parents[1]


def blocks(request: Request, block_size: int = 4, mode: str = "prefix", **kw):
    return request_blocks(request, block_size, mode, **kw)


# ---------------------------------------------------------------- prefix keying


def test_prefix_same_prompt_gives_same_keys():
    a = blocks(req(seg(T.SYSTEM, 8, "sys"), seg(T.USER_QUERY, 6, "q")))
    b = blocks(req(seg(T.SYSTEM, 8, "sys"), seg(T.USER_QUERY, 6, "q")))
    assert a.keys == b.keys
    assert a.parents == b.parents


def test_prefix_shared_prefix_shares_keys_up_to_the_divergent_block():
    a = blocks(req(seg(T.SYSTEM, 8, "sys"), seg(T.USER_QUERY, 8, "q1")))
    b = blocks(req(seg(T.SYSTEM, 8, "sys"), seg(T.USER_QUERY, 8, "q2")))
    assert a.keys[:2] == b.keys[:2]
    assert a.keys[2] != b.keys[2]
    assert a.keys[3] != b.keys[3]


def test_prefix_block_straddling_a_divergence_differs():
    # system is 6 tokens: block 1 holds 2 system tokens and 2 query tokens
    a = blocks(req(seg(T.SYSTEM, 6, "sys"), seg(T.USER_QUERY, 6, "q1")))
    b = blocks(req(seg(T.SYSTEM, 6, "sys"), seg(T.USER_QUERY, 6, "q2")))
    assert a.keys[0] == b.keys[0]
    assert a.keys[1] != b.keys[1]


def test_prefix_different_first_segment_changes_every_later_key():
    doc = seg(T.RETRIEVED_CONTEXT, 12, "doc")
    a = blocks(req(seg(T.SYSTEM, 4, "sys-a"), doc, seg(T.USER_QUERY, 5, "q")))
    b = blocks(req(seg(T.SYSTEM, 4, "sys-b"), doc, seg(T.USER_QUERY, 5, "q")))
    assert len(a.keys) == len(b.keys)
    assert all(x != y for x, y in zip(a.keys, b.keys, strict=True))
    assert set(a.keys).isdisjoint(b.keys)


def test_prefix_parents_form_one_chain():
    b = blocks(req(seg(T.SYSTEM, 9, "sys"), seg(T.USER_QUERY, 7, "q")))
    assert b.parents == [None, *b.keys[:-1]]


def test_prefix_blocks_cut_at_fixed_multiples_of_block_size_with_partial_last():
    b = blocks(req(seg(T.SYSTEM, 3, "a"), seg(T.USER_QUERY, 7, "b"), seg(T.OUTPUT, 1, "c")), 4)
    assert b.tokens == [4, 4, 3]
    assert b.prompt_tokens == 11
    assert b.num_blocks == 3
    assert b.block_size == 4


def test_prefix_block_aligned_prompt_has_no_partial_block():
    b = blocks(req(seg(T.SYSTEM, 5, "a"), seg(T.USER_QUERY, 3, "b")), 4)
    assert b.tokens == [4, 4]


def test_prefix_partial_block_key_differs_from_the_full_block_that_extends_it():
    short = blocks(req(seg(T.SYSTEM, 6, "sys")), 4)
    longer = blocks(req(seg(T.SYSTEM, 6, "sys"), seg(T.USER_QUERY, 2, "q")), 4)
    assert short.keys[0] == longer.keys[0]
    assert short.keys[1] != longer.keys[1]


def test_block_type_is_its_first_tokens_segment():
    # blocks start at 0 (system), 4 (system: tokens 4-5), 8 (query), 12 (query)
    b = blocks(req(seg(T.SYSTEM, 6, "sys"), seg(T.USER_QUERY, 10, "q")), 4)
    assert b.stypes == [TYPE_INDEX[T.SYSTEM]] * 2 + [TYPE_INDEX[T.USER_QUERY]] * 2
    assert b.seg_tokens == [6, 6, 10, 10]


def test_block_type_when_a_segment_starts_exactly_on_a_boundary():
    b = blocks(req(seg(T.SYSTEM, 4, "sys"), seg(T.CODE, 4, "code")), 4)
    assert b.stypes == [TYPE_INDEX[T.SYSTEM], TYPE_INDEX[T.CODE]]


def test_segment_without_content_hash_raises():
    r = Request("r", 0.0, [seg(T.SYSTEM, 4, "s"), Segment(T.CODE, 4)])
    with pytest.raises(ValueError, match="content_hash"):
        blocks(r)


def test_keying_mode_accepts_strings_and_rejects_unknown():
    r = req(seg(T.SYSTEM, 4, "s"))
    assert blocks(r, mode="prefix").keys == request_blocks(r, 4, KeyingMode.PREFIX).keys
    with pytest.raises(ValueError):
        blocks(r, mode="bogus")


# ---------------------------------------------------------------- segment keying


def rag(system: str, doc: str = "doc", query: str = "q") -> Request:
    return req(
        seg(T.SYSTEM, 6, system),
        seg(T.RETRIEVED_CONTEXT, 10, doc),
        seg(T.USER_QUERY, 5, query),
    )


def test_segment_mode_cuts_each_segment_from_its_own_start():
    b = blocks(rag("sys-a"), 4, "segment")
    # system 6 -> 4+2, doc 10 -> 4+4+2, query 5 -> 4+1
    assert b.tokens == [4, 2, 4, 4, 2, 4, 1]


def test_segment_mode_same_document_after_different_system_prompts_has_same_keys():
    a = blocks(rag("sys-a"), 4, "segment")
    b = blocks(rag("sys-b"), 4, "segment")
    assert a.keys[:2] != b.keys[:2]  # the system prompts differ
    assert a.keys[2:5] == b.keys[2:5]  # the document's three blocks are position independent


def test_segment_mode_reusable_segment_starts_a_chain():
    b = blocks(rag("sys-a"), 4, "segment")
    assert b.parents[0] is None
    assert b.parents[2] is None  # the document restarts the chain
    assert b.parents[3] == b.keys[2]
    assert b.parents[4] == b.keys[3]


def test_segment_mode_user_query_stays_chained_to_what_precedes_it():
    b = blocks(rag("sys-a"), 4, "segment")
    assert b.parents[5] == b.keys[4]  # first query block's parent is the last document block
    assert b.parents[6] == b.keys[5]


def test_segment_mode_same_query_after_different_documents_has_different_keys():
    a = blocks(rag("sys", doc="doc-1"), 4, "segment")
    b = blocks(rag("sys", doc="doc-2"), 4, "segment")
    assert set(a.keys[5:]).isdisjoint(b.keys[5:])


def test_segment_mode_query_after_the_same_document_is_found_again():
    a = blocks(rag("sys-a"), 4, "segment")
    b = blocks(rag("sys-b"), 4, "segment")
    assert a.keys[5:] == b.keys[5:]


def test_segment_mode_document_not_first_in_prefix_mode_is_not_shared():
    a = blocks(rag("sys-a"), 4, "prefix")
    b = blocks(rag("sys-b"), 4, "prefix")
    assert set(a.keys).isdisjoint(b.keys)


def test_reusable_override_true_restarts_a_chain_for_a_normally_chained_type():
    r = req(seg(T.SYSTEM, 4, "sys"), seg(T.USER_QUERY, 4, "q", reusable=True))
    b = blocks(r, 4, "segment")
    assert b.parents == [None, None]
    alone = blocks(req(seg(T.USER_QUERY, 4, "q")), 4, "segment")
    assert b.keys[1] == alone.keys[0]


def test_reusable_override_false_keeps_a_normally_reusable_type_chained():
    r = req(seg(T.SYSTEM, 4, "sys"), seg(T.RETRIEVED_CONTEXT, 4, "doc", reusable=False))
    b = blocks(r, 4, "segment")
    assert b.parents == [None, b.keys[0]]
    other = blocks(
        req(seg(T.SYSTEM, 4, "sys2"), seg(T.RETRIEVED_CONTEXT, 4, "doc", reusable=False)),
        4,
        "segment",
    )
    assert b.keys[1] != other.keys[1]


def test_segment_mode_first_segment_starts_a_chain_even_when_not_reusable():
    b = blocks(req(seg(T.USER_QUERY, 6, "q")), 4, "segment")
    assert b.parents == [None, b.keys[0]]


# ---------------------------------------------------------------- tenant salt


@pytest.mark.parametrize("mode", ["prefix", "segment"])
def test_tenant_salt_isolates_tenants(mode):
    ta = blocks(req(*rag("sys").segments, tenant_id="alice"), 4, mode, salt_by_tenant=True)
    tb = blocks(req(*rag("sys").segments, tenant_id="bob"), 4, mode, salt_by_tenant=True)
    assert set(ta.keys).isdisjoint(tb.keys)


@pytest.mark.parametrize("mode", ["prefix", "segment"])
def test_same_tenant_gets_equal_keys(mode):
    ta = blocks(req(*rag("sys").segments, tenant_id="alice"), 4, mode, salt_by_tenant=True)
    tb = blocks(req(*rag("sys").segments, tenant_id="alice"), 4, mode, salt_by_tenant=True)
    assert ta.keys == tb.keys


def test_tenants_share_keys_when_salting_is_off():
    ta = blocks(req(*rag("sys").segments, tenant_id="alice"), 4, "prefix")
    tb = blocks(req(*rag("sys").segments, tenant_id="bob"), 4, "prefix")
    assert ta.keys == tb.keys


def test_salted_keys_differ_from_unsalted_keys():
    salted = blocks(req(*rag("sys").segments, tenant_id="alice"), 4, salt_by_tenant=True)
    plain = blocks(req(*rag("sys").segments), 4, salt_by_tenant=True)  # no tenant: no salt
    assert set(salted.keys).isdisjoint(plain.keys)


def test_tenant_salt_isolates_hash_id_requests():
    def hreq(tenant):
        return req(seg(T.SYSTEM, 10, "s"), hash_ids=[1, 2, 3], hash_block_size=4, tenant_id=tenant)

    a = blocks(hreq("alice"), 4, salt_by_tenant=True)
    b = blocks(hreq("bob"), 4, salt_by_tenant=True)
    assert set(a.keys).isdisjoint(b.keys)
    assert blocks(hreq("alice"), 4, salt_by_tenant=True).keys == a.keys


# ---------------------------------------------------------------- hash-id requests


def hash_req(hash_ids, segments=None, block_size=4, **kw):
    segments = segments or [seg(T.UNKNOWN, 10, "x")]
    return req(*segments, hash_ids=hash_ids, hash_block_size=block_size, **kw)


def test_hash_id_request_has_one_block_per_id_and_a_partial_last_block():
    b = blocks(hash_req([7, 8, 9]), 4)
    assert b.num_blocks == 3
    assert b.tokens == [4, 4, 2]
    assert b.prompt_tokens == 10


def test_hash_id_request_block_aligned_has_full_last_block():
    b = blocks(hash_req([7, 8, 9], [seg(T.UNKNOWN, 12, "x")]), 4)
    assert b.tokens == [4, 4, 4]


def test_hash_id_keys_chain_like_prefix_keys():
    a = blocks(hash_req([1, 2, 3]), 4)
    b = blocks(hash_req([1, 2, 4]), 4)
    c = blocks(hash_req([5, 2, 3]), 4)
    assert a.keys[:2] == b.keys[:2]
    assert a.keys[2] != b.keys[2]
    assert set(a.keys).isdisjoint(c.keys)
    assert a.parents == [None, a.keys[0], a.keys[1]]


def test_hash_id_block_takes_the_type_of_its_first_token():
    segs = [seg(T.SYSTEM, 6, "s"), seg(T.USER_QUERY, 4, "q")]
    b = blocks(hash_req([1, 2, 3], segs), 4)
    # blocks start at tokens 0, 4, 8: system, system, query
    assert b.stypes == [TYPE_INDEX[T.SYSTEM]] * 2 + [TYPE_INDEX[T.USER_QUERY]]


def test_hash_id_request_uses_the_trace_block_size():
    b = blocks(hash_req([1, 2], [seg(T.UNKNOWN, 20, "x")], block_size=16), 16)
    assert b.block_size == 16
    assert b.tokens == [16, 4]


def test_hash_id_request_with_mismatched_block_size_raises():
    with pytest.raises(ValueError, match="16"):
        blocks(hash_req([1, 2], block_size=16), 4)


# ---------------------------------------------------------------- determinism

_KEY_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from helpers import req, seg
from skv.blocks import request_blocks
from skv.model import SemanticType as T
r = req(seg(T.SYSTEM, 6, "sys"), seg(T.RETRIEVED_CONTEXT, 9, "doc"), seg(T.USER_QUERY, 5, "q"),
        tenant_id="alice")
h = req(seg(T.SYSTEM, 10, "s"), hash_ids=[11, 12, 13], hash_block_size=4, tenant_id="bob")
out = {{
    mode: request_blocks(r, 4, mode, salt_by_tenant=True).keys for mode in ("prefix", "segment")
}}
out["hash"] = request_blocks(h, 4, salt_by_tenant=True).keys
print(json.dumps(out))
"""


def _keys_here():
    r = req(
        seg(T.SYSTEM, 6, "sys"),
        seg(T.RETRIEVED_CONTEXT, 9, "doc"),
        seg(T.USER_QUERY, 5, "q"),
        tenant_id="alice",
    )
    h = req(seg(T.SYSTEM, 10, "s"), hash_ids=[11, 12, 13], hash_block_size=4, tenant_id="bob")
    out = {m: request_blocks(r, 4, m, salt_by_tenant=True).keys for m in ("prefix", "segment")}
    out["hash"] = request_blocks(h, 4, salt_by_tenant=True).keys
    return out


@pytest.mark.parametrize("hashseed", ["0", "12345"])
def test_keys_are_identical_in_another_process_with_another_hash_seed(hashseed):
    script = _KEY_SCRIPT.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    assert json.loads(proc.stdout) == _keys_here()


def test_keys_are_unsigned_64_bit_ints():
    out = _keys_here()
    for keys in out.values():
        assert all(isinstance(k, int) and 0 <= k < 2**64 for k in keys)


def test_hash_id_segment_mode_restarts_the_chain_at_each_reusable_segment():
    segs = [seg(T.SYSTEM, 4, "s"), seg(T.RETRIEVED_CONTEXT, 8, "doc")]
    b = blocks(hash_req([1, 2, 3], segs), 4, "segment")
    assert b.parents == [None, None, b.keys[1]]


# ---------------------------------------------------------------- a session's repeated prefix


def _session_turns(seed: int = 5, sessions: int = 4, turns: int = 12) -> list[Request]:
    """Multi-turn hash-id sessions: each turn extends its session's last prompt, or (1 in 4)
    rewrites it from a random block on (a diverging turn), under two tenants, with several
    segments so blocks take different types; interleaved in arrival order."""
    import random

    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        ids: list[int] = []
        for t in range(turns):
            if ids and rng.random() < 0.25:
                ids = ids[: rng.randrange(len(ids))]
            ids = ids + [rng.randrange(10**6) for _ in range(rng.randint(0, 5))]
            n = 4 * len(ids) + rng.randint(0, 3) or 1
            cut = rng.randint(0, n)
            segs = [seg(T.SYSTEM, cut, "sys"), seg(T.RETRIEVED_CONTEXT, n - cut, f"d{s}-{t}")]
            out.append(
                Request(f"s{s}:{t}", t + s / 10, segs, hash_ids=list(ids), hash_block_size=4,
                        session_id=f"s{s}", tenant_id=f"t{s % 2}")
            )  # fmt: skip
    return sorted(out, key=lambda r: r.arrival_s)


@pytest.mark.parametrize("salt", [False, True])
@pytest.mark.parametrize("mode", ["prefix", "segment"])
def test_copying_a_sessions_repeated_prefix_gives_the_keys_hashing_gives(mode, salt):
    """``chains`` (what compile_trace passes) copies the keys of the prefix a turn shares with
    its session's previous turn; every block must equal the request cut on its own."""
    from skv.blocks import compile_trace

    reqs = _session_turns()
    shared = compile_trace(reqs, None, mode, salt_by_tenant=salt)
    alone = [request_blocks(r, 4, mode, index=i, salt_by_tenant=salt) for i, r in enumerate(reqs)]
    assert [b._fields() for b in shared] == [b._fields() for b in alone]
    # the copy happened (prefix keying): a later turn's keys are its predecessor's objects
    if mode == "prefix":
        assert any(b.num_blocks and any(b.keys[0] is a.keys[0] for a in shared[:i])
                   for i, b in enumerate(shared) if i)  # fmt: skip


def test_a_copied_chain_is_not_shared_across_sessions_or_tenants():
    """Two sessions (and two tenants of one session id) with the same ids: the chain memo is
    per session and salt, so nothing leaks between them."""
    chains: dict = {}
    a = request_blocks(hash_req([1, 2, 3], session_id="a"), 4, chains=chains)
    b = request_blocks(hash_req([1, 2, 3], session_id="b"), 4, chains=chains)
    assert a.keys == b.keys  # same root, same ids: the same keys, copied or not
    t1 = request_blocks(hash_req([1, 2], session_id="a", tenant_id="x"), 4, salt_by_tenant=True,
                        chains=chains)  # fmt: skip
    t2 = request_blocks(hash_req([1, 2], session_id="a", tenant_id="y"), 4, salt_by_tenant=True,
                        chains=chains)  # fmt: skip
    assert t1.keys[0] != t2.keys[0] and t1.keys[0] != a.keys[0]
