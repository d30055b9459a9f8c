from skv.cache.block cimport Block
from skv.policies.base cimport MonotonePriorityPolicy

cdef class SizeLRU(MonotonePriorityPolicy):
    cdef public double beta_s
    cpdef key(self, Block b, double now)
