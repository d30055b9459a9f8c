# C layout of ARC for the compiled hot path (see skv/_build.py); arc.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.base cimport HeapEntry, KeyHeap
from skv.policies.block_queue cimport KeyQueue

cdef class ARC(Policy):
    cdef public double p
    cdef public long long c
    cdef public long long n1
    cdef public long long n2
    cdef public KeyHeap _h1
    cdef public KeyHeap _h2
    cdef public KeyQueue b1
    cdef public KeyQueue b2
    cdef public long long _seq
    cdef public list _keys
    cdef public Py_ssize_t _cur
    cdef public object _pending
    cdef public Block _victim
    cdef public bint _evicted
    cdef public int _dest
    cdef public object _absent
    cpdef on_request(self, RequestBlocks rb, double now)
    cpdef on_extend(self, RequestBlocks rb, double now)
    cdef object _incoming(self)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cdef _push(self, Block b)
    cdef _compact(self, int label)
    cdef Block _lru(self, int label)
    cdef _adapt_up(self)
    cdef _adapt_down(self)
    cdef Block _replace(self, bint in_b2)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)
