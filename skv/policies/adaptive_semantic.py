"""``adaptive_semantic``: semantic-type weights learned online from eviction feedback.

Each evictable block is worth, at time ``now``,

    score = w[type] * (1 + hits) ** freq_gain * (tokens / block_size) * 2 ** (-(now - t) / h)

combining its semantic type (``w``, learned), frequency (``hits`` while cached), estimated prefill
savings per unit of memory (a block saves ``tokens`` of prefill and takes one block of KV memory,
so partial blocks are worth less) and recency (``t`` = when its last holder released it, halved
every ``h = half_life_s`` seconds). The block worth least goes first.

Ordering invariant: ``h * log2(score) = key(b) + h * log2(w[type]) - now`` with the time-invariant

    key(b) = t + h * (freq_gain * log2(1 + hits) + log2(tokens / block_size))

fixed at release. Blocks sit in one heap per semantic type ordered by ``key`` (kept lazily as in
``MonotonePriorityPolicy``: keys only grow while a block is cached); the victim is the heap top
minimising ``key + h * log2(w[type])`` (ties: earlier release first, so a request's tail goes
before its head). A weight change therefore re-ranks every cached block at once, with no
refresh and O(types) work per eviction.

Learning (every ``update_every`` = K evictions, per type ``t`` seen in the window):

- ``ghost_rate_t``: ghost hits on ``t`` (a block of type ``t`` evicted recently and needed
  again: the eviction was a mistake) per eviction of ``t`` in the window, capped at 1;
- ``reuse_rate_t``: share of the window's evicted ``t`` blocks that were reused while cached
  (blocks evicted without ever being reused pull it down);
- ``target_t = 1 + ghost_gain * ghost_rate_t + reuse_gain * reuse_rate_t`` and
  ``w_t <- (1 - eta) * w_t + eta * target_t``.

The target's form and default gains (5, 2) follow SAECache's published type-weight rule; the
initial weights default to ``static_semantic``'s prior. Nothing here was tuned on a trace.
``metrics()`` returns the current weights as ``w_<type>``.
"""

from __future__ import annotations

from typing import Any

import cython
from cython.cimports.libc.math import log2, pow  # C math when compiled

from skv.blocks import RequestBlocks
from skv.cache.block import Block, GhostEntry
from skv.cache.policy import Policy
from skv.model import NUM_TYPES, TYPES
from skv.policies.base import HeapEntry, KeyHeap
from skv.policies.static_semantic import resolve_weights


