"""A tiered KV store: GPU memory (the radix block cache) over lower tiers (host DRAM, local
NVMe, a remote store), each with its own capacity and eviction policy, joined by links.

Why: at KV-Repurpose's 30 GB-1 TB the KV does not fit in GPU memory; deployed systems (LMCache,
Mooncake Store, SGLang HiCache, vLLM's OffloadingConnector) keep it in DRAM or on SSD and load a
hit over a link. This module answers, by replay, how many hits each tier serves and how many
bytes each link moves, and (:class:`LoadPricer`, for the serving simulator) whether a hit in a
lower tier is worth loading or cheaper to recompute (docs/tiers.md).

Model (names in brackets are the knobs):

- Tier 0 is a :class:`~skv.cache.radix.BlockCache` with any online registered policy: prefix-
  closed (only unpinned leaves are evicted), so its hits are a prefix of every lookup run.
- Lower tiers are :class:`TierStore`\\ s: flat stores keyed by the block key, each with any
  online registered policy. Keys are prefix keys in prefix mode, so a key names its whole
  prefix, as LMCache's chunk hashes and vLLM's block hashes do.
- **Usable**: a block is usable when it is in some tier and every block before it in its lookup
  run is usable (a run stops at the first block no tier holds). Usable blocks not in tier 0 are
  *loads* from the highest tier that holds them; each load crosses every link from its tier up.
- Loaded blocks enter tier 0 like computed ones (a loaded block is KV in GPU memory, cached
  there as vLLM and SGLang cache it). [``load``] ``copy``: the lower tier keeps its copy (a hit
  there); ``move``: it drops it once tier 0 holds the block.
- [``write``] ``through``: every block computed for a request is written to every lower tier
  (vLLM's offloading and HiCache's write-through); ``evict``: a block reaches tier ``k + 1`` only
  when tier ``k`` evicts it. Under both, a block a tier evicts is demoted to the next tier if that
  tier lacks it; the last tier drops it.
- Exclusive = ``evict`` + ``move``; inclusive = ``through`` + ``copy`` (the default).

Invariant (tests/test_tiers.py): with flat single-block requests, two LRU tiers, ``evict`` and
``move`` give, request by request, the hits of one LRU of the summed capacity. With prefix
trees they can differ: tier 0 evicts only leaves while a lower tier evicts any block, so a
lower tier may keep a child whose parent it dropped (unusable until the parent returns).

Within a request, tier moves happen after its tier-0 lookup: blocks tier 0 evicts while serving
a request are demoted when it is done, and a block the request itself still needed but tier 0
evicted before reaching it (segment keying's later runs) is loaded from the highest lower tier
that holds it (under write-through, every tier), else recomputed. Offline policies (they
need next-use annotations per tier) and ``vllm``'s block pool (not a policy of the radix cache)
cannot be tiers.

The stores, the pricer and the cache are compiled with the replay hot path (:mod:`skv._build`;
plain Python without a compiler, same results: tests/test_compiled_equivalence.py).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import cython

from skv.blocks import RequestBlocks
from skv.cache.block import Block, Lease, new_block
from skv.cache.policy import Policy
from skv.cache.radix import BlockCache
from skv.model import NUM_TYPES
from skv.policies.registry import OFFLINE, make_policy, policy_class
from skv.sizing import Capacity, get_model

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Link:
    """A link between a tier and the one above it. Bandwidth in GB/s (10^9 bytes), one way."""

    name: str
    bandwidth_gbs: float
    latency_us: float
    source: str

    def seconds(self, nbytes: float, transfers: int = 1) -> float:
        """Time to move ``nbytes`` in ``transfers`` separate transfers (each pays the latency)."""
        return transfers * self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbs * 1e9)


#: Link presets. Bandwidths are the interface's raw one-way rate times an assumed efficiency;
#: latencies are assumptions of this artifact, named as such (docs/tiers.md).
LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link(
            "pcie5",
            50.0,
            10.0,
            "PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s raw one way (PCI-SIG); "
            "50 GB/s assumes the ~80% that large DMA copies reach; 10 us per transfer assumed",
        ),
        Link(
            "nvme",
            7.0,
            100.0,
            "one PCIe 4.0 x4 NVMe SSD: ~7 GB/s sequential read in vendors' data sheets (e.g. "
            "Samsung 990 PRO 7.45 GB/s); ~100 us NAND read latency assumed",
        ),
        Link(
            "rdma",
            25.0,
            5.0,
            "one 200 Gb/s RDMA NIC (InfiniBand HDR / ConnectX-6) = 25 GB/s raw; Mooncake Store's "
            "transfer engine and LMCache's remote backends use such links; 5 us assumed",
        ),
    )
}

#: tier name -> its default link (any other name must give ``link=``)
DEFAULT_LINK = {
    "cpu": "pcie5",
    "dram": "pcie5",
    "host": "pcie5",
    "disk": "nvme",
    "ssd": "nvme",
    "nvme": "nvme",
    "remote": "rdma",
    "rdma": "rdma",
}

WRITES = ("through", "evict")
LOADS = ("copy", "move")
#: lower-tier policies a ``move`` load may drop a block from: they keep no per-queue counts
#: that a removal outside their own eviction would leave stale (s3fifo's, arc's and
#: wtinylfu's do; the others are not checked)
MOVE_POLICIES = ("lru", "fifo", "sieve")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One lower tier as configs and the CLI give it: ``NAME=SIZE[@POLICY][,link=LINK]``.

    ``SIZE`` is any :class:`~skv.sizing.Capacity` (blocks, ``tok``, ``%`` of unique blocks,
    bytes with a model preset); ``POLICY`` any online registered policy (default ``lru``, the
    CPU pool of vLLM's OffloadingConnector and LMCache's default)."""

    name: str
    capacity: str
    policy: str = "lru"
    link: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tier name {self.name!r}: lowercase letters, digits and _")
        Capacity.parse(self.capacity)
        check_tier_policy(self.policy)
        link = self.link or DEFAULT_LINK.get(self.name)
        if link is None:
            raise ValueError(
                f"tier {self.name!r}: no default link for this name ({', '.join(DEFAULT_LINK)} "
                f"have one); give one: {self.name}={self.capacity},link=pcie5|nvme|rdma"
            )
        if link not in LINKS:
            raise ValueError(
                f"tier {self.name!r}: unknown link {link!r}; known: {', '.join(LINKS)}"
            )
        object.__setattr__(self, "link", link)

    @classmethod
    def parse(cls, text: str) -> TierSpec:
        name, sep, rest = text.partition("=")
        if not sep or not rest:
            raise ValueError(
                f"tier {text!r}: expected NAME=SIZE[@POLICY][,link=LINK], e.g. cpu=20%"
            )
        size_policy, *options = rest.split(",")
        size, _, policy = size_policy.partition("@")
        link = ""
        for opt in options:
            key, _, value = opt.partition("=")
            if key.strip() != "link" or not value:
                raise ValueError(f"tier {text!r}: unknown option {opt!r} (only link=LINK)")
            link = value.strip()
        return cls(name.strip(), size.strip(), policy.strip() or "lru", link)


