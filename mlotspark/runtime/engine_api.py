"""The engine's declared interface: what code above the engine may call on it.

``mlotspark.engine.Engine`` implements ``EngineProtocol``; everything that drives an
engine (conversations and persistence in ``mlotspark.conversations``, the server,
the CLI, the TUI) goes through these names and never through the engine's private
state, and the test fakes of the TUI and the server implement the same Protocol
(``tests/test_engine_api.py`` compares names and signatures).

It sits in the runtime, the lowest layer whose types its signatures name
(``RequestHandle``); objects of the layers above (a conversation,
the persistence layer) are named by what is called on them (``ConversationProtocol``)
or left ``Any``.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

from mlotspark.options import GenerationOptions
from mlotspark.results import GenerationResult, GenerationStats, ReasoningPiece
from mlotspark.runtime.progress import PrefillProgress
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
    def send(self, text: str, *, role: str = "user", **options: Any) -> GenerationResult: ...
    def stream(self, text: str, *, role: str = "user",
               **options: Any) -> Iterator[str | ReasoningPiece | GenerationStats]: ...
    def cancel(self) -> None: ...
    def reset(self) -> None: ...
    def delete(self) -> None: ...


@runtime_checkable
class EngineProtocol(Protocol):
    """A loaded model ready to generate (``mlotspark.engine.Engine``); see its docstrings.

    A façade: what is not a request is on a part it hands out (``caches``, ``persistence``,
    ``memory``, ``scheduler``).
    """

    #: option name -> where its default came from (the model's file, the catalogue, global)
    sampling_sources: dict[str, str]
    defaults: GenerationOptions  # ``defaults.merged(**options)``: a request's options, checked
    device: str  # where the model runs: ``cpu``, ``gpu`` ...
    loaded: Any  # models.loader.LoadedModel: model, tokenizer, fingerprint, weights, context
    caches: Any  # runtime.cache_choice.CacheChoice: make, cascade_for, kind_for, cascade, decision
    persistence: Any  # conversations.Persistence: conversations, stats, set_budgets, opened

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
               tools: Sequence[dict] | None = None, think: bool | None = None) -> list[int]: ...
    def info(self) -> dict: ...

    # -- requests: ``submit``'s keywords are ``options.RequestOptions`` and ``GenerationOptions``
    def submit(self, prompt_or_messages: str | Messages | None = None, **options: Any) -> RequestHandle: ...
    def stream(self, prompt_or_messages: str | Messages, raw: bool = False, *, progress: bool = False,
               **options: Any) -> Iterator[str | ReasoningPiece | PrefillProgress | GenerationStats]: ...
    def generate(self, prompt_or_messages: str | Messages, raw: bool = False, **options: Any) -> GenerationResult: ...
    def generate_batch(self, prompts: Sequence[str | Messages], raw: bool = False,
                       priority: int = 0, **options: Any) -> list[str]: ...

    # -- the engine thread ----------------------------------------------------------------
    @property
    def scheduler(self) -> Any: ...  # runtime.scheduler.Scheduler: ``call(fn, *args)`` on the engine thread
    def status(self) -> dict: ...
    def close(self) -> None: ...

    # -- conversations and memory ---------------------------------------------------------
    @property
    def memory(self) -> Any: ...  # memory.semantic.SemanticStore, opened on first use

    def conversation(self, name: str, *, system: str | None = None) -> ConversationProtocol: ...
    def conversations(self) -> list: ...
