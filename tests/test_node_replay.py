"""The node-level replay (skv.cache.node_replay) makes the block replay's choices exactly, for
lru and for vLLM's block pool.

Every result field of ``replay_one`` on the list (``BlockCache`` + ``LRU``, or
``VllmBlockPool``, block by block) is compared with ``NodeReplay`` on the compact trace, on
traces built to break its claims: turns that
rewrite their session's prompt from a random block (hits that end inside a node), prefixes
shared across sessions (a node taken by another owner), session-less streams, partial last
blocks and empty prompts, at capacities from 1 block (nothing fits: uncached blocks) to all of
them (for vllm: block-aligned prompts, whose capped last block is cached again as a
duplicate); and on the real traces when present.
"""

from __future__ import annotations

import random

import pytest
from helpers import seg
from test_compact_trace import _both, _content_keyed, _hash_id_sessions

from skv.blocks import compile_trace, iter_blocks
from skv.cache.node_replay import NodeReplay
from skv.compact_trace import CompactTrace
from skv.model import Request, SemanticType
from skv.replay import replay_one, trace_totals
from skv.traces import load_trace, trace_dir

T = SemanticType


def _forest(seed: int, n: int = 160, repeat: float = 0.2) -> list[Request]:
    """Requests walking a random prefix forest of hash ids: each extends a random earlier
    prompt cut at a random block (deep and shallow branches, many owners on one path), or
    (1 in 5) repeats one exactly, in 3 sessions plus a session-less stream, with mixed types
    and ragged last blocks."""
    rng = random.Random(seed)
    prompts: list[tuple[list[int], int]] = [([], 0)]
    out = []
    for i in range(n):
        base, base_tokens = rng.choice(prompts)
        if base and rng.random() < repeat:  # vllm: a repeated block-aligned prompt adds a copy
            ids, tokens = base, base_tokens
        else:
            ids = base[: rng.randint(0, len(base))] + [
                rng.randrange(10**9) for _ in range(rng.randint(0, 5))
            ]
            # a third block-aligned: vllm caps their hit and recomputes the last block (a copy)
            tokens = 4 * len(ids) - rng.choice((0, 0, 1, 3)) if ids else rng.randint(0, 3)
        prompts.append((ids, tokens))
        cut = rng.randint(0, max(tokens, 0))
        segs = [
            seg(T.SYSTEM, cut, "sys"),
            seg(rng.choice((T.TOOL_OUTPUT, T.USER_QUERY)), max(tokens, 0) - cut, f"d{i}"),
        ]
        session = rng.choice(("a", "b", "c", None))
        out.append(Request(f"r{i}", float(i), segs, hash_ids=ids, hash_block_size=4,
                           session_id=session, turn=i))  # fmt: skip
    return out


POLICIES = ["lru", "vllm"]


def _compare(full, policy, caps):
    totals = trace_totals(full)
    evicted = 0
    for cap in caps:
        ref = replay_one(full, policy, cap, totals=totals, progress=False)
        got = replay_one(CompactTrace(iter(full)), policy, cap, totals=totals, progress=False)
        ref.pop("replay_seconds"), got.pop("replay_seconds")
        assert got == ref, cap
        evicted += ref["evictions"]
    assert evicted


