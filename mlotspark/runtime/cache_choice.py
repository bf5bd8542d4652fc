"""Which cache a request gets, and why: the memory cascade or a KV cache of some kind.

Here, not in ``caches``: it chooses between the cascade (``memory``) and a KV kind (``caches``), above both.

The cascade when it is forced on (a ``CascadeConfig``), or under ``auto`` when
prompt + ``max_tokens`` pass the model's context (llama-family models only; shaped by
the engine's ``cascade_settings``, else ``CascadeConfig.for_model`` defaults); else a
KV cache of ``options.cache_kind``, where ``auto`` is decided by
``caches/policy.py`` on the engine thread. ``story`` tells a request which it
got and why (``stats.extra["cache"]``, shown by ``-v``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mlotspark.caches.policy import CacheDecision, kv_budget, request_cache
from mlotspark.memory.cascade import CascadeConfig, check_cascade, is_cascade, make_cascade_cache
from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions

__all__ = ["CacheChoice", "check_cascade_argument", "resolve_cascade"]

log = logging.getLogger(__name__)

# A context so long that no span exceeds it: checks field values before a model is loaded.
VALUES_ONLY_CONTEXT = 1 << 30


class CacheChoice:
    """The cache choice of one engine.

    Args:
        loaded: the ``LoadedModel`` (model, context length, weights).
        cascade: ``"auto"``, a ``CascadeConfig``, a dict of its fields, or None (never).
        settings: under ``"auto"``, the ``CascadeConfig`` fields of the cascade past the
            context (None or empty: ``for_model`` defaults); built and checked here.
        device: where the model runs (part of the ``auto`` probe's key).
        memory_limit: the engine's memory limit now (bytes, or None).
        run: runs MLX work on the engine thread (``engine.scheduler.call``).
    """

    def __init__(self, loaded: Any, cascade: "CascadeConfig | dict | str | None", *, device: str,
                 memory_limit: Callable[[], int | None], run: Callable[..., Any],
                 settings: dict | None = None):
        self.loaded = loaded
        self._cascade = resolve_cascade(loaded, cascade)
        #: The config ``auto`` runs past the context when settings were given, else None
        #: (``for_model`` defaults, made per request: a tiny test model has no defaults).
        self.auto_config: CascadeConfig | None = None
        if settings:
            self.auto_config = CascadeConfig.for_model(loaded.context_length, **settings)
            if loaded.supports_cascade:
                check_cascade(loaded.model, self.auto_config, loaded.name)
            else:  # auto never runs it: said, not raised (a server's flags hold for every model it loads)
                log.warning("%s (%s) does not run the memory cascade: its settings (%s) do not apply; a prompt past its "
                            "%d-token context is refused", loaded.name, loaded.config.get("model_type"),
                            ", ".join(settings), loaded.context_length)
        self.device = device
        self.memory_limit = memory_limit
        self.run = run
        #: The last ``cache_kind="auto"`` decision, None before one.
        self.decision: CacheDecision | None = None

    @property
    def cascade(self) -> "CascadeConfig | str | None":
        """The memory cascade setting: ``"auto"``, a ``CascadeConfig`` (always), or None (never);
        set it as ``Engine.load``'s ``cascade`` (a dict of fields is made a config and checked)."""
        return self._cascade

    @cascade.setter
    def cascade(self, value: "CascadeConfig | dict | str | None") -> None:
        self._cascade = resolve_cascade(self.loaded, value)

    def cascade_for(self, total_tokens: int, options: GenerationOptions) -> CascadeConfig | None:
        """The cascade config a request of ``total_tokens`` prompt tokens (cached ones included)
        and ``options`` (its ``max_tokens`` counts) runs under, or None (a KV cache): a kept
        cascade (a conversation's snapshot) continues with it."""
        cfg = self.cascade
        if cfg == "auto":
            cfg = None
            if total_tokens + options.max_tokens > self.loaded.context_length and self.loaded.supports_cascade:
                cfg = self.auto_config or CascadeConfig.for_model(self.loaded.context_length)
        return cfg  # type: ignore[return-value]

    def kind_for(self, total_tokens: int, options: GenerationOptions) -> str:
        """``"cascade"`` when ``make(total_tokens, options)`` would make the memory cascade, else
        ``"kv"``: what a conversation's kept cache must be to continue it."""
        return "kv" if self.cascade_for(total_tokens, options) is None else "cascade"

    def make(self, total_tokens: int, options: GenerationOptions) -> list:
        """A fresh per-layer cache for a request of about ``total_tokens`` prompt tokens."""
        cfg = self.cascade_for(total_tokens, options)
        if cfg is not None:
            return self.cascade_cache(cfg)
        return self.kv_cache(options, total_tokens)

    def cascade_cache(self, cfg: CascadeConfig) -> list:
        """A fresh cascade cache of ``cfg``; when ``cfg.episodic_budget_mb`` is None its
        episodic tier may keep one request's KV budget in memory, less a headroom from a
        fixed pool (``memory.cascade.blocks.episodic_budget_bytes``)."""
        return make_cascade_cache(self.loaded.model, cfg, weights_bytes=self.loaded.nbytes(),
                                  memory_limit=self.memory_limit(), attention=self.loaded.runner.attention)

    def kv_cache(self, options: GenerationOptions, total_tokens: int) -> list:
        """A KV cache of ``options.cache_kind``; ``auto`` decided on the engine thread."""
        budget = kv_budget(self.memory_limit(), self.loaded.nbytes())
        cache, decision = request_cache(self.loaded, options, total_tokens, device=self.device,
                                        budget_bytes=budget, run=self.run)
        if decision is not None:
            self.decision = decision
        return cache

    def story(self, cache: list, options: GenerationOptions, total_tokens: int, given: bool) -> dict:
        """Which cache a request got and why (``stats.extra["cache"]``, told by ``-v``)."""
        if is_cascade(cache):
            if isinstance(self.cascade, CascadeConfig):
                return {"kind": "cascade", "why": "the memory cascade was asked for"}
            return {"kind": "cascade", "why": f"prompt + max_tokens ({total_tokens + options.max_tokens}) "
                                              f"pass the context of {self.loaded.context_length}"}
        if given:
            return {"kind": type(cache[0]).__name__, "why": "continued from the caller's cache"}
        if options.cache_kind == "auto":
            decision = self.decision
            return {"kind": decision.kind if decision else "?", "why": f"auto: {decision.reason if decision else ''}"}
        if options.cache_kind:
            return {"kind": options.cache_kind, "why": "asked for"}
        return {"kind": "plain", "why": "default: the model's dtype"}


def resolve_cascade(loaded: Any, cascade: "CascadeConfig | dict | str | None") -> "CascadeConfig | str | None":
    """A cascade argument made concrete for ``loaded``: a dict of overrides becomes
    ``CascadeConfig.for_model`` of the model's own context; a config is checked to fit;
    ``auto`` and None pass through."""
    if isinstance(cascade, dict):
        cascade = CascadeConfig.for_model(loaded.context_length, **cascade)
    if isinstance(cascade, CascadeConfig):
        check_cascade(loaded.model, cascade, loaded.name)
    return cascade


def check_cascade_argument(cascade: Any, settings: Any = None) -> None:
    """Check ``Engine.load``'s ``cascade`` and ``cascade_settings`` before a model loads:
    their types, and the settings' field names and values (their span is checked against
    the model's context once it is loaded).

    Raises:
        OptionError: one line naming the bad value.
    """
    if not (cascade is None or cascade == "auto" or isinstance(cascade, (CascadeConfig, dict))):
        raise OptionError(f"invalid cascade {cascade!r}: a CascadeConfig, a dict of its fields, 'auto' or None")
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise OptionError(f"invalid cascade_settings {settings!r}: a dict of CascadeConfig fields, or None")
    if settings and cascade != "auto":
        raise OptionError(f"cascade_settings {settings!r} shape cascade='auto' only, not cascade={cascade!r}: "
                          "to force the cascade on, give its fields as cascade={...}")
    CascadeConfig.for_model(VALUES_ONLY_CONTEXT, **settings)
