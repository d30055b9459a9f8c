# C layout of the event loop (see skv/_build.py); events.py is the source.
from skv.sim.replica cimport Replica, RequestState

cdef class DecodeRun:
    cdef public double start
    cdef public long long context
    cdef public list ends
    cdef public dict sample

cdef class EventLoop:
    cdef public object latency
    cdef public list replicas
    cdef public object on_iteration
    cdef public list memory
    cdef public list policy_series
    cdef public list heap
    cdef public list version
    cdef public long long seq
    cdef public list runs
    cdef public list cap
    cdef public list next_sample
    cdef public long long finished
    cdef public long long run_cap_start
    cdef public long long run_cap_max
    cdef public double sample_every_s
    cdef public long long policy_metrics_every
    cdef public bint include_output_blocks
    cdef public bint tiered
    cdef public bint tier_overlap
    cdef public bint price_chunks

    cpdef push(self, Py_ssize_t k, double end)
    cpdef start_iteration(self, Replica rep, double now)
    cpdef cut_run(self, Py_ssize_t k, double now)
    cpdef end_run(self, Replica rep)
    cpdef finish(self, Replica rep, RequestState st, double now)
    cpdef dict snapshot(self, Replica rep)
    cpdef sample(self, Replica rep, double now)
