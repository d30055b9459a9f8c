"""The node-level lru replay (skv.cache.node_lru) makes the block replay's choices exactly.

Every result field of ``replay_one`` on the list (``BlockCache`` + ``LRU``, block by block) is
compared with ``NodeLRU`` on the compact trace, on traces built to break its claims: turns that
rewrite their session's prompt from a random block (hits that end inside a node), prefixes
shared across sessions (a node taken by another owner), session-less streams, partial last
blocks and empty prompts, at capacities from 1 block (nothing fits: uncached blocks) to all of
them; and on the real traces when present.
"""

from __future__ import annotations

import random

import pytest
from helpers import seg
from test_compact_trace import _both, _content_keyed, _hash_id_sessions

from skv.blocks import compile_trace, iter_blocks
from skv.cache.node_lru import NodeLRU
from skv.compact_trace import CompactTrace
from skv.model import Request, SemanticType
from skv.replay import replay_one, trace_totals
from skv.traces import load_trace, trace_dir

T = SemanticType


def _forest(seed: int, n: int = 160) -> list[Request]:
    """Requests walking a random prefix forest of hash ids: each extends a random earlier
    prompt cut at a random block (deep and shallow branches, many owners on one path), in
    3 sessions plus a session-less stream, with mixed types and ragged last blocks."""
    rng = random.Random(seed)
    prompts: list[list[int]] = [[]]
    out = []
    for i in range(n):
        base = rng.choice(prompts)
        ids = base[: rng.randint(0, len(base))] + [
            rng.randrange(10**9) for _ in range(rng.randint(0, 5))
        ]
        prompts.append(ids)
        tokens = 4 * len(ids) - rng.randint(0, 3) if ids else rng.randint(0, 3)
        cut = rng.randint(0, max(tokens, 0))
        segs = [
            seg(T.SYSTEM, cut, "sys"),
            seg(rng.choice((T.TOOL_OUTPUT, T.USER_QUERY)), max(tokens, 0) - cut, f"d{i}"),
        ]
        session = rng.choice(("a", "b", "c", None))
        out.append(Request(f"r{i}", float(i), segs, hash_ids=ids, hash_block_size=4,
                           session_id=session, turn=i))  # fmt: skip
    return out


def _compare(full, ct, caps):
    totals = trace_totals(full)
    evicted = 0
    for cap in caps:
        ref = replay_one(full, "lru", cap, totals=totals, progress=False)
        got = replay_one(CompactTrace(iter(full)), "lru", cap, totals=totals, progress=False)
        ref.pop("replay_seconds"), got.pop("replay_seconds")
        assert got == ref, cap
        evicted += ref["evictions"]
    assert evicted


def _caps(full):
    u = trace_totals(full).unique_blocks
    return sorted({1, 2, 3, 5, 8, u // 7 or 1, u // 3 or 1, u // 2 or 1, u, 2 * u})


@pytest.mark.parametrize("seed", range(12))
def test_random_forests_replay_exactly(seed):
    requests = _forest(seed)
    full = compile_trace(requests, None, "prefix")
    ct = CompactTrace(iter(full))
    assert ct.one_chain
    _compare(full, ct, _caps(full))


@pytest.mark.parametrize(
    ("make", "salt"),
    [(_hash_id_sessions, False), (_hash_id_sessions, True), (_content_keyed, False)],
    ids=["sessions", "sessions-salted", "content"],
)
def test_session_and_content_traces_replay_exactly(make, salt):
    full, ct = _both(make, "prefix", salt)
    _compare(full, ct, _caps(full))


def test_replay_one_uses_nodes_for_lru_on_a_prefix_compact_trace(monkeypatch):
    """The node replay is what ``skv replay`` runs for lru (so its speed is what users get);
    segment keying, parameters or a list keep the block replay."""
    import skv.replay as replay_module

    made = []

    class Spy(NodeLRU):
        def __init__(self, cap):
            made.append(cap)
            super().__init__(cap)

    monkeypatch.setattr(replay_module, "NodeLRU", Spy)
    full, ct = _both(_hash_id_sessions, "prefix", False)
    replay_one(ct, "lru", 9, progress=False)
    assert made == [9]
    replay_one(full, "lru", 9, progress=False)
    _, seg_ct = _both(_content_keyed, "segment", False)
    assert not seg_ct.one_chain
    replay_one(seg_ct, "lru", 9, progress=False)
    assert made == [9]


def test_what_it_cannot_replay_is_refused():
    _, seg_ct = _both(_content_keyed, "segment", False)
    with pytest.raises(ValueError, match="one chain per request"):
        NodeLRU(10).replay(seg_ct)
    _, ct = _both(_hash_id_sessions, "prefix", False)
    cache = NodeLRU(10)
    cache.replay(ct, 0, 5)
    with pytest.raises(ValueError, match="continues at request 5"):
        cache.replay(ct, 7, 9)
    with pytest.raises(ValueError, match="one trace"):
        cache.replay(CompactTrace(iter(ct)), 5, 6)
    with pytest.raises(ValueError, match=">= 1"):
        NodeLRU(0)


def test_chunked_calls_equal_one_call():
    _, ct = _both(_hash_id_sessions, "prefix", False)
    one, chunked = NodeLRU(17), NodeLRU(17)
    one.replay(ct)
    for a in range(0, len(ct), 6):
        chunked.replay(ct, a, min(a + 6, len(ct)))
    assert one.stats == chunked.stats and len(one) == len(chunked) <= 17


def test_the_cache_holds_what_the_block_replay_holds():
    """Beyond the counters: after the same requests both caches hold the same keys."""
    from skv.policies.registry import make_cache

    full, ct = _both(_hash_id_sessions, "prefix", False)
    for cap in (5, 23, 60):
        block = make_cache("lru", cap)
        block.replay(full, 0, len(full))
        node = NodeLRU(cap)
        node.replay(ct)
        assert len(node) == len(block) > 0
        assert all(key in node for key in block.blocks)


REAL = ["weka_cc", "mooncake/conversation_trace.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_traces_replay_exactly(name):
    root = trace_dir()
    if root is None or not (root / name).exists():
        pytest.skip(f"real trace {name} not present (see skv.traces.trace_dir)")
    full = compile_trace(load_trace(root / name), None, "prefix")
    ct = CompactTrace(iter_blocks(load_trace(root / name), None, "prefix"))
    assert ct.one_chain
    u = trace_totals(full).unique_blocks
    _compare(full, ct, [max(1, int(u * f)) for f in (0.003, 0.03, 0.3)])
