# C layout of Block and Lease for the compiled hot path (see skv/_build.py); block.py is the source.
cdef class Block:
    cdef public object key
    cdef public object parent
    cdef public int n_children
    cdef public int ref
    cdef public int tokens
    cdef public int stype
    cdef public int pos
    cdef public long long hits
    cdef public long long version
    cdef public long long next_use
    cdef public double inserted_at
    cdef public double last_access
    cdef public object req
    cdef public object pdata
    cdef public object link_prev
    cdef public object link_next
    cdef public double pk1
    cdef public double pk2
    cdef public long long pseq

cdef class Lease:
    cdef public list blocks
    cdef public long long hit_blocks
    cdef public long long hit_tokens

cdef class GhostEntry:
    cdef public int stype
    cdef public double evicted_at
    cdef public long long hits
    cdef public int tokens
    cdef public int pos
    cdef public object pdata
    cdef public object key

cdef class GhostList:
    cdef public long long capacity
    cdef dict _entries
    cdef list _ring
    cdef Py_ssize_t _head
    cpdef remember(self, Block b, double now)
    cpdef add(self, object key, GhostEntry entry)
    cpdef pop(self, object key)

cpdef Block new_block(object key, object parent, int tokens, int stype, int pos, object req,
                      double now)
cpdef Lease new_lease(list blocks, long long hit_blocks, long long hit_tokens)

cdef class Counters:
    cdef public long long requests
    cdef public long long prompt_tokens
    cdef public long long hit_tokens
    cdef public long long blocks
    cdef public long long hit_blocks
    cdef public long long evictions
    cdef public long long ghost_hits
    cdef public long long uncached
    cdef long long hit_tok_by_type[16]
    cdef long long hit_blk_by_type[16]
    cdef long long evict_by_type[16]
    cdef dict evict_by_reason
    cpdef void request(self, long long blocks, long long prompt_tokens, long long hit_blocks,
                      long long hit_tokens)
    cpdef void hit(self, Py_ssize_t stype, long long tokens)
    cpdef void hits(self, Py_ssize_t stype, long long blocks, long long tokens)
    cpdef void eviction(self, Py_ssize_t stype, str reason) except *
    cpdef snapshot(self)
