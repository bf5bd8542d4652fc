"""The request's grammar processor, chosen once per request from its options.

``response_format`` -> :class:`~mlotspark.decoding.constrained.JsonConstraint`;
``tools`` -> :class:`~mlotspark.decoding.tools.ToolConstraint`; ``logprobs`` wraps either
(or nothing) in a :class:`~mlotspark.decoding.logprobs.LogprobRecorder`, which records
before the grammar masks the alternatives.
"""

from __future__ import annotations

from typing import Any

from mlotspark.decoding.constrained import JsonConstraint
from mlotspark.decoding.logprobs import LogprobRecorder
from mlotspark.decoding.tools import ToolConstraint


def constraint_for(tokenizer: Any, options: Any, vocab_size: int | None = None) -> Any:
    """The request's processor, or None when its options need none.

    Args:
        tokenizer: the engine's tokenizer.
        options: the request's ``GenerationOptions``.
        vocab_size: the model's logits width (grammar masks are padded to it).

    Raises:
        OptionError: a schema that cannot be compiled, or tools the model's template lacks.
    """
    grammar: Any = None
    if options.tools is not None:
        grammar = ToolConstraint(tokenizer, list(options.tools), options.tool_choice, options.parallel_tool_calls,
                                 vocab_size)
    elif options.response_format is not None:
        grammar = JsonConstraint(tokenizer, options.response_format, vocab_size)
    if options.logprobs is not None:
        return LogprobRecorder(options.logprobs, grammar)
    return grammar


__all__ = ["constraint_for"]
