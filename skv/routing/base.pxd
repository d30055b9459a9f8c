# compiled with Cython (skv/_build.py): the router hot path; C layout of Ranking
cdef class Ranking:
    cdef readonly object order
    cdef readonly object scores
    cdef readonly str reason
