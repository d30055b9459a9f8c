# C layout of S3FIFO for the compiled hot path (see skv/_build.py); s3fifo.py is the source.
from skv.cache.block cimport Block
from skv.cache.policy cimport Policy
from skv.policies.block_queue cimport KeyQueue, link_before, sentinel, unlink

cdef class S3FIFO(Policy):
    cdef dict __dict__  # tests wrap an instance's victim() (the cache then calls the wrapper)
    cdef public double small_ratio
    cdef public double ghost_ratio
    cdef public long long move_to_main_threshold
    cdef public long long max_freq
    cdef public object capacity_blocks
    cdef public Block _small
    cdef public Block _main
    cdef public long long _n_small
    cdef public long long _n_main
    cdef public long long _live
    cdef public long long _main_cap
    cdef public long long _ghost_cap
    cdef public bint _started
    cdef public KeyQueue _ghost
    cdef public long long moved_to_main
    cdef public long long ghost_admits
    cpdef on_insert(self, Block b, double now)
    cpdef on_hit(self, Block b, double now)
    cpdef on_unpin(self, Block b, double now)
    cpdef on_leaf(self, Block b, double now)
    cpdef on_evict(self, Block b, double now)
    cdef _start(self)
    cpdef victim(self)
    cdef Block _evict_small(self)
    cdef Block _evict_main(self)