def check_tier_policy(name: str) -> None:
    """A tier takes an online policy of the radix cache: not ``vllm``'s pool, not an oracle."""
    policy_class(name)  # unknown names fail here, with the list
    if name == "vllm" or name in OFFLINE:
        raise ValueError(
            f"policy {name!r} cannot run a tier: a tier takes an online policy of the radix cache"
        )


def check_move_policies(policies: list[str]) -> None:
    """``move`` loads only over lower tiers whose policy can lose a block it did not evict."""
    bad = sorted({p for p in policies if p not in MOVE_POLICIES})
    if bad:
        raise ValueError(
            f"tier load move: lower tiers running {', '.join(bad)} cannot drop a loaded block "
            f"(their queue counts would go stale); use {', '.join(MOVE_POLICIES)} there, or "
            "--tier-load copy"
        )


class TierStore:
    """A lower tier: a flat, capacity-bounded set of blocks ordered by a policy.

    Blocks are chain roots (no parent), so the policy's leaf-only rule never binds. The store
    calls the policy hooks in :mod:`skv.cache.policy`'s order (insert pinned, then unpin; a hit
    pins, hits and unpins). :meth:`remove` (a ``move`` load) pins the block for good: the policy
    drops it from its order when its scan meets it, as it drops any pinned block."""

    def __init__(self, name: str, capacity_blocks: int, policy: Any) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"tier {name!r}: capacity must be >= 1 block, got {capacity_blocks}")
        self.name = name
        self.capacity_blocks = capacity_blocks
        self.policy = policy
        self.blocks = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, key: object) -> bool:
        return key in self.blocks

    def touch(self, key: object, now: cython.double):
        """A load served from here (``copy``): a hit for the policy."""
        b: Block = self.blocks[key]
        policy: Policy = self.policy
        b.ref = 1
        policy.on_pin(b)
        b.hits += 1
        b.last_access = now
        policy.on_hit(b, now)
        b.ref = 0
        policy.on_unpin(b, now)

    def insert(
        self, key: object, stype: cython.int, tokens: cython.int, req: object, now: cython.double
    ) -> list:
        """Store ``key`` (absent); returns the blocks evicted to make room, oldest decision
        first."""
        evicted: list = []
        policy: Policy = self.policy
        blocks: dict = self.blocks
        v: Block
        while len(blocks) >= self.capacity_blocks:
            found = policy.victim()
            if found is None:
                # nothing here is pinned for long: a policy that finds no victim is broken
                raise AssertionError(f"tier {self.name!r}: policy found no victim in a full tier")
            v = found
            del blocks[v.key]
            policy.on_evict(v, now)
            self.evictions += 1
            evicted.append(v)
        b: Block = new_block(key, None, tokens, stype, 0, req, now)
        blocks[key] = b
        b.ref = 1
        policy.on_insert(b, now)
        b.ref = 0
        policy.on_unpin(b, now)
        return evicted

    def remove(self, key: object):
        """Drop ``key`` without it being a victim (a ``move`` load)."""
        b: Block = self.blocks.pop(key)
        b.ref = 1
        self.policy.on_pin(b)


