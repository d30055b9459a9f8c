from skv.cache.block cimport Block
from skv.cache.policy cimport Policy

cdef class LRU(Policy):
    cdef Block _head
    cpdef on_unpin(self, Block b, double now)
    cpdef victim(self)
