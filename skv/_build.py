"""Which modules are compiled with Cython, and whether the compiled copies are current.

These modules are the replay hot path, written in Cython's pure-Python mode: ``setup.py``
compiles them in place when a C compiler exists, otherwise they run as plain Python. A compiled
module that is older than its source would silently run old code, so ``skv check``, the test
suite and ``reproduce.sh`` all look for stale builds. This file must not import skv.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def hot_path(root: Path = ROOT) -> tuple[str, ...]:
    """Every ``skv/**/*.py`` with a ``.pxd`` (its C declarations) beside it, sorted.

    Derived, not listed by hand: compiling a module is adding its ``.pxd``, nothing else.
    """
    return tuple(
        sorted(
            pxd.with_suffix(".py").relative_to(root).as_posix()
            for pxd in (root / "skv").rglob("*.pxd")
            if pxd.with_suffix(".py").is_file()
        )
    )


#: the compiled modules, as paths relative to the repository root (what setup.py cythonizes)
HOT_PATH: tuple[str, ...] = hot_path()


def build_status() -> dict[str, str]:
    """module path -> ``compiled``, ``stale`` (source newer than the build, or no build while
    other modules have one: a ``.pxd`` added since the last build) or ``python`` (nothing is
    compiled). A mix of compiled and plain modules is refused: plain code handing Python ints
    to compiled C fields may fail where either side alone would not."""
    out = {}
    for rel in HOT_PATH:
        src = ROOT / rel
        built = [
            src.with_name(src.stem + suffix)
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
            if src.with_name(src.stem + suffix).exists()
        ]
        if not built:
            out[rel] = "python"
        elif max(p.stat().st_mtime for p in built) < _source_mtime(src):
            out[rel] = "stale"
        else:
            out[rel] = "compiled"
    if "compiled" in out.values():
        out = {rel: "stale" if state == "python" else state for rel, state in out.items()}
    return out


def _source_mtime(src: Path) -> float:
    """The newest of the module and its .pxd (C declarations) companion."""
    pxd = src.with_suffix(".pxd")
    return max(src.stat().st_mtime, pxd.stat().st_mtime if pxd.exists() else 0.0)


if __name__ == "__main__":
    import sys

    status = build_status()
    for rel, state in status.items():
        print(f"{state:9} {rel}")
    sys.exit(1 if "stale" in status.values() else 0)
