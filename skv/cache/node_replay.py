"""``lru`` and ``vllm`` replayed a radix node at a time: a request costs O(log n + nodes it
crosses + blocks it inserts or evicts), not O(blocks it touches).

:class:`skv.cache.radix.BlockCache` with :class:`skv.policies.lru.LRU`, and
:class:`skv.cache.vllm_pool.VllmBlockPool`, touch every block of a request: a Claude Code turn
re-reads ~95% of its session's previous prompt, so almost all of that work is hits that change
nothing but recency. :class:`NodeReplay` makes the same choices as either (a test compares every
result field with the block replay's, on synthetic and real traces) for traces in prefix keying
(one chain per request, from its first block; :attr:`CompactTrace.one_chain`), replayed as
``skv replay`` does: each request acquires and releases its blocks at once.

Why both orders have this structure. Both are in release order, each request's blocks tail
first (the lru list; vLLM's free queue of cached blocks), and a hit on a block is a hit on its
whole chain above it. Call a block's *owner* the last request that touched it. Then:

1. The cached keys of a chain are a prefix of it (a parent is always more recent than its
   children, so eviction from the front takes children first), so a request's hits are the
   longest cached prefix of its keys, found by binary search: O(log n) lookups.
2. A request ``r`` owns a contiguous range of its own chain, ``[x, h)``: a later request that
   touches one of ``r``'s blocks touches the whole prefix above it (``x`` only grows), and
   eviction takes ``r``'s blocks from the deep end (``h`` only shrinks).
3. The victim is the deepest owned block of the oldest owner that owns any: the order is by
   owner's release, then deepest first (tail first).

So the state is a forest of *nodes*, runs of one chain ``[lo, hi)`` with one owner; each owner
keeps its nodes root to leaf (new owners take them from the shallow end, eviction takes blocks
from the deep end), and a queue holds the owners in release order. A request's hit path is
walked node by node from its deepest hit (one split where the hit ends inside a node); its new
blocks are one new node. While a request is being served its nodes belong to no queued owner,
which is pinning: eviction cannot reach them, as the block replays skip pinned blocks.

Each key maps to the node it was inserted into; a split leaves the deeper part in that node and
the shallower part in a new parent, so a key is resolved by walking up from the node it maps to
until the node's range holds its depth (then the map is updated: path compression). Hit tokens
and types are summed from the trace's run-length encoding, O(runs) per request.

vLLM's pool differs in four ways, each kept (``vllm=True``): one of the ``capacity_blocks`` is
the null block; a hit is capped at ``prompt_len - 1`` tokens, block-aligned, so a block-aligned
prompt recomputes its last block and caches it again as a duplicate (a key with several copies
stays cached until its last copy goes; a lookup uses the oldest copy); only full blocks are
cached, and a freed partial block goes to the front of the free queue, so it is reused before
any cached block is evicted (only a count is kept); and nothing is evicted until a new block
needs the physical block, so the cache fills the whole pool. A duplicate is always its owner's
deepest block (the capped block ends its chain), so claims 1-3 still hold.
"""

from __future__ import annotations

from array import array
from collections import deque

import cython

from skv.cache.block import CacheStats, Counters, GhostList
from skv.compact_trace import CompactTrace


def replays(trace: object, *, vllm: bool = False) -> bool:
    """Whether :class:`NodeReplay` can replay ``trace``: a :class:`CompactTrace` of one chain
    per request, and for vllm no partial block before a request's last (segment keying can cut
    one there; vLLM hashes the full blocks after it, which no lookup reaches)."""
    if not isinstance(trace, CompactTrace) or not trace.one_chain:
        return False
    return not vllm or trace.partial_blocks_last


class _Node:
    """Depths ``[lo, hi)`` of one chain; the key at depth ``d`` is ``keys[d - base]``."""

    def __init__(self, lo: cython.longlong, hi: cython.longlong, base: cython.longlong,
                 keys: object, stypes: object, parent: object) -> None:  # fmt: skip
        self.lo = lo
        self.hi = hi
        self.base = base
        self.keys = keys
        self.stypes = stypes
        self.parent = parent
        self.owner = None


class _Owner:
    """A request's nodes, root to leaf: ``nodes[head:]`` (taken from the left by later
    requests, from the right by eviction)."""

    def __init__(self) -> None:
        self.nodes = []
        self.head = 0


