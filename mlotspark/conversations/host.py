"""What a ``Conversation`` asks of the ``Persistence`` that made it, as a Protocol.

A ``Conversation`` reaches back to its ``Persistence`` (the prefix cache, the
snapshot budget, the semantic store, the writer); naming that contract here keeps
``conversation`` from importing ``persistence``, which imports it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Protocol, TypeVar

from mlotspark.runtime.engine_api import EngineProtocol

T = TypeVar("T")

__all__ = ["ConversationHost"]


class ConversationHost(Protocol):
    """What a ``Conversation`` asks of the ``Persistence`` that made it."""

    engine: EngineProtocol
    config: Any  # persistence.PersistenceConfig
    counters: Counter
    prefix_cache: Any  # memory.prefix_cache.PrefixCache
    n_layers: int
    read_only: bool  # the data directory cannot be written: keep turns in memory only
    writer: Any  # writer.Writer: stores finished turns beside the engine thread

    def run_exclusive(self, fn: Callable[[], T]) -> T: ...
    def model_identity(self) -> tuple[str, str]: ...
    def retrieve(self, text: str) -> list: ...
    def memory_section(self, hits: list, query: str = "") -> str: ...
    def learn(self, user_text: str, conversation: str) -> list[int]: ...
    def note_warm(self, conv: Any) -> None: ...
    def prepare_snapshot(self, conv: Any, cache: list, tokens: list[int]) -> Any: ...
    def write_snapshot(self, conv: Any, pending: Any, tokens: list[int]) -> dict: ...
    def keep_prefix(self, conv: Any, cache: list, tokens: list[int]) -> None: ...
    def save_prefix(self) -> None: ...
    def forget_conversation(self, name: str) -> None: ...