def _caps(full):
    u = trace_totals(full).unique_blocks
    return sorted({2, 3, 4, 5, 8, u // 7 or 2, u // 3 or 2, u // 2 or 2, u, 2 * u})


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(12))
def test_random_forests_replay_exactly(seed, policy):
    requests = _forest(seed)
    full = compile_trace(requests, None, "prefix")
    assert CompactTrace(iter(full)).one_chain
    _compare(full, policy, _caps(full) + ([1] if policy == "lru" else []))


@pytest.mark.parametrize("seed", range(6))
def test_vllm_copies_answer_lookups_oldest_first(seed):
    """Half the requests repeat an earlier prompt: keys with several copies, evicted and
    looked up in every order, at every capacity from 2 blocks to all of them."""
    full = compile_trace(_forest(seed, n=200, repeat=0.5), None, "prefix")
    u = trace_totals(full).unique_blocks
    _compare(full, "vllm", sorted({2, *range(3, u + 3, max(1, u // 25))}))


def _mid_partial(tail: int, n: int = 30) -> list[Request]:
    """One chain per request in segment keying (no reusable segment restarts it), with a
    partial block before the last: each segment is cut into blocks from its own start (tokens
    4, 1, 4, 3 with ``tail`` 7; 4, 1, 1 with ``tail`` 1, two partial blocks in one run)."""

    def segs(i: int) -> list:
        return [seg(T.USER_QUERY, 5, f"q{i % 4}"), seg(T.USER_QUERY, tail, f"a{i % 3}")]

    return [Request(f"r{i}", float(i), segs(i)) for i in range(n)]


@pytest.mark.parametrize("tail", [7, 1])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_partial_block_mid_request_keeps_vllm_block_by_block(policy, tail):
    """vLLM hashes the full blocks after a partial one, which no lookup reaches: the node
    replay does not model that, so such a trace replays vllm block by block (and lru, which
    caches partial blocks, by node); the rows are the block replay's either way."""
    from skv.cache.node_replay import replays

    full = compile_trace(_mid_partial(tail), 4, "segment")
    ct = CompactTrace(iter(full))
    assert ct.one_chain and any(t != 4 for rb in full for t in rb.tokens[:-1])
    assert replays(ct, vllm=policy == "vllm") == (policy == "lru")
    _compare(full, policy, [2, 3, 5, 9])
    if policy == "vllm":
        with pytest.raises(ValueError, match="partial blocks last"):
            NodeReplay(5, vllm=True).replay(ct)


def test_the_forests_make_vllm_copies():
    """The duplicates path runs: block-aligned prompts' capped last blocks are cached again
    while their key is, up to three blocks for one key (``VllmBlockPool``)."""
    from skv.policies.registry import make_cache

    full = compile_trace(_forest(0), None, "prefix")
    pool = make_cache("vllm", 10**6)
    most = 0
    for rb in full:
        pool.access(rb, rb.arrival_s)
        most = max([most, *(len(pool.holders(k)) for k in rb.keys)])
    assert most >= 3


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("make", "salt"),
    [(_hash_id_sessions, False), (_hash_id_sessions, True), (_content_keyed, False)],
    ids=["sessions", "sessions-salted", "content"],
)
def test_session_and_content_traces_replay_exactly(make, salt, policy):
    full, _ = _both(make, "prefix", salt)
    _compare(full, policy, _caps(full))


def test_replay_one_uses_nodes_for_lru_and_vllm_on_a_prefix_compact_trace(monkeypatch):
    """The node replay is what ``skv replay`` runs for lru and vllm (so its speed is what users
    get); segment keying, parameters, another policy or a list keep the block replay."""
    import skv.replay as replay_module

    made = []

    class Spy(NodeReplay):
        def __init__(self, cap, **kw):
            made.append((cap, kw["vllm"]))
            super().__init__(cap, **kw)

    monkeypatch.setattr(replay_module, "NodeReplay", Spy)
    full, ct = _both(_hash_id_sessions, "prefix", False)
    replay_one(ct, "lru", 9, progress=False)
    replay_one(ct, "vllm", 9, progress=False)
    assert made == [(9, False), (9, True)]
    replay_one(full, "lru", 9, progress=False)
    replay_one(ct, "fifo", 9, progress=False)
    replay_one(ct, "vllm", 9, params={"eviction": "lru"}, progress=False)
    _, seg_ct = _both(_content_keyed, "segment", False)
    assert not seg_ct.one_chain
    replay_one(seg_ct, "lru", 9, progress=False)
    assert made == [(9, False), (9, True)]


def test_what_it_cannot_replay_is_refused():
    _, seg_ct = _both(_content_keyed, "segment", False)
    with pytest.raises(ValueError, match="one chain per request"):
        NodeReplay(10).replay(seg_ct)
    _, ct = _both(_hash_id_sessions, "prefix", False)
    cache = NodeReplay(10)
    cache.replay(ct, 0, 5)
    with pytest.raises(ValueError, match="continues at request 5"):
        cache.replay(ct, 7, 9)
    with pytest.raises(ValueError, match="one trace"):
        cache.replay(CompactTrace(iter(ct)), 5, 6)
    with pytest.raises(ValueError, match=">= 1"):
        NodeReplay(0)
    with pytest.raises(ValueError, match="null block"):
        NodeReplay(1, vllm=True)


@pytest.mark.parametrize("vllm", [False, True])
def test_chunked_calls_equal_one_call(vllm):
    _, ct = _both(_hash_id_sessions, "prefix", False)
    one, chunked = NodeReplay(17, vllm=vllm), NodeReplay(17, vllm=vllm)
    one.replay(ct)
    for a in range(0, len(ct), 6):
        chunked.replay(ct, a, min(a + 6, len(ct)))
    assert one.stats == chunked.stats and len(one) == len(chunked) <= 17


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cache_holds_what_the_block_replay_holds(policy):
    """Beyond the counters: after the same requests both caches hold the same keys."""
    from skv.policies.registry import make_cache

    full = compile_trace(_forest(3), None, "prefix")
    ct = CompactTrace(iter(full))
    for cap in (5, 23, 60):
        block = make_cache(policy, cap)
        block.replay(full, 0, len(full))
        node = NodeReplay(cap, vllm=policy == "vllm")
        node.replay(ct)
        keys = block.cached if policy == "vllm" else block.blocks
        assert len(node) == len(block) > 0
        assert all(key in node for key in keys) and sum(k in node for k in keys) == len(keys)


REAL = ["weka_cc", "mooncake/conversation_trace.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", REAL)
def test_real_traces_replay_exactly(name, policy):
    root = trace_dir()
    if root is None or not (root / name).exists():
        pytest.skip(f"real trace {name} not present (see skv.traces.trace_dir)")
    full = compile_trace(load_trace(root / name), None, "prefix")
    assert CompactTrace(iter_blocks(load_trace(root / name), None, "prefix")).one_chain
    u = trace_totals(full).unique_blocks
    _compare(full, policy, [max(2, int(u * f)) for f in (0.003, 0.03, 0.3)])
