"""``ttl_pin``: keep a tool-calling session's KV for a learned time-to-live, LRU otherwise.

After Continuum (Li, Mang, He, Zhang, Mao, Chen, Zhou, Cheung, Gonzalez, Stoica, "Continuum:
Efficient and Robust Multi-Turn LLM Agent Scheduling with KV Cache Time-to-Live", arXiv
2511.02230, 2025; later versions call it CacheTTL). Continuum pins the KV of a request that ends
in a tool call in GPU memory for a time-to-live (TTL), so the agent's next turn finds it when the
tool returns, and lets it go when the TTL passes. Its TTL comes from the distribution of tool-call
durations, weighed against the reload cost and the queueing delay an eviction causes (a
cost-benefit optimum, not a fixed quantile); it also reorders the queue (program-level FCFS),
which a cache policy cannot do.

The algorithm as implemented:

- *Tool-calling sessions*: a session becomes tool-calling (for good) with its first request that
  holds a ``TOOL_OUTPUT`` or ``TOOL_SCHEMA`` block; with ``all_sessions`` every session counts.
  The trace does not say whether an answer ends in a tool call, so every release of a
  tool-calling session's request starts a TTL.
- *Learned TTL*: a tool-call duration is observed as the gap from the release of a session's
  request to the arrival of its next one (with no time in flight, cache-only replay, that is the
  gap between the two arrivals; when the previous request was not seen released, e.g. all its
  blocks were reused by another session since, the gap is counted from its arrival). The last
  ``gap_window`` gaps of tool-calling sessions are kept sorted; the TTL is their
  ``ttl_quantile`` quantile by nearest rank (the ``ceil(q * n)``-th smallest of ``n`` gaps).
  Before the first gap the TTL is ``initial_ttl_s``. The TTL in force when a block is released
  is its TTL: a TTL learned later applies to later releases only.
- *Protection*: a block released by a tool-calling session at ``t`` is protected until
  ``t + TTL``. Continuum's plain "never evict pinned KV" would stall a full cache; here protected
  blocks are evicted last: only when no unprotected block is evictable, the least recently
  released first (the one closest to expiring).
- *Outside the TTL the order is LRU*: unprotected blocks, and protected ones whose TTL passed,
  are evicted least recently released first (``lru``'s recency: a block is in use until its
  request releases it; ties tail first).
- *Shared blocks* follow their latest release: released by a tool-calling session they are
  protected from that release on, released by another session (or none) they are not.
- *Clock*: ``victim()`` is given no time; it uses the latest time a hook was given (in a
  ``BlockCache``, the arrival of the request that needs the room).

Protection only reorders blocks when some are unprotected: when every session is tool-calling
(every Claude Code and ``tool_agent`` prompt starts with its tool schemas) every release is
protected, the lists hold one release order, and the victims are exactly ``lru``'s.

Ordering invariant: three intrusive lists through ``link_prev``/``link_next``, each in release
order (``pseq``, the release sequence, grows along it): N, unprotected releases; P, protected
releases, each with its expiry in ``pk1``; E, the blocks whose protection ended, moved from P's
head in P's order, so E stays in release order too. ``victim()`` first moves P's expired head
blocks to E (lazily: only the head is checked, so a block behind a head that expires later stays
protected until that head expires, which happens only when the TTL fell between the two
releases, by at most that fall), then takes the older of N's and E's first evictable blocks, else
P's first. ``pdata`` is the session (state) that last pinned the block: the request that inserts
it, then each request that hits it. A pinned or non-leaf block met at a list's head leaves the
list (checked, never assumed: only unpinned leaves are returned); released, it rejoins at the
tail; becoming a leaf while unpinned, it rejoins at the head of P if still protected, else of N
(it was the oldest of its list when it left, so the head is where LRU would put it).

Complexity: O(1) per insert, hit and release, and ``victim()`` amortised O(1) (each block leaves
P and each non-evictable block leaves a list once per release or leaf event); O(``gap_window``)
per request of a tool-calling session to keep the gaps sorted (a ``bisect`` insert and delete
in a list of at most ``gap_window`` floats, a memmove), O(blocks of the request) per request to
look for tool blocks. Sessions are remembered up to ``max_sessions`` (the least recently arrived
forgotten first; a forgotten session that comes back starts afresh).

Parameters: ``ttl_quantile`` = 0.9 (the paper picks the TTL by its cost-benefit model and gives
no quantile: 0.9 is ours, keeping a block through nine in ten observed tool calls);
``gap_window`` = 1000 gaps, ``initial_ttl_s`` = 0 (no protection until a gap is seen),
``all_sessions`` = False and ``max_sessions`` = 100,000 are ours.

Inside vLLM (``skv.cache.free_order``, the plugin) the policy sees the same hooks; a request
without ``skv_session`` has no session, so none of its blocks is protected and the order is LRU
by release (stock vLLM's), and the plugin's clock (wall or client time) is the TTL's clock.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import cython

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.model import TYPE_INDEX, SemanticType
from skv.policies.block_queue import link_before, sentinel, unlink

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks

_TOOL_OUTPUT = cython.declare(cython.Py_ssize_t, TYPE_INDEX[SemanticType.TOOL_OUTPUT])
_TOOL_SCHEMA = cython.declare(cython.Py_ssize_t, TYPE_INDEX[SemanticType.TOOL_SCHEMA])
_NEVER = cython.declare(cython.double, -math.inf)  # pk1 of a block released unprotected


class _Session:
    """What is known of one session: when its last request arrived and was released, and
    whether it calls tools (a C struct when compiled, see ttl_pin.pxd)."""

    def __init__(self, now: cython.double) -> None:
        self.last_arrival = now
        self.last_release = -math.inf
        self.tool = False


class TTLPin(Policy):
    name = "ttl_pin"

    @cython.annotation_typing(False)  # the arguments are checked and converted as plain Python
    def __init__(
        self,
        ttl_quantile: float = 0.9,
        gap_window: int = 1000,
        initial_ttl_s: float = 0.0,
        all_sessions: bool = False,
        max_sessions: int = 100_000,
    ) -> None:
        if not 0.0 < ttl_quantile <= 1.0:
            raise ValueError(f"ttl_pin: ttl_quantile must be in (0, 1], got {ttl_quantile}")
        if gap_window < 1:
            raise ValueError(f"ttl_pin: gap_window must be >= 1, got {gap_window}")
        if not initial_ttl_s >= 0.0:
            raise ValueError(f"ttl_pin: initial_ttl_s must be >= 0 seconds, got {initial_ttl_s}")
        if max_sessions < 1:
            raise ValueError(f"ttl_pin: max_sessions must be >= 1, got {max_sessions}")
        self.ttl_quantile = float(ttl_quantile)
        self.gap_window = int(gap_window)
        self.initial_ttl_s = float(initial_ttl_s)
        self.all_sessions = bool(all_sessions)
        self.max_sessions = int(max_sessions)
        #: the TTL given to blocks released now (seconds)
        self.ttl_s = self.initial_ttl_s
        self._n = sentinel()  # unprotected, release order
        self._e = sentinel()  # protection ended, release order
        self._p = sentinel()  # protected, release order; pk1 = expiry
        self._sessions: dict[Any, _Session] = {}  # least recently arrived first
        self._cur: _Session | None = None  # the session of the request being looked up
        self._cur_rb: object = None
        self._gaps: deque[float] = deque()  # the window, in arrival order
        self._sorted: list[float] = []  # the same gaps, sorted
        self._now = -math.inf
        self._seq = 0
        self.protected_releases = 0
        self.expirations = 0
        self.protected_evictions = 0

    # --- sessions and the learned TTL ------------------------------------------------------

    def on_request(self, rb: RequestBlocks, now: cython.double) -> None:
        if now > self._now:
            self._now = now
        self._cur_rb = rb
        session = rb.session
        if session is None:
            self._cur = None
            return
        sessions: dict = self._sessions
        s: _Session = sessions.pop(session, None)
        seen: cython.bint
        if s is None:
            s = _Session(now)
            seen = False
        else:
            seen = True
        if not s.tool:
            stypes = rb.stypes
            s.tool = self.all_sessions or _TOOL_OUTPUT in stypes or _TOOL_SCHEMA in stypes
        if seen and s.tool:
            start: cython.double = (
                s.last_release if s.last_release >= s.last_arrival else s.last_arrival
            )
            gap: cython.double = now - start
            if not gap > 0.0:  # max(0.0, gap), as Python's max picks it
                gap = 0.0
            self.add_gap(gap)
        s.last_arrival = now
        sessions[session] = s
        if len(sessions) > self.max_sessions:
            del sessions[next(iter(sessions))]
        self._cur = s

    def on_extend(self, rb: RequestBlocks, now: cython.double) -> None:
        if now > self._now:
            self._now = now
        self._cur_rb = rb
        self._cur = self._sessions.get(rb.session) if rb.session is not None else None

    def add_gap(self, gap_s: cython.double) -> None:
        """Record one observed tool-call duration and recompute the TTL."""
        gaps = self._gaps
        ordered: list = self._sorted
        gaps.append(gap_s)
        bisect.insort(ordered, gap_s)
        if len(gaps) > self.gap_window:
            old = gaps.popleft()
            del ordered[bisect.bisect_left(ordered, old)]
        n: cython.Py_ssize_t = len(ordered)
        rank = max(1, math.ceil(self.ttl_quantile * n - 1e-9))
        self.ttl_s = ordered[rank - 1]

    def _session_of(self, req: object) -> _Session | None:
        if req is self._cur_rb:
            return self._cur
        session = getattr(req, "session", None)
        return None if session is None else self._sessions.get(session)

    # --- blocks ------------------------------------------------------------------------------

    def on_insert(self, b: Block, now: cython.double) -> None:
        req = b.req
        b.pdata = self._cur if req is self._cur_rb else self._session_of(req)

    def on_hit(self, b: Block, now: cython.double) -> None:
        b.pdata = self._cur

    def on_unpin(self, b: Block, now: cython.double) -> None:
        if now > self._now:
            self._now = now
        nxt: Block = b.link_next
        if nxt is not None:  # still in a list: out of it first (unlink, inlined)
            prev: Block = b.link_prev
            prev.link_next = nxt
            nxt.link_prev = prev
        seq: cython.longlong = self._seq + 1
        self._seq = seq
        b.pseq = seq
        s: _Session | None = b.pdata
        head: Block = self._n
        b.pk1 = _NEVER
        if s is not None:
            s.last_release = now
            if s.tool and self.ttl_s > 0.0:
                b.pk1 = now + self.ttl_s
                head = self._p
                self.protected_releases += 1
        last: Block = head.link_prev  # link_before(b, head), inlined
        b.link_prev = last
        b.link_next = head
        last.link_next = b
        head.link_prev = b

    def on_leaf(self, b: Block, now: cython.double) -> None:
        if b.link_next is None:
            head: Block = self._p if b.pk1 > now else self._n
            link_before(b, head.link_next)

    def victim(self) -> Block | None:
        p: Block = self._p
        e: Block = self._e
        b: Block = p.link_next
        if b is not p:
            now: cython.double = self._now
            while b is not p and b.pk1 <= now:  # protection over: on to E, in release order
                nxt: Block = b.link_next
                unlink(b)
                link_before(b, e)
                self.expirations += 1
                b = nxt
        old: Block = _first_evictable(self._n)
        expired: Block = _first_evictable(e) if e.link_next is not e else None
        found: Block
        if expired is None:
            if old is None:
                found = _first_evictable(p) if p.link_next is not p else None
                if found is None:
                    return None
                self.protected_evictions += 1
            else:
                found = old
        elif old is not None and old.pseq < expired.pseq:
            found = old
        else:
            found = expired
        unlink(found)
        return found

    def on_evict(self, b: Block, now: cython.double) -> None:
        if b.link_next is not None:  # not the block victim() gave (a pool's fallback)
            unlink(b)
        b.pdata = None

    def metrics(self) -> dict[str, float]:
        return {
            "ttl_s": self.ttl_s,
            "gaps": float(len(self._gaps)),
            "protected_releases": float(self.protected_releases),
            "expirations": float(self.expirations),
            "protected_evictions": float(self.protected_evictions),
        }

    def params(self) -> dict[str, Any]:
        return {
            "ttl_quantile": self.ttl_quantile,
            "gap_window": self.gap_window,
            "initial_ttl_s": self.initial_ttl_s,
            "all_sessions": self.all_sessions,
            "max_sessions": self.max_sessions,
        }


def _first_evictable(head: Block) -> Block | None:
    """The first unpinned leaf of the list at ``head`` (still linked); the pinned and non-leaf
    blocks before it leave the list (they rejoin on release or ``on_leaf``)."""
    b: Block = head.link_next
    while b is not head:
        nxt: Block = b.link_next
        if b.ref == 0 and b.n_children == 0:
            return b
        unlink(b)
        b = nxt
    return None
