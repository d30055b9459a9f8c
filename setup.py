"""Compiles the replay hot path with Cython when a C compiler is available.

The modules (every skv .py with a .pxd beside it, found by skv/_build.py) are plain Python
(Cython's pure-Python mode): without a compiler they run as ordinary Python, only slower.
`skv check` reports which mode is in use.
"""

import runpy

from Cython.Build import cythonize
from setuptools import setup

HOT_PATH = runpy.run_path("skv/_build.py")["HOT_PATH"]

extensions = cythonize(
    list(HOT_PATH),
    compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False},
    quiet=True,
)
for ext in extensions:
    ext.optional = True  # a failed compile falls back to pure Python instead of failing install
    # no fused multiply-add: a*b + c rounds twice, as in Python, so compiled floats are
    # Python's on every platform (aarch64 compilers contract by default)
    ext.extra_compile_args = ["-ffp-contract=off"]

setup(ext_modules=extensions)
