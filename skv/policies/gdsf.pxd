from skv.cache.block cimport Block
from skv.policies.base cimport MonotonePriorityPolicy

cdef class GDSF(MonotonePriorityPolicy):
    cdef public double inflation
    cpdef key(self, Block b, double now)
    cpdef on_evict(self, Block b, double now)
