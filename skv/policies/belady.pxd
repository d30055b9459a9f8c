from skv.cache.block cimport Block
from skv.policies.base cimport PriorityPolicy

cdef class Belady(PriorityPolicy):
    cpdef priority(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
