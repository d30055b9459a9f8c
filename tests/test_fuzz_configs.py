"""Fuzz the config loaders with random YAML: only ``ConfigError``, naming the file.

Loaders: :func:`skv.experiments.config.load_config` and every study's ``load_config``
(``skv/experiments/*/study.py``, found by import so a new study is covered), each with
``quick`` off and on. Inputs: the study's own shipped config with one value (any depth)
replaced by any YAML value, the same text with random edits, random documents over the
config's own keys, and YAML's special syntax (tags, anchors, aliases, merge keys, deep
nesting, ``.nan``, dates, binary). A loader returns a config or raises ``ConfigError`` whose
message names the file; any other exception, or a slow example (the deadline), fails.
Bounded and derandomized: the same examples in every run.
"""

from __future__ import annotations

import importlib
import inspect
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import json_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skv.experiments.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
FUZZ = settings(
    max_examples=int(os.environ.get("SKV_FUZZ_EXAMPLES", "100")),  # deeper runs: raise it
    deadline=timedelta(seconds=5),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _study_loaders() -> dict[str, tuple[Callable[..., Any], Path]]:
    """name -> (loader, a shipped config it reads), for every ``load_config`` of a study module
    (``skv/experiments/<study>/*.py``), paired with the first of its study's configs it reads
    (a study may hold several kinds: fidelity's sequential and under-load configs)."""
    out: dict[str, tuple[Callable[..., Any], Path]] = {
        "experiments.config": (
            lambda path, quick: load_config(path),
            ROOT / "experiments" / "semantickv" / "smoke.yaml",
        )
    }
    for path in sorted((ROOT / "skv" / "experiments").glob("*/*.py")):
        study = path.parent.name
        configs = sorted((ROOT / "experiments" / study).glob("*.yaml"))
        if path.stem == "__init__" or not configs:
            continue
        module = importlib.import_module(f"skv.experiments.{study}.{path.stem}")
        loader = getattr(module, "load_config", None)
        if loader is None or getattr(loader, "__module__", None) != module.__name__:
            continue
        if "quick" not in inspect.signature(loader).parameters:  # e.g. config.load_config
            loader = _without_quick(loader)
        readable = [c for c in configs if _reads(loader, c)]
        assert readable, f"{module.__name__}.load_config reads none of {study}'s configs"
        out[study if path.stem == "study" else f"{study}.{path.stem}"] = (loader, readable[0])
    return out


def _reads(loader: Callable[..., Any], path: Path) -> bool:
    try:
        loader(path, quick=True)
        loader(path, quick=False)
    except ConfigError:
        return False
    return True


def _without_quick(loader: Callable[..., Any]) -> Callable[..., Any]:
    return lambda path, quick: loader(path)


LOADERS = _study_loaders()


def test_the_loaders_read_their_shipped_configs():
    assert {"experiments.config", "fidelity", "fidelity.load", "routing", "repurpose"} <= set(
        LOADERS
    )
    for name, (load, seed) in LOADERS.items():
        for quick in (False, True):
            assert load(seed, quick=quick) is not None, name


# --------------------------------------------------------------------------- inputs

SPECIAL = [
    "!!python/object/apply:os.system ['true']", "!!binary aGVsbG8=", "!!set {a, b}", "!!str",
    "&a [1, 2]", "*a", "<<: *a", "? complex key", "- ", ": ", "{", "}", "[", "]", "|\n  x",
    ">-\n  y", ".nan", ".inf", "-.inf", "2024-01-01", "0x1F", "0o17", "1e400", "1_000",
    "~", "null", "yes", "no", "'", '"', "\t", "\n", "#", "%YAML 1.2\n---", "---", "...",
    "\x00", "\ufeff", "é", "9" * 40,
]  # fmt: skip
text = st.lists(st.one_of(st.characters(), st.sampled_from(SPECIAL)), max_size=12).map("".join)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["50%", "10GB", "1TB", "inf", "lru", "prefix", "0", "-1", "1e12"]),
)
values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)
    ),
    max_leaves=10,
)


def _keys(node: Any) -> set[str]:
    return {p[-1] for p in json_paths(node) if isinstance(p[-1], str)}


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")


@st.composite
def value_replaced(draw: st.DrawFn, seed: Any) -> bytes:
    """The shipped config with one value, at any depth, replaced by any value."""
    doc = yaml.safe_load(yaml.safe_dump(seed))  # a copy
    paths = list(json_paths(doc))
    if paths:
        path = draw(st.sampled_from(paths))
        node = doc
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = draw(values)
    return _dump(doc)


@st.composite
def edited(draw: st.DrawFn, seed_text: str) -> bytes:
    """The shipped config's text with a few random edits."""
    data = bytearray(seed_text.encode())
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        kind = draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[pos : pos + draw(st.integers(1, 30))]
        else:
            data[pos:pos] = draw(text).encode("utf-8", "surrogatepass")
    return bytes(data)


def documents(seed_path: Path) -> st.SearchStrategy[bytes]:
    seed_text = seed_path.read_text()
    seed = yaml.safe_load(seed_text)
    keys = sorted(_keys(seed)) or ["x"]
    own = st.recursive(
        scalars,
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(keys), kids, max_size=4)
        ),
        max_leaves=12,
    )
    return st.one_of(
        value_replaced(seed),
        edited(seed_text),
        own.map(_dump),
        text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.integers(1, 200).map(lambda n: b"a: " + b"[" * n + b"]" * n),
        st.binary(max_size=100),
    )


# --------------------------------------------------------------------------- the check


@contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="skv-fuzz-") as d:
        yield Path(d)


def load_cleanly(load: Callable[..., Any], data: bytes) -> None:
    """Only ConfigError, naming the file."""
    with _scratch() as d:
        path = d / "fuzzed.yaml"
        path.write_bytes(data)
        for quick in (False, True):
            try:
                load(path, quick=quick)
            except ConfigError as exc:
                assert "fuzzed.yaml" in str(exc), f"error does not name the file: {exc}"


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_fuzz_config_loader(name):
    load, seed = LOADERS[name]

    @FUZZ
    @given(data=documents(seed))
    def run(data: bytes) -> None:
        load_cleanly(load, data)

    run()


# --------------------------------------------------------------------------- found by the fuzz

_RUN = """id: fuzzfound
workload: {name: shared_system_prompt, params: {num_requests: 10}}
policies: [lru]
capacities: ["50%"]
"""


@pytest.mark.parametrize(
    "latency",
    [
        "{name: linear, params: {base_ttft_ms: {x: 1}}}",
        "{name: roofline, params: {model: qwen2.5-1.5b, gpu: null}}",
        "{name: roofline, params: {model: [], gpu: A40}}",
    ],
)
def test_wrong_latency_param_types_are_a_config_error(tmp_path, latency):
    path = tmp_path / "c.yaml"
    path.write_text(_RUN + f"latency: {latency}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml"):
        load_config(path)


def test_repurpose_non_mapping_workload_under_quick_is_a_config_error(tmp_path):
    from skv.experiments.repurpose.study import load_config as load_repurpose

    path = tmp_path / "r.yaml"
    path.write_text("workload: 1.5\n")
    with pytest.raises(ConfigError, match=r"r\.yaml"):
        load_repurpose(path, quick=True)
