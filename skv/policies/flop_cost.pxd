# C layout of the block cost model for the compiled hot path (see skv/_build.py); flop_cost.py is
# the source. Compiled callers (pgdsf) cimport block_cost for C-level calls.
from skv.blocks cimport RequestBlocks
from skv.cache.block cimport Block

cdef long long _DEFAULT_BS

cpdef double recompute_cost(double tokens, double context, double crossover) except? -1.0
cpdef double block_cost(Block b, double crossover) except? -1.0
