# C layout of Sieve for the compiled hot path (see skv/_build.py); sieve.py is the source.
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.block_queue cimport link_before, sentinel, unlink

cdef class Sieve(Policy):
    cdef public Block _s
    cdef public Block _hand
    cdef public long long hand_steps
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)
