"""Log-probabilities of the generated tokens (OpenAI's ``logprobs`` / ``top_logprobs``).

A :class:`LogprobRecorder` is a logits processor (mlx-lm's ``(tokens, logits) -> logits``)
placed last but one, before the grammar mask: at each step it keeps the step's
log-softmax; at the next step the history tells which token was sampled, and the
token's log-probability and the ``top`` most likely alternatives are recorded. The last
token is recorded by :meth:`LogprobRecorder.finish`. The figures are the model's
distribution after the repetition penalty, before temperature and the grammar mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx
import numpy as np


@dataclass
class TokenLogprob:
    """One generated token: its id, log-probability and the ``top`` alternatives (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class LogprobRecorder:
    """Records generated tokens' log-probabilities, then applies ``inner`` (a grammar, or None).

    Args:
        top: alternatives kept per token (0-20).
        inner: the processor that runs after recording (``JsonConstraint`` / ``ToolConstraint``).
    """

    def __init__(self, top: int, inner: Callable | None = None):
        self.top = top
        self.inner = inner
        self.entries: list[TokenLogprob] = []  # appended on the engine thread, read by others
        self._seen: int | None = None
        self._pending: tuple[np.ndarray, list[tuple[int, float]]] | None = None

    def _record(self, token: int) -> None:
        assert self._pending is not None
        logprobs, top = self._pending
        self.entries.append(TokenLogprob(token, float(logprobs[token]), top))
        self._pending = None

    def __call__(self, tokens: mx.array | None, logits: mx.array) -> mx.array:
        n = 0 if tokens is None else int(tokens.shape[0])
        if self._seen is None:
            self._seen = n  # the first call sees the prompt only
        elif n > self._seen:
            if self._pending is not None:
                self._record(int(tokens[self._seen].item()))  # type: ignore[index]
            self._seen = n
        lp = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32)
        values = np.array(lp[0])
        top: list[tuple[int, float]] = []
        if self.top:
            ids = np.argpartition(-values, self.top - 1)[: self.top]
            ids = ids[np.argsort(-values[ids])]
            top = [(int(i), float(values[i])) for i in ids]
        self._pending = (values, top)
        return self.inner(tokens, logits) if self.inner is not None else logits

    def finish(self, tokens: list[int]) -> list[TokenLogprob]:
        """All entries, the last generated token's included (``tokens``: the reply's ids)."""
        if self._pending is not None and len(self.entries) < len(tokens):
            self._record(int(tokens[len(self.entries)]))
        return self.entries[: len(tokens)]


def recorder_of(processor: Any) -> LogprobRecorder | None:
    """The request's recorder (``Generation.constraint``), or None when logprobs are off."""
    return processor if isinstance(processor, LogprobRecorder) else None


__all__ = ["LogprobRecorder", "TokenLogprob", "recorder_of"]
