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
        self._index = _np(index)
        self._arrival = _np(arrival)
        self._turn = _np(turn)
        self._templated = _np(templated).astype(bool)
        self._block_size = _np(block_size)
        self._prompt = _np(prompt)
        self._pred = _np(pred)
        self._shared = _np(shared)
        self._n_keys = _np(n_keys)
        self._new_keys = _np(new_keys)
        self._new_at = _offsets(self._n_keys - self._shared)
        self._access_at = _offsets(self._n_keys)
        self._starts = _np(starts)
        self._starts_at = _offsets(_np(n_starts))
        self._runs = {
            f: (_np(vals), _np(lens), _offsets(_np(count)))
            for f, (vals, lens, count) in runs.items()
        }
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
    def new_keys(self) -> np.ndarray:
        """The stored keys, request by request: each request's keys after its shared prefix
        (read-only; :meth:`select` takes one verdict per entry)."""
        return _read_only(self._new_keys)

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

    def select(self, keep: np.ndarray) -> Iterator[RequestBlocks]:
        """Every request cut down to the blocks whose stored key ``keep`` marks (``keep[k]``
        decides ``new_keys[k]``); requests left with no block are skipped, the rest numbered
        ``0..`` in trace order. For a per-key filter (a verdict that depends on the key alone).

        A block of a turn's shared prefix has its predecessor's key, so it takes that verdict
        without being looked at: the cost is O(stored keys + kept blocks + requests), not
        O(block accesses). A kept block's parent is the nearest kept block before it in its
        chain (none for a chain's first kept block), so prefix semantics hold within the cut.
        Tokens, types and segment sizes are the block's own; ``prompt_tokens`` is the kept
        tokens' sum unless every block is kept."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != self._new_keys.shape:
            raise ValueError(f"keep has {keep.size} verdicts for {self._new_keys.size} keys")
        live: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        kept = 0
        for i in range(len(self)):
            a, b = int(self._new_at[i]), int(self._new_at[i + 1])
            sel = np.flatnonzero(keep[a:b])
            new_keys = self._new_keys[a + sel]
            p, s = int(self._pred[i]), int(self._shared[i])
            if p == _NONE:
                pos, keys = sel, new_keys
            else:
                prev_pos, prev_keys = live.pop(p)
                m = int(np.searchsorted(prev_pos, s))
                pos = np.concatenate((prev_pos[:m], sel + s))
                keys = np.concatenate((prev_keys[:m], new_keys))
            live[i] = (pos, keys)
            if len(pos):
                yield self._build_cut(i, kept, pos, keys.tolist())
                kept += 1

    def _build_cut(self, i: int, index: int, pos: np.ndarray, keys: list) -> RequestBlocks:
        """Request ``i``'s blocks at positions ``pos`` (ascending), with keys ``keys``."""
        starts = self._starts[self._starts_at[i] : self._starts_at[i + 1]]
        chain = np.searchsorted(starts, pos, "right")
        parents: list = [None, *keys[:-1]]
        for j in np.flatnonzero(chain[1:] != chain[:-1]).tolist():
            parents[j + 1] = None
        tokens = self._decode_at("tokens", i, pos)
        whole = len(keys) == int(self._n_keys[i])
        return RequestBlocks(
            index=index,
            arrival_s=float(self._arrival[i]),
            keys=keys,
            parents=parents,
            tokens=tokens,
            stypes=self._decode_at("stypes", i, pos),
            seg_tokens=self._decode_at("seg_tokens", i, pos),
            session=self._sessions[i],
            turn=int(self._turn[i]),
            templated=bool(self._templated[i]),
            block_size=int(self._block_size[i]),
            prompt_tokens=int(self._prompt[i]) if whole else sum(tokens),
        )

    def _decode_at(self, field: str, i: int, pos: np.ndarray) -> list:
        """Request ``i``'s run-length encoded ``field`` at positions ``pos`` only."""
        vals, lens, at = self._runs[field]
        a, b = at[i], at[i + 1]
        ends = np.cumsum(lens[a:b])
        return vals[a:b][np.searchsorted(ends, pos, "right")].tolist()

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
