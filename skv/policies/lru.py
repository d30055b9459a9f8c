"""``lru``: evict the unpinned leaf whose last use ended longest ago, in O(1).

A block's recency is the time its last holder released it (a block in use is in use until its
request finishes), ties broken tail first. Blocks sit on one intrusive doubly linked list (the
``link_prev``/``link_next`` fields of ``Block``) in release order; a pinned block keeps its old
place (no work on pin) and moves to the back when released, and eviction unlinks pinned blocks
it meets at the front. Every access to a block also holds its parent and a request releases its
blocks tail first, so a parent always sits behind all of its children: the first unpinned block
at the front is a leaf (checked, never assumed).
"""

from __future__ import annotations

from skv.cache.block import Block
from skv.cache.policy import Policy


class LRU(Policy):
    name = "lru"

    def __init__(self) -> None:
        head = Block(None, None, 0, 0, 0, None, 0.0)  # sentinel: head.link_next is the front
        head.link_prev = head
        head.link_next = head
        self._head = head

    def on_unpin(self, b: Block, now: float) -> None:
        if b.link_next is not None:  # still linked (it was never evicted past): unlink first
            prev: Block = b.link_prev
            nxt: Block = b.link_next
            prev.link_next = nxt
            nxt.link_prev = prev
        head = self._head
        last: Block = head.link_prev
        b.link_prev = last
        b.link_next = head
        last.link_next = b
        head.link_prev = b

    def victim(self) -> Block | None:
        head = self._head
        b: Block = head.link_next
        while b is not head:
            nxt: Block = b.link_next
            prev: Block = b.link_prev
            prev.link_next = nxt
            nxt.link_prev = prev
            b.link_prev = None
            b.link_next = None
            if b.ref == 0:
                if b.n_children:
                    raise AssertionError(f"lru ordering invariant broken: {b} has children")
                return b
            b = nxt  # pinned: off the list until its release puts it back at the end
        return None
