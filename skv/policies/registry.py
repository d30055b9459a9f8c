"""Name -> eviction policy. Adding a policy is one file plus one line here.

Names are what configs and the CLI use. ``vllm`` is not a policy plugged into the radix cache
but vLLM's own block pool (``skv.cache.vllm_pool``), modelled exactly.

This module is the top of the cache + policy group: it imports the caches and (by name) the
policies, and nothing in ``skv/cache`` or ``skv/policies`` imports it (tests/test_layers.py).
"""

from __future__ import annotations

import importlib
from typing import Any

from skv.cache.radix import BlockCache
from skv.cache.vllm_pool import VllmBlockPool

#: name -> "module:Class"; modules are imported on first use
POLICIES: dict[str, str] = {
    "fifo": "skv.policies.fifo:FIFO",
    "lru": "skv.policies.lru:LRU",
    "lfu": "skv.policies.lfu:LFU",
    "s3fifo": "skv.policies.s3fifo:S3FIFO",
    "wtinylfu": "skv.policies.wtinylfu:WTinyLFU",
    "size_lru": "skv.policies.size_lru:SizeLRU",
    "gdsf": "skv.policies.gdsf:GDSF",
    "pgdsf": "skv.policies.pgdsf:PGDSF",
    "marconi": "skv.policies.marconi:Marconi",
    "slru": "skv.policies.slru:SLRU",
    "arc": "skv.policies.arc:ARC",
    "sieve": "skv.policies.sieve:Sieve",
    "static_semantic": "skv.policies.static_semantic:StaticSemantic",
    "adaptive_semantic": "skv.policies.adaptive_semantic:AdaptiveSemantic",
    "saecache": "skv.policies.saecache:SAECache",
    "saecache_fixed": "skv.policies.saecache:SAECacheFixed",
    "sglang_lru": "skv.policies.sglang:SGLangLRU",
    "sglang_lfu": "skv.policies.sglang:SGLangLFU",
    "lhd": "skv.policies.lhd:LHD",
    "ttl_pin": "skv.policies.ttl_pin:TTLPin",
    "kvflow": "skv.policies.kvflow:KVFlow",
    "belady": "skv.policies.belady:Belady",
    "vllm": "skv.cache.vllm_pool:VllmBlockPool",
}

#: policies that need the whole trace in advance (upper bounds, not deployable)
OFFLINE = frozenset({"belady"})


def policy_class(name: str) -> Any:
    try:
        target = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def make_cache(
    name: str,
    capacity_blocks: int,
    params: dict[str, Any] | None = None,
    **cache_options: Any,
) -> Any:
    """A ready cache for policy ``name``: a ``BlockCache`` or, for ``vllm``, a ``VllmBlockPool``."""
    cls = policy_class(name)
    if cls is VllmBlockPool:
        params = dict(params or {})
        eviction = params.pop("eviction", None)
        eviction_params = params.pop("eviction_params", None)
        if params:
            raise ValueError(
                f"policy 'vllm' takes only eviction and eviction_params, got {sorted(params)}"
            )
        if eviction is None:
            if eviction_params:
                raise ValueError("policy 'vllm': eviction_params without eviction")
            return VllmBlockPool(capacity_blocks, **cache_options)
        if cache_options:
            raise ValueError(
                f"policy 'vllm' with eviction: no cache options ({sorted(cache_options)}); "
                "the policy-ordered pool keeps its own ghost list and no eviction log"
            )
        return make_vllm_pool(capacity_blocks, eviction, eviction_params)
    try:
        policy = cls(**(params or {}))
    except (TypeError, OverflowError) as exc:  # overflow: past a compiled C integer field
        raise ValueError(f"policy {name!r}: bad parameters {params}: {exc}") from None
    return BlockCache(capacity_blocks, policy, **cache_options)


def make_policy(name: str, params: dict[str, Any] | None = None) -> Any:
    """A fresh instance of BlockCache policy ``name`` (not ``vllm``, not an offline one)."""
    if name == "vllm" or name in OFFLINE:
        raise ValueError(
            f"policy {name!r} cannot order vLLM's free queue; an online BlockCache policy can "
            f"({', '.join(n for n in POLICIES if n != 'vllm' and n not in OFFLINE)})"
        )
    cls = policy_class(name)
    try:
        return cls(**(params or {}))
    except (TypeError, OverflowError) as exc:  # overflow: past a compiled C integer field
        raise ValueError(f"policy {name!r}: bad parameters {params}: {exc}") from None


def make_vllm_pool(
    capacity_blocks: int, eviction: str, eviction_params: dict[str, Any] | None = None
) -> Any:
    """vLLM's block pool reusing free cached blocks in policy ``eviction``'s order: what the
    vLLM plugin (``skv vllm serve --eviction``) runs inside the engine, simulated."""
    from skv.cache.policy_pool import PolicyBlockPool

    return PolicyBlockPool(capacity_blocks, make_policy(eviction, eviction_params))


def check_all() -> list[str]:
    """Import every registered policy; returns the names (raises on the first broken one)."""
    for name in POLICIES:
        policy_class(name)
    return list(POLICIES)
