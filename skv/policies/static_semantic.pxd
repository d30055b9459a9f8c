from skv.cache.block cimport Block
from skv.policies.base cimport MonotonePriorityPolicy

cdef class StaticSemantic(MonotonePriorityPolicy):
    cdef public list weights
    cdef public double half_life_s
    cdef public list _offset
    cpdef key(self, Block b, double now)
