"""A compiled trace in O(unique blocks + requests) memory, rebuilt a chunk at a time for replay.

``compile_trace`` gives every request five per-block lists (keys, parents, tokens, types,
segment sizes): about 70 bytes per block access, 8 GB for the 20x Claude Code scale-up (112.8M
accesses), although a turn repeats ~95% of its session's previous prompt. A
:class:`CompactTrace` stores what is new instead:

- **keys**: each request names its predecessor (the previous request of the same session, in
  trace order), how many leading keys it shares with it, and its new keys (one flat ``uint64``
  array); so keys cost one slot per block *first seen in its session*, not per access;
- **parents**: a block's parent is the key before it except where a chain starts (block 0, and
  in segment keying each reusable segment): only those positions are stored;
- **tokens, types, segment sizes**: run-length encoded (a handful of runs per request: one per
  segment, plus a short last block).

Everything else (arrival, session, turn, ...) is one array entry per request. Encoding checks
the parents claim for every request and refuses one it does not hold for (every keying of
:mod:`skv.blocks` satisfies it); the other encodings are lossless for any input. A test compares
every rebuilt request with ``compile_trace``'s on synthetic and real traces, in both keyings.

Reading is sequential: iterating, or slicing ``trace[a:b]`` with ``a`` where the last slice
ended, rebuilds requests from their predecessors, keeping one key list alive per session (a
turn's shared prefix is copied from its predecessor's list: its ``int`` objects are shared).
Any other index rebuilds from the session's first request. Replay asks for one chunk at a time
(:func:`skv.replay.replay_one`), so memory is the store, one list per live session and one
chunk. Offline policies (``belady``) need next-use annotations on every access, which a
transient chunk cannot keep: they need the full ``compile_trace`` list.

What can be answered from the columns is, without rebuilding a request: a per-key cut
(:meth:`CompactTrace.cut`, SHARDS sampling) is itself a CompactTrace built column to column, the
stored keys' dense ids (:attr:`CompactTrace.key_codes`) serve the one-pass ``lru`` curve
(:mod:`skv.mrc`), and a single-chain trace's totals come from the columns
(:func:`skv.replay.trace_totals`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from typing import overload

import numpy as np

from skv.blocks import RequestBlocks, common_prefix_len

_NONE = -1
#: block accesses per part a replay rebuilds at once (~40 bytes each: five list slots)
PART_ACCESSES = 1 << 20


class CompactTrace(Sequence[RequestBlocks]):
    """An immutable, sequence-like compiled trace; see the module docstring."""

    def __init__(self, blocks: Iterable[RequestBlocks], *, drop_next_use: bool = False) -> None:
        """``drop_next_use``: store requests that carry next-use annotations (a list a Belady
        replay annotated), without them; else such a request is refused."""
        index, arrival, turn, templated, block_size, prompt = (
            array("q"), array("d"), array("q"), array("b"), array("q"), array("q"))  # fmt: skip
        self._sessions: list[str | None] = []
        pred, shared, n_keys = array("q"), array("q"), array("q")
        new_keys = array("Q")
        starts, n_starts = array("q"), array("q")
        runs: dict[str, tuple[array, array, array]] = {
            f: (array("q"), array("q"), array("q")) for f in ("tokens", "stypes", "seg_tokens")
        }
        last: dict[str | None, tuple[int, list]] = {}
        for rb in blocks:
            if rb.next_use is not None and not drop_next_use:
                raise ValueError("CompactTrace drops next_use; offline policies need a list")
            i = len(index)
            index.append(rb.index)
            arrival.append(rb.arrival_s)
            self._sessions.append(rb.session)
            turn.append(rb.turn)
            templated.append(rb.templated)
            block_size.append(rb.block_size)
            prompt.append(rb.prompt_tokens)
            keys = rb.keys
            p, prev = last.get(rb.session, (_NONE, None))
            same = common_prefix_len(prev, keys) if prev is not None else 0
            last[rb.session] = (i, keys)
            pred.append(p)
            shared.append(same)
            n_keys.append(len(keys))
            try:
                new_keys.extend(keys[same:])
            except (OverflowError, TypeError):
                raise ValueError(
                    f"request {rb.index}: block keys must be ints in [0, 2**64)"
                ) from None
            chain_starts = _chain_starts(keys, rb.parents)
            if chain_starts is None:
                raise ValueError(f"request {rb.index}: a parent that is not the previous key")
            starts.extend(chain_starts)
            n_starts.append(len(chain_starts))
            for f, (vals, lens, count) in runs.items():
                count.append(_encode_runs(getattr(rb, f), vals, lens))
        self._assign(
            _np(index),
            _np(arrival),
            _np(turn),
            _np(templated).astype(bool),
            _np(block_size),
            _np(prompt),
            _np(pred),
            _np(shared),
            _np(n_keys),
            _np(new_keys),
            _np(starts),
            _np(n_starts),
            {f: tuple(_np(a) for a in r) for f, r in runs.items()},
        )

    def _assign(self, index, arrival, turn, templated, block_size, prompt, pred, shared, n_keys,
                new_keys, starts, n_starts, runs) -> None:  # fmt: skip
        """Store the columns (``runs``: field -> run values, run lengths, runs per request)."""
        self._index = index
        self._arrival = arrival
        self._turn = turn
        self._templated = templated
        self._block_size = block_size
        self._prompt = prompt
        self._pred = pred
        self._shared = shared
        self._n_keys = n_keys
        self._new_keys = new_keys
        self._new_at = _offsets(n_keys - shared)
        self._access_at = _offsets(n_keys)
        self._starts = starts
        self._starts_at = _offsets(n_starts)
        self._runs = {f: (vals, lens, _offsets(count)) for f, (vals, lens, count) in runs.items()}
        self._live: dict[int, list] = {}  # the key lists a later request copies its prefix from
        self._cursor = 0

    def __len__(self) -> int:
        return len(self._pred)

    @property
    def block_accesses(self) -> int:
        return int(self._access_at[-1])

    @property
    def stored_keys(self) -> int:
        """Keys the store holds: each session's new keys, not every access."""
        return len(self._new_keys)

    @property
    def nbytes(self) -> int:
        """Bytes held by the store's arrays (the sessions' names come on top)."""
        arrays = [v for v in vars(self).values() if isinstance(v, np.ndarray)]
        arrays += [a for r in self._runs.values() for a in r]
        return sum(a.nbytes for a in arrays)

    @overload
    def __getitem__(self, i: int) -> RequestBlocks: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestBlocks]: ...
    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return self._read(start, stop)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"request {i} of {n}")
        if i == self._cursor:
            return self._read(i, i + 1)[0]
        return self._alone(i)

    def __iter__(self) -> Iterator[RequestBlocks]:
        for part in self.parts(0, len(self)):
            yield from part

    def parts(
        self, start: int, stop: int, max_accesses: int = PART_ACCESSES
    ) -> Iterator[list[RequestBlocks]]:
        """Requests ``start..stop-1`` rebuilt in consecutive lists of at most ``max_accesses``
        block accesses each (at least one request), so a caller holds one part at a time."""
        ends = np.searchsorted(self._access_at, self._access_at[start:stop] + max_accesses, "right")
        i = start
        while i < stop:
            j = min(stop, max(i + 1, int(ends[i - start]) - 1))
            yield self._read(i, j)
            i = j

    @property
    def sessions(self) -> tuple[str | None, ...]:
        """Each request's session, without rebuilding requests."""
        return tuple(self._sessions)

    @property
    def new_keys(self) -> np.ndarray:
        """The stored keys, request by request: each request's keys after its shared prefix
        (read-only; :meth:`cut` takes one verdict per entry)."""
        return _read_only(self._new_keys)

    @cached_property
    def key_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """The stored keys factorised (pandas' hash table): each one's dense id, ids numbered
        in order of first appearance, and the distinct keys (id ``c`` is ``uniques[c]``).
        Every key of the trace is stored at least once (a turn's shared prefix was its
        predecessor's), so these are the trace's distinct keys."""
        import pandas as pd

        if not len(self._new_keys):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
        codes, uniques = pd.factorize(self._new_keys)
        return _read_only(codes.astype(np.int64, copy=False)), _read_only(np.asarray(uniques))

    def first_seen(self) -> np.ndarray:
        """Per stored key: whether it is the key's first access in the trace (access order: a
        key's first access is always stored, and stored keys keep the access order)."""
        codes, _ = self.key_codes
        before = np.maximum.accumulate(codes) if len(codes) else codes
        out = np.ones(len(codes), dtype=bool)
        np.greater(codes[1:], before[:-1], out=out[1:])
        return out

    @cached_property
    def one_chain(self) -> bool:
        """Every request is a single chain from its first block (prefix keying: no segment
        restarts a chain), so a key's depth is its position in any request holding it."""
        n_starts = np.diff(self._starts_at)
        return bool(np.array_equal(n_starts, self._n_keys > 0) and not self._starts.any())

    @cached_property
    def partial_blocks_last(self) -> bool:
        """No request has a partial block (fewer tokens than its block size) before its last
        block (segment keying cuts each segment from its own start, so it can)."""
        vals, lens, at = self._runs["tokens"]
        if not len(vals):
            return True
        owner = np.repeat(np.arange(len(at) - 1), np.diff(at))
        partial = vals != self._block_size[owner]
        last = np.zeros(len(vals), dtype=bool)
        last[at[1:][np.diff(at) > 0] - 1] = True
        return not np.any(partial & (~last | (lens != 1)))

    def key_deltas(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The key store as read-only arrays, one entry per request unless said: predecessor
        (``-1``: none), keys shared with it, key count, the stored keys (all requests'), and
        where each request's new keys start in them (``len + 1`` offsets). Request ``i``'s keys
        are its predecessor's first ``shared[i]`` keys then ``new[at[i]:at[i + 1]]``."""
        return tuple(
            _read_only(a)
            for a in (self._pred, self._shared, self._n_keys, self._new_keys, self._new_at)
        )  # type: ignore[return-value]

    def runs(self, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``field`` (``tokens``, ``stypes`` or ``seg_tokens``) run-length encoded, read-only:
        run values, run lengths, and where each request's runs start (``len + 1`` offsets)."""
        return tuple(_read_only(a) for a in self._runs[field])  # type: ignore[return-value]

    def per_request(self, field: str) -> np.ndarray:
        """A per-request field as a read-only array, without rebuilding requests:
        ``prompt_tokens``, ``block_size`` or ``arrival_s``."""
        arrays = {"prompt_tokens": self._prompt, "block_size": self._block_size,
                  "arrival_s": self._arrival}  # fmt: skip
        if field not in arrays:
            raise ValueError(f"no per-request field {field!r}; one of {', '.join(arrays)}")
        return _read_only(arrays[field])

    def cut(self, keep: np.ndarray) -> CompactTrace:
        """Every request cut down to the blocks whose stored key ``keep`` marks (``keep[k]``
        decides ``new_keys[k]``), as a new trace; requests left with no block are dropped, the
        rest numbered ``0..`` in trace order. For a per-key filter (a verdict that depends on
        the key alone), such as per-key SHARDS sampling.

        A kept block's parent is the nearest kept block before it in its chain (none for a
        chain's first kept block), so prefix semantics hold within the cut. Tokens, types and
        segment sizes are the block's own; ``prompt_tokens`` is the kept tokens' sum unless
        every block is kept.

        Built column to column, never request by request: a block of a turn's shared prefix has
        its predecessor's key, hence its verdict, so a request's kept prefix is its
        predecessor's first kept blocks. One pass in request order counts them (O(1) per
        request; a request that shares less than its predecessor did looks further back, once
        per such step); kept positions are filled for the new keys at once and copied from the
        predecessor for the prefix; the run-length fields are read at the kept positions. Cost:
        O(stored keys + kept blocks + requests), not O(block accesses); the temporaries are a
        few arrays of one entry per kept block (~40 bytes each: meant for sampling rates, not
        for keeping most of a big trace)."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != self._new_keys.shape:
            raise ValueError(f"keep has {keep.size} verdicts for {self._new_keys.size} keys")
        n = len(self)
        before = _offsets(keep)  # kept stored keys before each index
        new_at = self._new_at
        kept_new = before[new_at[1:]] - before[new_at[:-1]]
        kept_prefix, cut_pred = self._kept_prefix(before, kept_new)
        total = kept_prefix + kept_new
        rows = np.flatnonzero(total)  # the requests that keep a block, in trace order
        renumber = np.full(n + 1, _NONE, dtype=np.int64)  # [-1] stays -1: no predecessor
        renumber[rows] = np.arange(len(rows))
        counts = total[rows]
        slot_at = _offsets(counts)
        pos = np.empty(int(slot_at[-1]), dtype=np.int64)  # kept positions, request by request
        stored = np.flatnonzero(keep)  # kept new keys, request by request
        owner = np.searchsorted(new_at, stored, "right") - 1
        rank = before[stored] - before[new_at[owner]]  # among its request's kept new keys
        pos[slot_at[renumber[owner]] + kept_prefix[owner] + rank] = (
            self._shared[owner] + stored - new_at[owner]
        )
        sources = renumber[cut_pred[rows]]
        copies = zip(sources.tolist(), kept_prefix[rows].tolist(), strict=True)
        for r, (src, k) in enumerate(copies):
            if k:  # the predecessor's slots are filled: it comes first
                pos[slot_at[r] : slot_at[r] + k] = pos[slot_at[src] : slot_at[src] + k]
        first = np.zeros(len(pos), dtype=bool)
        first[slot_at[:-1]] = True
        at = np.repeat(self._access_at[rows], counts) + pos  # each kept block's access index
        if self.one_chain:  # each request one chain from its first kept block
            chain_starts = first
        else:
            starts_of = np.repeat(self._access_at[:-1], np.diff(self._starts_at)) + self._starts
            chain_starts = first | _changes(np.searchsorted(starts_of, at, "right"))
        runs = {f: self._runs_at(f, at, first, slot_at) for f in self._runs}
        tok_vals, tok_lens, tok_count = runs["tokens"]
        tokens_before = _offsets(tok_vals * tok_lens)
        run_at = _offsets(tok_count)
        kept_tokens = tokens_before[run_at[1:]] - tokens_before[run_at[:-1]]
        whole = counts == self._n_keys[rows]
        out = CompactTrace.__new__(CompactTrace)
        out._sessions = [self._sessions[i] for i in rows.tolist()]
        out._assign(
            np.arange(len(rows), dtype=np.int64), self._arrival[rows], self._turn[rows],
            self._templated[rows], self._block_size[rows],
            np.where(whole, self._prompt[rows], kept_tokens), sources, kept_prefix[rows], counts,
            self._new_keys[stored], (np.arange(len(pos)) - np.repeat(slot_at[:-1], counts))[
                chain_starts], _per_group(chain_starts, slot_at), runs,
        )  # fmt: skip
        return out

    def _kept_prefix(
        self, before: np.ndarray, kept_new: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For :meth:`cut`: each request's kept blocks in its shared prefix, and its nearest
        predecessor that keeps a block (``-1``: none). Positions below ``shared[i]`` of request
        ``i`` are its predecessor ``p``'s; if ``shared[i] >= shared[p]`` those are ``p``'s
        kept prefix plus some of ``p``'s kept new keys (the usual case: a turn extends the
        last), else positions below ``shared[i]`` are ``p``'s predecessor's too: look there."""
        pred, shared = self._pred.tolist(), self._shared.tolist()
        new_at = self._new_at
        p = np.maximum(self._pred, 0)
        # kept new keys of the predecessor below shared[i] (meaningful where shared[i] >= shared[p])
        upto = new_at[p] + np.maximum(self._shared - self._shared[p], 0)
        from_pred = (before[np.minimum(upto, new_at[p + 1])] - before[new_at[p]]).tolist()
        kept_new_l = kept_new.tolist()
        kept_prefix = [0] * len(pred)
        keeper = [_NONE] * len(pred)  # the latest request up to i (in i's chain) keeping a block
        cut_pred = [_NONE] * len(pred)
        for i, j in enumerate(pred):
            if j != _NONE:
                cut_pred[i] = keeper[j]
                s = shared[i]
                if s >= shared[j]:
                    kept_prefix[i] = kept_prefix[j] + from_pred[i]
                else:
                    while s < shared[j]:
                        j = pred[j]
                    a = int(new_at[j])
                    kept_prefix[i] = kept_prefix[j] + int(before[a + s - shared[j]] - before[a])
            keeper[i] = i if kept_prefix[i] or kept_new_l[i] else cut_pred[i]
        return np.array(kept_prefix, dtype=np.int64), np.array(cut_pred, dtype=np.int64)

    def _runs_at(self, field: str, at: np.ndarray, first: np.ndarray, slot_at: np.ndarray):
        """For :meth:`cut`: ``field`` at the access indices ``at``, run-length encoded again
        per kept request (``first`` marks each request's first slot): values, lengths, runs
        per request."""
        vals, lens, _ = self._runs[field]
        values = vals[np.searchsorted(np.cumsum(lens), at, "right")]
        heads = np.flatnonzero(first | _changes(values))
        run_lens = np.diff(np.append(heads, len(values)))
        return values[heads], run_lens, _per_group_heads(heads, slot_at)

    def arrival_s(self, i: int) -> float:
        """Request ``i``'s arrival time, without rebuilding it."""
        return float(self._arrival[i])

    def _read(self, start: int, stop: int) -> list[RequestBlocks]:
        """Requests ``start..stop-1``, continuing from the cursor (else replaying keys from 0)."""
        if start != self._cursor:
            self._live = {}
            self._cursor = 0
            self._keys_upto(start)
        out = [self._build(i, self._next_keys(i)) for i in range(start, stop)]
        self._cursor = stop
        return out

    def _keys_upto(self, stop: int) -> None:
        for i in range(self._cursor, stop):
            self._next_keys(i)
        self._cursor = stop

    def _next_keys(self, i: int) -> list:
        p = int(self._pred[i])
        a, b = self._new_at[i], self._new_at[i + 1]
        if p == _NONE:
            keys = self._new_keys[a:b].tolist()
        else:
            keys = self._live.pop(p)[: self._shared[i]]
            keys += self._new_keys[a:b].tolist()
        self._live[i] = keys
        return keys

    def _alone(self, i: int) -> RequestBlocks:
        """Request ``i`` out of order: its session's chain rebuilt from the first request."""
        chain = [i]
        while (p := int(self._pred[chain[-1]])) != _NONE:
            chain.append(p)
        keys: list = []
        for j in reversed(chain):
            new = self._new_keys[self._new_at[j] : self._new_at[j + 1]].tolist()
            keys = keys[: self._shared[j]] + new
        return self._build(i, keys)

    def _build(self, i: int, keys: list) -> RequestBlocks:
        s = self._starts[self._starts_at[i] : self._starts_at[i + 1]].tolist()
        return RequestBlocks(
            index=int(self._index[i]),
            arrival_s=float(self._arrival[i]),
            keys=keys,
            parents=_parents_of(keys, s),
            tokens=self._decode("tokens", i),
            stypes=self._decode("stypes", i),
            seg_tokens=self._decode("seg_tokens", i),
            session=self._sessions[i],
            turn=int(self._turn[i]),
            templated=bool(self._templated[i]),
            block_size=int(self._block_size[i]),
            prompt_tokens=int(self._prompt[i]),
        )

    def _decode(self, field: str, i: int) -> list:
        vals, lens, at = self._runs[field]
        a, b = at[i], at[i + 1]
        out: list = []
        for v, k in zip(vals[a:b].tolist(), lens[a:b].tolist(), strict=True):
            out += [v] * k
        return out


def _chain_starts(keys: list, parents: list) -> list[int] | None:
    """Where ``parents`` starts a chain (``None``), provided every other parent is the key
    before it (else ``None``). One chain, the usual case, is checked by two list compares."""
    if len(parents) != len(keys):
        return None
    if parents and parents[0] is None and parents[1:] == keys[:-1]:
        return [0]
    starts = [j for j, parent in enumerate(parents) if parent is None]
    return starts if _parents_of(keys, starts) == parents else None


def _parents_of(keys: list, chain_starts: list[int]) -> list:
    parents: list = [None, *keys[:-1]] if keys else []
    for j in chain_starts:
        parents[j] = None
    return parents


def _encode_runs(values: list, vals: array, lens: array) -> int:
    """Append ``values`` as (value, length) runs; returns the number of runs."""
    n = len(values)
    if not n:
        return 0
    first = values[0]
    same = values.count(first)  # in C: most fields are one run, or two (a short last block)
    if same == n or (same == n - 1 and values[-1] != first):
        vals.append(first)
        lens.append(same)
        if same == n:
            return 1
        vals.append(values[-1])
        lens.append(1)
        return 2
    a = np.asarray(values, dtype=np.int64)
    edges = np.flatnonzero(a[1:] != a[:-1]) + 1
    bounds = np.concatenate(([0], edges, [n]))
    vals.extend(a[bounds[:-1]].tolist())
    lens.extend(np.diff(bounds).tolist())
    return len(bounds) - 1


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _np(a: array) -> np.ndarray:
    return np.frombuffer(a, dtype=a.typecode) if len(a) else np.zeros(0, a.typecode)


def _offsets(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _changes(a: np.ndarray) -> np.ndarray:
    """Where ``a`` differs from the entry before it (the first entry: True)."""
    out = np.ones(len(a), dtype=bool)
    np.not_equal(a[1:], a[:-1], out=out[1:])
    return out


def _per_group(marks: np.ndarray, group_at: np.ndarray) -> np.ndarray:
    """How many ``marks`` fall in each group (``group_at``: the groups' offsets)."""
    return _per_group_heads(np.flatnonzero(marks), group_at)


def _per_group_heads(heads: np.ndarray, group_at: np.ndarray) -> np.ndarray:
    return np.diff(np.searchsorted(heads, group_at))
