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
the policy registry that builds them. A failure lists each cycle's modules and the ``file:line``
of every import that makes it. ``ALLOWED`` lists the known exceptions with the reason each.

What counts as an import (:func:`import_edges`):

- every ``import`` statement anywhere in a module: module level, inside functions and methods
  (a lazy import still runs, just later), and under ``if TYPE_CHECKING:`` too (such a block
  never runs, but a type is a dependency all the same, so it is not exempt);
- ``"skv.module:Name"`` strings, which registries import by name (``importlib``);
- ``import a.b.c`` is an edge to ``a.b.c``; relative imports are resolved first;
- ``from X import Y`` is an edge to ``X`` and, when ``X.Y`` is a module, to ``X.Y`` as well:
  the statement runs ``X`` and reads ``Y`` from its namespace, so a module inside package ``P``
  that writes ``from P import sub`` depends on ``P/__init__.py`` (the package facade), and
  ``P/__init__.py`` re-exporting that module closes a cycle. Inside a package, name the
  submodule itself: ``from P.sub import name`` or ``import P.sub as sub``;
- the implicit import of a parent package is not an edge: Python imports ``skv.vllm`` before
  ``skv.vllm.server`` whenever anything imports the latter, for every submodule alike, so that
  edge would make every package whose ``__init__`` imports its own submodules a cycle. Only a
  module that names its parent (``from skv.vllm import ...``, ``import skv.vllm``) depends on it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping
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
    "skv.tiers": 1,
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


def import_edges(root: Path) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> the ``file:line`` of each import that makes the edge, for every
    skv module under ``root`` (self-imports left out; the rules are in the module docstring)."""
    files = module_files(root)
    edges: dict[tuple[str, str], list[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: set[str | None] = set()
            if isinstance(node, ast.Import):
                targets.update(_owner(a.name, files) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets.add(_owner(source, files))  # ``from X import Y`` runs and reads X
                for a in node.names:  # ``from pkg import submodule`` imports the submodule too
                    full = f"{source}.{a.name}"
                    if full in files:
                        targets.add(full)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                m = _BY_NAME.fullmatch(node.value)
                if m:
                    targets.add(_owner(m.group(1), files))
            for t in targets:
                if t and (t == "skv" or t.startswith("skv.")) and t != mod:
                    edges.setdefault((mod, t), []).append(f"{where}:{node.lineno}")
    return edges


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the skv modules it imports anywhere in its body (itself left out)."""
    graph: dict[str, set[str]] = {m: set() for m in module_files(root)}
    for m, t in import_edges(root):
        graph[m].add(t)
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
def edges() -> dict[tuple[str, str], list[str]]:
    return import_edges(ROOT)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def explain_cycles(
    found: list[list[str]],
    edges: Mapping[tuple[str, str], list[str]],
    node_of: Callable[[str], str] = lambda m: m,
) -> str:
    """Each cycle's nodes, then every import edge inside it with its ``file:line``s."""
    lines = []
    for comp in found:
        lines.append("cycle: " + " <-> ".join(comp))
        members = set(comp)
        for (m, t), where in sorted(edges.items()):
            a, b = node_of(m), node_of(t)
            if a != b and a in members and b in members and (m, t) not in ALLOWED:
                lines.append(f"  {m} -> {t}  ({', '.join(where)})")
    return "\n".join(lines)


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


def test_no_import_cycle_between_modules(graph, edges):
    """Zero cycles, counting every import anywhere in a module (lazy, function-level ones and
    ``TYPE_CHECKING`` ones included) with the rules of the module docstring."""
    found = cycles(_checked(graph))
    assert not found, "import cycles between modules:\n" + explain_cycles(found, edges)


def test_no_import_cycle_between_packages(graph, edges):
    packages: dict[str, set[str]] = {}
    for m, ts in _checked(graph).items():
        packages.setdefault(package_of(m), set()).update(
            package_of(t) for t in ts if package_of(t) != package_of(m)
        )
    found = cycles(packages)
    assert not found, "import cycles between packages:\n" + explain_cycles(found, edges, package_of)


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
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from skv.sub.b import REG\n"
    )
    g = import_graph(tmp_path)
    assert g["skv.sub"] == {"skv.sub.a"}
    assert g["skv.sub.a"] == {"skv.low"}
    assert g["skv.sub.b"] == {"skv.sub.a", "skv.low"}
    assert g["skv.sub.c"] == {"skv.sub.b"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_from_package_import_submodule_depends_on_the_package(tmp_path):
    """``from P import sub`` inside P reads P's facade, which imports the module back: a cycle,
    even when the import is lazy (in a function); ``import P.sub as sub`` and ``from P.sub import
    x`` name only the submodule (the implicit parent import is no edge)."""
    pkg = tmp_path / "skv" / "p"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from skv.p.server import Server\n")
    (pkg / "tool.py").write_text("X = 1\n")
    (pkg / "server.py").write_text(
        "class Server:\n    def build(self):\n        from skv.p import tool\n"
        "        return tool.X\n"
    )
    (pkg / "direct.py").write_text("import skv.p.tool as tool\nfrom skv.p.tool import X\n")
    edges = import_edges(tmp_path)
    assert edges[("skv.p.server", "skv.p")] == ["skv/p/server.py:3"]
    assert edges[("skv.p.server", "skv.p.tool")] == ["skv/p/server.py:3"]
    assert ("skv.p.direct", "skv.p") not in edges
    assert edges[("skv.p.direct", "skv.p.tool")] == ["skv/p/direct.py:1", "skv/p/direct.py:2"]
    found = cycles(import_graph(tmp_path))
    assert found == [["skv.p", "skv.p.server"]]
    text = explain_cycles(found, edges)
    assert "cycle: skv.p <-> skv.p.server" in text
    assert "skv.p -> skv.p.server  (skv/p/__init__.py:1)" in text
    assert "skv.p.server -> skv.p  (skv/p/server.py:3)" in text


#: modules besides the ``cli`` ones that parse command lines, and why
ARGPARSE_OUTSIDE_CLI = {
    "skv/artifact/pipeline.py": "python -m skv.artifact.pipeline, the entry reproduce.sh calls",
    "skv/artifact/timings.py": (
        "python -m skv.artifact.timings mark: shell scripts call it with any Python, no venv"
    ),
    "skv/vllm/smollm2.py": "a script run by the engine venv's python, not imported by skv",
    "skv/vllm/tiny_model.py": "a script run by the engine venv's python, not imported by skv",
    "skv/vllm/loadgen.py": "a script run by the engine venv's python (skv.vllm.engine_load)",
    "skv/experiments/vllm_eviction/plugin_check.py": (
        "python -m in the engine venv (drives vLLM's own block pool), not imported by skv"
    ),
    "skv/experiments/leaderboard/derive_defaults.py": (
        "python -m, a one-off derivation whose output is a committed record, not a user command"
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
