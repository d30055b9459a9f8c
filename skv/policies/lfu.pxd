from skv.cache.block cimport Block
from skv.policies.base cimport MonotonePriorityPolicy

cdef class LFU(MonotonePriorityPolicy):
    cpdef key(self, Block b, double now)
