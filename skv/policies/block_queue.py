"""A circular doubly linked queue threaded through ``Block.link_prev``/``link_next``, for the
queue policies in plain Python (``s3fifo``, ``sieve``, ``wtinylfu``): O(1) insert and removal
anywhere, no allocation per block. Invariant: a block is in at most one queue; out of every
queue its links are ``None``. (``lru`` inlines the same moves, as its compiled hot path needs.)"""

from __future__ import annotations

from skv.cache.block import Block


def sentinel() -> Block:
    """An empty queue: a block that is not cached, linked to itself. ``head.link_next`` is the
    oldest block, ``head.link_prev`` the newest."""
    head = Block(None, None, 0, 0, 0, None, 0.0)
    head.link_prev = head
    head.link_next = head
    return head


def link_before(b: Block, at: Block) -> None:
    """Put ``b`` just before ``at`` (before the sentinel: the newest end)."""
    prev: Block = at.link_prev
    b.link_prev = prev
    b.link_next = at
    prev.link_next = b
    at.link_prev = b


def unlink(b: Block) -> None:
    """Take ``b`` out of its queue."""
    prev: Block = b.link_prev
    nxt: Block = b.link_next
    prev.link_next = nxt
    nxt.link_prev = prev
    b.link_prev = None
    b.link_next = None
