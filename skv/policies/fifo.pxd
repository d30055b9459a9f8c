from skv.cache.block cimport Block
from skv.policies.base cimport MonotonePriorityPolicy

cdef class FIFO(MonotonePriorityPolicy):
    cdef public long long _inserted
    cpdef on_insert(self, Block b, double now)
    cpdef key(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
