# C layout of ttl_pin for the compiled hot path (see skv/_build.py); ttl_pin.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.block_queue cimport link_before, sentinel, unlink

cdef Py_ssize_t _TOOL_OUTPUT, _TOOL_SCHEMA
cdef double _NEVER

cdef class _Session:
    cdef public double last_arrival
    cdef public double last_release
    cdef public bint tool

cdef class TTLPin(Policy):
    cdef public double ttl_quantile
    cdef public long long gap_window
    cdef public double initial_ttl_s
    cdef public bint all_sessions
    cdef public long long max_sessions
    cdef public double ttl_s
    cdef public Block _n
    cdef public Block _e
    cdef public Block _p
    cdef public dict _sessions
    cdef public _Session _cur
    cdef public object _cur_rb
    cdef public object _gaps
    cdef public list _sorted
    cdef public double _now
    cdef public long long _seq
    cdef public long long protected_releases
    cdef public long long expirations
    cdef public long long protected_evictions
    cpdef on_request(self, RequestBlocks rb, double now)
    cpdef on_extend(self, RequestBlocks rb, double now)
    cpdef add_gap(self, double gap_s)
    cdef _Session _session_of(self, object req)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)

cdef Block _first_evictable(Block head)
