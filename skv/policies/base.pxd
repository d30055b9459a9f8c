# C layout of the policy base classes for the compiled hot path (see skv/_build.py).
# base.py is the source; Python subclasses need no .pxd (they run as ordinary Python).
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy

cdef class PriorityPolicy(Policy):
    cdef public list _heap
    cdef public long long _seq
    cdef public long long _live
    cpdef priority(self, Block b, double now)
    cpdef push(self, Block b, double now)
    cpdef push_key(self, Block b, object key)

cdef class HeapEntry:
    cdef public double k1
    cdef public double k2
    cdef public long long seq
    cdef public Block b

cdef bint _before(HeapEntry x, HeapEntry y)

cdef class KeyHeap:
    cdef list _items
    cpdef push(self, double k1, double k2, long long seq, Block b)
    cpdef top(self)
    cpdef HeapEntry pop(self)
    cpdef replace_top(self, double k1, double k2, long long seq)
    cdef void _sift_down(self, HeapEntry e) except *

cdef class MonotonePriorityPolicy(Policy):
    cdef public KeyHeap _heap
    cdef public long long _seq
    cpdef key(self, Block b, double now)
    cpdef offer(self, Block b)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
