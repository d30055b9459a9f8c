# C layout of the block queue helpers for the compiled hot path (see skv/_build.py);
# block_queue.py is the source. Compiled callers cimport these for C-level calls.
cimport cython

from skv.cache.block cimport Block

cpdef Block sentinel()
cpdef void link_before(Block b, Block at) except *
cpdef void unlink(Block b) except *

@cython.final
cdef class KeyNode:
    cdef public object key
    cdef public KeyNode prev
    cdef public KeyNode next

@cython.final
cdef class KeyQueue:
    cdef dict _nodes
    cdef KeyNode _head
    cdef KeyNode _spare
    cpdef add(self, object key)
    cpdef remove(self, object key)
    cpdef pop_oldest(self)
    cdef _drop(self, KeyNode node)
