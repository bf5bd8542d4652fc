"""Messages that worker threads post back to the app (toolong's habit: dataclass Messages), and
the ``Turn`` a reply's worker thread and the app share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class Turn:
    """A reply streaming in one conversation (fields written by its worker thread)."""

    conversation: str
    started: float
    conv: Any = None  # the Conversation object, once the worker has it
    first_piece: float | None = None
    pieces: int = 0
    sampled_pieces: int = 0
    sampled_at: float = 0.0
    cancel_requested: bool = False
    progress_seen: tuple[Any, float] | None = None  # the latest prefill event, when it was first shown
    reading_tools: bool = False  # MCP tool results prefill before the reply goes on: show that prefill too


@dataclass
class EngineLoaded(Message):
    """The model is loaded and ready."""

    engine: Any
    seconds: float


@dataclass
class EngineFailed(Message):
    """Loading the model failed; ``error`` is the one-line reason."""

    error: str


@dataclass
class ReplyPiece(Message):
    """A piece of the reply streaming in ``conversation``."""

    conversation: str
    text: str


@dataclass
class ReplyThinking(Message):
    """A piece of a reasoning model's thinking in ``conversation`` (shown folded, apart from the reply)."""

    conversation: str
    text: str


@dataclass
class ReplyToolCall(Message):
    """The reply in ``conversation`` made a tool call (a ``ToolCall``); ``runs``: an MCP tool
    given this round, asked about before it runs (else shown, never run), unless the user's
    ``standing`` answer in this conversation (``always`` | ``never``) decides it."""

    conversation: str
    call: Any
    runs: bool = False
    standing: str | None = None


@dataclass
class ReplyToolResult(Message):
    """An MCP tool ran for the reply in ``conversation``; ``outcome`` is its ``ToolOutcome``."""

    conversation: str
    outcome: Any


@dataclass
class ReplyFinished(Message):
    """The reply in ``conversation`` ended; ``stats`` is its GenerationStats."""

    conversation: str
    stats: Any


@dataclass
class ReplyFailed(Message):
    """The turn in ``conversation`` failed; ``error`` is the one-line reason."""

    conversation: str
    error: str


@dataclass
class FiguresReady(Message):
    """Fresh machine / tier figures for the side panel (either may be None)."""

    machine: Any
    tiers: Any


@dataclass
class EngineWarning(Message):
    """A warning mlotspark logged (a snapshot refused, memory not stored ...)."""

    text: str
    error: bool = False


__all__ = [
    "EngineFailed", "EngineLoaded", "EngineWarning", "FiguresReady", "ReplyFailed", "ReplyFinished", "ReplyPiece",
    "ReplyThinking", "ReplyToolCall", "ReplyToolResult", "Turn",
]
