"""Structured output: ``response_format`` constrains decoding to JSON (a schema).

The grammar engine is llguidance (Microsoft's, Rust, a ~3 MB wheel with no Python
dependencies, on PyPI for Linux and macOS): it compiles a JSON schema to a grammar
and computes, token by token, the set of vocabulary tokens that keep the output
valid, straight from our Hugging Face ``tokenizers`` vocabulary. We chose it over
outlines (what LM Studio's mlx-engine uses: a regex index built per schema over the
whole vocabulary up front, seconds per new schema) and xgrammar (needs torch).
Its own ``llguidance.mlx`` helper applies the mask with a Metal kernel, so the
mask is applied here with ``mx.where``, which runs on every MLX backend.

A :class:`JsonConstraint` is a logits processor with mlx-lm's signature
``(tokens, logits) -> logits``: it reads the tokens sampled since its last call
from ``tokens`` (the request's history), advances its matcher and masks every
token that would break the grammar; once the JSON is complete only EOS is left.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import mlx.core as mx
import numpy as np

from mlotspark.errors import OptionError
from mlotspark.models.tokenizer import hf_tokenizer
from mlotspark.options import validate_response_format

_LL_TOKENIZERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_LL_LOCK = threading.Lock()


def grammar_for(response_format: dict) -> str:
    """The llguidance grammar of a (validated, constraining) ``response_format``.

    Raises:
        OptionError: a schema llguidance cannot compile.
    """
    import llguidance

    if response_format["type"] == "json_object":
        schema: dict = {"type": "object"}
    else:
        schema = response_format["json_schema"].get("schema") or {"type": "object"}
    try:
        # Compact JSON (no free whitespace): a small model otherwise pads with newlines.
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
    except (ValueError, RuntimeError, TypeError) as e:
        raise OptionError(f"invalid response_format.json_schema.schema: {e}", options=("response_format",)) from None


def ll_tokenizer(tokenizer: Any, vocab_size: int | None = None) -> Any:
    """llguidance's view of an mlx-lm ``TokenizerWrapper`` (built once, ~1 s, then cached).

    Args:
        tokenizer: mlx-lm TokenizerWrapper over a Hugging Face fast tokenizer.
        vocab_size: the model's logits width when it exceeds the tokenizer's.

    Raises:
        OptionError: a tokenizer without a Hugging Face fast backend.
    """
    import llguidance.hf

    hf = hf_tokenizer(tokenizer)
    with _LL_LOCK:
        cached = _LL_TOKENIZERS.get(hf)
        if cached is not None:
            return cached
        eos = sorted(getattr(tokenizer, "eos_token_ids", None) or ())
        try:
            ll = llguidance.hf.from_tokenizer(
                hf, n_vocab=vocab_size, eos_token=eos[-1] if eos else None
            )
        except (ValueError, TypeError) as e:
            raise OptionError(f"response_format needs a Hugging Face fast tokenizer: {e}") from None
        _LL_TOKENIZERS[hf] = ll
        return ll


class JsonConstraint:
    """A logits processor that only lets through tokens keeping the output valid.

    Args:
        tokenizer: the engine's tokenizer (mlx-lm TokenizerWrapper).
        response_format: a validated, constraining ``response_format``.
        vocab_size: the model's logits width (the mask is padded to it).

    Raises:
        OptionError: a schema that cannot be compiled.
    """

    def __init__(self, tokenizer: Any, response_format: dict, vocab_size: int | None = None):
        import llguidance

        ll = ll_tokenizer(tokenizer, vocab_size)
        self.matcher = llguidance.LLMatcher(ll, grammar_for(response_format))
        self.eos = int(ll.eos_token)
        if self.matcher.is_error():
            raise OptionError(f"invalid response_format: {self.matcher.get_error()}", options=("response_format",))
        self._seen: int | None = None  # history length at the last call

    def __call__(self, tokens: mx.array | None, logits: mx.array) -> mx.array:
        """Mask ``logits`` (1, V) to the tokens the grammar allows next."""
        n = 0 if tokens is None else int(tokens.shape[0])
        if self._seen is None:
            self._seen = n  # the first call sees the prompt only
        elif n > self._seen:
            for t in tokens[self._seen :].tolist():  # type: ignore[index]
                self.matcher.consume_token(int(t))
            self._seen = n
        return mask_logits(self.matcher, logits, self.eos)


def mask_logits(matcher: Any, logits: mx.array, eos: int) -> mx.array:
    """``logits`` (1, V) with every token ``matcher`` does not allow next set to -inf.

    Args:
        matcher: an ``llguidance.LLMatcher`` that has consumed the reply so far.
        logits: the step's logits, (1, V).
        eos: the token left open when the matcher is in error (cannot happen with masked
            sampling; the reply then ends cleanly).

    Returns:
        The masked logits, same shape and dtype.
    """
    vocab = logits.shape[-1]
    if matcher.is_error():
        allowed = np.zeros(vocab, dtype=bool)
        allowed[eos] = True
    else:
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:vocab].astype(bool)
        if allowed.shape[0] < vocab:  # the matcher's vocabulary may be narrower than the logits
            allowed = np.pad(allowed, (0, vocab - allowed.shape[0]))
    return mx.where(mx.array(allowed), logits, mx.array(-np.inf, dtype=logits.dtype))


__all__ = ["JsonConstraint", "grammar_for", "ll_tokenizer", "mask_logits", "validate_response_format"]
