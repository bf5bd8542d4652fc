"""What a sampled token does to its sequence: the one acceptance rule of every path.

A request's own loop (mlx-lm's ``generate_step`` or speculative decoding, in
``runtime/sequence.py``), the batched step (``runtime/batching.py``) and each beam or
returned sample (``decoding/beam.py``, each a fork of the request's acceptance) hand
every token they pick to :meth:`Acceptance.accept`, which decides in this order:

1. the request was cancelled: ``cancelled``, the token is dropped;
2. an end-of-sequence token: ``stop``, not kept in the tokens or the text;
3. otherwise the token is kept and its text fed to the :class:`TextStream`; a stop
   string appearing in the text: ``stop`` (the token stays, the text ends before it);
4. ``max_tokens`` tokens kept: ``length``.

mlx-lm's loops end on EOS and ``max_tokens`` only; the stop strings, cancellation and
the one place that says so are ours.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Collection

from mlotspark.decoding.text_stream import TextStream

__all__ = ["Acceptance"]


@dataclass
class Acceptance:
    """One sequence's tokens, text and finish reason, grown one accepted token at a time.

    Args:
        stream: the sequence's text stream.
        eos: end-of-sequence token ids.
        max_tokens: most tokens to keep.
        cancel: when set, the next token ends the sequence as ``cancelled``.
        tokens: the list kept tokens are appended to (pass the caller's, e.g.
            ``Sequence.tokens``, to fill it in place).

    Attributes:
        finish: None while running, then ``stop``, ``length`` or ``cancelled``.
        ended_on_eos: the ``stop`` came from an EOS token (which a beam's length counts).
    """

    stream: TextStream
    eos: Collection[int]
    max_tokens: int
    cancel: threading.Event | None = None
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    ended_on_eos: bool = False

    @classmethod
    def of(cls, tokenizer: Any, stops: Any = (), **kwargs: Any) -> "Acceptance":
        """An acceptance over ``tokenizer``'s detokenizer and EOS ids (kwargs as the fields)."""
        if "eos" not in kwargs:
            kwargs["eos"] = frozenset(tokenizer.eos_token_ids or ())
        return cls(TextStream.of(tokenizer, stops), **kwargs)

    @property
    def text(self) -> str:
        """The text so far, cut before a stop string."""
        return self.stream.text

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self.stream.stop

    def accept(self, token: int) -> str:
        """Take one sampled token; return the text that may be emitted now.

        Sets ``finish`` when the sequence is done; a finished sequence takes no more.
        """
        if self.finish is not None:
            return ""
        if self.cancel is not None and self.cancel.is_set():
            self.finish = "cancelled"
            return ""
        if token in self.eos:
            self.finish, self.ended_on_eos = "stop", True
            return ""
        self.tokens.append(token)
        piece = self.stream.feed(token)
        if self.stream.stopped:
            self.finish = "stop"
        elif len(self.tokens) >= self.max_tokens:
            self.finish = "length"
        return piece

    def child(self, token: int) -> "Acceptance":
        """A copy that has taken ``token``; this one is left as it was (beam candidates).

        Returns:
            The copy; its ``finish`` says whether ``token`` ended it.
        """
        other = self.fork()
        other.accept(token)
        return other

    def close(self, reason: str | None = None) -> str:
        """End the sequence: flush the held-back text; return the last piece.

        Args:
            reason: overrides ``finish`` (default: ``finish``, else ``length``).
        """
        self.finish = reason or self.finish or "length"
        if self.finish == "cancelled" and not self.tokens:
            return ""
        return self.stream.finish()

    def fork(self) -> "Acceptance":
        """An independent copy (a beam that branches into several children)."""
        return Acceptance(self.stream.fork(), self.eos, self.max_tokens, self.cancel,
                          list(self.tokens), self.finish, self.ended_on_eos)
