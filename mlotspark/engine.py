"""The public entry point: ``Engine.load(...)``, ``generate``, ``stream``.

An Engine owns one loaded model. Requests go to its scheduler (``scheduler.py``):
one engine thread owns MLX, takes requests from a priority queue and decodes them
in continuous batches under the thermal governor. Other MLX work (saving or
restoring caches) goes through ``engine.scheduler.call``.

The Engine is a façade: what is not a request is on a part it hands out —
``engine.caches`` (which cache a request gets, ``runtime/cache_choice.py``),
``engine.persistence`` (conversations, snapshots, budgets and tier stats,
``conversations/persistence.py``), ``engine.memory`` (the semantic store),
``engine.scheduler`` and, across ranks, ``engine.ranks``. Its public names are declared
once, as ``runtime/engine_api.py``'s ``EngineProtocol``.
"""

from __future__ import annotations

from dataclasses import replace
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from mlotspark.models import loader, sampling_defaults
from mlotspark.models.hub import catalogue
from mlotspark.platform.blas import BLAS_IN_USE
from mlotspark.platform.device import configure_metal_limits, device_info
from mlotspark.distributed import DEFAULT_TIMEOUT_S, DistributedSession, check_distributed
from mlotspark.distributed import load as distributed_load
from mlotspark.errors import DistributedError, OptionError, PromptTooLongError
from mlotspark.results import GenerationResult, GenerationStats, ReasoningPiece
from mlotspark.runtime.generation import Generation
from mlotspark.runtime.progress import PrefillProgress
from mlotspark.runtime.request_handle import RequestHandle
from mlotspark.options import GenerationOptions, RequestOptions, check_text
from mlotspark.memory.cascade import CascadeConfig, cascade_stats, is_cascade
from mlotspark.runtime.scheduled import Request
from mlotspark.runtime.scheduler import Scheduler, SchedulerConfig
from mlotspark.runtime.scheduler_config import memory_status

from mlotspark.conversations.conversation import Conversation
from mlotspark.conversations.persistence import Persistence, PersistenceConfig
from mlotspark.memory.semantic import SemanticStore
from mlotspark.models.tokenizer import encode_chat, encode_raw, vocab_size
from mlotspark.decoding.constrained import JsonConstraint
from mlotspark.decoding.processors import constraint_for
from mlotspark.decoding.reasoning import close_open_block
from mlotspark.decoding.tool_calls import with_tool_calls
from mlotspark.runtime.cache_choice import CacheChoice, check_cascade_argument

Messages = Sequence[dict]


