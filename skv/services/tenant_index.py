"""A KV-event index that scores a tenant's prompt only against that tenant's cached blocks.

The ``precise`` router matches prompts against what each engine reports through KV events
(:class:`skv.vllm.kv_events.KVIndex`), by token CONTENT: vLLM's block hashes cannot be
recomputed outside the engine, and its events do not say which ``cache_salt`` a block was
stored under. Under tenant isolation two tenants' copies of one prefix are distinct blocks in
the engine (different salts) but the same content keys in the index, so content alone would
score tenant B's prompt against tenant A's blocks.

:class:`TenantKVIndex` adds ownership: per replica, content key -> the tenants whose requests
were SERVED by that replica with that content (:meth:`claim`, after the answer). A tenant's
overlap counts a leading block only when the engine reports the content AND the tenant owns
it there. Any removal of a block with that content on that replica (or a cache clear) drops
every owner of the content there: an eviction cannot tell which tenant's copy went, so the
index forgets all of them (it may under-count a tenant whose copy survived, never count one
that has none). A claim skips content removed on that replica after the request started (the
tenant's copy may be the one that went before the claim arrived). Invariant: ``owned(r, k,
t)`` implies a request of tenant ``t`` stored content ``k`` on replica ``r`` and no block of
content ``k`` was removed from ``r`` since that request started.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Hashable, Sequence

from skv.vllm.kv_events import AllBlocksCleared, BlockRemoved, KVEvent, KVIndex, content_keys

#: removal stamps kept per replica before old ones (older than every request in flight) go
_PRUNE_AT = 100_000


class TenantKVIndex(KVIndex):
    """:class:`KVIndex` plus per-tenant ownership of content keys (see the module docstring)."""

    def __init__(self, *, medium: str | None = None, block_size: int | None = None) -> None:
        super().__init__(medium=medium, block_size=block_size)
        self._owners: dict[Hashable, dict[int, set[str]]] = {}
        self._removed: dict[Hashable, dict[int, int]] = {}  # content key -> removal stamp
        self._cleared: dict[Hashable, int] = {}  # replica -> stamp of its last cache clear
        self._stamps = itertools.count(1)
        self._active: Counter[int] = Counter()  # start stamps of requests in flight
        self._tlock = threading.Lock()

    def apply(self, replica: Hashable, event: KVEvent) -> None:
        """Apply the event; a removal or clear also drops the owners of what it removed."""
        gone: list[int] = []
        if isinstance(event, BlockRemoved):
            st = self.replicas.get(replica)
            if st is not None:
                with self._lock:
                    gone = [k for h in event.block_hashes if (k := st.blocks.get(h)) is not None]
        super().apply(replica, event)
        if isinstance(event, AllBlocksCleared):
            with self._tlock:
                self._owners.pop(replica, None)
                # every content is gone: a claim of a request started before now is stale
                self._cleared[replica] = next(self._stamps)
                self._removed.pop(replica, None)
        elif gone:
            with self._tlock:
                owners = self._owners.get(replica, {})
                removed = self._removed.setdefault(replica, {})
                stamp = next(self._stamps)
                for k in gone:
                    owners.pop(k, None)
                    removed[k] = stamp

    def begin(self) -> int:
        """A request starts: its stamp (pass it to :meth:`claim` or :meth:`end`)."""
        with self._tlock:
            stamp = next(self._stamps)
            self._active[stamp] += 1
            return stamp

    def end(self, stamp: int) -> None:
        """A request that :meth:`begin` stamped ended (claimed or not)."""
        with self._tlock:
            self._active[stamp] -= 1
            if self._active[stamp] <= 0:
                del self._active[stamp]

    def claim(self, replica: Hashable, tenant: str, token_ids: Sequence[int], stamp: int) -> None:
        """Replica ``replica`` served tenant ``tenant`` the prompt ``token_ids`` (started at
        ``stamp``): the tenant owns the prompt's full blocks there, except content removed
        from the replica since the start. Ends the request (:meth:`end`)."""
        bs = self.replica_block_size(replica)
        keys = content_keys(token_ids, bs) if bs else []
        with self._tlock:
            removed = self._removed.get(replica, {})
            owners = self._owners.setdefault(replica, {})
            if self._cleared.get(replica, 0) <= stamp:
                for k in keys:
                    if removed.get(k, 0) > stamp:
                        break  # a prefix: blocks after a removed one are unreachable anyway
                    owners.setdefault(k, set()).add(tenant)
            self._active[stamp] -= 1
            if self._active[stamp] <= 0:
                del self._active[stamp]
            if len(removed) > _PRUNE_AT:
                oldest = min(self._active, default=next(self._stamps))
                self._removed[replica] = {k: s for k, s in removed.items() if s >= oldest}

    def tenant_overlaps(self, token_ids: Sequence[int], tenant: str) -> dict[Hashable, int]:
        """Leading full blocks of ``token_ids`` each replica holds AND ``tenant`` owns there."""
        keys_by_size: dict[int, list[int]] = {}
        out: dict[Hashable, int] = {}
        with self._lock, self._tlock:
            for r, st in self.replicas.items():
                bs = st.block_size or self.block_size
                owners = self._owners.get(r, {})
                if not bs:
                    out[r] = 0
                    continue
                keys = keys_by_size.get(bs)
                if keys is None:
                    keys = keys_by_size[bs] = content_keys(token_ids, bs)
                n = 0
                for k in keys:
                    if k not in st.content or tenant not in owners.get(k, ()):
                        break
                    n += 1
                out[r] = n
        return out
