"""Cut a request's prompt into KV blocks and give each block a cache key.

Keying modes:
- ``prefix``: a block's key chains its parent's key (vLLM: hash(parent_hash, tokens, extras)),
  so a block is found only after exactly the same prefix. Blocks are cut at fixed multiples of
  ``block_size`` over the whole prompt.
- ``segment``: each reusable segment (see ``Segment.is_reusable``) is cut from its own start and
  its chain restarts from a fixed root, so the same document is found after a different system
  prompt (position-independent reuse). Non-reusable segments continue the previous chain.

A tenant salt (vLLM ``cache_salt``) enters the root of every chain, which isolates tenants.

Keys are Python ints from tuple hashes of ints, which CPython computes deterministically
(no hash randomisation for ints), so runs are reproducible across processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum

import cython

from skv.model import TYPE_INDEX, Request, Segment, SemanticType

ROOT_SEED = 0x5EED_5EED_5EED
#: vLLM's default on GPU; hash-id traces bring their own
DEFAULT_BLOCK_SIZE = 16
_MASK64 = (1 << 64) - 1


class KeyingMode(StrEnum):
    PREFIX = "prefix"
    SEGMENT = "segment"


class RequestBlocks:
    """The hot-loop view of one request: parallel per-block lists of plain ints.

    ``parents[i]`` is the key of the block before ``i`` in its chain, or ``None`` when block ``i``
    starts a chain (a lookup run restarts there). ``seg_tokens[i]`` is the size of the segment
    the block belongs to (a cost signal for size-aware policies). ``next_use[i]`` is the index of
    the next request that uses the same key (filled for offline policies only).
    """

    def __init__(
        self,
        index: int,
        arrival_s: float,
        keys: list,
        parents: list,
        tokens: list,
        stypes: list,
        seg_tokens: list,
        session: str | None,
        turn: int,
        templated: bool,
        block_size: int,
        next_use: list | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.keys = keys
        self.parents = parents
        self.tokens = tokens
        self.stypes = stypes
        self.seg_tokens = seg_tokens
        self.session = session
        self.turn = turn
        self.templated = templated
        self.block_size = block_size
        # the whole prompt, which can exceed the blocks' tokens when a trace hashes only full
        # blocks (the unhashed tail is always computed, never hit)
        self.prompt_tokens = sum(tokens) if prompt_tokens is None else prompt_tokens
        self.next_use = next_use

    @property
    def num_blocks(self) -> int:
        return len(self.keys)

    def _fields(self) -> tuple:
        return (
            self.index, self.arrival_s, self.keys, self.parents, self.tokens, self.stypes,
            self.seg_tokens, self.session, self.turn, self.templated, self.block_size,
            self.next_use,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestBlocks):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"RequestBlocks(index={self.index}, arrival_s={self.arrival_s}, "
            f"blocks={len(self.keys)}, prompt_tokens={self.prompt_tokens})"
        )


def _root(tenant_salt: str | None) -> int:
    if tenant_salt is None:
        return ROOT_SEED
    return hash((ROOT_SEED, _int_id(tenant_salt))) & _MASK64


def _int_id(text: str) -> int:
    """A deterministic int from a string (str hashes are randomised per process)."""
    from skv.model import content_hash

    return int(content_hash(text), 16)


def _segment_int_ids(segments: list[Segment]) -> list[int]:
    out = []
    for seg in segments:
        if seg.content_hash is None:
            raise ValueError(
                f"segment of type {seg.stype} has no content_hash; cannot key it by content"
            )
        out.append(int(seg.content_hash, 16))
    return out


def request_blocks(
    request: Request,
    block_size: int,
    mode: KeyingMode | str = KeyingMode.PREFIX,
    *,
    index: int = 0,
    salt_by_tenant: bool = False,
    chains: dict | None = None,
    segment_keys: dict | None = None,
) -> RequestBlocks:
    """Turn a request into blocks with keys; see the module docstring for the keying rules.

    ``chains``: a dict shared across the calls for one trace (``compile_trace`` passes one),
    holding each session's last hash-id chain: a turn that repeats its session's previous
    prompt copies those keys instead of hashing them again (prefix keying; the keys are the
    same either way, since a prefix key depends only on the root and the ids up to it).
    ``segment_keys``: likewise shared, the keys of each segment that restarts a chain
    (segment keying: they depend only on the root, the segment and the block size), so a
    document seen before is not hashed again."""
    if mode.__class__ is not KeyingMode:
        mode = KeyingMode(mode)
    salt = request.tenant_id if salt_by_tenant else None
    prompt = request.prompt_tokens
    if request.hash_ids is not None:
        keys, parents, tokens, stypes, seg_tokens = _hash_id_blocks(
            request, block_size, mode, salt, chains, prompt
        )
        block_size = request.hash_block_size or block_size
    elif mode is KeyingMode.PREFIX:
        keys, parents, tokens, stypes, seg_tokens = _prefix_blocks(request, block_size, salt)
    else:
        keys, parents, tokens, stypes, seg_tokens = _segment_blocks(
            request, block_size, salt, segment_keys
        )
    return RequestBlocks(
        index=index,
        arrival_s=request.arrival_s,
        keys=keys,
        parents=parents,
        tokens=tokens,
        stypes=stypes,
        seg_tokens=seg_tokens,
        session=request.session_id,
        turn=request.turn or 0,
        templated=request.templated,
        block_size=block_size,
        prompt_tokens=max(prompt, sum(tokens)),
    )


def resolve_block_size(block_size: int | None, request: Request | None = None) -> int:
    """The one block-size rule: the size asked for, else a hash-id trace's own, else the default.

    Replay, the simulator and timed replay all cut requests with it, so they see the same keys.
    """
    if block_size:
        return block_size
    if request is not None and request.hash_block_size:
        return request.hash_block_size
    return DEFAULT_BLOCK_SIZE


def compile_trace(
    requests: Sequence[Request],
    block_size: int | None = None,
    mode: KeyingMode | str = KeyingMode.PREFIX,
    *,
    salt_by_tenant: bool = False,
) -> list[RequestBlocks]:
    """Blocks and keys for every request, in the given order (``index`` = position).

    ``block_size=None`` takes a hash-id trace's own block size, else ``DEFAULT_BLOCK_SIZE``.
    """
    return list(iter_blocks(requests, block_size, mode, salt_by_tenant=salt_by_tenant))


def iter_blocks(
    requests: Iterable[Request],
    block_size: int | None = None,
    mode: KeyingMode | str = KeyingMode.PREFIX,
    *,
    salt_by_tenant: bool = False,
) -> Iterator[RequestBlocks]:
    """:func:`compile_trace` one request at a time (a consumer that keeps less than every
    request's lists, such as ``skv.compact_trace.CompactTrace``, stays small)."""
    chains: dict = {}
    segment_keys: dict = {}
    mode = KeyingMode(mode)
    for i, r in enumerate(requests):
        yield request_blocks(
            r,
            resolve_block_size(block_size, r),
            mode,
            index=i,
            salt_by_tenant=salt_by_tenant,
            chains=chains,
            segment_keys=segment_keys,
        )


def retimed(trace: Sequence[RequestBlocks], arrivals: Sequence[float]) -> list[RequestBlocks]:
    """``trace``'s blocks at new arrival times (``arrivals[i]`` for ``trace[i]``, as many as
    there are times): each a new ``RequestBlocks`` equal to ``trace[i]`` but for ``arrival_s``,
    sharing its lists (the caller mutates none of them). Field by field in one compiled loop:
    what ``RequestBlocks(index, t, keys, ..., next_use, prompt_tokens)`` builds, without the
    call's argument passing."""
    if len(arrivals) > len(trace):
        raise ValueError(f"retimed: {len(arrivals)} times for {len(trace)} requests")
    out = []
    rb: RequestBlocks
    new: RequestBlocks
    for rb, t in zip(trace, arrivals, strict=False):
        new = RequestBlocks.__new__(RequestBlocks)
        new.index = rb.index
        new.arrival_s = t
        new.keys = rb.keys
        new.parents = rb.parents
        new.tokens = rb.tokens
        new.stypes = rb.stypes
        new.seg_tokens = rb.seg_tokens
        new.session = rb.session
        new.turn = rb.turn
        new.templated = rb.templated
        new.block_size = rb.block_size
        new.prompt_tokens = rb.prompt_tokens
        new.next_use = rb.next_use
        out.append(new)
    return out


def tally_blocks(
    rb: RequestBlocks, seen: set, tokens_by_type: list, blocks_by_type: list
) -> tuple[int, int]:
    """Count ``rb``'s blocks into the per-type totals and its keys into ``seen``; returns the
    (blocks, tokens) an infinite cache would hit: a block hits when its key was seen before and
    every block since its chain root hit (a key repeated within one request hits, as in the
    cache). The per-access loop of every trace summary (``replay.trace_totals``), compiled."""
    keys: list = rb.keys
    parents: list = rb.parents
    tokens: list = rb.tokens
    stypes: list = rb.stypes
    n: cython.Py_ssize_t = len(keys)
    i: cython.Py_ssize_t
    hits: cython.longlong = 0
    hit_tokens: cython.longlong = 0
    tok: cython.longlong
    st: cython.Py_ssize_t
    run_type: cython.Py_ssize_t = -1  # the per-type totals take a run of one type at once
    run_tokens: cython.longlong = 0
    run_blocks: cython.longlong = 0
    in_run: cython.bint = False
    for i in range(n):
        tok = tokens[i]
        st = stypes[i]
        if st != run_type:
            if run_blocks:
                tokens_by_type[run_type] += run_tokens
                blocks_by_type[run_type] += run_blocks
            run_type, run_tokens, run_blocks = st, 0, 0
        run_tokens += tok
        run_blocks += 1
        if parents[i] is None:
            in_run = True
        key = keys[i]
        if in_run and key in seen:
            hits += 1
            hit_tokens += tok
        else:
            in_run = False
            seen.add(key)
    if run_blocks:
        tokens_by_type[run_type] += run_tokens
        blocks_by_type[run_type] += run_blocks
    return hits, hit_tokens


def annotate_next_use(trace: Sequence[RequestBlocks]) -> None:
    """Fill ``next_use``: for each block access, the index of the next request using that key.

    Lives here, below both replay and the offline policies (``belady``) that need it.
    """
    never = len(trace) + 1
    upcoming: dict[int, int] = {}
    for rb in reversed(trace):
        nu = []
        for key in rb.keys:
            nu.append(upcoming.get(key, never))
        for key in rb.keys:
            upcoming[key] = rb.index
        rb.next_use = nu


def _prefix_blocks(request: Request, block_size: int, salt: str | None):
    """Fixed block boundaries over the whole prompt; key = hash(parent, content pieces)."""
    segs = request.segments
    ids = _segment_int_ids(segs)
    keys: list[int] = []
    parents: list[int | None] = []
    tokens: list[int] = []
    stypes: list[int] = []
    seg_tokens: list[int] = []
    parent: int | None = None
    prev = _root(salt)
    pieces: list[tuple[int, int, int]] = []
    fill = 0
    first_seg: Segment | None = None
    for seg, sid in zip(segs, ids, strict=True):
        off = 0
        while off < seg.num_tokens:
            take = min(block_size - fill, seg.num_tokens - off)
            if fill == 0:
                first_seg = seg
            pieces.append((sid, off, off + take))
            off += take
            fill += take
            if fill == block_size:
                key = hash((prev, tuple(pieces))) & _MASK64
                keys.append(key)
                parents.append(parent)
                tokens.append(fill)
                assert first_seg is not None
                stypes.append(TYPE_INDEX[first_seg.stype])
                seg_tokens.append(first_seg.num_tokens)
                parent = prev = key
                pieces = []
                fill = 0
    if fill:
        assert first_seg is not None
        key = hash((prev, tuple(pieces))) & _MASK64
        keys.append(key)
        parents.append(parent)
        tokens.append(fill)
        stypes.append(TYPE_INDEX[first_seg.stype])
        seg_tokens.append(first_seg.num_tokens)
    return keys, parents, tokens, stypes, seg_tokens


def _segment_blocks(request: Request, block_size: int, salt: str | None, memo: dict | None = None):
    """Segment-aligned blocks; reusable segments restart the chain from the (salted) root.
    ``memo``: (root, segment id, tokens, block size) -> the keys of a restarting segment."""
    root = _root(salt)
    keys: list[int] = []
    parents: list[int | None] = []
    tokens: list[int] = []
    stypes: list[int] = []
    seg_tokens: list[int] = []
    prev: int | None = None
    for seg, sid in zip(request.segments, _segment_int_ids(request.segments), strict=True):
        restart = prev is None or seg.is_reusable()
        parent: int | None = None if restart else prev
        chain = root if restart else prev
        st = TYPE_INDEX[seg.stype]
        n_tok = seg.num_tokens
        known = memo.get((root, sid, n_tok, block_size)) if restart and memo is not None else None
        if known is not None:
            nb = len(known)
            keys += known
            parents.append(None)
            parents += known[: nb - 1]
            tokens += [block_size] * (nb - 1)
            tokens.append(n_tok - block_size * (nb - 1))
            stypes += [st] * nb
            seg_tokens += [n_tok] * nb
            chain = known[nb - 1]
        else:
            first = len(keys)
            for off in range(0, n_tok, block_size):
                n = min(block_size, n_tok - off)
                key = hash((chain, sid, off, n)) & _MASK64
                keys.append(key)
                parents.append(parent)
                tokens.append(n)
                stypes.append(st)
                seg_tokens.append(n_tok)
                parent = chain = key
            if restart and memo is not None and n_tok:
                memo[(root, sid, n_tok, block_size)] = keys[first:]
        prev = chain if n_tok else prev
    return keys, parents, tokens, stypes, seg_tokens


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading equal elements of two id lists (the trace readers use it too)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, one prompt extends the other: compared in C
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _hash_id_blocks(
    request: Request,
    block_size: int,
    mode: KeyingMode,
    salt: str | None,
    chains: dict | None = None,
    prompt: int | None = None,
):
    """Blocks straight from a trace's hash ids; a block takes the type of its first token.
    ``chains``: see :func:`request_blocks`; ``prompt``: the request's prompt tokens (None:
    summed here)."""
    bs = request.hash_block_size or block_size
    if request.hash_block_size and block_size and block_size != request.hash_block_size:
        raise ValueError(
            f"request {request.request_id}: trace blocks are {request.hash_block_size} tokens; "
            f"block_size={block_size} cannot re-cut hash ids (use the trace's block size)"
        )
    hids: list = request.hash_ids or []
    n: cython.Py_ssize_t = len(hids)
    i: cython.Py_ssize_t
    if prompt is None:
        prompt = request.prompt_tokens
    root = _root(salt)
    segs = request.segments or [Segment(SemanticType.UNKNOWN, prompt)]
    # block i starts at token i * bs and takes the type of the last segment starting at or
    # before it: segment j owns the blocks starting in [start_j, start_j+1), so types and
    # sizes are filled a segment at a time and only the keys cost a step per block
    stypes: list[int] = []
    seg_tokens: list[int] = []
    restarts: list[int] = []  # blocks that start a chain (segment keying: reusable segments)
    segment_mode = mode is KeyingMode.SEGMENT
    acc = 0
    first = 0
    prev_seg: Segment | None = None
    for j in range(len(segs)):
        seg = segs[j]
        acc += seg.num_tokens
        end = n if j == len(segs) - 1 else min(n, -(-acc // bs))  # blocks starting before acc
        if end > first:
            count = end - first
            stypes += [TYPE_INDEX[seg.stype]] * count
            seg_tokens += [seg.num_tokens] * count
            if segment_mode and first and seg is not prev_seg and seg.is_reusable():
                restarts.append(first)
            prev_seg = seg
            first = end
    keys: list[int] = []
    known = 0  # leading keys copied from the session's previous chain
    memo = None
    if chains is not None and not segment_mode and request.session_id is not None:
        memo = (request.session_id, salt)  # a key depends on the root and the ids only
        prev = chains.get(memo)
        if prev is not None:
            known = common_prefix_len(hids, prev[0])
            keys = prev[1][:known]
    chain = keys[known - 1] if known else root
    mask = _MASK64
    if not restarts:  # prefix keying: one chain (the common case, kept tight)
        for i in range(known, n):
            chain = hash((chain, hids[i])) & mask
            keys.append(chain)
    else:
        nxt = restarts[0]
        r = 0
        for i in range(known, n):
            if i == nxt:
                chain = root
                r += 1
                nxt = restarts[r] if r < len(restarts) else n
            chain = hash((chain, hids[i])) & mask
            keys.append(chain)
    if memo is not None:
        chains[memo] = (hids, keys)
    parents: list[int | None] = [None, *keys[: n - 1]] if n else []
    for i in restarts:
        parents[i] = None
    tokens = [bs] * n
    if n:
        tokens[n - 1] = max(1, min(bs, prompt - bs * (n - 1)))
    return keys, parents, tokens, stypes, seg_tokens
