"""The public surface and the one-way import rule (mlotspark never imports tui;
tui uses only names that mlotspark exports)."""

from __future__ import annotations

import ast
from pathlib import Path

import mlotspark

ROOT = Path(__file__).resolve().parents[1]


def test_all_names_resolve():
    for name in mlotspark.__all__:
        assert getattr(mlotspark, name) is not None, name
    assert {"Engine", "GenerationOptions", "MlotsparkError", "OptionError"} <= set(mlotspark.__all__)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_engine_package_never_imports_tui():
    for path in (ROOT / "mlotspark").rglob("*.py"):
        if path.parent.name == "cli":
            continue  # the chat command starts the app: the CLI sits above both
        assert not any(n == "tui" or n.startswith("tui.") for n in _imports(path)), path


def test_tui_uses_only_the_public_api():
    allowed = {"mlotspark", "mlotspark.errors"}
    for path in (ROOT / "tui").rglob("*.py"):
        for name in _imports(path):
            if name.startswith("mlotspark"):
                assert name in allowed, f"{path.name} imports {name}"
