# C layout of BlockCache for the compiled hot path (see skv/_build.py); radix.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block, Lease

cdef class BlockCache:
    cdef public long long capacity_blocks
    cdef public object policy
    cdef public dict blocks
    cdef public object ghost
    cdef public object eviction_log
    cdef long long _requests
    cdef long long _prompt_tokens
    cdef long long _hit_tokens
    cdef long long _blocks
    cdef long long _hit_blocks
    cdef long long _evictions
    cdef long long _ghost_hits
    cdef long long _uncached
    cdef list _hit_tok_by_type
    cdef list _hit_blk_by_type
    cdef list _evict_by_type
    cdef dict _evict_by_reason

    cpdef Lease acquire(self, RequestBlocks rb, double now)
    cpdef release(self, Lease lease, double now)
    cpdef Lease access(self, RequestBlocks rb, double now)
    cdef bint _evict_one(self, double now, str reason)
