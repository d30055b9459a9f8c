"""Small builders shared by the cache, pool, property, replay, KV-event, router and claims
tests."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from skv.blocks import RequestBlocks
from skv.model import TYPE_INDEX, Request, Segment, SemanticType, content_hash
from skv.policies.registry import OFFLINE, POLICIES, make_cache
from skv.replay import annotate_next_use

#: policies whose class may not be written yet; a missing module skips, never a broken one
ALWAYS_PRESENT = frozenset({"lru", "vllm"})
RADIX_POLICIES = [n for n in POLICIES if n != "vllm"]
ONLINE_POLICIES = [n for n in POLICIES if n not in OFFLINE]


def rb(
    keys: Sequence[int],
    *,
    parents: Sequence[int | None] | None = None,
    tokens: Sequence[int] | None = None,
    stypes: Sequence[SemanticType] | None = None,
    block_size: int = 4,
    index: int = 0,
    arrival_s: float = 0.0,
    seg_tokens: Sequence[int] | None = None,
    session: str | None = None,
) -> RequestBlocks:
    """A hand-made request: one prefix chain over ``keys`` of full blocks unless told otherwise
    (``seg_tokens``: each block's segment length, default its own tokens)."""
    keys = list(keys)
    n = len(keys)
    if parents is None:
        parents = [None, *keys[:-1]] if keys else []
    tokens = [block_size] * n if tokens is None else list(tokens)
    st = [SemanticType.UNKNOWN] * n if stypes is None else list(stypes)
    return RequestBlocks(
        index=index,
        arrival_s=arrival_s,
        keys=keys,
        parents=list(parents),
        tokens=tokens,
        stypes=[TYPE_INDEX[t] for t in st],
        seg_tokens=list(tokens) if seg_tokens is None else list(seg_tokens),
        session=session,
        turn=0,
        templated=False,
        block_size=block_size,
    )


def check_tree(cache: Any) -> None:
    """A ``BlockCache``'s tree is closed: every cached block's parent is cached, child counts
    match, so leaf-only eviction never left a block without its chain."""
    children: dict[int, int] = {}
    for b in cache.blocks.values():
        if b.parent is not None:
            assert cache.blocks.get(b.parent.key) is b.parent, f"{b} cached without its parent"
            children[b.parent.key] = children.get(b.parent.key, 0) + 1
    for b in cache.blocks.values():
        assert b.n_children == children.get(b.key, 0), f"{b}: wrong child count"


def seg(stype: SemanticType, num_tokens: int, name: str, **kw: Any) -> Segment:
    """A segment whose content identity is ``name``."""
    return Segment(stype, num_tokens, content_hash=content_hash(name), **kw)


def req(*segments: Segment, request_id: str = "r", arrival_s: float = 0.0, **kw: Any) -> Request:
    return Request(request_id=request_id, arrival_s=arrival_s, segments=list(segments), **kw)


def require_policy(name: str) -> None:
    """Skip when the policy's own module is not written yet; anything else is a failure."""
    module = POLICIES[name].split(":")[0]
    try:
        make_cache(name, 4)
    except ModuleNotFoundError as exc:
        if name in ALWAYS_PRESENT or exc.name != module:
            raise
        pytest.skip(f"policy {name!r}: module {module} not written yet")


def new_cache(name: str, capacity: int, trace: Sequence[RequestBlocks] = (), **opts: Any) -> Any:
    """A cache for ``name``; offline policies get ``trace`` annotated and prepared."""
    require_policy(name)
    cache = make_cache(name, capacity, **opts)
    if name in OFFLINE:
        if trace and trace[0].next_use is None:
            annotate_next_use(trace)
        cache.prepare(trace)
    return cache


class KVPublisher:
    """vLLM's side of KV events: a ZMQ PUB bound on ``endpoint``; [topic, seq, payload]."""

    def __init__(self, endpoint: str, topic: str = "kv") -> None:
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.topic = topic
        self.seq = 0

    def send(self, events: Sequence[Any], *, positional: bool = False, seq: int | None = None):
        from skv.vllm.kv_events import encode_events

        if seq is not None:
            self.seq = seq
        payload = encode_events(events, positional=positional)
        self.sock.send_multipart([self.topic.encode(), self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def close(self) -> None:
        self.sock.close(0)


_WORDS = (
    "cache",
    "block",
    "token",
    "prefix",
    "engine",
    "segment",
    "tool",
    "system",
    "prompt",
    "query",
    "answer",
    "memory",
    "eviction",
    "policy",
    "request",
    "tenant",
    "document",
    "code",
    "function",
    "value",
    "key",
    "attention",
    "layer",
    "head",
    "batch",
    "stream",
)


def words(n_words: int, seed: int) -> str:
    """Reproducible filler: ``n_words`` words (about 2.5 tokens each with the tiny tokenizer)."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def serve_app(app: Any):
    """Run an ASGI ``app`` under uvicorn on 127.0.0.1 (a free port) in a thread; yields its URL."""
    from skv.services._common import serve_in_thread

    return serve_in_thread(app)


@contextmanager
def running_engine(model: Path, python: Path, log_dir: Path, **kw: Any) -> Iterator[Any]:
    """A real vLLM server on ``model`` (``VllmServer`` options in ``kw``), started and, however
    the block ends, stopped with its whole process group. ``SKV_VLLM_STARTUP_TIMEOUT`` (s)
    bounds the start (default 600: a loaded 2-core machine can take minutes)."""
    from skv.vllm.server import VllmServer

    srv = VllmServer(
        model,
        python=python,
        log_path=Path(log_dir) / "server.log",
        startup_timeout=float(os.environ.get("SKV_VLLM_STARTUP_TIMEOUT", "600")),
        **kw,
    )
    try:
        srv.start()
        print(f"vLLM ready in {srv.ready_seconds:.1f} s at {srv.base_url} (log {srv.log_path})")
        yield srv
    finally:
        srv.close()
        assert not srv.is_running()


def wait_until(pred: Any, what: str, timeout: float = 10.0) -> None:
    """Poll ``pred()`` until true; fail naming ``what`` after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def make_claim(**over: Any) -> Any:
    """A valid claim (:class:`skv.artifact.claims.Claim`, deterministic, with a quick
    expectation) with the fields in ``over`` replaced."""
    from skv.artifact.claims import Claim

    base = {
        "id": "x",
        "text": "t",
        "compares": "a minus b",
        "source": "measured",
        "source_note": "why",
        "step": "fig_hit_rate_mooncake",
        "value": "v",
        "unit": "points",
        "expected": 1.0,
        "tolerance": 0.5,
        "tolerance_basis": "deterministic",
        "quick": {"expected": 2.0, "tolerance": 0.1},
    }
    return Claim.model_validate({**base, **over})


def json_paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every key/index path in a JSON document (the fuzz tests mutate one at a time)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from json_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from json_paths(v, (*prefix, i))


#: libCacheSim: next access vtime of an object not requested again
LCS_NEVER = 1 << 62


def flat_trace(keys: Sequence[int]) -> list[RequestBlocks]:
    """One single-block request per access, each block its own chain root: an object cache's
    view of ``keys`` (tests/test_libcachesim.py; ``skv replay --mode flat`` builds its
    equivalent with :func:`skv.replay.flatten`)."""
    return [
        RequestBlocks(i, float(i), [key], [None], [1], [0], [1], None, 0, False, 1)
        for i, key in enumerate(keys)
    ]


def skv_misses(policy: str, trace: Sequence[RequestBlocks], size: int) -> int:
    """Block misses of skv's ``policy`` over ``trace`` at ``size`` blocks (offline policies
    prepared by :func:`new_cache`)."""
    cache = new_cache(policy, size, trace)
    for r in trace:
        cache.access(r, r.arrival_s)
    assert cache.stats.blocks == sum(len(r.keys) for r in trace)  # every access counted
    return cache.stats.blocks - cache.stats.hit_blocks


def lcs_misses(algo: str, keys: Sequence[int], size: int) -> int:
    """libCacheSim's ``algo`` (a class of the ``libcachesim`` package, a test-only dependency)
    driven request by request over ``keys``: objects of size 1, a cache of ``size`` objects,
    logical time = access index, next-access times filled for Belady. Keys must fit a uint64
    after +1 (libCacheSim reserves id 0)."""
    import libcachesim as lcs

    next_access = [LCS_NEVER] * len(keys)
    seen: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        next_access[i] = seen.get(keys[i], LCS_NEVER)
        seen[keys[i]] = i
    cache = getattr(lcs, algo)(size)
    misses = 0
    for i, key in enumerate(keys):
        req = lcs.Request()
        req.obj_id = key + 1
        req.obj_size = 1
        req.clock_time = i
        req.next_access_vtime = next_access[i]
        if not cache.get(req):
            misses += 1
    return misses