@dataclass
class TierStats:
    """Hits per tier (index 0 = GPU) and traffic per link (index ``k`` = the link above tier
    ``k``; index 0 unused), in blocks and tokens."""

    names: list[str]
    requests: int = 0
    prompt_tokens: int = 0
    block_accesses: int = 0
    hit_blocks: list[int] = field(default_factory=list)
    hit_tokens: list[int] = field(default_factory=list)
    loaded_blocks: list[int] = field(default_factory=list)  # up each link
    loaded_tokens: list[int] = field(default_factory=list)
    stored_blocks: list[int] = field(default_factory=list)  # down each link
    stored_tokens: list[int] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)  # the last tier's are drops
    # the pricer's choices, per tier (index 0 unused): segments loaded, and segments (and
    # their tokens) recomputed though the tier held them; total load time in ms
    loaded_segments: list[int] = field(default_factory=list)
    recomputed_segments: list[int] = field(default_factory=list)
    recomputed_tokens: list[int] = field(default_factory=list)
    load_ms: float = 0.0
    hit_tokens_by_type: list[int] = field(default_factory=lambda: [0] * NUM_TYPES)  # all tiers

    def __post_init__(self) -> None:
        n = len(self.names)
        for f in (
            "hit_blocks",
            "hit_tokens",
            "loaded_blocks",
            "loaded_tokens",
            "stored_blocks",
            "stored_tokens",
            "evictions",
            "loaded_segments",
            "recomputed_segments",
            "recomputed_tokens",
        ):
            if not getattr(self, f):
                setattr(self, f, [0] * n)

    @property
    def total_hit_tokens(self) -> int:
        return sum(self.hit_tokens)

    @property
    def total_hit_blocks(self) -> int:
        return sum(self.hit_blocks)


CHOICES = ("cheaper", "load")


