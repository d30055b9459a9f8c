"""Shared test setup: make ``tests/helpers.py`` importable under any pytest import mode; refuse
stale compiled modules; the real-engine fixtures (engine venv, tiny model) shared by the
``vllm``-marked modules."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)
_TRACE_CACHE: str | None = None
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config) -> None:
    """Refuse to test stale compiled modules: they would run old code (see skv/_build.py).

    The binary trace cache the CLI uses by default goes to a directory of this run's own
    (removed at the end), not the user's ~/.cache; subprocesses inherit it."""
    from skv._build import build_status

    global _TRACE_CACHE
    _TRACE_CACHE = tempfile.mkdtemp(prefix="skv-test-trace-cache-")
    os.environ["SKV_TRACE_CACHE"] = _TRACE_CACHE

    stale = [rel for rel, state in build_status().items() if state == "stale"]
    if stale:
        pytest.exit(
            f"compiled modules older than their sources (or not built): {', '.join(stale)}; "
            "rebuild with "
            "`python setup.py build_ext --inplace` (./reproduce.sh does it for you)",
            returncode=3,
        )


def pytest_unconfigure(config) -> None:
    if _TRACE_CACHE:
        shutil.rmtree(_TRACE_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's interpreter; the ``vllm`` tests skip without it (scripts/setup_vllm.sh)."""
    from skv.vllm.server import find_engine_python, setup_hint

    py = find_engine_python()
    if py is None:
        pytest.skip(f"vLLM engine venv absent: {setup_hint()}")
    return py


@pytest.fixture(scope="session")
def tiny_model(engine_python, tmp_path_factory) -> Path:
    """A tiny random-weight Llama with its own tokenizer and chat template (built in seconds)."""
    from skv.vllm.server import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), engine_python)
