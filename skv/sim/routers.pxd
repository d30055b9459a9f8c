# compiled with Cython (skv/_build.py): the router hot path
