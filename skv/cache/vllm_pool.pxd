# C layout of VllmBlockPool for the compiled hot path (see skv/_build.py); vllm_pool.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Counters, GhostList, Lease, new_lease

cdef class VllmBlockPool:
    cdef public long long capacity_blocks
    cdef public long long[:] ref
    cdef public list hash
    cdef public long long[:] stype
    cdef public long long[:] tokens
    cdef long long[:] _prev
    cdef long long[:] _next
    cdef Py_ssize_t _nfree
    cdef public dict cached
    cdef public dict _copies
    cdef public GhostList ghost
    cdef public object eviction_log
    cdef public Counters counters

    cdef void _unlink(self, Py_ssize_t blk)
    cdef void _push_back(self, Py_ssize_t blk)
    cdef void _push_front(self, Py_ssize_t blk)
    cpdef Lease acquire(self, RequestBlocks rb, double now)
    cdef void _allocate(self, RequestBlocks rb, Py_ssize_t start, list held, double now,
                        bint count) except *
    cdef void _hash_block(self, Py_ssize_t blk, object key, long long st, long long bs) except *
    cpdef release(self, Lease lease, double now)
    cpdef Lease access(self, RequestBlocks rb, double now)
    cdef Py_ssize_t _hit_count(self, RequestBlocks rb) except -1
    cdef void _evict_hash(self, Py_ssize_t blk, double now) except *
