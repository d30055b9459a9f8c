"""Imports go downward only: the package's layers, checked from the source with ``ast``.

A module may import modules of its own layer and of the layers below, never above. Layers,
lowest first (a module takes the layer of the longest matching entry in ``LAYERS``; a new
top-level module must be added there, the test says so):

=====  ===========  ======================================================================
layer  name         modules
=====  ===========  ======================================================================
0      vocabulary   skv/__init__.py, _build.py, model.py, blocks.py, segmenter.py,
                    tokenize.py, sizing.py, fileio.py, runtime.py
1      simulator    cache/, policies/, traces/, workloads/, latency/, routing/, sim/,
                    replay.py
2      engines      services/ (mock engine, proxy and trace collection, router service,
                    simulation API), vllm/ (the real-engine harness): they run simulator parts
3      studies      experiments/: the shared experiment machinery (config, runner, report,
                    figures, plotstyle, stats, notebook, engine) and one package per study
                    (semantickv, replay, fidelity, routing, saecache, repurpose); studies
                    never import each other
4      top          artifact/ (pipeline, claims check, paper values), cli.py
=====  ===========  ======================================================================

On top of the direction rule: no import cycle between modules (a strongly connected component
of more than one module) and none between packages (``skv.cache``, ``skv.policies``, ... and each
top-level module and each package's ``cli`` module as one node), so e.g. the caches cannot import
the policy registry that builds them. Imports are module-level and function-level ones
(``TYPE_CHECKING`` included: a type is a dependency too), relative ones resolved, plus
``"skv.module:Name"`` strings, which registries import by name (``importlib``). ``ALLOWED``
lists the known exceptions with the reason each.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: module-name prefix -> layer (0 lowest); the longest matching prefix wins
LAYERS: dict[str, int] = {
    # 0 vocabulary: requests, blocks, sizes, leaf utilities
    "skv": 0,  # the package root module only (skv/__init__.py), not its children
    "skv._build": 0,
    "skv.model": 0,
    "skv.blocks": 0,
    "skv.compact_trace": 0,
    "skv.segmenter": 0,
    "skv.tokenize": 0,
    "skv.sizing": 0,
    "skv.fileio": 0,
    "skv.runtime": 0,
    # 1 simulator
    "skv.cache": 1,
    "skv.policies": 1,
    "skv.traces": 1,
    "skv.workloads": 1,
    "skv.latency": 1,
    "skv.routing": 1,
    "skv.sim": 1,
    "skv.replay": 1,
    "skv.mrc": 1,
    # 2 engines
    "skv.services": 2,
    "skv.vllm": 2,
    # 3 studies
    "skv.experiments": 3,
    # 4 top
    "skv.artifact": 4,
    "skv.cli": 4,
}
LAYER_NAMES = ("vocabulary", "simulator", "engines", "studies", "top")

#: (importer, imported) -> why it is still there; ignored by every check below. Keep it short:
#: an entry whose import is gone fails the test, so paid debt leaves the list.
ALLOWED: dict[tuple[str, str], str] = {}

_BY_NAME = re.compile(r"(skv(?:\.\w+)+):\w+")


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root / "skv"``."""
    out = {}
    for path in sorted((root / "skv").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: Iterable[str]) -> str | None:
    """The module that ``name`` (a module, or a name inside one) resolves to."""
    modules = set(modules)
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the skv modules it imports anywhere in its body (itself left out)."""
    files = module_files(root)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_owner(a.name, files) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for a in node.names:  # ``from pkg import submodule`` imports the submodule
                    full = f"{source}.{a.name}"
                    targets.add(full if full in files else _owner(source, files))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                m = _BY_NAME.fullmatch(node.value)
                if m:
                    targets.add(_owner(m.group(1), files))
        graph[mod] = {t for t in targets if t and t.startswith("skv") and t != mod}
    return graph


def layer_of(mod: str) -> int | None:
    if mod == "skv":
        return LAYERS["skv"]
    best = max(
        (p for p in LAYERS if p != "skv" and (mod == p or mod.startswith(p + "."))),
        key=len,
        default=None,
    )
    return None if best is None else LAYERS[best]


def package_of(mod: str) -> str:
    """``skv.cache.radix`` -> ``skv.cache``; a top-level module is its own node, and so is a
    package's ``cli`` module: the domain's entry point sits above the domain (``skv.cli``
    registers it), so ``artifact/cli.py`` may run ``pipeline.py``, which uses ``artifact/``."""
    if mod.endswith(".cli"):
        return mod
    return ".".join(mod.split(".")[:2])


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _checked(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {t for t in ts if (m, t) not in ALLOWED} for m, ts in graph.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_every_module_has_a_layer(graph):
    missing = sorted(m for m in graph if layer_of(m) is None)
    assert not missing, f"add these to LAYERS in tests/test_layers.py: {missing}"


def test_imports_go_downward_only(graph):
    upward = [
        f"{m} ({LAYER_NAMES[layer_of(m)]}) imports {t} ({LAYER_NAMES[layer_of(t)]})"
        for m, ts in sorted(_checked(graph).items())
        for t in sorted(ts)
        if layer_of(t) is not None and layer_of(m) is not None and layer_of(t) > layer_of(m)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules(graph):
    assert cycles(_checked(graph)) == []


def test_no_import_cycle_between_packages(graph):
    packages: dict[str, set[str]] = {}
    for m, ts in _checked(graph).items():
        packages.setdefault(package_of(m), set()).update(
            package_of(t) for t in ts if package_of(t) != package_of(m)
        )
    assert cycles(packages) == []


def study_of(mod: str, studies: Iterable[str]) -> str | None:
    """``skv.experiments.replay.capacity`` -> ``replay`` (None outside the study packages)."""
    parts = mod.split(".")
    if len(parts) >= 3 and parts[:2] == ["skv", "experiments"] and parts[2] in studies:
        return parts[2]
    return None


def test_studies_never_import_each_other(graph):
    """What two studies share lives in skv/experiments/ itself, so a study can be read, run
    and removed on its own."""
    studies = {p.parent.name for p in (ROOT / "skv" / "experiments").glob("*/__init__.py")}
    assert {"semantickv", "replay", "fidelity", "routing"} <= studies
    across = sorted(
        f"{m} imports {t}"
        for m, ts in graph.items()
        for t in ts
        if study_of(m, studies) and study_of(t, studies) not in (None, study_of(m, studies))
    )
    assert not across, "studies import each other:\n" + "\n".join(across)
    shared = {m for m in graph if m.startswith("skv.experiments") and not study_of(m, studies)}
    into = sorted(f"{m} imports {t}" for m in shared for t in graph[m] if study_of(t, studies))
    assert not into, "shared experiment modules import a study:\n" + "\n".join(into)


def test_every_allowed_import_still_exists(graph):
    gone = sorted(edge for edge in ALLOWED if edge[1] not in graph.get(edge[0], ()))
    assert not gone, f"fixed: remove from ALLOWED in tests/test_layers.py: {gone}"


def test_the_parser_sees_function_level_relative_and_by_name_imports(tmp_path):
    pkg = tmp_path / "skv"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from ..low import X\n    return X\n")
    (pkg / "sub" / "b.py").write_text('REG = {"a": "skv.sub.a:f"}\nimport skv.low as low\n')
    g = import_graph(tmp_path)
    assert g["skv.sub"] == {"skv.sub.a"}
    assert g["skv.sub.a"] == {"skv.low"}
    assert g["skv.sub.b"] == {"skv.sub.a", "skv.low"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: modules besides the ``cli`` ones that parse command lines, and why
ARGPARSE_OUTSIDE_CLI = {
    "skv/artifact/pipeline.py": "python -m skv.artifact.pipeline, the entry reproduce.sh calls",
    "skv/vllm/smollm2.py": "a script run by the engine venv's python, not imported by skv",
    "skv/vllm/tiny_model.py": "a script run by the engine venv's python, not imported by skv",
    "skv/vllm/loadgen.py": "a script run by the engine venv's python (skv.vllm.engine_load)",
    "skv/experiments/vllm_eviction/plugin_check.py": (
        "python -m in the engine venv (drives vLLM's own block pool), not imported by skv"
    ),
    "skv/experiments/repurpose/quality_probe.py": (
        "python -m in the engine venv (torch, transformers on SmolLM2), not imported by skv"
    ),
}


def test_command_lines_are_parsed_only_in_cli_modules():
    """Library code takes typed parameters, never an argparse Namespace: a domain's ``cli``
    module turns flags into arguments."""
    found = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "skv").rglob("*.py")
        if p.name != "cli.py" and re.search(r"^\s*import argparse\b", p.read_text(), re.M)
    }
    assert found == set(ARGPARSE_OUTSIDE_CLI), sorted(found ^ set(ARGPARSE_OUTSIDE_CLI))
