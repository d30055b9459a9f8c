# C layout of the node-level lru/vllm replay (see skv/_build.py); node_replay.py is the source.
from skv.cache.block cimport Counters, GhostList

cdef class _Node:
    cdef public long long lo
    cdef public long long hi
    cdef public long long base
    cdef public object keys
    cdef public list stypes
    cdef public _Node parent
    cdef public _Owner owner

cdef class _Owner:
    cdef public list nodes
    cdef public Py_ssize_t head

cdef class NodeReplay:
    cdef public long long capacity_blocks
    cdef public bint vllm
    cdef public str name
    cdef public object policy
    cdef public GhostList ghost
    cdef public Counters counters
    cdef dict _where
    cdef dict _copies
    cdef Py_ssize_t _n_copies
    cdef Py_ssize_t _unhashed
    cdef Py_ssize_t _pinned
    cdef object _queue
    cdef dict _live
    cdef object _trace
    cdef Py_ssize_t _cursor
    cdef tuple _cols
    cdef object _new_keys
    cdef list _tv
    cdef list _tl
    cdef list _sv
    cdef list _sl

    cdef void _access(self, object keys, Py_ssize_t hint, long long prompt_tokens,
                      long long block_size, Py_ssize_t tok_at, Py_ssize_t tok_end,
                      Py_ssize_t st_at, Py_ssize_t st_end) except *
    cdef Py_ssize_t _full_blocks(self, Py_ssize_t n, long long block_size, Py_ssize_t tok_at,
                                 Py_ssize_t tok_end) except -1
    cdef Py_ssize_t _cached_prefix(self, object keys, Py_ssize_t hint) except -1
    cdef _Node _node_at(self, object keys, Py_ssize_t d)
    cdef void _take_path(self, _Node node, Py_ssize_t m, _Owner owner) except *
    cdef long long _count_hits(self, Py_ssize_t m, Py_ssize_t tok_at,
                               Py_ssize_t st_at) except? -1
    cdef void _insert(self, object keys, Py_ssize_t m, Py_ssize_t full, _Owner owner,
                      list stypes) except *
    cdef bint _evict_one(self) except? 0
    cdef void _drop(self, object key, _Node node, Py_ssize_t depth) except *

cdef list _decode(list vals, list lens, Py_ssize_t at, Py_ssize_t end, Py_ssize_t a,
                  Py_ssize_t b)
