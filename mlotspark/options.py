"""Generation options: one validated record, shared by the API, CLI and TUI."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from mlotspark.errors import OptionError


SPECULATIVE = (None, "prompt_lookup", "draft")
CACHE_KINDS = (None, "float16", "q8", "q4", "auto")
FORMAT_TYPES = ("text", "json_object", "json_schema")  # response_format types (OpenAI's)


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

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> OptionError:
            return OptionError(f"invalid {name} {getattr(self, name)!r}: {why}")

        def number(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
            return v

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        if number("temperature") < 0:
            raise bad("temperature", "must be >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 = off)")
        if not 0 < number("top_p") <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if not 0 <= number("min_p") < 1:
            raise bad("min_p", "must be in [0, 1)")
        if number("repetition_penalty") <= 0:
            raise bad("repetition_penalty", "must be > 0 (1 = off)")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise bad("seed", "must be a non-negative integer")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            raise bad("stop", "stop strings must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1:
            raise bad("prefill_chunk", "must be an integer >= 1")
        for name in ("num_beams", "num_return_sequences"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(name, "must be an integer >= 1")
        number("length_penalty")
        if self.speculative not in SPECULATIVE:
            raise bad("speculative", f"choose one of {', '.join(str(k) for k in SPECULATIVE)}")
        if self.speculative == "draft" and not self.draft_model:
            raise bad("speculative", "'draft' needs draft_model")
        if self.cache_kind not in CACHE_KINDS:
            raise bad("cache_kind", f"choose one of {', '.join(str(k) for k in CACHE_KINDS)}")
        object.__setattr__(self, "response_format", validate_response_format(self.response_format))
        if self.response_format is not None and (self.num_beams > 1 or self.num_return_sequences > 1 or self.speculative):
            # The grammar mask follows one sequence; beams and drafts branch it.
            raise bad("response_format", "cannot be combined with beams, several returned sequences or speculative decoding")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def merged(self, **overrides: Any) -> "GenerationOptions":
        """A copy with ``overrides`` applied (None values ignored).

        Raises:
            OptionError: an unknown option name or an invalid value.
        """
        unknown = set(overrides) - set(self.names())
        if unknown:
            raise OptionError(
                f"unknown option {sorted(unknown)[0]!r} (known: {', '.join(self.names())})"
            )
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


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
