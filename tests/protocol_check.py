"""``mismatches(impl, Protocol)``: how a class departs from a Protocol it should
implement (a missing name, a method whose parameters differ). Shared by the engine's
own check (test_engine_api.py) and the fakes of the TUI and server tests."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any


def _members(cls: type) -> dict[str, Any]:
    """Public names a class declares: methods, properties, annotated attributes and
    attributes its methods set on ``self``."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        out.update({n: None for n in _set_on_self(klass) if not n.startswith("_")})
        out.update({n: None for n in getattr(klass, "__annotations__", {}) if not n.startswith("_")})
        out.update({n: v for n, v in vars(klass).items() if not n.startswith("_")})
    return out


def _set_on_self(klass: type) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError):
        return set()
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _params(fn: Any) -> list[tuple[str, Any, bool]]:
    """(name, kind, has a default) of each parameter but ``self``."""
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default is not p.empty) for p in list(sig.parameters.values())[1:]]


def mismatches(impl: type, protocol: type, partial: bool = False) -> list[str]:
    """What ``impl`` lacks or declares differently from ``protocol`` ([] when it implements it).

    ``partial``: a fake that stands in for part of it: only what it declares is compared.
    """
    have = _members(impl)
    wrong = []
    for name, member in _members(protocol).items():
        if name not in have:
            if not partial:
                wrong.append(f"{impl.__name__} lacks {name}")
        elif inspect.isfunction(member):
            theirs = have[name]
            if not inspect.isfunction(theirs):
                wrong.append(f"{impl.__name__}.{name} is not a method")
            elif _params(theirs) != _params(member):
                wrong.append(f"{impl.__name__}.{name}{inspect.signature(theirs)} != {inspect.signature(member)}")
    return wrong
