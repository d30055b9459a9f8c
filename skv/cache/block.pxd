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

cdef class Lease:
    cdef public list blocks
    cdef public long long hit_blocks
    cdef public long long hit_tokens
