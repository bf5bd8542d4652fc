"""Generation options: one validated record, shared by the API, CLI and TUI."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable

from mlotspark.errors import OptionError, literal


SPECULATIVE = (None, "prompt_lookup", "draft")
TEXT_PREVIEW = 40  # characters of a bad text shown in its error
# Counts go to MLX as C ints (a larger top_k or beam count failed deep in MLX with
# std::bad_cast or a TypeError, found by tests/reliability); seeds as uint64.
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**64 - 1
MAX_TOP_LOGPROBS = 20  # as OpenAI


def check_text(value: object, what: str = "prompt") -> str:
    """Return ``value`` if it is text the tokenizer and the stores can take.

    NUL bytes and any length pass (a too-long prompt is the model's to refuse);
    a lone surrogate (``"\\udcff"``, from a mis-decoded file name or a broken
    pipe) cannot be encoded as UTF-8 and is refused here rather than deep inside
    the tokenizer or a file write.

    Args:
        value: the text.
        what: what it is, for the message (``prompt``, ``message``, ``system prompt``).

    Returns:
        ``value`` unchanged.

    Raises:
        OptionError: not a string, or not valid Unicode (the position is named).
    """
    if not isinstance(value, str):
        raise OptionError(f"invalid {what} {_preview(value)}: use a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise OptionError(
            f"invalid {what} {_preview(value)}: character {value[e.start]!r} at position {e.start} "
            "is a lone surrogate, not valid Unicode"
        ) from None
    return value


def check_int(name: str, value: Any, lo: int) -> int:
    """Return ``value`` if it is an integer (not a bool) of at least ``lo``.

    Raises:
        OptionError: naming ``name`` and the bad value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise OptionError(f"{name} must be an integer ≥ {lo}, got {value!r}")
    return value


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= TEXT_PREVIEW else f"{text[:TEXT_PREVIEW]}...' ({len(value) if isinstance(value, str) else '?'} characters)"

CACHE_KINDS = (None, "float16", "q8", "q4", "auto")
# What beam search does not use: it keeps the most likely beams, it never samples.
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")
FORMAT_TYPES = ("text", "json_object", "json_schema")  # response_format types (OpenAI's)
REASONING_EFFORTS = (None, "none", "minimal", "low", "medium", "high")  # decoding/reasoning.EFFORT_BUDGETS


@dataclass(frozen=True)
class GenerationOptions:
    """What to generate and how to sample it. Names match the CLI flags.

    Args:
        max_tokens: upper bound on generated tokens (default 512).
        temperature: 0 = greedy (default 0.7).
        top_k: keep the k most likely tokens; 0 = off.
        top_p: nucleus sampling, in (0, 1]; 1 = off (default 0.95).
        min_p: drop tokens below min_p x the top token's probability; 0 = off.
        repetition_penalty: > 0; 1 = off. Applied over the last 64 tokens.
        seed: random seed for sampling; None = not reseeded.
        stop: extra stop strings (the reply ends before them).
        prefill_chunk: prompt tokens processed per forward pass.
        num_beams: beam search width; 1 = off.
        length_penalty: beam score = logprob / length ** length_penalty.
        num_return_sequences: replies to return (beams or independent samples).
        speculative: None, "prompt_lookup" or "draft" (needs ``draft_model``).
        draft_model: the draft model for ``speculative="draft"`` (same vocabulary).
        cache_kind: KV cache of the working memory: float16 | q8 | q4 | auto; None = the model's dtype.
        response_format: constrain the reply to JSON, as OpenAI's field: ``{"type": "json_object"}``
            or ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``;
            None or ``{"type": "text"}`` = free text (``decoding/constrained.py``).
        tools: functions the model may call, as OpenAI's field (``[{"type": "function", "function":
            {"name", "description", "parameters"}}]``); the calls come back in
            ``GenerationResult.tool_calls``, their arguments valid for ``parameters`` (``decoding/tools.py``).
        tool_choice: ``auto`` (default with tools), ``none``, ``required``, or
            ``{"type": "function", "function": {"name": ...}}`` to force one function.
        parallel_tool_calls: allow several calls in one reply (default True).
        logprobs: record each generated token's log-probability and this many most likely
            alternatives (0-20); None = off (``decoding/logprobs.py``).
        reasoning_budget: a reasoning model's thinking tokens before its close tag is forced
            (0: closed as soon as it opens); None = unbounded (``decoding/reasoning.py``).
        reasoning_effort: the budget by name: ``none`` | ``minimal`` (0), ``low`` (512),
            ``medium`` (2048), ``high`` (unbounded); ``reasoning_budget`` wins when both are set.
        think: False turns a reasoning model's thinking off (the template's ``enable_thinking``
            switch where it has one, else a budget of 0; a block the prompt opened is closed
            there: ``decoding/reasoning.close_open_block``); None/True = as the model does.
    """

    max_tokens: int = 512
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 0.95
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    prefill_chunk: int = 2048  # as mlx-lm's prefill_step_size; the cascade splits further itself
    num_beams: int = 1
    length_penalty: float = 1.0
    num_return_sequences: int = 1
    speculative: str | None = None
    draft_model: str | None = None
    cache_kind: str | None = None
    response_format: dict | None = None
    tools: tuple | list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    logprobs: int | None = None
    reasoning_budget: int | None = None
    reasoning_effort: str | None = None
    think: bool | None = None

    def __post_init__(self) -> None:
        given: dict[str, Any] = {}  # values as the caller wrote them, for messages

        def bad(name: str, why: str) -> OptionError:
            return OptionError.about(f"invalid {{0}} {literal(given.get(name, getattr(self, name)))}: {why}", name)

        def number(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
            # As a float: MLX cannot take a Python int past 64 bits (std::bad_cast).
            given[name] = v
            object.__setattr__(self, name, float(v))
            return float(v)

        def count(name: str, low: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_COUNT:
                raise bad(name, f"must be an integer from {low} to {MAX_COUNT}")

        count("max_tokens", 1)
        if number("temperature") < 0:
            raise bad("temperature", "must be >= 0 (0 = greedy)")
        count("top_k", 0)  # 0 = off
        if not 0 < number("top_p") <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if not 0 <= number("min_p") < 1:
            raise bad("min_p", "must be in [0, 1)")
        if number("repetition_penalty") <= 0:
            raise bad("repetition_penalty", "must be > 0 (1 = off)")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED):
            raise bad("seed", f"must be an integer from 0 to {MAX_SEED}")
        if not isinstance(self.stop, (str, list, tuple)) and self.stop is not None:
            raise bad("stop", "use a string or a list of strings")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            raise bad("stop", "stop strings must be non-empty strings")
        for s in stop:
            check_text(s, "stop string")
        object.__setattr__(self, "stop", stop)
        for name in ("prefill_chunk", "num_beams", "num_return_sequences"):
            count(name, 1)
        if not -10.0 <= number("length_penalty") <= 10.0:
            # length ** penalty must stay a float: 1e30 overflowed in beam scoring.
            raise bad("length_penalty", "must be between -10 and 10 (1 = average logprob per token)")
        if self.speculative not in SPECULATIVE:
            raise bad("speculative", f"choose one of {', '.join(str(k) for k in SPECULATIVE)}")
        if self.cache_kind not in CACHE_KINDS:
            raise bad("cache_kind", f"choose one of {', '.join(str(k) for k in CACHE_KINDS)}")
        try:
            rf = validate_response_format(self.response_format)
        except OptionError as e:  # name the option, so each surface can point at its own field
            raise OptionError(str(e), options=("response_format",)) from None
        object.__setattr__(self, "response_format", rf)
        if self.response_format is not None:
            # The grammar mask follows one sequence; beams and drafts branch it.
            for other, on in (("num_beams", self.num_beams > 1), ("num_return_sequences", self.num_return_sequences > 1),
                              ("speculative", bool(self.speculative))):
                if on:
                    raise OptionError.about("{0} conflicts with {1}: the JSON grammar follows one sequence, "
                                            "which beams, several returns and drafts branch", "response_format", other)
        if self.logprobs is not None:
            v = self.logprobs
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS:
                raise bad("logprobs", f"must be an integer from 0 to {MAX_TOP_LOGPROBS} (alternatives per token)")
            for other, on in (("num_beams", self.num_beams > 1), ("num_return_sequences", self.num_return_sequences > 1),
                              ("speculative", bool(self.speculative))):
                if on:
                    raise OptionError.about("{0} conflicts with {1}: log-probabilities are recorded along "
                                            "one sampled sequence", "logprobs", other)
        if self.reasoning_budget is not None:
            count("reasoning_budget", 0)
        if self.reasoning_effort not in REASONING_EFFORTS:
            raise bad("reasoning_effort", f"choose one of {', '.join(str(k) for k in REASONING_EFFORTS)}")
        if self.think is not None and not isinstance(self.think, bool):
            raise bad("think", "must be true or false")
        tools, choice = validate_tools(self.tools, self.tool_choice)
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "tool_choice", choice)
        if not isinstance(self.parallel_tool_calls, bool):
            raise bad("parallel_tool_calls", "must be true or false")
        if tools is not None:
            for other, on in (("response_format", self.response_format is not None), ("num_beams", self.num_beams > 1),
                              ("num_return_sequences", self.num_return_sequences > 1),
                              ("speculative", bool(self.speculative))):
                if on:
                    raise OptionError.about("{0} conflicts with {1}: the tool-call grammar follows one sequence "
                                            "of its own", "tools", other)
        self._check_conflicts()

    def _check_conflicts(self) -> None:
        """Refuse options that cannot all take effect (one would be silently ignored)."""
        if self.speculative == "draft" and not self.draft_model:
            raise OptionError.about("{0} draft needs {1} (the draft model)", "speculative", "draft_model")
        if self.draft_model and self.speculative != "draft":
            raise OptionError.about("{0} needs {1} draft (it would be ignored)", "draft_model", "speculative")
        if self.speculative and self.num_beams > 1:
            raise OptionError.about("{0} conflicts with {1}: beam search runs its own loop, "
                                    "without speculation", "num_beams", "speculative")
        if self.speculative and self.num_return_sequences > 1:
            raise OptionError.about("{0} conflicts with {1}: several returns decode together, "
                                    "without speculation", "num_return_sequences", "speculative")
        budget = "reasoning_budget" if self.reasoning_budget is not None else "reasoning_effort" if self.reasoning_effort else None
        if budget:  # the budget counts the thinking of one sequence, which beams and drafts branch
            for other, on in (("num_beams", self.num_beams > 1), ("num_return_sequences", self.num_return_sequences > 1),
                              ("speculative", bool(self.speculative))):
                if on:
                    raise OptionError.about("{0} conflicts with {1}: the budget counts the thinking of one "
                                            "sequence, which beams, several returns and drafts branch", budget, other)
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise OptionError.about(f"invalid {{0}} {self.num_return_sequences}: at most {{1}} "
                                    f"({self.num_beams}) with beam search", "num_return_sequences", "num_beams")

    def check_given(self, given: "set[str] | frozenset[str]") -> None:
        """Refuse options the caller set that these options would ignore.

        Only options set explicitly count (engine or model defaults never conflict):
        a sampling setting with beam search, a length penalty without beams or
        several returns.

        Args:
            given: names of the options the caller set.

        Raises:
            OptionError: naming both options.
        """
        if self.num_beams > 1:
            for name in SAMPLING:
                if name in given and not (name == "temperature" and self.temperature == 0):
                    raise OptionError.about("{0} conflicts with {1}: beam search keeps the most likely "
                                            "beams and never samples", name, "num_beams")
        if "length_penalty" in given and self.num_beams == 1 and self.num_return_sequences == 1:
            raise OptionError.about("{0} needs {1} or {2} (it ranks several sequences)",
                                    "length_penalty", "num_beams", "num_return_sequences")

    def ignored(self, given: "set[str] | frozenset[str]") -> list[tuple[str, str]]:
        """Options the caller set that take no effect here but harm nothing: greedy
        decoding (temperature 0) never samples, so a seed or a sampling filter is moot.

        Entry points say so once (the CLI as a note); they are not refused, since
        clients such as OpenAI's send ``top_p=1`` with ``temperature=0`` as a matter of course.

        Args:
            given: names of the options the caller set.

        Returns:
            ``(option, why)`` pairs, in ``SAMPLING`` order.
        """
        if self.temperature != 0 or self.num_beams > 1:
            return []  # sampling is on, or beams refused these already
        return [(name, "temperature") for name in SAMPLING if name != "temperature" and name in given]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def merged(self, **overrides: Any) -> "GenerationOptions":
        """A copy with ``overrides`` applied (None values ignored).

        Raises:
            OptionError: an unknown option name, an invalid value, or options that
                conflict (``check_given`` over the ones given here).
        """
        unknown = set(overrides) - set(self.names())
        if unknown:
            raise OptionError(
                f"unknown option {sorted(unknown)[0]!r} (known: {', '.join(self.names())})"
            )
        given = {k: v for k, v in overrides.items() if v is not None}
        out = replace(self, **given)
        out.check_given(set(given))
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass(frozen=True)
class RequestOptions:
    """How one request is run, beside what it generates: ``Engine.submit``'s keywords.

    Declared once here: ``Engine.submit(prompt, **keywords)`` takes these by name and
    hands every other keyword to ``GenerationOptions`` (``split``), so a new request
    option is one field here and the code that reads it.

    Args:
        raw: no chat template on a prompt string.
        priority: lower runs first when requests queue (default 0).
        prompt_ids: token ids instead of a prompt (those not yet in ``cache``).
        cache: per-layer caches to continue from (conversations, the prefix cache).
        cached_tokens: how many tokens ``cache`` already holds.
        on_finish: called with the finished ``Generation`` on the engine thread: keep it to
            MLX work and hand disk or database writes to a thread of your own, as
            conversations do (``conversations/writer.py``): other requests wait meanwhile.
        on_progress: called with each ``PrefillProgress`` of the prompt, in order, the last
            one at ``done == total`` (on the engine thread: keep it quick);
            ``handle.progress`` holds the latest event for callers that poll.
        progress: also yield the ``PrefillProgress`` events when iterating the handle.
        cache_key: the conversation ``cache`` belongs to. Across ranks every other rank keeps
            its share of the cache under this name (and saves it as its own snapshot); a
            single process ignores it.
        cached_ids: the token ids ``cache`` holds (its first ``cached_tokens``). Across ranks a
            rank that lost its share of the conversation (no snapshot, a damaged one)
            rebuilds it from them instead of failing the request.
        validated: options already made by ``engine.defaults.merged`` (not checked again; the
            generation keywords are merged over them).
        arrived_at: when the request arrived (``time.perf_counter``; None = now): its
            ``stats.extra["queue_s"]`` counts from then, so a server's wait on the engine
            thread before submitting (its prompt-cache lookup) is part of the queue.

    Raises:
        OptionError: a priority that is not an integer, an ``arrived_at`` that is not a time.
    """

    raw: bool = False
    priority: int = 0
    prompt_ids: list[int] | None = None
    cache: list | None = None
    cached_tokens: int = 0
    on_finish: Callable[[Any], None] | None = None
    on_progress: Callable[[Any], None] | None = None
    progress: bool = False
    cache_key: str | None = None
    cached_ids: list[int] | None = None
    validated: GenerationOptions | None = None
    arrived_at: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise OptionError(f"invalid priority {self.priority!r}: must be an integer (lower runs first)")
        t = self.arrived_at
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))):
            raise OptionError(f"invalid arrived_at {t!r}: a time.perf_counter() value")

    @classmethod
    def split(cls, keywords: dict[str, Any]) -> tuple["RequestOptions", dict[str, Any]]:
        """``keywords`` parted into these request options and the generation options left.

        Args:
            keywords: what ``Engine.submit`` was called with, prompt aside.

        Returns:
            (``RequestOptions``, the other keywords for ``GenerationOptions``).
        """
        names = REQUEST_FIELDS
        return cls(**{k: v for k, v in keywords.items() if k in names}), {
            k: v for k, v in keywords.items() if k not in names}