class LoadPricer:
    """Prices a request's lower-tier hits and chooses, per run, which to load.

    A *segment* is a maximal stretch of one lookup run served by one lower tier. Loading it
    moves its bytes (``kv_bytes_per_token`` x tokens) up every link from its tier:
    ``sum(latency) + bytes / min(bandwidth)`` over those links (a pipelined transfer bound
    by its slowest link). Recomputing from a segment on costs the prefill of every usable
    token from there to the end of the run, priced as what those tokens add to the prefill
    the request runs anyway (:meth:`recompute_ms`; a roofline prices it by FLOPs and
    bytes). A run's tier-0 hits are always used (they are a prefix of
    the run: tier 0 evicts only leaves); after them, an engine's computed tokens follow its
    cached ones, so the choice is a cut: load the segments before it, recompute from it. With
    ``choice="cheaper"`` the cut minimises load time + recompute time (ties load);
    ``"load"`` loads every segment, as engines that always prefer a hit do."""

    def __init__(
        self,
        latency: Any,
        kv_bytes_per_token: float,
        links: list[Link],
        *,
        choice: str = "cheaper",
    ) -> None:
        if choice not in CHOICES:
            raise ValueError(f"tier choice {choice!r}: one of {', '.join(CHOICES)}")
        if not kv_bytes_per_token > 0:
            raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token!r}")
        self.latency = latency
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.choice = choice
        # tier t (1-based) -> (summed latency s, slowest bandwidth bytes/s) of links 1..t
        self._paths = []
        for t in range(1, len(links) + 1):
            up = links[:t]
            self._paths.append(
                (sum(x.latency_us for x in up) * 1e-6, min(x.bandwidth_gbs for x in up) * 1e9)
            )

    @cython.boundscheck(True)
    @cython.wraparound(True)
    def load_ms(self, tier: cython.longlong, tokens: cython.longlong) -> cython.double:
        """Time to bring ``tokens`` of KV from lower tier ``tier`` (1-based) to tier 0."""
        path: tuple = self._paths[tier - 1]
        lat: cython.double = path[0]
        bw: cython.double = path[1]
        return (lat + tokens * self.kv_bytes_per_token / bw) * 1e3

    def recompute_ms(
        self, tokens: cython.longlong, after: cython.longlong, before: cython.longlong
    ) -> cython.double:
        """Marginal prefill cost of ``tokens`` after ``before`` tokens already in KV, in a
        request that computes ``after`` more tokens anyway (at least its last one): computing
        ``tokens + after`` from ``before`` against computing ``after`` from ``before + tokens``.
        A short stretch then costs its share of the prefill it joins, not the fixed cost an
        empty prefill would save."""
        if tokens <= 0:
            return 0.0
        after = max(1, after)
        ttft = self.latency.ttft_ms
        return ttft(tokens + after, before) - ttft(after, before + tokens)

    def decide(self, rb: RequestBlocks, where: list, st: object) -> cython.double:
        """Set ``where[i] = -1`` for the lower-tier blocks to recompute; count the choices
        in ``st``; returns the load time (ms) of the rest."""
        n: cython.Py_ssize_t = len(where)
        i: cython.Py_ssize_t
        j: cython.Py_ssize_t
        k: cython.Py_ssize_t
        x: cython.Py_ssize_t
        m: cython.Py_ssize_t
        cut: cython.Py_ssize_t
        best_cut: cython.Py_ssize_t
        nseg: cython.Py_ssize_t
        t: cython.Py_ssize_t
        w: cython.Py_ssize_t
        tok: cython.longlong
        for i in range(n):
            if where[i] >= 1:
                break
        else:  # nothing below GPU memory: nothing to choose
            return 0.0
        tokens: list = rb.tokens
        parents: list = rb.parents
        total: cython.double = 0.0
        cheaper: cython.bint = self.choice == "cheaper"
        # under "cheaper": tokens computed anyway in the whole request; then, as the scan goes,
        # the prompt tokens before block x and those of them computed anyway (blocks of a run
        # being decided are not computed anyway: they are in a lower tier)
        computed: cython.longlong = 0
        before: cython.longlong = 0
        computed_before: cython.longlong = 0
        if cheaper:
            for x in range(n):
                if where[x] < 0:
                    computed += tokens[x]
        loaded_segments: list = st.loaded_segments
        recomputed_segments: list = st.recomputed_segments
        recomputed_tokens: list = st.recomputed_tokens
        # (start, stop, tier, tokens) of each segment of a run: from block i to the run's last
        # usable block
        seg_start: list
        seg_stop: list
        seg_tier: list
        seg_tokens: list
        loads: list
        run_tokens: cython.longlong
        after: cython.longlong
        loaded_tok: cython.longlong
        rest: cython.longlong
        best_ms: cython.double
        loaded_ms: cython.double
        cost: cython.double
        load: cython.double
        i = 0
        while i < n:
            w = where[i]
            if w < 1:  # not in a lower tier: no choice here
                if cheaper:
                    tok = tokens[i]
                    before += tok
                    if w < 0:
                        computed_before += tok
                i += 1
                continue
            seg_start = []
            seg_stop = []
            seg_tier = []
            seg_tokens = []
            loads = []
            run_tokens = 0
            j = i
            while j < n and where[j] >= 1 and (j == i or parents[j] is not None):
                t = where[j]
                k = j
                tok = 0
                while k < n and where[k] == t and (k == j or parents[k] is not None):
                    tok += tokens[k]
                    k += 1
                seg_start.append(j)
                seg_stop.append(k)
                seg_tier.append(t)
                seg_tokens.append(tok)
                run_tokens += tok
                j = k
            nseg = len(seg_start)
            best_cut = nseg
            best_ms = 0.0
            for m in range(nseg):
                loads.append(self.load_ms(seg_tier[m], seg_tokens[m]))
            if cheaper:
                best_ms = float("inf")
                loaded_ms = 0.0
                loaded_tok = 0
                after = computed - computed_before  # computed anyway from block j on
                for cut in range(nseg + 1):
                    rest = run_tokens - loaded_tok
                    cost = loaded_ms + self.recompute_ms(rest, after, before + loaded_tok)
                    if cost <= best_ms:
                        best_cut = cut
                        best_ms = cost
                    if cut < nseg:
                        load = loads[cut]
                        loaded_ms += load
                        tok = seg_tokens[cut]
                        loaded_tok += tok
                before += run_tokens
            for m in range(nseg):
                t = seg_tier[m]
                if m < best_cut:
                    loaded_segments[t] += 1
                    load = loads[m]
                    total += load
                else:
                    recomputed_segments[t] += 1
                    recomputed_tokens[t] += seg_tokens[m]
                    for x in range(seg_start[m], seg_stop[m]):
                        where[x] = -1
            i = j
        st.load_ms += total
        return total


