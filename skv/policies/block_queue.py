"""A circular doubly linked queue threaded through ``Block.link_prev``/``link_next``, for the
queue policies (``s3fifo``, ``sieve``, ``wtinylfu``; compiled, they call these as C functions,
see ``block_queue.pxd``): O(1) insert and removal anywhere, no allocation per block. Invariant: a
block is in at most one queue; out of every queue its links are ``None``. (``lru`` inlines the
same moves.) And ``KeyQueue``, the same for keys: the ghost lists of ``arc`` and ``s3fifo``."""

from __future__ import annotations

from collections.abc import Iterator

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


class KeyNode:
    """One key of a ``KeyQueue``, on its ring."""

    def __init__(self) -> None:
        self.key: object = None
        self.prev: KeyNode = self
        self.next: KeyNode = self


class KeyQueue:
    """An insertion-ordered set of keys, oldest first: the ghost lists of ``arc`` and
    ``s3fifo``. It is ``OrderedDict``'s ``key in q``, ``len(q)``, iteration, ``q[key] = None``
    (a key already there keeps its place), ``del q[key]`` and ``popitem(last=False)``, as
    ``add``, ``remove`` and ``pop_oldest``: one dict operation each (a dict of nodes threaded on
    a ring), and no allocation once the queue stops growing (a node that leaves is reused)."""

    def __init__(self) -> None:
        self._nodes: dict = {}
        self._head = KeyNode()  # the ring's sentinel: _head.next is the oldest key
        self._spare: KeyNode | None = None

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def __iter__(self) -> Iterator[object]:
        head: KeyNode = self._head
        keys = []
        node: KeyNode = head.next
        while node is not head:
            keys.append(node.key)
            node = node.next
        return iter(keys)

    def add(self, key: object) -> None:
        """Append ``key`` at the newest end, unless it is already in the queue."""
        node: KeyNode = self._spare if self._spare is not None else KeyNode()
        if self._nodes.setdefault(key, node) is not node:
            self._spare = node  # already queued: it keeps its place
            return
        self._spare = None
        node.key = key
        head: KeyNode = self._head
        last: KeyNode = head.prev
        node.prev = last
        node.next = head
        last.next = node
        head.prev = node

    def remove(self, key: object) -> None:
        """Take ``key`` out of the queue (``KeyError`` if it is not there)."""
        self._drop(self._nodes.pop(key))

    def pop_oldest(self) -> object:
        """Take the oldest key out of the queue and return it (``KeyError`` if it is empty)."""
        node: KeyNode = self._head.next
        if node is self._head:
            raise KeyError("pop_oldest(): the queue is empty")
        key = node.key
        del self._nodes[key]
        self._drop(node)
        return key

    def _drop(self, node: KeyNode) -> None:
        prev: KeyNode = node.prev
        nxt: KeyNode = node.next
        prev.next = nxt
        nxt.prev = prev
        node.key = None
        node.prev = node
        node.next = node
        self._spare = node
