"""The public entry point: ``Engine.load(...)``, ``generate``, ``stream``.

An Engine owns one loaded model. Requests are serialised by a lock so callers on
several threads never touch MLX at once.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Sequence

from . import loader, registry
from .device import configure_metal_limits, device_info
from .errors import OptionError
from .generate import Generation, GenerationResult, GenerationStats
from .handle import RequestHandle
from .options import GenerationOptions

Messages = Sequence[dict]


class Engine:
    """A loaded model ready to generate. Create it with ``Engine.load``."""

    def __init__(self, loaded: loader.LoadedModel, defaults: GenerationOptions):
        self.loaded = loaded
        self.defaults = defaults
        self._lock = threading.RLock()
        self._device = device_info()["device"]

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        weights: str = "auto",
        pull: bool = True,
        progress: bool = True,
        **defaults: Any,
    ) -> "Engine":
        """Load a model and return an Engine.

        Args:
            model: alias (default ``smollm2-135m-instruct``), ``.gguf`` path, mlx-lm
                directory or Hugging Face repo id. None = the default model.
            weights: ``auto | quantized | float16 | bfloat16 | float32``.
            pull: fetch the model if it is not stored yet.
            progress: show a progress bar while fetching.
            **defaults: default generation options (``max_tokens``, ``temperature`` ...).

        Raises:
            ModelError: the model cannot be found, fetched or loaded.
            OptionError: a bad option value.
        """
        options = GenerationOptions().merged(**defaults)
        source = registry.resolve(model, pull=pull, progress=progress)
        configure_metal_limits()
        return cls(loader.load(source, weights=weights), options)

    # ------------------------------------------------------------------ public
    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def encode(self, prompt_or_messages: str | Messages, raw: bool = False) -> list[int]:
        """Token ids of a prompt: the chat template applied unless ``raw``."""
        from .tokenizer import encode_chat, encode_raw

        if isinstance(prompt_or_messages, str):
            if raw:
                return encode_raw(self.tokenizer, prompt_or_messages)
            messages: Messages = [{"role": "user", "content": prompt_or_messages}]
        else:
            if raw:
                raise OptionError("raw=True needs a prompt string, not a list of messages")
            messages = list(prompt_or_messages)
            for m in messages:
                if not isinstance(m, dict) or "role" not in m or "content" not in m:
                    raise OptionError(f"invalid message {m!r}: need a dict with 'role' and 'content'")
        return encode_chat(self.tokenizer, list(messages))

    def options(self, **overrides: Any) -> GenerationOptions:
        """The engine's default options with ``overrides`` applied (validated)."""
        return self.defaults.merged(**overrides)

    def new_generation(
        self,
        prompt_ids: list[int],
        options: GenerationOptions,
        *,
        cache: list | None = None,
        cached_tokens: int = 0,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """A Generation over ``prompt_ids`` (not yet run). For conversation and
        scheduler code that manage caches themselves."""
        return Generation(
            self.loaded.model,
            self.tokenizer,
            prompt_ids,
            cache if cache is not None else self.loaded.model.make_cache(),
            options,
            cached_tokens=cached_tokens,
            context_limit=self.loaded.context_length,
            cancel=cancel,
            stats_base={"model": self.model_name, "device": self._device, "weights": self.loaded.weights},
        )

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
        **options: Any,
    ) -> RequestHandle:
        """Submit a request; returns a handle to iterate, wait on or cancel.

        Args:
            prompt_or_messages: prompt string or messages (see ``generate``).
            raw: no chat template.
            priority: lower runs first when requests queue (scheduler).
            prompt_ids: token ids instead of a prompt (those not yet in ``cache``).
            cache: per-layer caches to continue from (conversations, prefix cache).
            cached_tokens: how many tokens ``cache`` already holds.
            on_finish: called with the finished Generation (on the engine's thread).
            **options: generation options.
        """
        opts = self.options(**options)
        if prompt_ids is None:
            if prompt_or_messages is None:
                raise OptionError("submit needs a prompt, messages or prompt_ids")
            prompt_ids = self.encode(prompt_or_messages, raw=raw)
        ids = list(prompt_ids)
        return RequestHandle(
            lambda cancel: self.new_generation(ids, opts, cache=cache, cached_tokens=cached_tokens, cancel=cancel),
            self._lock,
            on_finish,
        )

    def stream(self, prompt_or_messages: str | Messages, raw: bool = False, **options: Any) -> Iterator[str | GenerationStats]:
        """Yield the reply's text pieces as they decode, then its ``GenerationStats``.

        Options as in ``generate``.
        """
        handle = self.submit(prompt_or_messages, raw=raw, **options)
        yield from handle
        yield handle.result().stats

    def generate(self, prompt_or_messages: str | Messages, raw: bool = False, **options: Any) -> GenerationResult:
        """Generate a reply.

        Args:
            prompt_or_messages: a prompt string (chat template applied unless ``raw``)
                or a list of ``{"role", "content"}`` messages.
            raw: send the string as-is, without the chat template.
            **options: ``max_tokens``, ``temperature`` (0 = greedy), ``top_k``,
                ``top_p``, ``min_p``, ``repetition_penalty``, ``seed``, ``stop``.

        Returns:
            GenerationResult with ``.text``, ``.tokens`` and ``.stats``.
        """
        return self.submit(prompt_or_messages, raw=raw, **options).result()

    def info(self) -> dict:
        """Device and model facts (for ``mlotspark info`` and the TUI)."""
        info = device_info()
        info.update(
            model=self.model_name,
            model_path=str(self.loaded.source.path),
            weights=self.loaded.weights,
            weights_mb=round(self.loaded.nbytes() / 1e6, 1),
            context_length=self.loaded.context_length,
        )
        return info
