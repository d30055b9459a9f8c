from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.base cimport HeapEntry, KeyHeap

cdef class AdaptiveSemantic(Policy):
    cdef public long long _seq
    cdef public double half_life_s
    cdef public double eta
    cdef public long long update_every
    cdef public list initial_weights
    cdef public double ghost_gain
    cdef public double reuse_gain
    cdef public double freq_gain
    cdef public list weights
    cdef public list _offset
    cdef public list _heaps
    cdef long long _evicted[16]
    cdef long long _evicted_reused[16]
    cdef long long _ghost_hits[16]
    cdef public long long _window
    cdef public long long updates
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)
    cpdef on_ghost_hit(self, Block b, object ghost, double now)
