"""``kvflow``: evict the KV of the session predicted to come back last (workflow-aware eviction).

After KVFlow (Pan, Patel, Hu, Shen, Guan, Li, Qin, Wang, Ding, "KVFlow: Efficient Prefix Caching
for Accelerating LLM-Based Multi-Agent Workflows", arXiv 2507.07400, NeurIPS 2025). KVFlow knows
the workflow: its Agent Step Graph gives each agent a steps-to-execution value (how many steps
until it runs again), and the radix cache evicts the KV of the agent whose next execution is
furthest away; a prefix shared by several agents takes the smallest value among them. (KVFlow
also prefetches the next agents' KV from CPU memory, which a cache policy cannot model.)

skv traces carry no workflow graph, so the steps-to-execution are predicted online, in seconds:

- *Agents are sessions.* A session's next arrival is predicted as its last arrival plus an EWMA
  (weight ``ewma_alpha`` on the newest gap) of the gaps between its consecutive arrivals. A
  session seen once has no gap of its own: with ``prior`` its gap is the population's, an EWMA
  (weight ``prior_alpha``) over every session's gaps, taken when it arrives; otherwise (or before
  any gap was seen) it has no prediction.
- *Sessions age out.* A session that has not come back ``age_out`` times its gap after its last
  arrival (``now > last + age_out * gap``) is predicted never to return. With the default 1 a
  session is aged out as soon as it misses its predicted arrival: gaps are heavy-tailed (tool
  calls, people), so the longer a session has been silent, the longer it is likely to stay so.
- *A block's next use is its latest toucher's.* KVFlow takes the minimum over the agents that
  share a prefix; tracking every session that touched a block is not O(1), so a block belongs to
  the session of the last request that pinned it (inserted or hit it), released into that
  session's bucket. A session that used the block earlier and is predicted back sooner than
  its latest toucher does not protect it (the approximation); a chain's shared head is still
  kept while any session's blocks below it are cached (leaf-only eviction).
- *Eviction order*, first to last: blocks of aged-out sessions (the earliest aged out first);
  blocks of no session, LRU (no prediction says they will be reused: ahead of every predicted
  session, the choice for this adaptation); blocks of sessions with no prediction, the least
  recently arrived session first; then blocks of live predicted sessions, the one predicted to
  come back last first. Within a session's bucket, LRU (the least recently released first,
  ``lru``'s recency: ties tail first).
- *Clock*: ``victim()`` is given no time; it uses the latest time a hook was given (in a
  ``BlockCache``, the arrival of the request that needs the room).

Ordering invariant: each session has a bucket, an intrusive list (``link_prev``/``link_next``)
of its released blocks in release order; ``pdata`` is the session a block belongs to (its latest
toucher). A min-heap of sessions holds one current entry per session whose bucket is not empty,
keyed ``(tier, key)``: tier 0 aged out (key: when), tier 2 no prediction (key: last arrival),
tier 3 predicted (key: minus the predicted next arrival); an arrival or an ageing re-keys the
session by pushing a new entry and bumping ``version`` (stale entries are skipped and compacted
when they outnumber the live ones). A second heap holds each live session's ageing time.
Blocks of no session are one more bucket, served between tiers 0 and 2. ``victim()`` ages the
sessions whose time passed, then takes the first unpinned leaf of the best bucket; pinned and
non-leaf blocks met there leave the bucket (checked, never assumed) and rejoin it when released
(at the tail) or when they become leaves (at the head: they were the oldest when they left); a
bucket found empty leaves the heap and comes back with its next block.

Complexity: O(1) per insert, hit and release, plus O(log S) (S sessions with blocks) when a
release refills an empty bucket; O(log S) per request of a session (its predicted arrival
changes: one push, never a visit to its blocks); ``victim()`` amortised O(log S): each block
leaves a bucket once per release or leaf event, each bucket the heap once per refill, each
ageing entry is popped once. Sessions are remembered up to ``max_sessions`` (the least recently
arrived forgotten first; their blocks keep their bucket, a returning session starts afresh).

Parameters (KVFlow's are the workflow graph's; none of these is from the paper): ``ewma_alpha``
= 0.5, ``prior`` = True, ``prior_alpha`` = 0.05, ``age_out`` = 1.0 gap (``inf``: never, which
keeps finished sessions' KV for good; 1.0 is the best of 1, 1.5, 2, 4 and ``inf`` on the policy
leaderboard's tuning workloads, none of which it ranks:
``python -m skv.experiments.leaderboard.derive_defaults``), ``max_sessions`` = 100,000.

Inside vLLM (``skv.cache.free_order``, the plugin): a request without ``skv_session`` has no
session, so every block is in the no-session bucket and the order is LRU by release (stock
vLLM's); with sessions the gaps are measured on the plugin's clock.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

import cython

from skv.cache.block import Block
from skv.cache.policy import Policy
from skv.policies.block_queue import link_before, sentinel, unlink

if TYPE_CHECKING:
    from skv.blocks import RequestBlocks

_AGED = cython.declare(cython.int, 0)  # session heap tiers, lowest first (1: no session)
_UNKNOWN = cython.declare(cython.int, 2)
_PREDICTED = cython.declare(cython.int, 3)


class _Agent:
    """One session: its bucket of released blocks and its predicted next arrival (a C struct
    when compiled, see kvflow.pxd)."""

    def __init__(self, now: cython.double) -> None:
        self.head = sentinel()  # head.link_next: least recently released
        self.last_arrival = now
        self.gap = math.nan  # EWMA of its own gaps (s); NaN before its second arrival
        self.turns = 0
        self.tier = _UNKNOWN
        self.key = now
        self.version = 0
        self.in_heap = False
        self.predicted = math.inf  # predicted next arrival (s); inf: none or aged out


class KVFlow(Policy):
    name = "kvflow"

    @cython.annotation_typing(False)  # the arguments are checked and converted as plain Python
    def __init__(
        self,
        ewma_alpha: float = 0.5,
        prior: bool = True,
        prior_alpha: float = 0.05,
        age_out: float = 1.0,
        max_sessions: int = 100_000,
    ) -> None:
        if not 0.0 < ewma_alpha <= 1.0:
            raise ValueError(f"kvflow: ewma_alpha must be in (0, 1], got {ewma_alpha}")
        if not 0.0 < prior_alpha <= 1.0:
            raise ValueError(f"kvflow: prior_alpha must be in (0, 1], got {prior_alpha}")
        if not age_out > 0.0:
            raise ValueError(f"kvflow: age_out must be > 0 gaps (inf: never), got {age_out}")
        if max_sessions < 1:
            raise ValueError(f"kvflow: max_sessions must be >= 1, got {max_sessions}")
        self.ewma_alpha = float(ewma_alpha)
        self.prior = bool(prior)
        self.prior_alpha = float(prior_alpha)
        self.age_out = float(age_out)
        self.max_sessions = int(max_sessions)
        #: the population's gap (s), NaN before the first gap
        self.prior_gap_s = math.nan
        self._agents: dict[Any, _Agent] = {}  # least recently arrived first
        self._none = _Agent(0.0)  # the bucket of blocks of no session (never in the heap)
        self._cur: _Agent = self._none  # the session of the request being looked up
        self._cur_rb: object = None
        self._heap: list[tuple[int, float, int, int, _Agent]] = []
        self._in_heap = 0  # sessions with a current heap entry
        self._ageing: list[tuple[float, int, int, _Agent]] = []  # (when, seq, turns, agent)
        self._seq = 0
        self._now = -math.inf
        self.aged_out = 0

    # --- sessions and their predictions ----------------------------------------------------

    def on_request(self, rb: RequestBlocks, now: cython.double) -> None:
        if now > self._now:
            self._now = now
        self._cur_rb = rb
        session = rb.session
        if session is None:
            self._cur = self._none
            return
        agents: dict = self._agents
        a: _Agent = agents.pop(session, None)
        if a is None:
            a = _Agent(now)
        elif a.turns:
            gap: cython.double = now - a.last_arrival
            if not gap > 0.0:  # max(0.0, gap), as Python's max picks it
                gap = 0.0
            al: cython.double = self.ewma_alpha
            a.gap = gap if a.turns == 1 else al * gap + (1.0 - al) * a.gap
            pa: cython.double = self.prior_alpha
            g: cython.double = self.prior_gap_s
            self.prior_gap_s = gap if g != g else pa * gap + (1.0 - pa) * g
        a.turns += 1
        a.last_arrival = now
        self._predict(a)
        agents[session] = a
        if len(agents) > self.max_sessions:
            del agents[next(iter(agents))]
        self._cur = a

    def on_extend(self, rb: RequestBlocks, now: cython.double) -> None:
        if now > self._now:
            self._now = now
        self._cur_rb = rb
        a = self._agents.get(rb.session) if rb.session is not None else None
        self._cur = self._none if a is None else a

    def _predict(self, a: _Agent) -> None:
        """Re-key ``a`` after an arrival: its predicted next arrival and its ageing time."""
        gap: cython.double = a.gap
        if gap != gap and self.prior:
            gap = self.prior_gap_s
        if gap != gap:  # no gap of its own, no prior
            a.tier = _UNKNOWN
            a.key = a.last_arrival
            a.predicted = math.inf
        else:
            a.tier = _PREDICTED
            a.predicted = a.last_arrival + gap
            a.key = -a.predicted
            if self.age_out != math.inf:
                self._seq += 1
                when: cython.double = a.last_arrival + self.age_out * gap
                heapq.heappush(self._ageing, (when, self._seq, a.turns, a))
                if len(self._ageing) > 2 * len(self._agents) + 1024:
                    self._ageing = [e for e in self._ageing if e[2] == e[3].turns]
                    heapq.heapify(self._ageing)
        if a.in_heap:
            self._push(a)

    def _push(self, a: _Agent) -> None:
        a.version += 1
        self._seq += 1
        heapq.heappush(self._heap, (a.tier, a.key, self._seq, a.version, a))
        if len(self._heap) > 2 * self._in_heap + 1024:
            self._heap = [e for e in self._heap if e[3] == e[4].version]
            heapq.heapify(self._heap)

    def _age(self, now: cython.double) -> None:
        """Sessions whose ageing time has passed are predicted never to return."""
        ageing: list = self._ageing
        a: _Agent
        while ageing and ageing[0][0] < now:
            when, _, turns, a = heapq.heappop(ageing)
            if turns == a.turns and a.tier == _PREDICTED:
                a.tier = _AGED
                a.key = when
                a.predicted = math.inf
                self.aged_out += 1
                if a.in_heap:
                    self._push(a)

    def _agent_of(self, req: object) -> _Agent:
        if req is self._cur_rb:
            return self._cur
        session = getattr(req, "session", None)
        a = self._agents.get(session) if session is not None else None
        return self._none if a is None else a

    # --- blocks ------------------------------------------------------------------------------

    def on_insert(self, b: Block, now: cython.double) -> None:
        b.pdata = self._agent_of(b.req)

    def on_hit(self, b: Block, now: cython.double) -> None:
        b.pdata = self._cur

    def on_unpin(self, b: Block, now: cython.double) -> None:
        if now > self._now:
            self._now = now
        if b.link_next is not None:
            unlink(b)
        a: _Agent | None = b.pdata
        if a is None:  # never inserted through this policy: no session known
            a = b.pdata = self._none
        link_before(b, a.head)
        if not a.in_heap and a is not self._none:
            a.in_heap = True
            self._in_heap += 1
            self._push(a)

    def on_leaf(self, b: Block, now: cython.double) -> None:
        if b.link_next is None:
            a: _Agent = b.pdata
            link_before(b, a.head.link_next)
            if not a.in_heap and a is not self._none:
                a.in_heap = True
                self._in_heap += 1
                self._push(a)

    def victim(self) -> Block | None:
        self._age(self._now)
        heap: list = self._heap
        none_head: Block = self._none.head
        top: tuple
        a: _Agent
        found: Block
        while True:
            while heap:  # drop stale entries (their session was re-keyed since)
                top = heap[0]
                a = top[4]
                if top[3] == a.version:
                    break
                heapq.heappop(heap)
            if not heap or heap[0][0] > _AGED:
                found = _first_evictable(none_head)
                if found is not None:
                    unlink(found)
                    return found
                if not heap:
                    return None
            top = heap[0]
            a = top[4]
            found = _first_evictable(a.head)
            if found is not None:
                unlink(found)
                return found
            heapq.heappop(heap)  # an empty bucket leaves the heap until it is refilled
            a.in_heap = False
            self._in_heap -= 1

    def on_evict(self, b: Block, now: cython.double) -> None:
        if b.link_next is not None:  # not the block victim() gave (a pool's fallback)
            unlink(b)
        b.pdata = None

    def predicted_next_arrival(self, session: object) -> float:
        """When ``session`` is predicted to arrive next (s; ``inf``: never, or unknown)."""
        a = self._agents.get(session)
        return math.inf if a is None else a.predicted

    def metrics(self) -> dict[str, float]:
        out = {
            "sessions": float(len(self._agents)),
            "sessions_with_blocks": float(self._in_heap),
            "aged_out": float(self.aged_out),
        }
        if self.prior_gap_s == self.prior_gap_s:  # known once a gap was seen
            out["prior_gap_s"] = self.prior_gap_s
        return out

    def params(self) -> dict[str, Any]:
        return {
            "ewma_alpha": self.ewma_alpha,
            "prior": self.prior,
            "prior_alpha": self.prior_alpha,
            "age_out": self.age_out,
            "max_sessions": self.max_sessions,
        }


def _first_evictable(head: Block) -> Block | None:
    """The first unpinned leaf of the bucket at ``head`` (still linked); the pinned and
    non-leaf blocks before it leave the bucket (they rejoin on release or ``on_leaf``)."""
    b: Block = head.link_next
    while b is not head:
        nxt: Block = b.link_next
        if b.ref == 0 and b.n_children == 0:
            return b
        unlink(b)
        b = nxt
    return None
