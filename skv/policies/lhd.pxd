# C layout of the lhd policy for the compiled hot path (see skv/_build.py); lhd.py is the source.
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy

cdef Py_ssize_t _MT_N, _MT_M
cdef unsigned int _MT_UPPER, _MT_LOWER, _MT_MATRIX_A, _MT_TEMPER_B, _MT_TEMPER_C

cdef void _densities(double[:] hits, double[:] evictions, double[:] out) except *
cdef list _as_list(double[:] values)

cdef class _Class:
    cdef public long long cid
    cdef double[:] _hits
    cdef double[:] _evictions
    cdef double[:] _density

cdef class LHD(Policy):
    cdef dict __dict__  # an instance may replace a method (tests wrap victim())
    cdef public long long associativity
    cdef public long long reconfigure_interval
    cdef public long long max_age
    cdef public double coarsening_tolerance
    cdef public double ewma_decay
    cdef public long long hit_classes
    cdef public str features
    cdef public double explore_fraction
    cdef public long long explore_inverse_probability
    cdef public object seed
    cdef public bint _by_hits
    cdef public bint _by_reuse
    cdef public bint _by_type
    cdef public bint _by_session
    cdef public list _classes
    cdef public list _active
    cdef public object _rng
    cdef object _words
    cdef Py_ssize_t _word
    cdef unsigned int _mt[624]
    cdef Py_ssize_t _mti
    cdef public list _leaves
    cdef readonly long long[:] _leaf_t
    cdef readonly long long[:] _leaf_c
    cdef readonly double[:] _leaf_x
    cdef long long[:] _sample_j
    cdef long long[:] _sample_t
    cdef double[:] _sample_d
    cdef public long long _clock
    cdef public long long _next_reconfig
    cdef public long long _reconfigs
    cdef public long long _shift
    cdef public long long _age_shift
    cdef public long long _top
    cdef public long long _resident
    cdef public long long _explorers
    cdef public double _ewma_n
    cdef public double _ewma_mass
    cdef _Class _class_of(self, Block b, double reuse)
    cpdef long long _reuse_class(self, double total) except? -1
    cdef void _explore(self, Block b) except *
    cdef void _tick(self) except *
    cdef void _add(self, Block b) except *
    cdef void _grow_leaves(self) except *
    cdef void _remove(self, Block b) except *
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_pin(self, Block b)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef victim(self)
    cpdef on_evict(self, Block b, double now)

cdef double _uniform(LHD p) noexcept
cdef void _seed_words(LHD p, tuple state) except *
cdef unsigned int _next_word(LHD p) noexcept
