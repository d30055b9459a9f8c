"""Cache-only trace replay: requests -> blocks -> cache + policy -> hit-rate tables.

Each request acquires its blocks at its arrival time and releases them at once (no timing
model, no requests in flight); the serving simulator adds time. The trace is compiled to blocks
once and replayed through every (policy, capacity) pair, so all policies see identical keys.
Results are tidy rows (one per policy x capacity) written as CSV and JSON.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from skv.blocks import RequestBlocks, annotate_next_use, tally_blocks
from skv.blocks import compile_trace as compile_trace  # re-exported: the usual import site
from skv.cache.node_replay import NodeReplay
from skv.cache.node_replay import replays as node_replays
from skv.compact_trace import CompactTrace
from skv.fileio import atomic_dir, atomic_write
from skv.model import NUM_TYPES, TYPES
from skv.policies.registry import OFFLINE, make_cache, make_policy, policy_class
from skv.runtime import no_cyclic_gc
from skv.sizing import Capacity
from skv.tiers import TieredCache, TierSpec, resolve_tiers, tier_row

log = logging.getLogger(__name__)

#: policies replayed a radix node at a time on a prefix-keyed compact trace (skv.cache.node_replay)
NODE_POLICIES = frozenset({"lru", "vllm"})


@dataclass
class TraceTotals:
    """Policy-independent totals of a compiled trace."""

    requests: int = 0
    prompt_tokens: int = 0
    block_accesses: int = 0
    unique_blocks: int = 0
    ceiling_hit_blocks: int = 0
    ceiling_hit_tokens: int = 0
    tokens_by_type: list[int] = field(default_factory=lambda: [0] * NUM_TYPES)
    blocks_by_type: list[int] = field(default_factory=lambda: [0] * NUM_TYPES)

    @property
    def ceiling_block_hit_rate(self) -> float:
        return self.ceiling_hit_blocks / self.block_accesses if self.block_accesses else 0.0

    @property
    def ceiling_token_hit_rate(self) -> float:
        return self.ceiling_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def trace_totals(trace: Iterable[RequestBlocks]) -> TraceTotals:
    """Totals plus the infinite-cache ceiling: a block hits if its key was seen before (and,
    as in a cache, every block since its chain root hit: :func:`skv.blocks.tally_blocks`)."""
    if isinstance(trace, CompactTrace) and trace.one_chain:
        return _compact_totals(trace)
    t = TraceTotals()
    seen: set[int] = set()
    for rb in trace:
        t.requests += 1
        t.prompt_tokens += rb.prompt_tokens
        t.block_accesses += len(rb.keys)
        hits, hit_tokens = tally_blocks(rb, seen, t.tokens_by_type, t.blocks_by_type)
        t.ceiling_hit_blocks += hits
        t.ceiling_hit_tokens += hit_tokens
    t.unique_blocks = len(seen)
    return t


def _compact_totals(trace: CompactTrace) -> TraceTotals:
    """:func:`trace_totals` of a single-chain :class:`CompactTrace` from its columns, without
    rebuilding a request: O(stored keys + runs + requests).

    Request ``i``'s shared prefix holds its predecessor's keys, all seen, and being one chain
    from block 0 they all hit; its new keys hit up to the first one never seen before (a miss
    ends the chain's run of hits). The per-type totals come from the token and type runs cut at
    each other's boundaries."""
    _, shared, n_keys, _, new_at = trace.key_deltas()
    first = np.flatnonzero(trace.first_seen())
    # new keys that hit: up to the request's first never-seen key
    nxt = np.append(first, new_at[-1])[np.searchsorted(first, new_at[:-1])]
    hit_blocks = shared + np.minimum(nxt, new_at[1:]) - new_at[:-1]
    access_at = np.zeros(len(n_keys) + 1, dtype=np.int64)
    np.cumsum(n_keys, out=access_at[1:])
    tok_vals, tok_lens, _ = trace.runs("tokens")
    type_vals, type_lens, _ = trace.runs("stypes")
    tok_ends, type_ends = np.cumsum(tok_lens), np.cumsum(type_lens)
    tokens_before = np.zeros(len(tok_vals) + 1, dtype=np.int64)  # before each run, and all
    np.cumsum(tok_vals * tok_lens, out=tokens_before[1:])

    def tokens_upto(at: np.ndarray) -> np.ndarray:  # the tokens of accesses 0..at-1
        r = np.minimum(np.searchsorted(tok_ends, at, "right"), len(tok_vals) - 1)  # at's run
        return tokens_before[r] + (at - (tok_ends[r] - tok_lens[r])) * tok_vals[r]

    t = TraceTotals(requests=len(trace), block_accesses=trace.block_accesses)
    t.prompt_tokens = int(trace.per_request("prompt_tokens").sum())
    t.unique_blocks = len(first)
    t.ceiling_hit_blocks = int(hit_blocks.sum())
    if len(tok_vals):
        starts = access_at[:-1]
        t.ceiling_hit_tokens = int((tokens_upto(starts + hit_blocks) - tokens_upto(starts)).sum())
        ends = np.union1d(tok_ends, type_ends)  # pieces of one token size and one type
        lens = np.diff(ends, prepend=0)
        heads = ends - lens
        tok = tok_vals[np.searchsorted(tok_ends, heads, "right")]
        typ = type_vals[np.searchsorted(type_ends, heads, "right")]
        by_tokens, by_blocks = np.zeros(NUM_TYPES, np.int64), np.zeros(NUM_TYPES, np.int64)
        np.add.at(by_tokens, typ, tok * lens)
        np.add.at(by_blocks, typ, lens)
        t.tokens_by_type, t.blocks_by_type = by_tokens.tolist(), by_blocks.tolist()
    return t


def flatten(trace: Iterable[RequestBlocks]) -> list[RequestBlocks]:
    """The trace's block stream as an object cache (libCacheSim) sees it: every block access of
    every request, in order, becomes its own single-block request whose block starts a chain
    (``parents`` ``[None]``), so neither pinning (a request holds one block) nor leaf-only
    eviction (no block has a child in the stream's chains) ever binds. ``skv replay --mode
    flat``.

    Keys are those of the input (prefix keys when compiled in prefix mode), so the unique
    blocks, and hence a capacity given as a share of them, are the same as in prefix mode. Each
    flat request is one whole block: ``tokens`` and ``prompt_tokens`` are ``block_size`` (a
    partial last block counts as full), so the token hit rate equals the block hit rate and the
    hit tokens are the hit blocks x block size; only block-level metrics mean anything (no
    request, session or prefix). Arrival times are the original request's; the semantic type
    and segment size of each block are kept.

    Memory is one :class:`RequestBlocks` per block access (the flat stream has no shared
    structure to compress): proportional to the stream's accesses, not to its unique blocks.
    ``trace`` may be a generator (:func:`skv.blocks.iter_blocks`): it is read once."""
    flat: list[RequestBlocks] = []
    append = flat.append
    for rb in trace:
        bs = rb.block_size
        for key, stype, seg in zip(rb.keys, rb.stypes, rb.seg_tokens, strict=True):
            append(
                RequestBlocks(
                    len(flat), rb.arrival_s, [key], [None], [bs], [stype], [seg], None, 0, False, bs
                )
            )
    return flat


def replay_one(
    trace: Sequence[RequestBlocks],
    policy: str,
    capacity_blocks: int,
    *,
    params: dict[str, Any] | None = None,
    totals: TraceTotals | None = None,
    metrics_every: int = 0,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` through one policy at one capacity; returns one result row."""
    totals = totals or trace_totals(trace)
    compact = isinstance(trace, CompactTrace)
    vllm = policy == "vllm"
    by_node = policy in NODE_POLICIES and not params and node_replays(trace, vllm=vllm)
    # lru or vllm on a prefix-keyed compact trace: the same choices, a radix node at a time
    if by_node:  # lru's policy object only for its params() in the row; vllm has none
        lru = None if vllm else make_policy(policy)
        cache = NodeReplay(capacity_blocks, vllm=vllm, policy=lru)
    else:
        cache = make_cache(policy, capacity_blocks, params)
    if policy in OFFLINE:
        if compact:
            raise ValueError(
                f"{policy} is offline: it needs next-use annotations on every access, which a "
                "CompactTrace does not keep; replay it on compile_trace's list"
            )
        if trace and trace[0].next_use is None:
            annotate_next_use(trace)
        cache.prepare(trace)
    series: list[dict[str, float]] = []
    policy_obj = getattr(cache, "policy", None)
    chunk = metrics_every if metrics_every and policy_obj is not None else 8192

    def sample(stop: int) -> None:
        m = policy_obj.metrics()
        if m:
            series.append({"request": stop, "time_s": _arrival(trace, stop - 1), **m})

    elapsed = _replay_chunks(
        cache,
        trace,
        f"{policy}@{capacity_blocks}",
        progress,
        chunk,
        by_node=by_node,
        after_chunk=sample if metrics_every and policy_obj is not None else None,
    )
    s = cache.stats
    row: dict[str, Any] = {
        "policy": policy,
        "capacity_blocks": capacity_blocks,
        "requests": s.requests,
        "prompt_tokens": s.prompt_tokens,
        "hit_tokens": s.hit_tokens,
        "block_accesses": s.blocks,
        "hit_blocks": s.hit_blocks,
        "token_hit_rate": s.token_hit_rate,
        "block_hit_rate": s.block_hit_rate,
        "ceiling_token_hit_rate": totals.ceiling_token_hit_rate,
        "ceiling_block_hit_rate": totals.ceiling_block_hit_rate,
        "evictions": s.evictions,
        "ghost_hits": s.ghost_hits if cache.ghost.capacity else None,
        "uncached_blocks": s.uncached_blocks,
        "evictions_by_type": _by_type(s.evictions_by_type),
        "hit_rate_by_type": {
            TYPES[i].value: s.hit_tokens_by_type[i] / totals.tokens_by_type[i]
            for i in range(NUM_TYPES)
            if totals.tokens_by_type[i]
        },
        "replay_seconds": round(elapsed, 3),
    }
    if policy_obj is not None:
        row["params"] = policy_obj.params()
        if series:
            row["metrics_over_time"] = series
    log.info(
        "%s @ %d blocks: token hit rate %.4f, block hit rate %.4f (%.1fs)",
        policy,
        capacity_blocks,
        row["token_hit_rate"],
        row["block_hit_rate"],
        elapsed,
    )
    return row


def _replay_chunks(
    cache: Any,
    trace: Sequence[RequestBlocks],
    desc: str,
    progress: bool | None,
    chunk: int,
    *,
    by_node: bool = False,
    after_chunk: Any = None,
) -> float:
    """``cache.replay`` over ``trace`` in chunks of ``chunk`` requests, with a progress bar and
    the cyclic collector paused; a compact trace is rebuilt a part at a time (memory is one
    part, not the trace) unless the cache replays nodes (``by_node``). ``after_chunk(stop)``
    runs after each chunk. Returns the seconds the replay took."""
    compact = isinstance(trace, CompactTrace)
    t0 = time.perf_counter()
    with (
        tqdm(
            total=len(trace),
            desc=desc,
            unit="req",
            disable=(not progress) if progress is not None else None,
            mininterval=1.0,
            leave=False,
        ) as bar,
        no_cyclic_gc(),
    ):
        for start in range(0, len(trace), chunk):
            stop = min(start + chunk, len(trace))
            if compact and not by_node:
                for part in trace.parts(start, stop):
                    cache.replay(part, 0, len(part))
            else:
                cache.replay(trace, start, stop)
            bar.update(stop - start)
            if after_chunk is not None:
                after_chunk(stop)
    return time.perf_counter() - t0


def replay_tiered(
    trace: Sequence[RequestBlocks],
    policy: str,
    capacity_blocks: int,
    lower: list[tuple[TierSpec, int]],
    *,
    write: str = "through",
    load: str = "copy",
    totals: TraceTotals | None = None,
    model: str | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` through a :class:`~skv.tiers.TieredCache`: ``policy`` at
    ``capacity_blocks`` in GPU memory over the ``lower`` tiers. The row has
    :func:`replay_one`'s fields, hits counted over all tiers, plus ``tiers`` (per tier hits,
    evictions, and blocks and bytes moved on its link)."""
    totals = totals or trace_totals(trace)
    cache = TieredCache(policy, capacity_blocks, lower, write=write, load=load)
    desc = f"{policy}@{capacity_blocks}+{len(lower)} tiers"
    elapsed = _replay_chunks(cache, trace, desc, progress, 8192)
    st = cache.tier_stats
    top = cache.top.stats
    row: dict[str, Any] = {
        "policy": policy,
        "capacity_blocks": capacity_blocks,
        "requests": st.requests,
        "prompt_tokens": st.prompt_tokens,
        "hit_tokens": st.total_hit_tokens,
        "block_accesses": st.block_accesses,
        "hit_blocks": st.total_hit_blocks,
        "token_hit_rate": st.total_hit_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
        "block_hit_rate": st.total_hit_blocks / st.block_accesses if st.block_accesses else 0.0,
        "ceiling_token_hit_rate": totals.ceiling_token_hit_rate,
        "ceiling_block_hit_rate": totals.ceiling_block_hit_rate,
        "evictions": top.evictions,
        "ghost_hits": None,
        "uncached_blocks": top.uncached_blocks,
        "evictions_by_type": _by_type(top.evictions_by_type),
        "hit_rate_by_type": {
            TYPES[i].value: st.hit_tokens_by_type[i] / totals.tokens_by_type[i]
            for i in range(NUM_TYPES)
            if totals.tokens_by_type[i]
        },
        "params": cache.top.policy.params(),
        **tier_row(cache, model=model),
        "replay_seconds": round(elapsed, 3),
    }
    log.info(
        "%s @ %d blocks + %s: token hit rate %.4f (%s) (%.1fs)",
        policy,
        capacity_blocks,
        ", ".join(f"{s.name}={c}" for s, c in lower),
        row["token_hit_rate"],
        ", ".join(f"{t['tier']} {t['token_hit_rate']:.4f}" for t in row["tiers"]),
        elapsed,
    )
    return row


def _arrival(trace: Sequence[RequestBlocks], i: int) -> float:
    if isinstance(trace, CompactTrace):
        return trace.arrival_s(i)
    return trace[i].arrival_s


def _by_type(values: list[int]) -> dict[str, int]:
    return {TYPES[i].value: v for i, v in enumerate(values) if v}


def resolve_capacities(
    specs: Sequence[str], *, block_size: int, unique_blocks: int, model: str | None
) -> list[tuple[str, int]]:
    return [
        (
            spec,
            Capacity.parse(spec).to_blocks(
                block_size=block_size, unique_blocks=unique_blocks, model=model
            ),
        )
        for spec in specs
    ]


def replay_trace(
    trace: Sequence[RequestBlocks],
    policies: Sequence[str],
    capacities: Sequence[str],
    *,
    model: str | None = None,
    metrics_every: int = 0,
    progress: bool | None = None,
    tiers: Sequence[TierSpec] = (),
    tier_write: str = "through",
    tier_load: str = "copy",
) -> list[dict[str, Any]]:
    """Every policy at every capacity; rows in (capacity, policy) order. With ``tiers``,
    each capacity is the GPU tier's and the lower tiers are the same for every row
    (:func:`replay_tiered`)."""
    for policy in policies:  # fail on a bad name before hours of replay, not after
        policy_class(policy)
    totals = trace_totals(trace)
    block_size = trace[0].block_size if trace else 1
    lower = resolve_tiers(
        list(tiers), block_size=block_size, unique_blocks=totals.unique_blocks, model=model
    )
    rows: list[dict[str, Any]] = []
    try:
        for spec, cap in resolve_capacities(
            capacities, block_size=block_size, unique_blocks=totals.unique_blocks, model=model
        ):
            for policy in policies:
                if lower:
                    row = replay_tiered(
                        trace,
                        policy,
                        cap,
                        lower,
                        write=tier_write,
                        load=tier_load,
                        totals=totals,
                        model=model,
                        progress=progress,
                    )
                else:
                    row = replay_one(
                        trace,
                        policy,
                        cap,
                        totals=totals,
                        metrics_every=metrics_every,
                        progress=progress,
                    )
                rows.append({"capacity": spec, "block_size": block_size, **row})
    except KeyboardInterrupt as exc:
        exc.add_note(
            f"replay: interrupted after {len(rows)} of {len(policies) * len(capacities)} "
            "(capacity, policy) replays; nothing written (results are written whole, at the end)"
        )
        raise
    return rows


CSV_COLUMNS = [
    "capacity",
    "capacity_blocks",
    "block_size",
    "policy",
    "requests",
    "block_accesses",
    "prompt_tokens",
    "hit_blocks",
    "hit_tokens",
    "token_hit_rate",
    "block_hit_rate",
    "ceiling_token_hit_rate",
    "ceiling_block_hit_rate",
    "evictions",
    "ghost_hits",
    "uncached_blocks",
]


#: per-tier CSV columns of a tiered replay, ``<tier>_<field>`` (the JSON nests them)
TIER_FIELDS = (
    "capacity_blocks",
    "policy",
    "hit_tokens",
    "token_hit_rate",
    "evictions",
    "link",
    "loaded_blocks",
    "stored_blocks",
    "loaded_bytes",
    "stored_bytes",
)


def _tier_columns(rows: list[dict[str, Any]]) -> list[str]:
    if not rows or "tiers" not in rows[0]:
        return []
    return [f"{t['tier']}_{f}" for t in rows[0]["tiers"] for f in TIER_FIELDS if f in t]


def write_results(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> None:
    """``replay_results.csv`` (flat, per-type columns) and ``replay_results.json`` (nested).

    Timing fields are left out so the same config gives byte-identical files. Both or neither:
    they are written into a staging directory that becomes ``out_dir`` at the end
    (:func:`skv.fileio.atomic_dir`; into an existing ``out_dir`` the JSON arrives last).
    """
    type_names = [t.value for t in TYPES]
    tier_columns = _tier_columns(rows)
    header = (
        CSV_COLUMNS
        + [f"evictions_{t}" for t in type_names]
        + [f"hit_rate_{t}" for t in type_names]
        + tier_columns
    )
    lines = []
    for r in rows:
        flat = {c: r[c] for c in CSV_COLUMNS}
        for t in type_names:
            flat[f"evictions_{t}"] = r["evictions_by_type"].get(t, 0)
            flat[f"hit_rate_{t}"] = r["hit_rate_by_type"].get(t, "")
        for tier in r.get("tiers", ()):
            for f in TIER_FIELDS:
                if f in tier:
                    flat[f"{tier['tier']}_{f}"] = "" if tier[f] is None else tier[f]
        lines.append(flat)
    stable_rows = [{k: v for k, v in r.items() if k != "replay_seconds"} for r in rows]
    payload = {"meta": meta, "results": stable_rows}
    try:
        with atomic_dir(out_dir, last=("replay_results.json",)) as tmp:
            with atomic_write(tmp / "replay_results.csv") as f:
                _write_csv(f, header, lines)
            with atomic_write(tmp / "replay_results.json") as f:
                f.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    except KeyboardInterrupt as exc:
        exc.add_note(
            f"replay: every replay done, interrupted while writing; nothing written to {out_dir}"
        )
        raise


def _write_csv(f, header: list[str], lines: list[dict[str, Any]]) -> None:
    w = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
    w.writeheader()
    for line in lines:
        w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in line.items()})