class Engine:
    """A loaded model ready to generate. Create it with ``Engine.load``.

    Its public names are ``runtime.engine_api.EngineProtocol``, what code above it calls.
    Public members, counted (at most 15): the methods ``load``, ``submit``, ``generate``,
    ``stream``, ``generate_batch``, ``encode``, ``conversation``,
    ``conversations``, ``status``, ``info``, ``follow``, ``close``, and the properties that
    start or open something, ``scheduler`` and ``memory``. Plain data is not counted: the
    attributes set when it is made (``loaded``, ``defaults``, ``device``,
    ``sampling_sources``, ``scheduling``) with the parts held from then (``caches``,
    ``persistence``, ``ranks``), and the read-only properties that read a fact of them
    (``model_name``, ``tokenizer``, ``vocab_size``, ``rank``).
    """

    #: option name -> where its default came from (``models.sampling_defaults``); set by ``load``.
    sampling_sources: dict[str, str] = {}
    loaded: loader.LoadedModel
    defaults: GenerationOptions
    device: str

    def __init__(self, loaded: loader.LoadedModel, defaults: GenerationOptions,
                 scheduling: SchedulerConfig | None = None,
                 cascade: "CascadeConfig | dict | str | None" = "auto", cascade_settings: dict | None = None,
                 persistence: PersistenceConfig | None = None):
        self.loaded = loaded
        self.defaults = defaults
        self._lock = threading.RLock()  # the engine thread holds it around each step
        #: Where the model runs (``device_info()["device"]``, e.g. ``cpu``, ``gpu``).
        self.device: str = device_info()["device"]
        self.scheduling = scheduling or SchedulerConfig()
        #: Which cache each request gets and why (``runtime/cache_choice.py``): ``make``,
        #: ``cascade_for``, ``kind_for``, ``cascade`` (settable), ``decision``.
        self.caches = CacheChoice(loaded, cascade, device=self.device, run=self._run,
                                  memory_limit=lambda: self.scheduling.memory_limit, settings=cascade_settings)
        #: Conversations, snapshots, the prefix cache and semantic memory; each opened on first use.
        self.persistence = Persistence(self, persistence or PersistenceConfig())
        self._closed = False
        self._scheduler: Scheduler | None = None
        self._scheduler_lock = threading.Lock()  # not _lock: the engine thread holds that
        # Set by ``load(distributed=...)``: rank 0 runs requests with the other ranks.
        self.ranks: DistributedSession | None = None

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        weights: str = "auto",
        pull: bool = True,
        progress: bool = True,
        cascade: "CascadeConfig | dict | str | None" = "auto",
        cascade_settings: dict | None = None,
        mode: str = "auto",
        max_batch: int = 8,
        memory_limit: int | str | None = None,
        governor: Any = None,
        distributed: str | None = None,
        split: str = "memory",
        rank_timeout: float = DEFAULT_TIMEOUT_S,
        memory_writer: str = "auto",
        memory: bool = True,
        **defaults: Any,
    ) -> "Engine":
        """Load a model and return an Engine.

        Args:
            model: alias (default ``smollm2-135m-instruct``), ``.gguf`` path, mlx-lm
                directory or Hugging Face repo id. None = the default model.
            weights: ``auto | quantized | float16 | bfloat16 | float32``.
            pull: fetch the model if it is not stored yet.
            progress: show a progress bar while fetching.
            cascade: the memory cascade. ``"auto"`` (default): plain full attention
                while prompt + max_tokens fit the model's context, the cascade with
                ``CascadeConfig.for_model`` defaults past it. A ``CascadeConfig``:
                always the cascade. A dict (e.g. ``{"window": 512}``): always the
                cascade, ``for_model`` defaults of this model's context with those
                fields. None: never (a too-long prompt is an error).
            cascade_settings: with ``cascade="auto"`` only: the ``CascadeConfig``
                fields of the cascade past the context (e.g. ``{"window": 512}``,
                sized as the dict above); None (default): ``for_model`` defaults.
            mode: thermal governor mode: ``auto`` (balanced on AC, efficiency on
                battery), ``performance``, ``balanced`` or ``efficiency``.
            max_batch: most requests decoded together (default 8).
            memory_limit: keep projected KV + weights under this (bytes or ``"8GB"``);
                new requests queue rather than fail running ones. None = no limit.
            governor: a ready ``ThermalGovernor`` (scripted probes in tests/bench).
            distributed: ``pipeline`` (layers split across ranks) or ``tensor`` (heads
                split) to run on every rank ``mlx.launch`` started; every rank calls
                ``load``, rank 0 takes requests and the others call ``follow()``.
                None (default): this process alone.
            split: pipeline layers per rank: ``memory`` (by free memory) or ``even``.
            rank_timeout: seconds without progress before rank 0 fails a request
                with ``DistributedError`` (a rank died or stalled).
            memory_writer: who writes semantic memory: ``auto`` (default), ``model``, ``simple``.
            memory: read and write semantic memory (default True; one conversation: ``Conversation.memory``).
            **defaults: default generation options (``max_tokens``, ``temperature`` ...).

        Raises:
            ModelError: the model cannot be found, fetched or loaded.
            OptionError: a bad option value.
        """
        GenerationOptions().merged(**defaults)  # a bad option fails before the model loads
        persistence = PersistenceConfig(memory_writer=memory_writer, memory=memory, learn=memory)  # checked now too
        scheduling = SchedulerConfig(mode=mode, max_batch=max_batch, memory_limit=memory_limit,
                                     governor=governor)
        check_cascade_argument(cascade, cascade_settings)
        if distributed is not None:
            check_distributed(distributed, split)
            if distributed == "tensor" and isinstance(cascade, (CascadeConfig, dict)):
                raise OptionError(f"the memory cascade runs across ranks with distributed='pipeline' only, "
                                  f"not {distributed!r}: cascade={cascade!r}")
        source = catalogue.resolve(model, pull=pull, progress=progress)
        if distributed is None:
            loaded = loader.load(source, weights=weights, progress=progress)
        else:
            loaded = distributed_load(source, weights=weights, mode=distributed, split=split)
        # The model's recommended sampling replaces the global defaults; the caller's options still win.
        options, sources = loaded.sampling.effective(defaults)
        if distributed == "tensor":  # heads split across ranks: never the cascade
            cascade, cascade_settings = None, None
        engine = cls(loaded, options, scheduling, cascade, cascade_settings, persistence)
        # Wire the weights and the most KV they can use (not the whole working set); close() restores.
        engine._metal_limits = configure_metal_limits(
            loaded.nbytes(), scheduling.kv_ceiling(loaded.model, loaded.context_length))
        engine.sampling_sources = sources
        if distributed is not None:
            engine.ranks = DistributedSession(loaded.extra["distributed"], loaded.runner, loaded.nbytes(), rank_timeout,
                                              identity=(loaded.fingerprint, loaded.weights, loaded.name),
                                              probes=governor.probes if governor is not None else None)
            # No prefix cache across ranks: the other ranks would not find a hit under its name.
            engine.persistence.config = replace(persistence, prefix_cache_mb=0)
            if engine.ranks.leader is not None:
                engine.scheduler.start()  # rank 0's idle beat from now on: the others sleep, not poll
        return engine

    # ------------------------------------------------------------------ public
    @property
    def model_name(self) -> str:
        """The loaded model's name (its alias or file)."""
        return self.loaded.name

    @property
    def tokenizer(self) -> Any:
        """The loaded model's tokenizer (mlx-lm's ``TokenizerWrapper``)."""
        return self.loaded.tokenizer

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer knows (added tokens included): ids at or past it are invalid."""
        return vocab_size(self.tokenizer)

    def encode(self, prompt_or_messages: str | Messages, raw: bool = False,
               tools: Sequence[dict] | None = None, think: bool | None = None) -> list[int]:
        """Token ids of a prompt: the chat template applied unless ``raw`` (shown ``tools``;
        ``think=False``: the template's switch that turns thinking off, where it has one)."""
        if isinstance(prompt_or_messages, str):
            check_text(prompt_or_messages)
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
                check_text(m["content"], f"{m['role']} message")
        return encode_chat(self.tokenizer, list(messages), tools=tools, think=think)

    def _new_generation(
        self,
        prompt_ids: list[int],
        options: GenerationOptions,
        *,
        cache: list | None = None,
        cached_tokens: int = 0,
        cancel: threading.Event | None = None,
        constraint: JsonConstraint | None = None,
    ) -> Generation:
        """A Generation over ``prompt_ids`` (not yet run), its cache made or adopted: what
        ``submit`` and a follower rank hand the engine thread. ``constraint``: the
        ``response_format``'s compiled grammar, when the caller built it already."""
        total = cached_tokens + len(prompt_ids)
        if not self.loaded.supports_cascade and total >= self.loaded.context_length:
            raise PromptTooLongError(
                f"prompt of {total} tokens does not fit the {self.loaded.context_length}-token context of "
                f"{self.model_name} ({self.loaded.config.get('model_type')}); the memory cascade serves only "
                "llama-family models, so shorten the prompt"
            )
        given = cache is not None
        if cache is None:
            cache = self.caches.make(total, options)
        else:  # restored from a snapshot or a prefix cache: the runner's attention from now on
            self.loaded.runner.adopt(cache)
        cascaded = is_cascade(cache)
        facts = {"blas": BLAS_IN_USE, "cache": self.caches.story(cache, options, total, given)}
        return Generation(
            self.loaded.runner,
            self.tokenizer,
            prompt_ids,
            cache,
            options,
            cached_tokens=cached_tokens,
            context_limit=None if cascaded else self.loaded.context_length,
            cancel=cancel,
            stats_base={"model": self.model_name, "device": self.device, "weights": self.loaded.weights,
                        "extra": {**facts, "weight_formats": dict(self.loaded.extra.get("weight_formats", {}))}},
            extra_stats=cascade_stats if cascaded else None,
            constraint=constraint,
        )

    def submit(self, prompt_or_messages: str | Messages | None = None, **options: Any) -> RequestHandle:
        """Submit a request; returns a handle to iterate, wait on or cancel.

        Args:
            prompt_or_messages: prompt string or messages (see ``generate``); None with ``prompt_ids``.
            **options: request options by name (``options.RequestOptions``, declared there
                alone: ``raw``, ``priority``, ``prompt_ids``, ``on_finish`` ...), and the
                generation options (``GenerationOptions``: ``max_tokens``, ``temperature`` ...).

        Raises:
            OptionError: a bad option value, or neither a prompt nor ``prompt_ids``.
        """
        req, generation = RequestOptions.split(options)
        v = req.validated
        opts = v if v is not None and not generation else (v or self.defaults).merged(**generation)
        # A bad schema fails here, not on the engine thread; the grammar is compiled once per request.
        constraint = constraint_for(self.tokenizer, opts)
        prompt_ids = req.prompt_ids
        if prompt_ids is None:
            if prompt_or_messages is None:
                raise OptionError("submit needs a prompt, messages or prompt_ids")
            prompt_ids = self.encode(prompt_or_messages, raw=req.raw, tools=opts.tools, think=opts.think)
        prompt_ids = close_open_block(self.tokenizer, list(prompt_ids), opts)
        meta: dict = {}
        if self.ranks is not None:  # rank 0 batches; every other rank runs the same steps
            self.ranks.check_request(opts, req.cache, req.cache_key)
            p = self.persistence
            save = req.cache_key is not None and p.config.snapshots and not p.read_only
            meta = {"key": req.cache_key, "save": save,
                    "context": None if req.cached_ids is None else list(req.cached_ids)}
        gen = self._new_generation(list(prompt_ids), opts, cache=req.cache, cached_tokens=req.cached_tokens,
                                  constraint=constraint)
        scheduler = self.scheduler
        handle = RequestHandle(gen, scheduler.wake, on_progress=req.on_progress, progress_events=req.progress)
        scheduler.submit(Request(gen, handle, priority=req.priority, on_finish=req.on_finish,
                                 owns_cache=req.cache is None, meta=meta,
                                 submitted_at=time.perf_counter() if req.arrived_at is None else float(req.arrived_at)))
        return handle

    def stream(self, prompt_or_messages: str | Messages, raw: bool = False, *, progress: bool = False,
               **options: Any) -> Iterator[str | ReasoningPiece | PrefillProgress | GenerationStats]:
        """Yield the reply's text pieces as they decode, then its ``GenerationStats``.

        A reasoning model's thinking comes as ``ReasoningPiece``s, its answer as ``str``:
        joining the ``str`` pieces gives ``result.text``, never the thinking.

        Args:
            prompt_or_messages: a prompt string or messages (see ``generate``).
            raw: no chat template.
            progress: first yield ``PrefillProgress`` events while the prompt
                prefills (``done`` / ``total`` tokens, ``tokens_per_s``, ``eta_s``,
                ``cascade``), in order, the last one at ``done == total``; a long
                prompt then never leaves the caller without news.
            **options: generation options, as in ``generate``.
        """
        handle = self.submit(prompt_or_messages, raw=raw, progress=progress, **options)
        yield from handle
        yield handle.result().stats

    def generate(self, prompt_or_messages: str | Messages, raw: bool = False, **options: Any) -> GenerationResult:
        """Generate a reply.

        Args:
            prompt_or_messages: a prompt string (chat template applied unless ``raw``)
                or a list of ``{"role", "content"}`` messages.
            raw: send the string as-is, without the chat template.
            **options: ``max_tokens``, ``temperature`` (0 = greedy), ``top_k``,
                ``top_p``, ``min_p``, ``repetition_penalty``, ``seed``, ``stop``,
                ``response_format`` (``{"type": "json_object"}`` or ``{"type": "json_schema",
                "json_schema": {"schema": {...}}}``: the reply parses as JSON / validates),
                ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` (OpenAI's: the calls come back in
                ``result.tool_calls``, each valid for its tool's schema), ``reasoning_budget`` /
                ``reasoning_effort`` / ``think`` (a reasoning model's thinking, which comes back
                in ``result.reasoning``, never in ``text``).

        Returns:
            GenerationResult with ``.text``, ``.tokens`` and ``.stats``.
        """
        handle = self.submit(prompt_or_messages, raw=raw, **options)
        return with_tool_calls(handle.result(), self.tokenizer, handle.generation.options)

    def generate_batch(self, prompts: Sequence[str | Messages], raw: bool = False,
                       priority: int = 0, **options: Any) -> list[str]:
        """Generate replies to many prompts through the batcher; texts in prompt order.

        Args:
            prompts: prompt strings or message lists.
            raw: no chat template.
            priority: queue priority of these requests (lower runs first).
            **options: generation options, as in ``generate``.
        """
        handles = [self.submit(p, raw=raw, priority=priority, **options) for p in prompts]
        texts = []
        try:
            for i, h in enumerate(handles):
                texts.append(h.result().text)
                handles[i] = None  # type: ignore[call-overload]  # its KV can go
        finally:
            for h in handles:
                if h is not None and not h.done:
                    h.cancel()
        return texts

    @property
    def scheduler(self) -> Scheduler:
        """The engine's scheduler (started on first use): ``call(fn, *args)`` runs MLX work
        outside a request on the engine thread (saving or restoring a cache; from ``on_finish``,
        already on that thread, at once)."""
        with self._scheduler_lock:
            if self._scheduler is None:
                if self.ranks is not None and self.ranks.leader is None:
                    raise DistributedError(f"rank {self.rank} runs rank 0's steps: call follow(), not submit()")
                self._scheduler = Scheduler(
                    self.loaded.runner,
                    self.scheduling.make_governor(),
                    lock=self._lock,
                    weights_bytes=self.loaded.nbytes(),
                    eos=set(self.tokenizer.eos_token_ids or ()),
                    mirror=None if self.ranks is None else self.ranks.leader,
                )
                if self.ranks is not None:
                    self.ranks.attach(self._scheduler)
            return self._scheduler

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.call(fn, *args, **kwargs)

    def status(self) -> dict:
        """Governor state, batch cap, batch size, queue length and the last reasons.

        Returns:
            ``Scheduler.status()``: ``state``, ``cap``, ``mode``, ``batch_size``,
            ``running``, ``queued``, ``reason``, ``admission``, ``kv_bytes`` ...
            ``memory``: the memory signal and KV budget in force
            (``scheduler_config.memory_status``), as ``info`` says them. Across ranks
            (rank 0): the hottest rank's state, and ``ranks``, every rank's figures, rank 0
            first (``rank``, ``host``, ``layers``, ``weights_mb``, ``rss_mb``,
            ``available_mb``, ``thermal``, ``thermal_reason``, ``last_step_ms``).
        """
        status = self.scheduler.status()
        status["memory"] = memory_status(self.loaded.model, self.loaded.nbytes(), self.scheduling.memory_limit)
        return self.ranks.scheduler_status(status) if self.ranks is not None else status

    def close(self) -> None:
        """Cancel what is queued or running and stop the engine thread (a second close does nothing)."""
        closed, self._closed = self._closed, True
        if not closed:  # saves the prefix cache: needs the engine thread
            self.persistence.close()
        stopped = True
        if self._scheduler is not None:
            # Across ranks, cancelled requests leave every rank first: give that the rank timeout.
            stopped = self._scheduler.close(**({} if self.ranks is None else {"timeout": self.ranks.timeout}))
        if self.ranks is not None and stopped:
            # The stop goes out once the engine thread is done; a thread stuck inside MLX is left alone.
            self.ranks.close()
        limits, self._metal_limits = self.__dict__.get("_metal_limits"), None
        if limits is not None and stopped:
            limits.restore()  # the wired and cache limits found before load

    @property
    def rank(self) -> int:
        """This process's rank: 0 leads (and alone runs without ``distributed``)."""
        return 0 if self.ranks is None else self.ranks.rank

    def follow(self) -> int:
        """On every rank but 0 of a distributed engine: run rank 0's requests until rank 0 closes its engine.

        Returns:
            How many requests this rank ran.

        Raises:
            DistributedError: not a distributed engine, called on rank 0, or rank 0 is gone.
        """
        if self.ranks is None:
            raise DistributedError("follow() is for the ranks of Engine.load(distributed=...)")
        cascade = self.caches.cascade
        return self.ranks.follow(self._follower_generation, cascade if isinstance(cascade, CascadeConfig) else None)

    def _follower_generation(self, ids: list[int], opts: GenerationOptions, cascade: CascadeConfig | None,
                             cache: list | None, cached_tokens: int) -> Generation:
        """A follower rank's Generation: its share of a conversation's cache, else a fresh one
        of the kind rank 0 chose, for this rank's layers."""
        if cache is None:
            if cascade is None:
                cache = self.caches.kv_cache(opts, len(ids))
            else:
                cache = self.caches.cascade_cache(cascade)
        return self._new_generation(ids, opts, cache=cache, cached_tokens=cached_tokens)

    # ------------------------------------------------- persistent memory (persistence.py)
    def conversation(self, name: str, *, system: str | None = None) -> "Conversation":
        """A persistent conversation (``send``, ``stream``, ``messages``, ``system``,
        ``reset``, ``delete``), stored under ``$MLOTSPARK_HOME/conversations/<name>``.

        Raises:
            OptionError: a name that could leave the data directory.
        """
        return self.persistence.conversation(name, system=system)

    def conversations(self) -> list:
        """Stored conversations (``name``, ``title``, ``updated``, ``turns``, ``tokens``), newest first."""
        return self.persistence.conversations()

    @property
    def memory(self) -> "SemanticStore":
        """The semantic memory store, opened on first use: ``remember``, ``forget``, ``search``,
        ``list``, ``embed`` (its encoder's sentence vectors), ``export_json``, ``import_json`` ..."""
        return self.persistence.memory

    def info(self) -> dict:
        """Device and model facts (for ``mlotspark info`` and the TUI)."""
        info = device_info()
        info.update(
            model=self.model_name,
            model_path=str(self.loaded.source.path),
            weights=self.loaded.weights,
            weights_mb=round(self.loaded.nbytes() / 1e6, 1),
            context_length=self.loaded.context_length,
            weight_formats=self.loaded.extra.get("weight_formats", {}),
            sampling={k: {"value": getattr(self.defaults, k),
                          "source": self.sampling_sources.get(k, sampling_defaults.SOURCE_GLOBAL)}
                      for k in sampling_defaults.KEYS},
        )
        if self.ranks is not None:  # rank 0's scheduler batches for every rank
            if self.ranks.leader is not None:
                self.scheduler  # noqa: B018 - started, so the figures are asked for on the engine thread
            info["distributed"] = {"mode": self.ranks.setup.mode, "backend": self.ranks.setup.group.backend,
                                   "ranks": self.ranks.ranks_status()}
            if self.ranks.leader is None:
                return info
        status = self.status()
        info["scheduler"] = {k: v for k, v in status.items() if k != "governor"}
        return info
