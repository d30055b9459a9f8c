"""skv._build.build_status: which compiled modules are current. A module with a .pxd but no
build while others are built (a .pxd added since the last build) must count as stale, so the
test suite and `skv check` refuse the mix instead of running plain code against C fields."""

from __future__ import annotations

import importlib.machinery
import os

from skv import _build


def _tree(tmp_path, built: set[str]):
    pkg = tmp_path / "skv"
    pkg.mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("a", "b"):
        (pkg / f"{name}.py").write_text("x = 1\n")
        (pkg / f"{name}.pxd").write_text("")
        if name in built:
            so = pkg / f"{name}{suffix}"
            so.write_bytes(b"")
            os.utime(so, (2e9, 2e9))  # newer than its source
    return _build.hot_path(tmp_path)


def test_a_module_without_a_build_beside_built_ones_is_stale(tmp_path, monkeypatch):
    hot = _tree(tmp_path, built={"a"})
    monkeypatch.setattr(_build, "ROOT", tmp_path)
    monkeypatch.setattr(_build, "HOT_PATH", hot)
    assert _build.build_status() == {"skv/a.py": "compiled", "skv/b.py": "stale"}


def test_nothing_built_is_plain_python_and_everything_built_is_compiled(tmp_path, monkeypatch):
    monkeypatch.setattr(_build, "ROOT", tmp_path)
    monkeypatch.setattr(_build, "HOT_PATH", _tree(tmp_path, built=set()))
    assert set(_build.build_status().values()) == {"python"}
    for name in ("a", "b"):
        so = tmp_path / "skv" / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        so.write_bytes(b"")
        os.utime(so, (2e9, 2e9))
    assert set(_build.build_status().values()) == {"compiled"}
