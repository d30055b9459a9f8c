# C layout of RequestState and Replica for the compiled event loop (see skv/_build.py);
# replica.py is the source.
from skv.blocks cimport RequestBlocks

cdef class RequestState:
    cdef public long long index
    cdef public object request
    cdef public RequestBlocks rb
    cdef public double arrival_s
    cdef public long long prompt_tokens
    cdef public long long output_target
    cdef public long long replica
    cdef public object lease
    cdef public object admitted_s
    cdef public object first_token_s
    cdef public object finished_s
    cdef public long long cached_tokens
    cdef public long long hit_blocks
    cdef public long long prefill_total
    cdef public long long prefilled
    cdef public long long generated
    cdef public long long chunk
    cdef public long long seq
    cdef public long long decode_from
    cdef public object ext_rb
    cdef public long long ext_start

cdef class Replica:
    cdef public long long index
    cdef public object cache
    cdef public long long max_batch_tokens
    cdef public long long max_running
    cdef public object waiting
    cdef public list prefilling
    cdef public long long running
    cdef public long long decoding
    cdef public long long decode_context
    cdef public bint busy
    cdef public long long iterations
    cdef public long long load
    cdef public list finishes
    cdef public Py_ssize_t chunked
    cdef public long long admitted

    cpdef enqueue(self, RequestState st)
    cpdef list admit(self, double now)
    cpdef object plan(self)
    cpdef object iteration(self)
    cpdef tuple chunk_lists(self)
    cpdef Py_ssize_t plan_chunks(self)
    cpdef list advance(self, double now)
    cpdef void skip_decodes(self, long long count) except *
