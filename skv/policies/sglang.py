"""``sglang_lru`` / ``sglang_lfu``: SGLang's radix-cache eviction strategies.

SGLang (``srt/mem_cache/evict_policy.py``) gives each evictable leaf a priority and pops the
lowest from a heap: ``LRUStrategy`` -> ``last_access_time``; ``LFUStrategy`` ->
``(hit_count, last_access_time)``. A leaf's parent is pushed when the leaf goes.

When ``last_access_time`` is set (``srt/mem_cache/radix_cache.py``): on every node along the
matched path at ``match_prefix`` (skv: the block's hit, ``b.last_access``), on every node along
the path at ``insert``, and ``insert`` runs both after prefill (``cache_unfinished_req``) and when
the request finishes (``cache_finished_req``, unless ``disable_finished_insert``, which only
deterministic mode sets). So by default a request's whole path ends up stamped with its finish
time: ``touch_on_release=True`` models that (the stamp is the release time, the same recency as
``lru``; only tie order can differ). ``touch_on_release=False`` models the finished-insert
disabled case: the stamp is the last hit or insertion (acquire) time, so a long request's blocks
look old when it finishes.

``hit_count``: SGLang's plain ``RadixCache`` never increments it (only ``HiRadixCache`` does, on
host write-through), so upstream ``lfu`` on the plain radix cache orders like ``lru``. Here
``hit_count`` is skv's ``b.hits`` (reuses while cached), which is what the strategy intends.

Ties (equal priority) pop in push order: a request's tail before its head.
"""

from __future__ import annotations

from typing import Any

from skv.cache.block import Block
from skv.policies.base import MonotonePriorityPolicy


class SGLangLRU(MonotonePriorityPolicy):
    """Priority ``last_access_time`` (release time, or last hit/insert time)."""

    name = "sglang_lru"

    def __init__(self, touch_on_release: bool = True) -> None:
        super().__init__()
        self.touch_on_release = bool(touch_on_release)

    def key(self, b: Block, now: float) -> float:
        return now if self.touch_on_release else b.last_access

    def params(self) -> dict[str, Any]:
        return {"touch_on_release": self.touch_on_release}


class SGLangLFU(SGLangLRU):
    """Priority ``(hit_count, last_access_time)``."""

    name = "sglang_lfu"

    def key(self, b: Block, now: float) -> tuple[int, float]:
        return (b.hits, now if self.touch_on_release else b.last_access)
