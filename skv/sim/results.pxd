# compiled with Cython (skv/_build.py): one row per simulated request, read from C fields
from skv.sim.replica cimport RequestState