class NodeReplay:
    """The ``lru`` block cache, or with ``vllm`` vLLM's block pool, as radix nodes; see the
    module docstring. ``replay`` only."""

    def __init__(self, capacity_blocks: int, *, vllm: bool = False, policy: object = None) -> None:
        """``policy``: the lru policy object whose choices these are, for its ``params()`` in
        the results (never consulted; the cache does not import policies)."""
        if capacity_blocks < (2 if vllm else 1):
            raise ValueError(
                f"vllm needs >= 2 blocks (one is the null block), got {capacity_blocks}"
                if vllm
                else f"capacity_blocks must be >= 1, got {capacity_blocks}"
            )
        self.capacity_blocks = capacity_blocks
        self.vllm = vllm
        self.name = "vllm" if vllm else "lru"
        self.policy = policy
        self.ghost = GhostList(0)  # neither learns from evicted keys
        self.counters = Counters()
        self._where = {}  # key -> the node it was inserted into (or one below its node)
        self._copies = {}  # vllm: key -> nodes holding later copies of it, oldest first
        self._n_copies = 0
        self._unhashed = capacity_blocks - 1  # vllm: free blocks with no hash (at the front)
        self._pinned = 0  # vllm: blocks the request being served holds
        self._queue = deque()  # owners in release order, oldest first
        self._live = {}  # request index -> its keys (array 'Q'), until its successor takes it
        self._trace = None
        self._cursor = 0
        self._cols = None
        self._new_keys = None
        self._tv = self._tl = self._sv = self._sl = None  # the token and type runs, as lists

    def __len__(self) -> int:
        """Cached blocks (for vllm: blocks holding a hash, duplicates included)."""
        return len(self._where) + self._n_copies

    def __contains__(self, key: object) -> bool:
        return key in self._where

    @property
    def stats(self) -> CacheStats:
        return self.counters.snapshot()

    def replay(self, trace: CompactTrace, start: int = 0, stop: int | None = None) -> None:
        """Replay requests ``start..stop-1`` of ``trace``, continuing where the last call ended
        (calls go through one trace in order)."""
        if self._trace is None:
            if not replays(trace, vllm=self.vllm):
                raise ValueError(
                    "NodeReplay needs one chain per request (prefix keying; segment keying "
                    "restarts chains) and for vllm partial blocks last: replay it block by block"
                )
            self._trace = trace
            pred, shared, _, self._new_keys, new_at = trace.key_deltas()
            tv, tl, ta = trace.runs("tokens")
            sv, sl, sa = trace.runs("stypes")
            prompt = trace.per_request("prompt_tokens")
            bs = trace.per_request("block_size")
            # per-request columns and runs as lists (O(requests + runs)); keys stay in numpy
            self._cols = tuple(
                a.tolist() for a in (pred, shared, new_at, tv, tl, ta, sv, sl, sa, prompt, bs)
            )
        elif trace is not self._trace:
            raise ValueError("NodeReplay replays one trace; make a new one for another")
        end = len(trace) if stop is None else stop
        if start != self._cursor:
            raise ValueError(f"NodeReplay continues at request {self._cursor}, not {start}")
        pred: list
        shared: list
        new_at: list
        ta: list
        sa: list
        prompt: list
        bs: list
        pred, shared, new_at, self._tv, self._tl, ta, self._sv, self._sl, sa, prompt, bs = (
            self._cols
        )
        i: cython.Py_ssize_t
        for i in range(start, end):
            keys = self._keys_of(i, pred[i], shared[i], new_at[i], new_at[i + 1])
            self._access(
                keys, shared[i], prompt[i], bs[i], ta[i], ta[i + 1], sa[i], sa[i + 1]
            )  # fmt: skip
        self._cursor = end

    def _keys_of(self, i: int, p: int, s: int, a: int, b: int) -> array:
        """Request ``i``'s keys: its predecessor's array cut to the shared prefix, then its new
        keys ``new_keys[a:b]`` (O(keys changed), not O(keys))."""
        if p < 0:
            keys = array("Q")
        else:
            keys = self._live.pop(p)
            del keys[s:]
        keys.frombytes(self._new_keys[a:b].tobytes())
        self._live[i] = keys
        return keys

    def _access(
        self,
        keys: array,
        hint: cython.Py_ssize_t,
        prompt_tokens: cython.longlong,
        block_size: cython.longlong,
        tok_at: cython.Py_ssize_t,
        tok_end: cython.Py_ssize_t,
        st_at: cython.Py_ssize_t,
        st_end: cython.Py_ssize_t,
    ) -> None:
        """One request (its token runs ``tok_at:tok_end``, type runs ``st_at:st_end``): hits,
        pinned; misses cached (evicting as needed); released."""
        n: cython.Py_ssize_t = len(keys)
        m: cython.Py_ssize_t = self._cached_prefix(keys, hint)
        full: cython.Py_ssize_t = n
        if self.vllm:  # full blocks only, and at most prompt_len - 1 tokens
            full = self._full_blocks(n, block_size, tok_at, tok_end)
            m = min(m, max(0, prompt_tokens - 1) // block_size)  # the cap leaves out a partial
            self._pinned = m
        owner: _Owner = _Owner()
        if m:
            self._take_path(self._node_at(keys, m - 1), m, owner)
        hit_tokens: cython.longlong = self._count_hits(m, tok_at, st_at)
        if m < n:
            self._insert(keys, m, full, owner, _decode(self._sv, self._sl, st_at, st_end, m, n))
        self.counters.request(n, prompt_tokens, m, hit_tokens)
        if len(owner.nodes):
            self._queue.append(owner)

    def _full_blocks(
        self,
        n: cython.Py_ssize_t,
        block_size: cython.longlong,
        tok_at: cython.Py_ssize_t,
        tok_end: cython.Py_ssize_t,
    ) -> cython.Py_ssize_t:
        """The request's full blocks: all but a partial last one (vLLM hashes full blocks only;
        a partial block anywhere else is refused)."""
        full: cython.Py_ssize_t = 0
        k: cython.Py_ssize_t
        for k in range(tok_at, tok_end):
            if self._tv[k] != block_size:
                if full + self._tl[k] != n or self._tl[k] != 1:
                    raise ValueError("vllm: a partial block before a request's last block")
                return full
            full += self._tl[k]
        return full

    def _cached_prefix(self, keys: array, hint: cython.Py_ssize_t) -> cython.Py_ssize_t:
        """How many leading keys are cached (claim 1: they are a prefix). ``hint``, the keys
        shared with the predecessor, is tried first: usually the answer."""
        where: dict = self._where
        lo: cython.Py_ssize_t = 0
        hi: cython.Py_ssize_t = len(keys)
        mid: cython.Py_ssize_t
        if 0 < hint <= hi:
            if keys[hint - 1] in where:
                lo = hint
            else:
                hi = hint - 1
            if lo == hint and hint < hi:
                if keys[hint] in where:
                    lo = hint + 1
                else:
                    hi = hint
        while lo < hi:
            mid = (lo + hi) >> 1
            if keys[mid] in where:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _node_at(self, keys: array, d: cython.Py_ssize_t) -> _Node:
        """The node holding the cached key at depth ``d`` (for vllm its oldest copy; the map
        entry is updated)."""
        key = keys[d]
        node: _Node = self._where[key]
        start: _Node = node
        while d < node.lo and node.parent is not None:
            node = node.parent
        if not node.lo <= d < node.hi:  # a key at two depths: a 64-bit key collision
            raise AssertionError(f"key {key:#x} at depth {d} maps outside its node")
        if node is not start:
            self._where[key] = node
        return node

    def _take_path(self, node: _Node, m: cython.Py_ssize_t, owner: _Owner) -> None:
        """Give ``owner`` the hit path, depths ``[0, m)``, whose deepest block is in
        ``node``: split ``node`` at ``m``, then take every node above from its old owner."""
        if m < node.hi:  # the deeper part keeps the node (keys map to it) and its owner
            top: _Node = _Node(node.lo, m, node.base, node.keys, node.stypes, node.parent)
            node.lo = m
            node.parent = top
            node = top
        path: list = [node]
        while node.parent is not None:
            node = node.parent
            path.append(node)
        nodes: list = owner.nodes
        j: cython.Py_ssize_t
        p: _Node
        old: _Owner
        for j in range(len(path) - 1, -1, -1):
            p = path[j]
            if p.owner is not None:
                old = p.owner
                if old.nodes[old.head] is not p:
                    raise AssertionError("node order broken: a hit node is not its owner's top")
                old.nodes[old.head] = None
                old.head += 1
            p.owner = owner
            nodes.append(p)

    def _count_hits(
        self, m: cython.Py_ssize_t, tok_at: cython.Py_ssize_t, st_at: cython.Py_ssize_t
    ) -> cython.longlong:
        """Count blocks ``[0, m)`` as hits by type from the two run-length encodings (runs from
        ``tok_at`` and ``st_at``); returns their tokens."""
        tok_vals: list = self._tv
        tok_lens: list = self._tl
        st_vals: list = self._sv
        st_lens: list = self._sl
        total: cython.longlong = 0
        d: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t = tok_at
        j: cython.Py_ssize_t = st_at
        t_end: cython.Py_ssize_t = 0
        s_end: cython.Py_ssize_t = 0
        step: cython.Py_ssize_t
        tok: cython.longlong
        if m:
            t_end = tok_lens[i]
            s_end = st_lens[j]
        while d < m:
            while t_end <= d:
                i += 1
                t_end += tok_lens[i]
            while s_end <= d:
                j += 1
                s_end += st_lens[j]
            step = min(t_end, s_end, m) - d
            tok = tok_vals[i]
            self.counters.hits(st_vals[j], step, step * tok)
            total += step * tok
            d += step
        return total

    def _insert(
        self,
        keys: array,
        m: cython.Py_ssize_t,
        full: cython.Py_ssize_t,
        owner: _Owner,
        stypes: list,
    ) -> None:
        """Cache keys ``m:`` (types ``stypes``) as one new node below the hit path, evicting as
        needed; what cannot be cached (everything else is this request's) is counted uncached.
        vllm: keys ``full:`` (a partial last block) take a block but are not cached; a key
        already cached (the capped block) becomes a copy."""
        n: cython.Py_ssize_t = len(keys)
        new_keys: list = keys[m:].tolist()  # one int object per key, shared with the map
        parent: object = owner.nodes[len(owner.nodes) - 1] if len(owner.nodes) else None
        node: _Node = _Node(m, m, m, new_keys, stypes, parent)
        where: dict = self._where
        vllm: cython.bint = self.vllm
        cap: cython.Py_ssize_t = self.capacity_blocks
        d: cython.Py_ssize_t
        for d in range(m, n):
            if vllm:
                if self._pinned == cap - 1:  # every block is this request's
                    self.counters.uncached += n - d
                    break
                if self._unhashed:
                    self._unhashed -= 1
                elif not self._evict_one():
                    raise AssertionError("vllm: a free block that no owner holds")
                self._pinned += 1
                if d >= full:  # the partial last block: freed to the front, unhashed
                    self._unhashed += 1
                    break
                key = new_keys[d - m]
                if key in where:
                    self._copies.setdefault(key, []).append(node)
                    self._n_copies += 1
                else:
                    where[key] = node
            else:
                if len(where) >= cap and not self._evict_one():
                    self.counters.uncached += n - d
                    break
                where[new_keys[d - m]] = node
            node.hi = d + 1
        if node.hi > m:
            node.owner = owner
            owner.nodes.append(node)

    def _evict_one(self) -> cython.bint:
        """Evict the deepest block of the oldest owner that has one (claim 3)."""
        queue = self._queue
        old: _Owner
        node: _Node
        d: cython.Py_ssize_t
        while queue:
            old = queue[0]
            if len(old.nodes) > old.head:
                node = old.nodes[len(old.nodes) - 1]
                node.hi -= 1
                d = node.hi - node.base
                self._drop(node.keys[d], node, node.hi)
                self.counters.eviction(node.stypes[d], "capacity")
                if node.hi == node.lo:
                    old.nodes.pop()
                    node.owner = None
                return True
            queue.popleft()
        return False

    def _drop(self, key: object, node: _Node, depth: cython.Py_ssize_t) -> None:
        """Forget ``node``'s copy of ``key`` (at ``depth``): the key stays cached while another
        copy does, the oldest one answering lookups."""
        copies: list = self._copies.get(key)
        if copies is None:
            del self._where[key]
            return
        self._n_copies -= 1
        primary: _Node = self._where[key]
        while depth < primary.lo:
            primary = primary.parent
        if primary is node:  # the oldest copy goes: the next oldest answers lookups
            self._where[key] = copies.pop(0)
        else:
            copies.remove(node)  # a copy is its node's deepest block: its node is the inserted one
        if not copies:
            del self._copies[key]


def _decode(
    vals: list,
    lens: list,
    at: cython.Py_ssize_t,
    end: cython.Py_ssize_t,
    a: cython.Py_ssize_t,
    b: cython.Py_ssize_t,
) -> list:
    """Positions ``[a, b)`` of the run-length encoded list in runs ``at:end``."""
    out: list = []
    stop: cython.Py_ssize_t = 0
    first: cython.Py_ssize_t
    k: cython.Py_ssize_t
    for k in range(at, end):
        first = stop
        stop += lens[k]
        if stop > a and first < b:
            out += [vals[k]] * (min(stop, b) - max(first, a))
    return out
