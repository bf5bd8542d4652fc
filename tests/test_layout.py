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
    "mlotspark.storage": 0, "mlotspark.platform": 0, "mlotspark.steps": 0, "mlotspark.units": 0,
    "mlotspark.models": 1, "mlotspark.caches": 1, "mlotspark.thermal": 1,
    "mlotspark.memory": 2,
    "mlotspark.decoding": 3,
    "mlotspark.runtime": 4, "mlotspark.distributed": 4,
    "mlotspark.conversations": 5,
    "mlotspark.engine": 6, "mlotspark.tools": 6,
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


# -- private names ----------------------------------------------------------------------
# A unit is a top-level room of the package (a LAYERS entry, or ``tui``): its modules may
# share private names among themselves, never with another unit.
_BY_NAME = {"getattr", "hasattr", "setattr", "delattr", "__setattr__"}
#: Private names of third-party objects a unit must reach, each with the reason.
THIRD_PARTY_PRIVATE = {
    "mlotspark.models": {
        "_tokenizer": "mlx-lm's TokenizerWrapper has no public name for its Hugging Face tokenizer",
        "_detokenizer": "mlx-lm's TokenizerWrapper takes a streaming detokenizer of ours only there",
    },
}


def _unit(module: str) -> str:
    if module.startswith("tui"):
        return "tui"
    for prefix in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return module


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own names, whoever defined them."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _by_name(node: ast.Call) -> tuple[ast.expr, str, bool] | None:
    """``getattr(x, "_n")``-like calls, ``object.__setattr__(x, "_n", v)`` and
    ``x.__dict__.get("_n")``: (x, "_n", whether it sets)."""
    f, args = node.func, node.args
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name in _BY_NAME and len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
        return args[0], args[1].value, name in ("setattr", "__setattr__")
    if (name == "get" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute)
            and f.value.attr == "__dict__" and args and isinstance(args[0], ast.Constant)):
        return f.value.value, str(args[0].value), False
    return None


def _defines(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Private names a module defines: (its own: functions, classes, names it binds,
    attributes of ``self``/``cls`` and class-body annotations; markers: names it sets
    on other objects)."""
    own: set[str] = set()
    markers: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            (own if _own(node.value) else markers).add(node.attr)
        elif isinstance(node, ast.Call) and (reach := _by_name(node)) and reach[2]:
            (own if _own(reach[0]) else markers).add(reach[1])
    return {n for n in own if _private(n)}, {n for n in markers if _private(n)}


def _reaches(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, private name, how) of every reach into an object that is not ``self``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            out.append((node.lineno, node.attr, ast.unparse(node)))
        elif isinstance(node, ast.Call) and (reach := _by_name(node)) and _private(reach[1]) and not _own(reach[0]):
            out.append((node.lineno, reach[1], ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGES):
            out += [(node.lineno, a.name, f"from {node.module} import {a.name}") for a in node.names if _private(a.name)]
    return sorted(out)


def _defined_per_unit() -> dict[str, set[str]]:
    """Private names each unit defines; a marker counts for the unit that sets it
    unless another unit defines the name as its own (then setting it is a reach too)."""
    own: dict[str, set[str]] = {}
    markers: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        o, m = _defines(ast.parse(path.read_text(), str(path)))
        own.setdefault(_unit(name), set()).update(o)
        markers.setdefault(_unit(name), set()).update(m)
    out = {}
    for unit in own:
        others = set().union(*(names for u, names in own.items() if u != unit))
        out[unit] = own[unit] | (markers[unit] - others) | set(THIRD_PARTY_PRIVATE.get(unit, ()))
    return out


def test_no_module_reads_another_units_private_names():
    """``obj._name``, ``getattr(obj, "_name")``, ``obj.__dict__.get("_name")`` and
    ``from x import _name`` only for names the reader's own unit defines (dunders are
    public). The check reads no types: a name the unit defines itself counts as its own."""
    defined = _defined_per_unit()
    wrong = []
    for name, path in MODULES.items():
        mine = defined[_unit(name)]
        for line, attr, how in _reaches(ast.parse(path.read_text(), str(path))):
            if attr not in mine:
                owners = sorted(u for u, names in defined.items() if attr in names) or ["a third-party library"]
                wrong.append(f"{name}:{line} {how} (private to {', '.join(owners)})")
    assert not wrong, "\n".join(wrong)


def test_the_private_name_check_sees_each_kind_of_reach():
    tree = ast.parse("import x\nx.engine._persistence\ngetattr(e, '_lock')\ne.__dict__.get('_p')\n"
                     "from mlotspark.models.loader import _convert\nself._mine\nsuper()._also\nx.__len__")
    assert [n for _, n, _ in _reaches(tree)] == ["_persistence", "_lock", "_p", "_convert"]


# -- rooms ------------------------------------------------------------------------------
#: Packages whose ``__init__`` holds code, each with the reason.
INIT_CODE = {
    "mlotspark": "PEP 562: the public names load on first use (``import mlotspark`` stays light)",
    "mlotspark.bench": "PEP 562: ``bench.config`` loads without the suites, which import MLX",
    "mlotspark.bench.suites": "the suite table and ``--suite`` parsing, to move with the bench work on them",
}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if MODULES[n].name == "__init__.py"))
def test_package_inits_hold_no_code(name):
    """An ``__init__.py`` says what its package holds (docstring), imports and lists names
    (``__all__``); code lives in a module named for it."""
    if name in INIT_CODE:
        return
    code = [f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}"
            for node in ast.parse(MODULES[name].read_text()).body
            if not (isinstance(node, (ast.Import, ast.ImportFrom))
                    or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
                    or (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]))]
    assert not code, f"{name}/__init__.py holds code; move it to a module:\n" + "\n".join(code)


def test_long_modules_say_why():
    """A module past 500 lines is usually two concerns (STYLE.md 8): one that stays says why,
    in its first three lines or its docstring."""
    silent = []
    for name, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") <= 500:
            continue
        top = "\n".join(text.splitlines()[:3]) + (ast.get_docstring(ast.parse(text)) or "")
        if "500 lines" not in top:
            silent.append(f"{name}: {text.count(chr(10))} lines")
    assert not silent, "split along a concern, or say why not:\n" + "\n".join(silent)
