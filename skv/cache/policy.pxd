# C layout of the policy interface for the compiled hot path (see skv/_build.py); policy.py is
# the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block

cdef class Policy:
    cpdef on_request(self, RequestBlocks rb, double now)
    cpdef on_extend(self, RequestBlocks rb, double now)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_pin(self, Block b)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)
    cpdef on_ghost_hit(self, Block b, object ghost, double now)
