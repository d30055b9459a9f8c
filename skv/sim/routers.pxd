# C layout of the simulator's replica views (see skv/_build.py); routers.py is the source.
from skv.sim.replica cimport Replica

cdef class ExactCacheView:
    cdef public Replica replica
    cdef public long long routed

cdef class ApproximateView(ExactCacheView):
    cdef public object cache
    cdef public long long clock
    cdef public object index
    cdef public object bit

cdef list _match_small(dict index, object rb, Py_ssize_t n)
cdef void _credit_small(list hits, unsigned long long mask, Py_ssize_t amount) except *
