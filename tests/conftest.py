"""Shared test setup: make ``tests/helpers.py`` importable under any pytest import mode."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config) -> None:
    """Refuse to test stale compiled modules: they would run old code (see skv/_build.py)."""
    import pytest

    from skv._build import build_status

    stale = [rel for rel, state in build_status().items() if state == "stale"]
    if stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; rebuild with "
            "`python setup.py build_ext --inplace` (./reproduce.sh does it for you)",
            returncode=3,
        )
