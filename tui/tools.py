"""Tools in the chat: read an OpenAI tools file, and split a reply into text and calls.

The chat never runs a tool of a tools file: a call the model makes is shown as a block (the
function's name and its arguments as JSON) and the conversation goes on with the user's next
message. (MCP servers' tools, ``--mcp``, are run once the user says so: ``mcp_turns.py``.) The calls are split from the reply's text with the engine's own splitter
(``mlotspark.CallSplitter``, what the server uses), so no ``<tool_call>`` markup is
ever shown, streamed or stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mlotspark import OptionError


@dataclass(frozen=True)
class ToolSpec:
    """Tools given to the chat (``--tools FILE``, ``/tools FILE``).

    Attributes:
        tools: OpenAI tools (``[{"type": "function", "function": {...}}]``).
        choice: ``tool_choice`` (``auto`` unless the file says otherwise).
        source: the file they came from.
    """

    tools: list[dict]
    choice: Any = "auto"
    source: str = ""

    @property
    def names(self) -> list[str]:
        return [str((t.get("function") or {}).get("name")) for t in self.tools]

    def options(self) -> dict[str, Any]:
        """The generation options that give these tools to the model."""
        return {"tools": self.tools, "tool_choice": self.choice}


def load_tools(path: str | Path) -> ToolSpec:
    """Read a tools file: a JSON list of OpenAI tools, or ``{"tools": [...], "tool_choice": ...}``
    (a request body's fields). The tools themselves are checked by the engine's options.

    Raises:
        OptionError: the file cannot be read, is not JSON, has neither shape, or holds a tool or
            a tool_choice the engine refuses (naming the file).
    """
    p = Path(path).expanduser()
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError(f"cannot read tools file {str(path)!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise OptionError(f"tools file {str(path)!r} is not JSON: {e}") from None
    choice: Any = "auto"
    if isinstance(doc, dict) and "tools" in doc:
        choice = doc.get("tool_choice") or "auto"
        doc = doc["tools"]
    if not isinstance(doc, list) or not doc:
        raise OptionError(f"tools file {str(path)!r} holds no tools: give a JSON list of OpenAI tools "
                          '([{"type": "function", "function": {"name": ..., "parameters": {...}}}]) '
                          'or {"tools": [...]}')
    from mlotspark import GenerationOptions

    try:  # the file's own fields, named as the file names them (the chat has no --tool-choice flag)
        GenerationOptions(tools=doc, tool_choice=choice)
    except OptionError as e:
        raise OptionError(f"tools file {str(path)!r}: {e}") from None
    return ToolSpec(doc, choice, str(p))


def tool_support(engine: Any) -> Any:
    """The model's tool-call format from its chat template, or None (no tool support)."""
    from mlotspark import tool_format  # imports MLX: only once an engine is loaded

    return tool_format(getattr(engine, "tokenizer", None))


#: The ``<tool_call>`` format (Qwen2.5, Hermes), for stored replies opened under a model
#: without tool support: their calls still show as blocks, never as markup.
_HERMES_TEMPLATE = "{% if tools %}<tool_call>{% endif %}"


def stored_format(fmt: Any, text: str) -> Any:
    """The format a stored reply is split by: the open model's, else ``<tool_call>``'s when
    the reply holds one."""
    if fmt is not None or "<tool_call>" not in text:
        return fmt
    from mlotspark import tool_format

    return tool_format(SimpleNamespace(chat_template=_HERMES_TEMPLATE))


CUT_SHORT = "*(a tool call was cut short by max_tokens and dropped)*"


class ReplySplitter:
    """Text pieces in; ``(text, calls)`` out, never the call markup.

    Args:
        fmt: the model's tool format (``tool_support``); None passes text through.
        tools: the tool names given this turn: a call must name one. A call opens as the
            engine's parser reads it: the template's tag, a ```` ```json ```` fence or a
            reply that is one bare JSON call (as Qwen2.5-Coder writes under ``auto``).
    """

    def __init__(self, fmt: Any, tools: list[str] | None = None):
        from mlotspark import CallSplitter

        self.splitter = CallSplitter(fmt, tools or None) if fmt is not None else None

    def feed(self, piece: str) -> tuple[str, list]:
        if self.splitter is None:
            return piece, []
        return self.splitter.feed(piece)

    def close(self) -> tuple[str, list]:
        """What is left; a call cut short (``max_tokens``) is dropped and said so."""
        if self.splitter is None:
            return "", []
        text, calls = self.splitter.close()
        if self.splitter.cut_short:
            text += f"\n\n{CUT_SHORT}"
        return text, calls


def split_reply(fmt: Any, text: str, tools: list[str] | None = None) -> tuple[str, list]:
    """A stored reply as the chat shows it: its text without the calls, and the calls
    (``tools``: the tool names in force, for a bare JSON call)."""
    if fmt is None:
        return text, []
    splitter = ReplySplitter(fmt, tools)
    shown, calls = splitter.feed(text)
    rest, more = splitter.close()
    return shown + rest, calls + more


__all__ = ["CUT_SHORT", "ReplySplitter", "ToolSpec", "load_tools", "split_reply", "stored_format", "tool_support"]
