# C layout of BlockCache for the compiled hot path (see skv/_build.py); radix.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block, Counters, GhostList, Lease, new_block, new_lease
from skv.cache.policy cimport Policy

cdef class BlockCache:
    cdef public long long capacity_blocks
    cdef public Policy policy
    cdef public dict blocks
    cdef public GhostList ghost
    cdef public object eviction_log
    cdef public list evicted_blocks
    cdef public Counters counters

    cdef long long _pinned
    cdef long long _last_hit_blocks
    cdef long long _last_hit_tokens

    cpdef Lease acquire(self, RequestBlocks rb, double now)
    cdef void _acquire_into(self, RequestBlocks rb, double now, list held, Py_ssize_t start,
                            bint count) except *
    cpdef release(self, Lease lease, double now)
    cdef void _release_list(self, list held, double now) except *
    cpdef Lease access(self, RequestBlocks rb, double now)
    cdef bint _evict_one(self, double now, str reason)
