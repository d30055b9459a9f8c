"""The discrete-event serving simulator: arrivals -> router -> replicas -> per-request metrics.

Simulated time jumps from event to event: the next arrival, or the end of some replica's
current iteration (whose length the latency model gives). A replica runs iterations back to back
while it has work and idles otherwise. Everything is deterministic: same requests, config and
latency model give identical results.

Runs of decode-only iterations are one event (the fast path that makes decode-heavy cluster
runs cheap): while a replica has no prompt to prefill, nothing changes on it until a decoding
request finishes (known in advance: :mod:`skv.sim.replica`) or a new request is routed to it,
so its next iterations' end times are computed at once (``LatencyModel.decode_ms``) and only the
run's last end is queued. A request routed to the replica mid-run cuts the run at the first
iteration end at or after its arrival, exactly where the iteration-by-iteration loop would have
admitted it, so results are identical to pricing each iteration as its own event (a test checks
this). Runs are capped in length (doubling while runs finish uncut, shrinking when cut) so a cut
wastes little pricing work. An iteration with prefill is priced from its chunks' numbers
(``LatencyModel.prefill_ms``, the price of the same ``Iteration``) when the latency model
overrides it (the roofline) and no ``on_iteration`` hook needs the ``Iteration`` itself.

This module builds a run (requests in arrival order, their blocks, replicas, router) and
summarises it; the loop itself is :class:`skv.sim.events.EventLoop`. The loop, the replicas
(:mod:`skv.sim.replica`), the result rows, the router views and the roofline's arithmetic are
compiled with the replay hot path (plain Python without a compiler, same results:
tests/test_compiled_equivalence.py). The trace and the result rows are built with the cyclic
garbage collector paused and the loop runs with everything built before it frozen
(:mod:`skv.runtime`): each collection used to rescan every request's objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tqdm import tqdm

from skv.blocks import (
    KeyingMode,
    RequestBlocks,
    annotate_next_use,
    compile_trace,
    request_blocks,
)
from skv.latency.base import LatencyModel
from skv.model import Request, Segment, SemanticType, content_hash
from skv.policies.registry import OFFLINE, make_cache
from skv.runtime import existing_objects_frozen, no_cyclic_gc
from skv.sim.config import SimConfig
from skv.sim.events import EventLoop, IterationHook
from skv.sim.replica import Replica, RequestState
from skv.sim.results import SimResult, column_result, summarize
from skv.sim.routers import SimRouting
from skv.sizing import Capacity, get_model
from skv.tiers import LINKS, LoadPricer, TieredCache, TierSpec, resolve_tiers, tier_summary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompiledRun:
    """What :func:`simulate` builds from the requests before it serves them: the requests in
    arrival order, their prompt blocks and, with ``include_output_blocks``, each one's prompt +
    answer blocks. It depends on the config only through :func:`compile_key` (never on the
    policy, capacity, replicas or latency), so a caller that serves one workload under many
    policies compiles it once (:func:`compile_run`). ``simulate`` never changes it: an offline
    policy, which writes next uses onto the blocks, compiles a copy of its own."""

    key: tuple[Any, ...]
    requests: tuple[Request, ...]
    trace: tuple[RequestBlocks, ...]
    #: per request, (prompt + answer blocks, the first of them that differs from the prompt's);
    #: empty without ``include_output_blocks``
    answers: tuple[tuple[RequestBlocks | None, int], ...]


def compile_key(config: SimConfig) -> tuple[Any, ...]:
    """The config fields a :class:`CompiledRun` depends on."""
    return (config.block_size, config.mode, config.salt_by_tenant, config.include_output_blocks)


def compile_run(requests: Sequence[Request], config: SimConfig) -> CompiledRun:
    """The requests (any order; sorted by arrival here) compiled for ``config``'s keying.

    Every prompt needs at least one token: an engine computes the last prompt token to emit the
    first output token, and a request with nothing to prefill would never get one (it used to
    loop forever). Such a request is rejected with its id, before anything runs."""
    empty = [r.request_id for r in requests if r.prompt_tokens <= 0]
    if empty:
        shown = ", ".join(map(str, empty[:5])) + (
            f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        )
        raise ValueError(
            f"{len(empty)} request(s) with an empty prompt (0 tokens): {shown}; a serving "
            "engine needs at least one prompt token (drop or fix them in the trace)"
        )
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    ordered = tuple(requests[i] for i in order)
    with no_cyclic_gc():  # plain data, no cycles: nothing for the collector to find
        mode, salt = KeyingMode(config.mode), config.salt_by_tenant
        trace = compile_trace(ordered, config.block_size, mode, salt_by_tenant=salt)
    answers = (
        tuple(_answer_blocks(r, rb, config) for r, rb in zip(ordered, trace, strict=True))
        if config.include_output_blocks
        else ()
    )
    return CompiledRun(compile_key(config), ordered, tuple(trace), answers)


def simulate(
    requests: Sequence[Request] | CompiledRun,
    config: SimConfig,
    latency: LatencyModel,
    *,
    progress: bool | None = None,
    on_iteration: IterationHook | None = None,
    columns: bool = False,
) -> SimResult:
    """Serve ``requests`` (any order, or compiled once for many runs: :func:`compile_run`) and
    measure every request; the same results either way.

    ``on_iteration(replica, start_s, end_s, iteration)`` is called for every iteration a replica
    runs, in each replica's order (for tests and debugging; None costs nothing). ``columns``:
    no rows and no summary (``requests`` empty, ``summary`` only the latency label and the
    count), but a few of the rows' fields as arrays in ``columns``
    (:func:`skv.sim.results.request_columns`): for a caller that summarises many runs itself,
    to whom the rows cost about a sixth of the run."""
    if not isinstance(requests, CompiledRun):
        run = compile_run(requests, config)
    elif requests.key != compile_key(config):
        raise ValueError(
            f"simulate: the requests were compiled for (block_size, mode, salt_by_tenant, "
            f"include_output_blocks) = {requests.key}, the config has {compile_key(config)}"
        )
    elif config.policy in OFFLINE:  # it writes next uses onto the blocks: its own copy
        run = compile_run(requests.requests, config)
    else:
        run = requests
    trace = list(run.trace)
    with no_cyclic_gc():
        states = [
            RequestState(rb.index, r, rb, r.arrival_s)
            for r, rb in zip(run.requests, trace, strict=True)
        ]
    for st, (ext_rb, ext_start) in zip(states, run.answers, strict=False):
        st.ext_rb, st.ext_start = ext_rb, ext_start
    make = _tiered_cache_maker(config, latency, trace) if config.tiers else None
    replicas = [
        Replica(
            k,
            make()
            if make is not None
            else make_cache(config.policy, config.capacity_blocks, config.policy_params),
            config.max_batch_tokens,
            config.max_running,
        )
        for k in range(config.replicas)
    ]
    if config.policy in OFFLINE:
        _annotate_next_use(states)
        for rep in replicas:
            rep.cache.prepare(trace)
    router = SimRouting(
        config.router,
        config.router_params,
        replicas,
        config.router_view,
        config.router_cache_blocks,
    )
    sim = EventLoop(config, latency, replicas, on_iteration, _RUN_CAP_START, _RUN_CAP_MAX)
    with (
        tqdm(
            total=len(states),
            desc=f"simulate {config.policy}",
            unit="req",
            leave=False,
            disable=(not progress) if progress is not None else None,
            mininterval=1.0,
        ) as bar,
        existing_objects_frozen(),
    ):
        sim.run(states, router, None if bar.disable else bar.update)
    unfinished = [st for st in states if st.finished_s is None]
    if unfinished:  # cannot happen unless a request can never be admitted
        raise RuntimeError(
            f"{len(unfinished)} requests never finished (first: {unfinished[0].request.request_id})"
        )
    sim.memory.sort(key=_by_time)  # decode runs add their samples when they end
    if columns:
        result = column_result(states, sim.memory, sim.policy_series, config, latency)
    else:
        with no_cyclic_gc():  # one row dict per request
            result = summarize(states, replicas, sim.memory, sim.policy_series, config, latency)
    if config.tiers:
        result.summary.update(tier_summary([rep.cache for rep in replicas]))
    return result


def _tiered_cache_maker(
    config: SimConfig, latency: LatencyModel, trace: Sequence[RequestBlocks]
) -> Callable[[], TieredCache]:
    """A factory of each replica's tiered cache (docs/tiers.md): its lower tiers sized from
    the trace, and a pricer of its loads on the latency model."""
    if config.policy in OFFLINE:
        raise ValueError(f"policy {config.policy!r} cannot run a tier (an offline oracle)")
    specs = [TierSpec.parse(s) for s in config.tiers]
    model = config.tier_model or latency.describe().get("constants", {}).get("llm")
    if model is None:
        raise ValueError(
            f"tiers need the KV bytes per token: set tier_model (the {latency.name} latency "
            "model names no model preset)"
        )
    per_token = get_model(model).kv_bytes_per_token
    # the distinct blocks (millions of keys on a long trace) size only a capacity in % of them
    relative = any(Capacity.parse(s.capacity).kind == "fraction" for s in specs)
    unique = len({k for rb in trace for k in rb.keys}) if relative else None
    block_size = trace[0].block_size if trace else 1
    lower = resolve_tiers(specs, block_size=block_size, unique_blocks=unique, model=model)
    links = [LINKS[s.link] for s in specs]

    def make() -> TieredCache:
        return TieredCache(
            config.policy,
            config.capacity_blocks,
            lower,
            write=config.tier_write,
            load=config.tier_load,
            top_params=config.policy_params,
            pricer=LoadPricer(latency, per_token, links, choice=config.tier_choice),
        )

    return make


#: a decode run's length cap starts here, doubles while runs end uncut, and never exceeds the max
_RUN_CAP_START = 8
_RUN_CAP_MAX = 1024


def _by_time(row: dict[str, float]) -> float:
    return row["time_s"]


def _answer_blocks(
    r: Request, rb: RequestBlocks, config: SimConfig
) -> tuple[RequestBlocks | None, int]:
    """The blocks of prompt + answer (cached when the request ends) and the first of them that
    differs from the prompt's own (the prompt's partial last block is completed by the answer's
    first tokens). Hash-id traces carry no identity for generated tokens, so their answers are
    not cached: ``(None, 0)``.
    """
    if r.hash_ids is not None:
        return None, 0
    answer = Segment(
        SemanticType.OUTPUT,
        max(1, int(r.output_tokens)),  # the request's output target (RequestState)
        content_hash=r.output_hash or content_hash(f"output:{r.request_id}"),
        reusable=False,
    )
    ext = Request(
        r.request_id,
        r.arrival_s,
        [*r.segments, answer],
        tenant_id=r.tenant_id,
        session_id=r.session_id,
        turn=r.turn,
        templated=r.templated,
    )
    ext_rb = request_blocks(
        ext,
        rb.block_size,
        KeyingMode(config.mode),
        index=rb.index,
        salt_by_tenant=config.salt_by_tenant,
    )
    start = 0
    for a, b in zip(rb.keys, ext_rb.keys, strict=False):
        if a != b:
            break
        start += 1
    return ext_rb, start


def _annotate_next_use(states: list[RequestState]) -> None:
    """Next use of every block a request touches, prompt and answer, for offline policies."""
    combined = []
    for st in states:
        rb = st.rb
        keys = list(rb.keys)
        if st.ext_rb is not None:
            keys += st.ext_rb.keys[st.ext_start :]
        combined.append(
            RequestBlocks(
                rb.index,
                rb.arrival_s,
                keys,
                [None] * len(keys),
                [1] * len(keys),
                [0] * len(keys),
                [1] * len(keys),
                None,
                0,
                False,
                rb.block_size,
            )
        )
    annotate_next_use(combined)
    for st, comb in zip(states, combined, strict=True):
        n = len(st.rb.keys)
        st.rb.next_use = comb.next_use[:n]
        if st.ext_rb is not None:
            st.ext_rb.next_use = st.rb.next_use[: st.ext_start] + comb.next_use[n:]


def config_dict(config: SimConfig) -> dict[str, Any]:
    return asdict(config)