class AdaptiveSemantic(Policy):
    uses_ghost_list = True
    name = "adaptive_semantic"

    def __init__(
        self,
        half_life_s: float = 10.0,
        eta: float = 0.1,
        update_every: int = 256,
        initial_weights: dict[str, float] | None = None,
        ghost_gain: float = 5.0,
        reuse_gain: float = 2.0,
        freq_gain: float = 1.0,
    ) -> None:
        if not half_life_s > 0:
            raise ValueError(f"adaptive_semantic: half_life_s must be > 0, got {half_life_s}")
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"adaptive_semantic: eta must be in [0, 1], got {eta}")
        if update_every < 1:
            raise ValueError(f"adaptive_semantic: update_every must be >= 1, got {update_every}")
        if ghost_gain < 0 or reuse_gain < 0 or freq_gain < 0:
            raise ValueError("adaptive_semantic: ghost_gain, reuse_gain, freq_gain must be >= 0")
        self.half_life_s = float(half_life_s)
        self.eta = float(eta)
        self.update_every = int(update_every)
        self.initial_weights = resolve_weights(initial_weights, self.name)
        self.ghost_gain = float(ghost_gain)
        self.reuse_gain = float(reuse_gain)
        self.freq_gain = float(freq_gain)
        self.weights = list(self.initial_weights)
        self._offset = [self.half_life_s * log2(w) for w in self.weights]
        self._heaps = [KeyHeap() for _ in range(NUM_TYPES)]
        self._seq = 0
        # feedback over the current window of update_every evictions, per type
        self._reset_window()
        self.updates = 0

    # --- ordering (MonotonePriorityPolicy's lazy heap, one heap per type) ---------------------

    def on_unpin(self, b: Block, now: float) -> None:
        req: RequestBlocks = b.req
        value = b.tokens / req.block_size
        if b.hits:
            value *= pow(1.0 + b.hits, self.freq_gain)
        self._seq += 1
        b.pk1 = now + self.half_life_s * log2(value)
        b.pk2 = 0.0
        b.pseq = self._seq
        if not b.version & 1 and not b.n_children:
            b.version += 1
            heap: KeyHeap = self._heaps[b.stype]
            heap.push(b.pk1, 0.0, b.pseq, b)

    def on_leaf(self, b: Block, now: float) -> None:
        if not b.version & 1:
            b.version += 1
            heap: KeyHeap = self._heaps[b.stype]
            heap.push(b.pk1, 0.0, b.pseq, b)

    def victim(self) -> Block | None:
        best: KeyHeap | None = None
        best_key = 0.0
        best_seq = 0
        heap: KeyHeap
        e: HeapEntry
        b: Block
        t: cython.Py_ssize_t
        for t in range(len(self._heaps)):
            heap = self._heaps[t]
            while heap._items:
                e = heap._items[0]
                b = e.b
                if b.ref or b.n_children:
                    heap.pop()
                    b.version += 1
                elif b.pseq != e.seq:
                    heap.replace_top(b.pk1, 0.0, b.pseq)
                else:
                    k = e.k1 + self._offset[t]
                    if best is None or k < best_key or (k == best_key and e.seq < best_seq):
                        best, best_key, best_seq = heap, k, e.seq
                    break
        if best is None:
            return None
        e = best.pop()
        b = e.b
        b.version += 1
        return b

    # --- learning -------------------------------------------------------------------------

    def on_evict(self, b: Block, now: float) -> None:
        t = b.stype
        self._evicted[t] += 1
        if b.hits:
            self._evicted_reused[t] += 1
        self._window = w = self._window + 1
        if w >= self.update_every:
            self._update_weights()

    def on_ghost_hit(self, b: Block, ghost: GhostEntry, now: float) -> None:
        self._ghost_hits[ghost.stype] += 1

    def _update_weights(self) -> None:
        eta = self.eta
        t: cython.Py_ssize_t
        for t in range(NUM_TYPES):
            ev = self._evicted[t]
            gh = self._ghost_hits[t]
            if ev == 0 and gh == 0:
                continue
            ghost_rate = min(1.0, gh / ev) if ev else 1.0
            reuse_rate = self._evicted_reused[t] / ev if ev else 0.0
            target = 1.0 + self.ghost_gain * ghost_rate + self.reuse_gain * reuse_rate
            w = (1.0 - eta) * self.weights[t] + eta * target
            self.weights[t] = w
            self._offset[t] = self.half_life_s * log2(w)
        self._reset_window()
        self.updates += 1

    def _reset_window(self) -> None:
        """Zero the per-type feedback counters (C arrays when compiled, see the .pxd)."""
        if not cython.compiled:
            self._evicted = [0] * NUM_TYPES
            self._evicted_reused = [0] * NUM_TYPES
            self._ghost_hits = [0] * NUM_TYPES
        t: cython.Py_ssize_t
        for t in range(NUM_TYPES):
            self._evicted[t] = 0
            self._evicted_reused[t] = 0
            self._ghost_hits[t] = 0
        self._window = 0

    def set_weights(self, weights: dict[str, float]) -> None:
        """Overwrite some type weights (by type name); every cached block is re-ranked at once."""
        for t, w in enumerate(resolve_weights(weights, self.name)):
            if TYPES[t].value in weights:
                self.weights[t] = w
                self._offset[t] = self.half_life_s * log2(w)

    def metrics(self) -> dict[str, float]:
        out = {f"w_{t.value}": w for t, w in zip(TYPES, self.weights, strict=True)}
        out["weight_updates"] = float(self.updates)
        return out

    def params(self) -> dict[str, Any]:
        return {
            "half_life_s": self.half_life_s,
            "eta": self.eta,
            "update_every": self.update_every,
            "initial_weights": {
                t.value: w for t, w in zip(TYPES, self.initial_weights, strict=True)
            },
            "ghost_gain": self.ghost_gain,
            "reuse_gain": self.reuse_gain,
            "freq_gain": self.freq_gain,
        }
