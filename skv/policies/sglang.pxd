from skv.cache.block cimport Block
from skv.policies.base cimport MonotonePriorityPolicy

cdef class SGLangLRU(MonotonePriorityPolicy):
    cdef public bint touch_on_release
    cpdef key(self, Block b, double now)

cdef class SGLangLFU(SGLangLRU):
    cpdef key(self, Block b, double now)
