"""What the decoding strategies drive: a request, as a Protocol.

``select_step`` and ``beam.run_sequences`` run a request that lives in the runtime
above them (``runtime.sequence.Sequence`` implements this; checked in
tests/test_engine_api.py); naming what they use here keeps ``decoding`` from
importing ``runtime``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from mlotspark.options import GenerationOptions
from mlotspark.results import GenerationResult, GenerationStats

__all__ = ["DecodeRequest"]


class DecodeRequest(Protocol):
    """One request's model, prompt, cache and options, and what a strategy fills in."""

    model: Any  # the model's runner: ``__call__(inputs, cache=...)``
    tokenizer: Any  # a TokenizerWrapper: ``eos_token_ids``, ``detokenizer``
    prompt: list[int]  # the request's new tokens; all but the last are in ``cache`` once prefilled
    cache: list  # per-layer caches
    options: GenerationOptions
    cancel: threading.Event  # set: stop at the next token
    stats: GenerationStats  # ``extra`` takes a strategy's notes
    tokens: list[int]  # filled: the reply's tokens
    text: str  # filled: the reply's text
    acceptance: Any  # its ``decoding.acceptance.Acceptance``: EOS ids, stop strings, max_tokens

    def adopt(self, acceptance: Any) -> None: ...  # a fork of ``acceptance`` that ran on becomes the reply's

    def max_new_tokens(self) -> int: ...
    def sampling(self) -> tuple[Any, list]: ...  # the request's (sampler, logits processors), built once
    def finalize(
        self,
        finish: str,
        t_start: float,
        t_first: float | None,
        t_end: float | None = None,
        *,
        decoded: int | None = None,
        decode_s: float | None = None,
        sequences: list | None = None,
        stop_sequence: str | None = None,
    ) -> GenerationResult: ...
