# C layout of the marconi policy for the compiled hot path (see skv/_build.py); marconi.py is
# the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy

cdef class _Entry:
    cdef public double key
    cdef public long long seq
    cdef public long long version
    cdef public Block b

cdef _Entry _entry(double key, long long seq, long long version, Block b)
cdef bint _before(_Entry x, _Entry y) noexcept
cdef void _heap_push(list heap, _Entry e) except *
cdef void _sift_up(list heap, Py_ssize_t i, _Entry e) except *
cdef void _sift_down(list heap, Py_ssize_t i, _Entry e) except *
cdef _Entry _heap_pop(list heap)
cdef void _heapify(list heap) except *
cdef bint _one_cost(list recorded) except -1

cdef class Marconi(Policy):
    cdef public double alpha
    cdef public bint tune
    cdef public list alpha_grid
    cdef public long long bootstrap_multiplier
    cdef public long long tune_max_blocks
    cdef public double refresh_fraction
    cdef public double attn_crossover
    cdef public double _alpha0
    cdef public list _heap
    cdef public list _run
    cdef public Py_ssize_t _run_head
    cdef public long long _rseq
    cdef public long long _live
    cdef public double _since
    cdef public double _t0
    cdef public double _rt
    cdef public double _e0
    cdef public double _re
    cdef public double _w
    cdef public long long refreshes
    cdef public double saved
    cdef public object _window
    cdef public long long _window_blocks
    cdef public long long _requests
    cdef public long long _window_size
    cdef public long long _capacity
    cdef public bint tuned
    cpdef on_request(self, RequestBlocks rb, double now)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_pin(self, Block b)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)
    cdef void _push(self, Block b) except *
    cdef void _add(self, _Entry e) except *
    cdef _Entry _pop(self)
    cdef void _compact(self) except *
    cdef void _refresh(self) except *
