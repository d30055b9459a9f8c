# C layout of kvflow for the compiled hot path (see skv/_build.py); kvflow.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.block_queue cimport link_before, sentinel, unlink

cdef int _AGED, _UNKNOWN, _PREDICTED

cdef class _Agent:
    cdef public Block head
    cdef public double last_arrival
    cdef public double gap
    cdef public long long turns
    cdef public int tier
    cdef public double key
    cdef public long long version
    cdef public bint in_heap
    cdef public double predicted

cdef class KVFlow(Policy):
    cdef public double ewma_alpha
    cdef public bint prior
    cdef public double prior_alpha
    cdef public double age_out
    cdef public long long max_sessions
    cdef public double prior_gap_s
    cdef public dict _agents
    cdef public _Agent _none
    cdef public _Agent _cur
    cdef public object _cur_rb
    cdef public list _heap
    cdef public long long _in_heap
    cdef public list _ageing
    cdef public long long _seq
    cdef public double _now
    cdef public long long aged_out
    cpdef on_request(self, RequestBlocks rb, double now)
    cpdef on_extend(self, RequestBlocks rb, double now)
    cdef void _predict(self, _Agent a) except *
    cdef void _push(self, _Agent a) except *
    cdef void _age(self, double now) except *
    cdef _Agent _agent_of(self, object req)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)

cdef Block _first_evictable(Block head)
