# C layout of RooflineKernel (see skv/_build.py); roofline_kernel.py is the source.
cdef class RooflineKernel:
    cdef public double two_p
    cdef public double attn
    cdef public double weights
    cdef public double kv
    cdef public double fpm
    cdef public double bpm
    cdef public double comm_fixed
    cdef public double comm_per_token
    cdef public double overhead

    cpdef tuple terms(self, object it)
    cpdef tuple sum_terms(self, double pairs, long long kv_read, long long prefill,
                          long long decode_seqs, long long decode_ctx)
    cpdef double iteration_ms(self, object it) except? -1.0
    cpdef double prefill_ms(self, list tokens, list contexts, long long decode_seqs,
                            long long decode_context_tokens) except? -1.0
    cpdef double decode_ms(self, long long seqs, long long context_tokens) except? -1.0
    cpdef list decode_run_ends(self, long long seqs, long long context_tokens, Py_ssize_t count,
                               double start_s)