class TierLease:
    """What a request holds in a :class:`TieredCache` while in flight: tier 0's lease, the
    tier that served each block (-1: computed), the hits of all tiers together (what the
    request does not compute) and the time its loads take (ms, 0 without a pricer)."""

    def __init__(
        self,
        top: Lease,
        where: list,
        hit_blocks: cython.longlong,
        hit_tokens: cython.longlong,
        load_ms: cython.double,
    ) -> None:
        self.top = top
        self.where = where
        self.hit_blocks = hit_blocks
        self.hit_tokens = hit_tokens
        self.load_ms = load_ms


@dataclass
class ServingStats:
    """The cache counters the serving simulator's summary reads (``hit_tokens_by_type`` and
    ``hit_blocks_by_type`` over all tiers, evictions of tier 0), so its hit rates by type
    agree with its per-request cached tokens, which include loads."""

    hit_tokens_by_type: list[int]
    hit_blocks_by_type: list[int]
    evictions_by_type: list[int]
    evictions: int


class TieredCache:
    """Tier 0 (a recording :class:`BlockCache`) over :class:`TierStore`\\ s; see the module
    docstring for the rules.

    Two uses: :meth:`access` serves one request at its arrival (the cache-only replay), and
    :meth:`acquire` / :meth:`extend` / :meth:`release` hold a request in flight, with the
    cache interface a serving replica reads (:mod:`skv.sim.replica`). ``access`` is
    ``acquire`` then ``release``. With a ``pricer`` (:class:`LoadPricer`) each lower-tier
    run is loaded or recomputed by its cost, and the loads' time is kept for the replica to
    take (:meth:`take_load_ms`)."""

    def __init__(
        self,
        top_policy: str,
        top_capacity_blocks: int,
        lower: list[tuple[TierSpec, int]],
        *,
        write: str = "through",
        load: str = "copy",
        top_params: dict[str, Any] | None = None,
        pricer: LoadPricer | None = None,
    ) -> None:
        if write not in WRITES:
            raise ValueError(f"tier write {write!r}: one of {', '.join(WRITES)}")
        if load not in LOADS:
            raise ValueError(f"tier load {load!r}: one of {', '.join(LOADS)}")
        if not lower:
            raise ValueError("a tiered cache needs at least one lower tier")
        names = ["gpu"] + [spec.name for spec, _ in lower]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be distinct (gpu is tier 0): {names}")
        check_tier_policy(top_policy)
        if load == "move":
            check_move_policies([spec.policy for spec, _ in lower])
        self.top = BlockCache(top_capacity_blocks, make_policy(top_policy, top_params))
        # what tier 0 evicts, in eviction order, until demoted (BlockCache keeps it)
        self._evicted = []
        self.top.evicted_blocks = self._evicted
        self.tiers = [
            TierStore(spec.name, cap, make_policy(spec.policy, spec.params)) for spec, cap in lower
        ]
        self.specs = [spec for spec, _ in lower]
        self.write = write
        self.load = load
        self._through = write == "through"
        self._move = load == "move"
        self.pricer = pricer
        st = TierStats(names)
        self.tier_stats = st
        self._stored_blocks = st.stored_blocks
        self._stored_tokens = st.stored_tokens
        self._tier_evictions = st.evictions
        self._pending_load_ms = 0.0
        self._hit_blocks_by_type = [0] * NUM_TYPES

    # ---------------------------------------------------------- the replica's cache interface

    @property
    def policy(self) -> Any:
        return self.top.policy

    @property
    def capacity_blocks(self) -> int:
        return self.top.capacity_blocks

    @property
    def usable_blocks(self) -> int:
        return self.top.usable_blocks

    @property
    def pinned_blocks(self) -> int:
        return self.top.pinned_blocks

    def __len__(self) -> int:
        return len(self.top)

    def lookup(self, rb: RequestBlocks) -> int:
        """Tier 0's hits (what a cache-aware router's exact view reads: GPU-resident KV)."""
        return self.top.lookup(rb)

    def admission_need(self, rb: RequestBlocks) -> int:
        """Tier 0's: a loaded block takes a GPU block like a computed one."""
        return self.top.admission_need(rb)

    @property
    def stats(self) -> ServingStats:
        top = self.top.stats
        return ServingStats(
            list(self.tier_stats.hit_tokens_by_type),
            list(self._hit_blocks_by_type),
            list(top.evictions_by_type),
            top.evictions,
        )

    def take_load_ms(self) -> float:
        """The load time of the requests acquired since the last call (ms), and reset it."""
        ms: cython.double = self._pending_load_ms
        self._pending_load_ms = 0.0
        return ms

    # ---------------------------------------------------------------------- serving a request

    def access(self, rb: RequestBlocks, now: float) -> list[int]:
        """Serve ``rb`` at once: returns the tier that served each block (-1: computed)."""
        lease: TierLease = self.acquire(rb, now)
        self.release(lease, now)
        return lease.where

    def acquire(self, rb: RequestBlocks, now: cython.double) -> TierLease:
        """Look ``rb`` up in every tier, load what is usable (or recompute it, by the
        pricer), pin its blocks in tier 0 and apply the tier moves."""
        top: BlockCache = self.top
        cached: dict = top.blocks
        tiers: list = self.tiers
        n_low: cython.Py_ssize_t = len(tiers)
        keys: list = rb.keys
        parents: list = rb.parents
        tokens: list = rb.tokens
        stypes: list = rb.stypes
        n: cython.Py_ssize_t = len(keys)
        i: cython.Py_ssize_t
        k: cython.Py_ssize_t
        t: cython.Py_ssize_t
        s: cython.Py_ssize_t
        tok: cython.longlong
        in_run: cython.bint
        store: TierStore
        b: Block
        for k in range(n_low):  # sessions, turns: what session-aware policies learn from
            store = tiers[k]
            store.policy.on_request(rb, now)
        where: list = self._classify(keys, parents)
        evicted: list = self._evicted
        del evicted[:]
        lease: Lease = top.acquire(rb, now)
        # tier-0 blocks evicted before this request reached them, and blocks tier 0 could not
        # cache (a request larger than it): a load must land in GPU memory, else it is computed.
        # Without either, the pass below changes nothing.
        short: cython.bint = len(lease.blocks) != n
        gone: set = set()
        for i in range(len(evicted)):
            b = evicted[i]
            gone.add(b.key)
        if short or not gone.isdisjoint(keys):
            # a repeat is a tier-0 hit iff its key is cached now: its first copy, hit or
            # cached by this request, stays pinned; a copy tier 0 could not cache means no
            # later copy could be cached either (nothing is released during an acquire)
            in_run = False
            seen: set = set()
            for i in range(n):
                key = keys[i]
                if parents[i] is None:
                    in_run = True
                if not in_run:
                    where[i] = -1
                    seen.add(key)
                    continue
                if key in seen:
                    in_run = key in cached
                    where[i] = 0 if in_run else -1
                    continue
                seen.add(key)
                t = where[i]
                if t == 0 and key in gone:  # loaded from below if kept there
                    t = -1
                    for k in range(n_low):
                        store = tiers[k]
                        if key in store.blocks:
                            t = k + 1
                            break
                    where[i] = t
                    in_run = t > 0
                if in_run and t >= 0 and short and key not in cached:
                    where[i] = -1  # also a repeat whose first copy tier 0 could not cache
                    in_run = False
        st = self.tier_stats
        load_ms: cython.double = 0.0
        if self.pricer is not None:
            load_ms = self.pricer.decide(rb, where, st)
        st.requests += 1
        st.prompt_tokens += rb.prompt_tokens
        st.block_accesses += n
        blocks_at: list = [0] * (n_low + 1)  # this request's hits per tier
        tokens_at: list = [0] * (n_low + 1)
        tokens_by_type: list = st.hit_tokens_by_type
        blocks_by_type: list = self._hit_blocks_by_type
        move: cython.bint = self._move
        # hits are summed in C over stretches of one tier (and of one type), then added to the
        # per-tier (per-type) counts when the stretch ends
        run_t: cython.Py_ssize_t = -1
        run_blocks: cython.longlong = 0
        run_tokens: cython.longlong = 0
        run_s: cython.Py_ssize_t = -1
        type_blocks: cython.longlong = 0
        type_tokens: cython.longlong = 0
        for i in range(n):
            t = where[i]
            if t < 0:
                continue
            tok = tokens[i]
            s = stypes[i]
            if t != run_t:
                if run_t >= 0:
                    blocks_at[run_t] += run_blocks
                    tokens_at[run_t] += run_tokens
                run_t = t
                run_blocks = 0
                run_tokens = 0
            run_blocks += 1
            run_tokens += tok
            if s != run_s:
                if run_s >= 0:
                    tokens_by_type[run_s] += type_tokens
                    blocks_by_type[run_s] += type_blocks
                run_s = s
                type_blocks = 0
                type_tokens = 0
            type_blocks += 1
            type_tokens += tok
            if t:
                store = tiers[t - 1]
                key = keys[i]
                if move and key in cached:
                    store.remove(key)
                else:
                    store.touch(key, now)
        if run_t >= 0:
            blocks_at[run_t] += run_blocks
            tokens_at[run_t] += run_tokens
        if run_s >= 0:
            tokens_by_type[run_s] += type_tokens
            blocks_by_type[run_s] += type_blocks
        for t in range(n_low + 1):
            st.hit_blocks[t] += blocks_at[t]
            st.hit_tokens[t] += tokens_at[t]
            if t:  # a load from tier t crosses every link from tier t up to tier 0
                st.loaded_blocks[t] += sum(blocks_at[t:])
                st.loaded_tokens[t] += sum(tokens_at[t:])
        top_hits = blocks_at[0]
        hit_blocks = sum(blocks_at)
        hit_tokens = sum(tokens_at)
        if top_hits != lease.hit_blocks:
            raise AssertionError(
                f"request {rb.index}: tier 0 served {lease.hit_blocks} blocks, the tier "
                f"classification says {top_hits}"
            )
        if self._through:
            for i in range(n):
                t = where[i]
                if t < 0:
                    found = cached.get(keys[i])
                    if found is not None:  # computed and cached: write it down
                        self._write_through(found, now)
        self._demote(now)
        self._pending_load_ms += load_ms
        return TierLease(lease, where, hit_blocks, hit_tokens, load_ms)

    def _classify(self, keys: list, parents: list) -> list:
        """Per block, the highest tier holding it (0: GPU memory) while its lookup run lasts,
        else -1; a key met again in the request counts as in tier 0 (it is by then)."""
        cached: dict = self.top.blocks
        tiers: list = self.tiers
        n_low: cython.Py_ssize_t = len(tiers)
        n: cython.Py_ssize_t = len(keys)
        i: cython.Py_ssize_t
        k: cython.Py_ssize_t
        t: cython.Py_ssize_t
        store: TierStore
        where: list = []
        in_run: cython.bint = False
        repeats: cython.bint = len(set(keys)) != n
        seen: set = set()
        for i in range(n):
            key = keys[i]
            if parents[i] is None:
                in_run = True
            if not in_run:
                where.append(-1)
            elif key in cached or (repeats and key in seen):
                where.append(0)
            else:
                t = -1
                for k in range(n_low):
                    store = tiers[k]
                    if key in store.blocks:
                        t = k + 1
                        break
                if t < 0:
                    in_run = False
                where.append(t)
            if repeats:
                seen.add(key)
        return where

    def extend(self, lease: TierLease, rb: RequestBlocks, start: int, now: float) -> None:
        """Tier 0 grows the request by its answer's blocks (computed: written down under
        ``through``)."""
        cached: dict = self.top.blocks
        self.top.extend(lease.top, rb, start, now)
        if self._through:
            for key in rb.keys[start:]:
                found = cached.get(key)
                if found is not None:
                    self._write_through(found, now)
        self._demote(now)

    def release(self, lease: TierLease, now: cython.double):
        self.top.release(lease.top, now)
        self._demote(now)

    def _write_through(self, b: Block, now: cython.double) -> None:
        key = b.key
        tiers: list = self.tiers
        k: cython.Py_ssize_t
        store: TierStore
        for k in range(len(tiers)):
            store = tiers[k]
            if key not in store.blocks:
                self._store(k, key, b.stype, b.tokens, b.req, now)

    def _demote(self, now: cython.double) -> None:
        """Demote what tier 0 evicted, in eviction order (unless back in tier 0 since)."""
        evicted: list = self._evicted
        if not evicted:
            return
        first: TierStore = self.tiers[0]
        cached: dict = self.top.blocks
        i: cython.Py_ssize_t
        b: Block
        for i in range(len(evicted)):  # _store changes lower tiers only: evicted stays as is
            b = evicted[i]
            if b.key not in first.blocks and b.key not in cached:
                self._store(0, b.key, b.stype, b.tokens, b.req, now)
        del evicted[:]
        self._tier_evictions[0] = self.top.counters.evictions

    def _store(
        self,
        k: cython.Py_ssize_t,
        key: object,
        stype: cython.int,
        tokens: cython.int,
        req: object,
        now: cython.double,
    ) -> None:
        """Put a block into lower tier ``k`` (index into ``self.tiers``), cascading what it
        evicts down to the tiers below (dropped past the last)."""
        self._stored_blocks[k + 1] += 1
        self._stored_tokens[k + 1] += tokens
        tiers: list = self.tiers
        store: TierStore = tiers[k]
        below: TierStore = tiers[k + 1] if k + 1 < len(tiers) else None
        v: Block
        for v in store.insert(key, stype, tokens, req, now):
            self._tier_evictions[k + 1] += 1
            if below is not None and v.key not in below.blocks:
                self._store(k + 1, v.key, v.stype, v.tokens, v.req, now)

    def replay(self, trace: Any, start: int = 0, stop: int | None = None) -> None:
        rb: RequestBlocks
        i: cython.Py_ssize_t
        end: cython.Py_ssize_t = len(trace) if stop is None else stop
        for i in range(start, end):
            rb = trace[i]
            self.release(self.acquire(rb, rb.arrival_s), rb.arrival_s)


