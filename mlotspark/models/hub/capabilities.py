"""What a model can do: measured for the catalogue's chat models, read off the template
for any other.

The catalogue's figures come from the conformance matrix (``bench/conformance.py``) run
on the real weights through ``serve`` and the real client SDKs, and ship in
``capabilities.json`` beside this file (``mlotspark bench --suite conformance
--write-capabilities`` writes it). A feature is claimed when every cell it rests on was
``ok``. A model outside the catalogue reports what its chat template offers, marked
unverified; ``mlotspark check MODEL`` measures it.

``mlotspark list``, ``/v1/models``, Ollama's ``/api/show`` and the chat's model picker
all report :func:`capabilities`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

MEASURED_FILE = Path(__file__).with_name("capabilities.json")

#: A feature and the matrix cells it rests on (all ``ok`` to claim it).
FEATURES: dict[str, tuple[str, ...]] = {
    "chat": ("chat", "stream"),
    "stop": ("stop",),
    "json": ("json_schema",),
    "tools": ("tools_required", "tools_named", "tools_result", "anthropic_tools"),
    "tools_auto": ("tools_auto", "tools_streamed", "ollama_tools"),
    "logprobs": ("logprobs",),
    "embeddings": ("embeddings",),
    "memory": ("conversation",),
    "memory_writer": ("memory_writer",),  # the model writes memory better than the simple writer
    "cascade": ("cascade",),
}


@dataclass(frozen=True)
class Capabilities:
    """A model's features (names of ``FEATURES``), whether they were measured
    (``verified``), and the matrix's cells (``cell -> ok | refused | fail``) when they were."""

    features: tuple[str, ...]
    verified: bool
    cells: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``chat, json, tools`` (``…, unverified`` when read off the template)."""
        return ", ".join(self.features) + ("" if self.verified else " (unverified)")

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features), "verified": self.verified}


@lru_cache(maxsize=1)
def measured() -> dict[str, Any]:
    """The shipped measurement: ``{"command", "date", "models": {alias: {cell: status}}}``."""
    try:
        return json.loads(MEASURED_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"models": {}}


def from_cells(cells: dict[str, str]) -> tuple[str, ...]:
    """The features whose cells were all ``ok``."""
    return tuple(f for f, need in FEATURES.items() if all(cells.get(c) == "ok" for c in need))


def capabilities(name: str | None, has_tools: bool = False) -> Capabilities:
    """What model ``name`` (a catalogue alias, else any name) can do.

    Args:
        name: the model's alias or id.
        has_tools: for a model the matrix has not measured: its chat template has a
            tool-call format (``decoding.tools.tool_format``).
    """
    cells = measured().get("models", {}).get(name or "")
    if cells:
        return Capabilities(from_cells(cells), True, dict(cells))
    features = ["chat", "stop", "json", "logprobs", "embeddings", "memory"]
    if has_tools:
        features[3:3] = ["tools", "tools_auto"]
    return Capabilities(tuple(features), False)


__all__ = ["Capabilities", "FEATURES", "MEASURED_FILE", "capabilities", "from_cells", "measured"]
