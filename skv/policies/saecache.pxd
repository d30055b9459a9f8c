# C layout of saecache for the compiled hot path (see skv/_build.py); saecache.py is the source.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block, GhostEntry
from skv.policies.adaptive_semantic cimport AdaptiveSemantic
from skv.cache.policy cimport Policy
from skv.policies.base cimport HeapEntry, KeyHeap

cdef int _EF, _CHAT, _AGENTIC, _STRUCT
cdef Py_ssize_t _T, _OUTPUT, _HISTORY, _TOOL_SCHEMA, _TOOL_OUTPUT
cdef double _SQRT2, _HALF_LOG_PI, _LOG_HALF
cdef Py_ssize_t _NUM_PARTIALS

cpdef int request_queue(RequestBlocks rb) except? -1
cpdef double log_survival(double dt, double mu, double sigma)
cdef double _clip(double x, double lo, double hi) noexcept
cdef double _fsum(object arr, double[::1] buf, Py_ssize_t n, bint square) except? -1.0
cdef double _fsum_python(object arr, Py_ssize_t n, bint square) except? -1.0

cdef class LogWindow:
    cdef public Py_ssize_t size
    cdef object _arr
    cdef double[::1] _buf
    cdef public Py_ssize_t _n
    cdef Py_ssize_t _head
    cdef public double s1
    cdef public double s2
    cdef Py_ssize_t _since_exact
    cpdef push(self, double x)
    cpdef double mean(self) except? -1.0
    cpdef double std(self) except? -1.0

cdef class Group:
    cdef public int q
    cdef public int t
    cdef public int lev
    cdef public bint timed
    cdef public double ratio
    cdef public KeyHeap heap
    cdef public double cbase
    cdef public double base
    cdef public double gamma
    cdef public long long stamp
    cdef public bint active
    cdef public bint memo
    cdef public double memo_key
    cdef public double memo_t
    cdef public double memo_now
    cdef public double memo_eps
    cdef public double memo_mu
    cdef public double memo_sigma

cdef class SAECache(Policy):
    # configuration
    cdef public long long update_every
    cdef public double eta
    cdef public double ghost_gain
    cdef public double reuse_gain
    cdef public double alpha_eta
    cdef public double alpha_min
    cdef public double alpha_max
    cdef public long long gap_window
    cdef public long long min_gap_samples
    cdef public double sigma_min
    cdef public long long max_sessions
    cdef public long long gamma_window
    cdef public long long min_gamma_samples
    cdef public double gamma_min
    cdef public double gamma_max
    cdef public Py_ssize_t position_levels
    cdef long long _promote
    cdef public double dt_epsilon
    cdef public bint queue_weights
    cdef public bint type_weights
    cdef public bint lognormal_timing
    cdef public bint position_decay
    cdef public bint learn
    cdef long long _slack
    # parameters
    cdef public list initial_alpha
    cdef public list initial_weights
    cdef public list initial_mu
    cdef public list initial_sigma
    cdef public double initial_gamma
    cdef public list alpha
    cdef public list weights
    cdef public list mu
    cdef public list sigma
    cdef public double gamma
    cdef public bint _learn_alpha
    cdef public bint _learn_timing
    cdef public bint _learn_gamma
    cdef public AdaptiveSemantic _types
    cdef bint _uses_ghost
    # groups
    cdef public Py_ssize_t num_groups
    cdef public list _groups
    cdef public list _heaps
    cdef public list _active
    cdef public long long _n_entries
    cdef public long long _n_live
    cdef public long long _seq
    cdef public long long _stamp
    cdef list _la
    cdef list _lw
    # the current request and the learning windows
    cdef public double _now
    cdef public int _cls
    cdef bint _req_single
    cdef long long _req_blocks
    cdef long long _req_hits
    cdef public dict _sessions
    cdef public list _gaps
    cdef public LogWindow _depths
    cdef long long _n_hits[4]
    cdef long long _n_evicted[4]
    cdef long long _n_ghost[4]
    cdef public long long _evictions
    cdef public long long alpha_updates
    cdef public long long _w_seen

    cpdef Py_ssize_t group_of(self, Block b, int cls) except -1
    cpdef _refresh_cbase(self)
    cpdef on_request(self, RequestBlocks rb, double now)
    cpdef on_extend(self, RequestBlocks rb, double now)
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cdef void _push(self, Block b) except *
    cpdef victim(self)
    cpdef _compact(self)
    cpdef on_evict(self, Block b, double now)
    cpdef on_ghost_hit(self, Block b, object ghost, double now)
    cdef void _reset_window(self) noexcept
    cpdef _update_alpha(self)

cdef class SAECacheFixed(SAECache):
    pass