def resolve_tiers(
    specs: list[TierSpec], *, block_size: int, unique_blocks: int | None, model: str | None
) -> list[tuple[TierSpec, int]]:
    """Each spec with its capacity in blocks (``unique_blocks`` is read only by a capacity in
    ``%`` of unique blocks: None when no spec has one)."""
    return [
        (
            s,
            Capacity.parse(s.capacity).to_blocks(
                block_size=block_size, unique_blocks=unique_blocks, model=model
            ),
        )
        for s in specs
    ]


def tier_row(cache: TieredCache, *, model: str | None) -> dict[str, Any]:
    """The tiered part of a replay result row: hits per tier, traffic per link (bytes with a
    model preset)."""
    st = cache.tier_stats
    per_token = get_model(model).kv_bytes_per_token if model else None
    tiers = []
    for t, name in enumerate(st.names):
        entry: dict[str, Any] = {
            "tier": name,
            "capacity_blocks": cache.top.capacity_blocks
            if t == 0
            else cache.tiers[t - 1].capacity_blocks,
            "policy": cache.top.policy.name if t == 0 else cache.specs[t - 1].policy,
            "hit_blocks": st.hit_blocks[t],
            "hit_tokens": st.hit_tokens[t],
            "token_hit_rate": st.hit_tokens[t] / st.prompt_tokens if st.prompt_tokens else 0.0,
            "evictions": st.evictions[t],
        }
        if t:
            link = LINKS[cache.specs[t - 1].link]
            entry.update(
                link=link.name,
                loaded_blocks=st.loaded_blocks[t],
                stored_blocks=st.stored_blocks[t],
                loaded_bytes=st.loaded_tokens[t] * per_token if per_token else None,
                stored_bytes=st.stored_tokens[t] * per_token if per_token else None,
            )
        tiers.append(entry)
    return {
        "tier_write": cache.write,
        "tier_load": cache.load,
        "tiers": tiers,
    }


