# C layout of WTinyLFU and its sketch for the compiled hot path (see skv/_build.py);
# wtinylfu.py is the source.
cimport cython

from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.block_queue cimport link_before, sentinel, unlink

cpdef unsigned long long key64(object key) except? 0
cdef void _g(unsigned long long* v, int a, int b, int c, int d, unsigned long long x,
             unsigned long long y) noexcept
cdef unsigned long long _blake2b_word(unsigned long long m) noexcept
cdef unsigned long long _mix(unsigned long long x) noexcept

@cython.final
cdef class CountMinSketch:
    cdef public long long width
    cdef public long long depth
    cdef public long long sample_size
    cdef public bytearray table
    cdef public int _shift
    cdef public list _muls
    cdef public long long samples
    cdef public long long resets
    cdef public object doorkeeper
    cpdef increment(self, unsigned long long k)
    cpdef long estimate(self, unsigned long long k) except? -1
    cpdef reset(self)

cdef class WTinyLFU(Policy):
    cdef dict __dict__  # tests wrap an instance's victim() (the cache then calls the wrapper)
    cdef public double window_ratio
    cdef public double protected_ratio
    cdef public long long sample_factor
    cdef public long long depth
    cdef public bint doorkeeper
    cdef public object seed
    cdef public object capacity_blocks
    cdef public Block _window
    cdef public Block _prob
    cdef public Block _prot
    cdef public long long _n_window
    cdef public long long _n_prob
    cdef public long long _n_prot
    cdef public long long _live
    cdef public long long _main_cap
    cdef public long long _prot_cap
    cdef public CountMinSketch sketch
    cdef public list _pending
    cdef public long long admitted
    cdef public long long rejected
    cdef Block _list(self, int seg)
    cdef unsigned long long _key(self, Block b) except? 0
    cdef _record(self, Block b)
    cdef _start(self)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef on_evict(self, Block b, double now)
    cdef _demote(self)
    cdef Block _main_victim(self)
    cpdef victim(self)
