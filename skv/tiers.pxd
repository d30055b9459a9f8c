# C layout of the tiered store for the compiled hot path (see skv/_build.py); tiers.py is the
# source. Link, TierSpec, TierStats and ServingStats stay Python classes (dataclasses).
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block, Lease, new_block
from skv.cache.policy cimport Policy
from skv.cache.radix cimport BlockCache

cdef class TierStore:
    cdef public str name
    cdef public long long capacity_blocks
    cdef public Policy policy
    cdef public dict blocks
    cdef public long long evictions
    cpdef touch(self, object key, double now)
    cpdef list insert(self, object key, int stype, int tokens, object req, double now)
    cpdef remove(self, object key)

cdef class LoadPricer:
    cdef public object latency
    cdef public double kv_bytes_per_token
    cdef public str choice
    cdef public list _paths
    cpdef double load_ms(self, long long tier, long long tokens) except? -1
    cpdef double recompute_ms(self, long long tokens, long long after,
                              long long before) except? -1
    cpdef double decide(self, RequestBlocks rb, list where, object st) except? -1

cdef class TierLease:
    cdef public Lease top
    cdef public list where
    cdef public long long hit_blocks
    cdef public long long hit_tokens
    cdef public double load_ms

cdef class TieredCache:
    cdef public BlockCache top
    cdef public list tiers
    cdef public list specs
    cdef readonly str write
    cdef readonly str load
    cdef public LoadPricer pricer
    cdef readonly object tier_stats
    cdef list _evicted
    cdef double _pending_load_ms
    cdef list _hit_blocks_by_type
    cdef list _stored_blocks
    cdef list _stored_tokens
    cdef list _tier_evictions
    cdef bint _through
    cdef bint _move

    cpdef TierLease acquire(self, RequestBlocks rb, double now)
    cdef list _classify(self, list keys, list parents)
    cpdef release(self, TierLease lease, double now)
    cdef void _write_through(self, Block b, double now) except *
    cdef void _demote(self, double now) except *
    cdef void _store(self, Py_ssize_t k, object key, int stype, int tokens, object req,
                     double now) except *
