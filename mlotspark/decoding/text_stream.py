"""One sequence's text as it decodes: detokenize, cut at stop strings, hold back.

Every decode path (solo, batched, beam, speculative, and the server, which reads the
request handle's pieces) turns tokens into text through a :class:`TextStream`:

- **detokenize** with the tokenizer's streaming detokenizer (mlx-lm's
  ``StreamingDetokenizer`` interface: ``reset``, ``add_token``, ``finalize``, ``text``;
  ours are exact subclasses of mlx-lm's BPE and SentencePiece ones, see
  ``models/tokenizer.py``), which already holds back a split UTF-8 character;
- **cut** the text where the earliest stop string begins (the stop is never in it);
- **hold back** a tail that might be the start of a stop string, until the next
  token tells (``stops.StopMatcher``).

mlx-lm's ``StopSequences`` matches stop *token-id* sequences (``tokenizer.encode``
of each word); ours must match *text*, because a stop string split at other token
boundaries in context (byte-level BPE, a stop inside a longer token) has other ids.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from mlotspark.decoding.stops import StopMatcher

__all__ = ["TextStream"]


class TextStream:
    """Text of one sequence, fed one token at a time.

    ``feed(token)`` returns the text that may be shown now; ``finish()`` the tail
    (held-back characters, bytes the detokenizer kept). Once a stop string appears,
    ``stopped`` is True, ``text`` ends where it begins and later tokens are ignored.

    Args:
        new_detokenizer: makes a fresh streaming detokenizer (e.g. ``lambda:
            tokenizer.detokenizer``; mlx-lm's wrapper hands out a reset copy per call).
        stops: stop strings (empty: none), or a ``StopMatcher``.

    Attributes:
        text: the text so far, cut before a stop string (held-back tail included).
        emitted: how many characters of ``text`` were handed out.
        stopped: a stop string was found.
        stop: which stop string (None while none was found).
        finished: ``finish`` was called.
    """

    def __init__(self, new_detokenizer: Callable[[], Any], stops: Sequence[str] | StopMatcher = ()):
        self.detokenizer = new_detokenizer()
        self.detokenizer.reset()
        self.matcher = stops if isinstance(stops, StopMatcher) else StopMatcher(stops)
        self.text = ""
        self.emitted = 0
        self.stopped = False
        self.stop: str | None = None
        self.finished = False

    @classmethod
    def of(cls, tokenizer: Any, stops: Sequence[str] = ()) -> "TextStream":
        """A stream over ``tokenizer``'s detokenizer (an mlx-lm ``TokenizerWrapper``);
        with no tokenizer (None) the text stays empty (search over bare token ids)."""
        return cls(_NoText if tokenizer is None else (lambda: tokenizer.detokenizer), stops)

    def _update(self, text: str) -> None:
        hit = self.matcher.find(text) if self.matcher.stops else None
        if hit is not None:
            text, self.stop, self.stopped = text[: hit[0]], hit[1], True
        self.text = text

    def feed(self, token: int) -> str:
        """Add one token; return the text that can be emitted now (may be empty).

        Args:
            token: a generated token id (never an EOS: that ends the sequence first).

        Returns:
            New text past what was emitted, short of any possible stop-string start.
        """
        if self.stopped or self.finished:
            return ""
        self.detokenizer.add_token(token)
        self._update(self.detokenizer.text)
        if self.stopped:
            return ""
        safe = self.matcher.safe_length(self.text)
        if safe <= self.emitted:
            return ""
        piece, self.emitted = self.text[self.emitted : safe], safe
        return piece

    def finish(self) -> str:
        """End the stream: flush what the detokenizer held, cut at a stop; return the tail."""
        if not self.finished:
            self.finished = True
            if not self.stopped:
                self.detokenizer.finalize()  # bytes of a split UTF-8 character
                self._update(self.detokenizer.text)
        piece = self.text[self.emitted :]
        self.emitted = len(self.text)
        return piece

    def fork(self) -> "TextStream":
        """An independent copy at the same point (a beam that branches)."""
        other = copy.copy(self)
        other.detokenizer = _fork_detokenizer(self.detokenizer)
        return other


class _NoText:
    """A detokenizer that makes no text: search code run on bare ids (no tokenizer)."""

    text = ""

    def reset(self) -> None:
        pass

    def add_token(self, token: int) -> None:
        pass

    def finalize(self) -> None:
        pass


def _fork_detokenizer(detokenizer: Any) -> Any:
    """A copy of a streaming detokenizer mid-stream.

    mlx-lm's ``TokenizerWrapper.detokenizer`` hands out ``copy.copy``s of one prototype;
    their per-stream state is strings, bytes and token lists, so copying the lists (the
    shared, read-only token map excepted) makes the copy independent.
    """
    other = copy.copy(detokenizer)
    for name, value in list(vars(other).items()):
        if isinstance(value, list) and name != "tokenmap":
            setattr(other, name, list(value))
    return other
