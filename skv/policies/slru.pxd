from skv.cache.block cimport Block
from skv.cache.policy cimport Policy

cdef class SLRU(Policy):
    cdef public double protected_fraction
    cdef public long long promote_hits
    cdef public object _prob
    cdef public object _prot
    cdef public long long _n_protected
    cdef public long long _live
    cdef public long long _cap
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)