REQUEST_FIELDS = frozenset(f.name for f in fields(RequestOptions))


def validate_response_format(value: Any) -> dict | None:
    """Check a ``response_format`` (OpenAI's shape); None and ``text`` mean unconstrained.

    Returns:
        The value, or None when decoding is unconstrained.

    Raises:
        OptionError: a shape that is none of ``FORMAT_TYPES`` (the message names the bad part).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OptionError(f"invalid response_format {value!r}: use an object with a 'type'")
    kind = value.get("type")
    if kind not in FORMAT_TYPES:
        raise OptionError(f"invalid response_format.type {kind!r}: choose one of {', '.join(FORMAT_TYPES)}")
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise OptionError(
                'invalid response_format.json_schema: use {"name": ..., "schema": {...a JSON schema...}}'
            )
    return value


TOOL_CHOICES = ("auto", "none", "required")


def validate_tools(tools: Any, choice: Any) -> tuple[tuple | None, Any]:
    """Check ``tools`` and ``tool_choice`` (OpenAI's shapes).

    Returns:
        ``(tools, choice)``: tools as a tuple of ``{"type": "function", "function": {...}}``
        and the choice, or ``(None, None)`` when no tool may be called (none given, or
        ``tool_choice="none"``).

    Raises:
        OptionError: naming ``tools`` or ``tool_choice``, and the bad part.
    """
    def bad(name: str, why: str) -> OptionError:
        return OptionError.about(f"invalid {{0}}: {why}", name)

    if choice is not None and not (choice in TOOL_CHOICES or isinstance(choice, dict)):
        raise bad("tool_choice", f"{literal(choice)} is none of {', '.join(TOOL_CHOICES)} or "
                                 "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise bad("tools", f"{literal(tools)} is not a list of "
                           "{{\"type\": \"function\", \"function\": {{...}}}}")
    if not tools or choice == "none":
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", f"{literal(choice)} needs tools")
        return None, None
    names = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(f, dict):
            raise bad("tools", f"tools[{i}] is not {{{{\"type\": \"function\", \"function\": {{{{...}}}}}}}}")
        name = f.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise bad("tools", f"tools[{i}].function.name must be a non-empty string of at most 64 characters")
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad("tools", f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(name)
    if len(set(names)) != len(names):
        raise bad("tools", "two tools share a name")
    if isinstance(choice, dict):
        f = choice.get("function")
        name = f.get("name") if isinstance(f, dict) else None
        if name not in names:
            raise bad("tool_choice", f"names no given tool ({literal(name)}; tools: {literal(names)})")
    tools = tuple({"type": "function", "function": t["function"]} for t in tools)
    return tools, choice or "auto"
