"""The import graph: no circles, dependencies pointing one way, ``tui`` on the public API.

Every import statement counts, also those inside functions and under
``TYPE_CHECKING``: a circle broken only by moving an import into a function is
still a circle. An import of an enclosing package (``mlotspark.cli.generate`` importing
``mlotspark.cli``) is not an edge: Python initialises parents before their
submodules whatever the code says.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mlotspark

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mlotspark", "tui")

# Lower layers never import higher ones (same layer: either way, but no circle).
LAYERS = {
    "mlotspark.errors": 0, "mlotspark.options": 0, "mlotspark.results": 0,
    "mlotspark.storage": 0, "mlotspark.platform": 0, "mlotspark.steps": 0,
    "mlotspark.models": 1, "mlotspark.thermal": 1,
    "mlotspark.memory": 2,
    "mlotspark.decoding": 3,
    "mlotspark.runtime": 4, "mlotspark.distributed": 4,
    "mlotspark.conversations": 5,
    "mlotspark.engine": 6,
    "mlotspark.bench": 7, "mlotspark.cli": 7, "mlotspark.server": 7, "mlotspark.__main__": 7,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Modules of ours that ``name`` imports (anywhere in the file)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import submodule`` imports the submodule; other names come from pkg.
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # ``import a.b.c`` of a name inside a module
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def test_the_graph_is_read():
    assert "mlotspark.engine" in MODULES and "tui.app" in MODULES
    assert "mlotspark.runtime.generation" in GRAPH["mlotspark.engine"]


def test_no_import_circles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_dependencies_point_down():
    wrong = []
    for module, deps in GRAPH.items():
        mine = _layer(module)
        if mine is None:
            continue
        for dep in deps:
            theirs = _layer(dep)
            if theirs is not None and theirs > mine:
                wrong.append(f"{module} (layer {mine}) imports {dep} (layer {theirs})")
    assert not wrong, "\n".join(wrong)


def test_mlotspark_never_imports_tui():
    offenders = [m for m, deps in GRAPH.items() if m.startswith("mlotspark") and any(d.startswith("tui") for d in deps)
                 and not m.startswith("mlotspark.cli")]
    assert not offenders


def test_tui_uses_only_the_public_api():
    public = set(mlotspark.__all__)
    wrong = []
    for name, path in MODULES.items():
        if not name.startswith("tui"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wrong += [f"{name}: import {a.name}" for a in node.names if a.name.startswith("mlotspark.")]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("mlotspark"):
                if node.module != "mlotspark":
                    wrong.append(f"{name}: from {node.module} import ...")
                else:
                    wrong += [f"{name}: from mlotspark import {a.name}" for a in node.names if a.name not in public]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if MODULES[n].name == "__init__.py"))
def test_every_package_says_what_it_owns(name):
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert doc and len(doc) > 40, f"{name}/__init__.py needs a docstring: what it owns and what it may import"
