"""What the memory tiers need from the layers above them, as Protocols.

Memory sits below the runtime and the engine in the import graph, yet a
conversation turn is submitted to the engine, and a ``Conversation`` reaches back to
the ``Persistence`` that made it. These Protocols name those two contracts, so
``conversations`` and ``persistence`` depend on them instead of on each other or on
``mlotspark.engine``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")

__all__ = ["ConversationHost", "EngineLike", "FinishedGeneration"]


class EngineLike(Protocol):
    """The engine as the memory tiers use it (``mlotspark.engine.Engine`` is one)."""

    loaded: Any  # models.loader.LoadedModel: model, tokenizer, fingerprint, weights
    tokenizer: Any
    model_name: str

    def encode(self, prompt_or_messages: Any, raw: bool = False) -> list[int]: ...
    def options(self, **overrides: Any) -> Any: ...
    def submit(self, prompt_or_messages: Any = None, **kwargs: Any) -> Any: ...
    def make_cache(self, total_tokens: int = 0, options: Any = None) -> list: ...
    def cache_kind_for(self, total_tokens: int, options: Any = None) -> str: ...
    def run_on_engine(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class FinishedGeneration(Protocol):
    """A finished request as ``on_finish`` hands it over (``runtime.generation.Generation``)."""

    result: Any  # results.GenerationResult
    cache: list | None
    fed_tokens: list[int]


class ConversationHost(Protocol):
    """What a ``Conversation`` asks of the ``Persistence`` that made it."""

    engine: EngineLike
    config: Any  # persistence.PersistenceConfig
    counters: Counter
    prefix_cache: Any  # prefix_cache.PrefixCache
    n_layers: int
    read_only: bool  # the data directory cannot be written: keep turns in memory only
    writer: Any  # writer.Writer: stores finished turns beside the engine thread

    def run_exclusive(self, fn: Callable[[], T]) -> T: ...
    def model_identity(self) -> tuple[str, str]: ...
    def retrieve(self, text: str) -> list: ...
    def memory_section(self, hits: list) -> str: ...
    def learn(self, user_text: str, conversation: str) -> list[int]: ...
    def note_warm(self, conv: Any) -> None: ...
    def prepare_snapshot(self, conv: Any, cache: list, tokens: list[int]) -> Any: ...
    def write_snapshot(self, conv: Any, pending: Any, tokens: list[int]) -> dict: ...
    def keep_prefix(self, conv: Any, cache: list, tokens: list[int]) -> None: ...
    def save_prefix(self) -> None: ...
    def forget_conversation(self, name: str) -> None: ...