def tier_summary(caches: list[TieredCache]) -> dict[str, Any]:
    """The tiered part of a simulation summary, summed over replicas: per tier its hits,
    and for lower tiers the loads chosen, the runs recomputed instead, and the blocks moved."""
    first = caches[0]
    names = first.tier_stats.names
    prompt = sum(c.tier_stats.prompt_tokens for c in caches)
    tiers = []
    for t, name in enumerate(names):
        hit = sum(c.tier_stats.hit_tokens[t] for c in caches)
        entry: dict[str, Any] = {
            "tier": name,
            "hit_tokens": hit,
            "token_hit_rate": hit / prompt if prompt else 0.0,
        }
        if t:
            for key in (
                "loaded_blocks",
                "loaded_tokens",
                "stored_blocks",
                "loaded_segments",
                "recomputed_segments",
                "recomputed_tokens",
            ):
                entry[key] = sum(getattr(c.tier_stats, key)[t] for c in caches)
            entry["link"] = first.specs[t - 1].link
        tiers.append(entry)
    return {
        "tiers": tiers,
        "tier_load_ms": sum(c.tier_stats.load_ms for c in caches),
        "tier_loaded_segments": sum(sum(c.tier_stats.loaded_segments) for c in caches),
        "tier_recomputed_segments": sum(sum(c.tier_stats.recomputed_segments) for c in caches),
    }
