# C layout of RequestBlocks for the compiled hot path (see skv/_build.py); blocks.py is the source.
cdef class RequestBlocks:
    cdef public long long index
    cdef public double arrival_s
    cdef public list keys
    cdef public list parents
    cdef public list tokens
    cdef public list stypes
    cdef public list seg_tokens
    cdef public object session
    cdef public int turn
    cdef public bint templated
    cdef public int block_size
    cdef public long long prompt_tokens
    cdef public object next_use
