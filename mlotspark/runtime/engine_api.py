"""The engine's declared interface: what code above the engine may call on it.

``mlotspark.engine.Engine`` implements ``EngineProtocol``; everything that drives an
engine (conversations and persistence in ``mlotspark.conversations``, the server,
the CLI, the TUI) goes through these names and never through the engine's private
state, and the test fakes of the TUI and the server implement the same Protocol
(``tests/test_engine_api.py`` compares names and signatures).

It sits in the runtime, the lowest layer whose types its signatures name
(``RequestHandle``, ``Generation``); objects of the layers above (a conversation,
the persistence layer) are named by what is called on them (``ConversationProtocol``)
or left ``Any``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

from mlotspark.options import GenerationOptions
from mlotspark.results import GenerationResult, GenerationStats
from mlotspark.runtime.generation import Generation
from mlotspark.runtime.progress import PrefillProgress, ProgressListener
from mlotspark.runtime.request_handle import RequestHandle

__all__ = ["ConversationProtocol", "EngineProtocol", "Messages"]

Messages = Sequence[dict]


@runtime_checkable
class ConversationProtocol(Protocol):
    """A persistent conversation as ``EngineProtocol.conversation(name)`` returns it
    (``mlotspark.conversations.Conversation``)."""

    name: str

    @property
    def messages(self) -> list[dict]: ...
    @property
    def system(self) -> str: ...
    @system.setter
    def system(self, text: str) -> None: ...
    @property
    def title(self) -> str: ...
    @title.setter
    def title(self, text: str) -> None: ...
    @property
    def progress(self) -> Any: ...

    def info(self) -> Any: ...
    def render(self, text: str | None = None) -> list[dict]: ...
    def add(self, role: str, content: str) -> None: ...
    def send(self, text: str, **options: Any) -> GenerationResult: ...
    def stream(self, text: str, **options: Any) -> Iterator[str | GenerationStats]: ...
    def cancel(self) -> None: ...
    def reset(self) -> None: ...
    def delete(self) -> None: ...


@runtime_checkable
class EngineProtocol(Protocol):
    """A loaded model ready to generate (``mlotspark.engine.Engine``); see its docstrings."""

    #: option name -> where its default came from (the model's file, the catalogue, global)
    sampling_sources: dict[str, str]
    defaults: GenerationOptions
    device: str  # where the model runs: ``cpu``, ``gpu`` ...
    cache_decision: Any  # the last ``cache_kind="auto"`` decision, or None

    loaded: Any  # models.loader.LoadedModel: model, tokenizer, fingerprint, weights, context

    # -- the model ----------------------------------------------------------------------
    @property
    def model_name(self) -> str: ...
    @property
    def tokenizer(self) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def rank(self) -> int: ...

    def encode(self, prompt_or_messages: str | Messages, raw: bool = False,
               tools: Sequence[dict] | None = None) -> list[int]: ...
    def options(self, **overrides: Any) -> GenerationOptions: ...
    def info(self) -> dict: ...

    # -- requests -----------------------------------------------------------------------
    def submit(
        self,
        prompt_or_messages: str | Messages | None = None,
        *,
        raw: bool = False,
        priority: int = 0,
        prompt_ids: list[int] | None = None,
        cache: list | None = None,
        cached_tokens: int = 0,
        on_finish: Callable[[Generation], None] | None = None,
        on_progress: ProgressListener | None = None,
        progress: bool = False,
        cache_key: str | None = None,
        cached_ids: list[int] | None = None,
        validated: GenerationOptions | None = None,
        arrived_at: float | None = None,
        **options: Any,
    ) -> RequestHandle: ...
    def stream(self, prompt_or_messages: str | Messages, raw: bool = False, *, progress: bool = False,
               **options: Any) -> Iterator[str | PrefillProgress | GenerationStats]: ...
    def generate(self, prompt_or_messages: str | Messages, raw: bool = False, **options: Any) -> GenerationResult: ...
    def generate_batch(self, prompts: Sequence[str | Messages], raw: bool = False,
                       priority: int = 0, **options: Any) -> list[str]: ...
    def embed(self, texts: Sequence[str]) -> Any: ...

    # -- caches and the engine thread ----------------------------------------------------
    def make_cache(self, total_tokens: int = 0, options: GenerationOptions | None = None) -> list: ...
    def cache_kind_for(self, total_tokens: int, options: GenerationOptions | None = None) -> str: ...
    def cascade_for(self, total_tokens: int, options: GenerationOptions | None = None) -> Any: ...
    def run_on_engine(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...
    def scheduler_status(self) -> dict: ...
    def ranks_status(self) -> list[dict]: ...
    def close(self) -> None: ...

    # -- conversations and memory ---------------------------------------------------------
    @property
    def persistence(self) -> Any: ...  # conversations.Persistence, opened on first use
    @property
    def opened_persistence(self) -> Any: ...  # the same, or None while nothing opened it
    @property
    def memory(self) -> Any: ...  # memory.semantic.SemanticStore

    def conversation(self, name: str, *, system: str | None = None) -> ConversationProtocol: ...
    def conversations(self) -> list: ...
    def remember(self, text: str, **kwargs: Any) -> int: ...
    def forget(self, entry_id: int) -> bool: ...
    def tier_stats(self) -> dict: ...
    def set_budgets(self, **budgets: Any) -> Any: ...
