from skv.cache.block cimport Block
from skv.policies.flop_cost cimport block_cost
from skv.policies.gdsf cimport GDSF

cdef class PGDSF(GDSF):
    cdef public double attn_crossover
    cpdef key(self, Block b, double now)
