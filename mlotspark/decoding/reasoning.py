"""A reasoning model's thinking, kept apart from its answer.

Models such as DeepSeek-R1's distills and Qwen3 think in a block before they answer:
``<think>\\n...\\n</think>\\n\\n`` then the answer. Which tags a model uses is mlx-lm's
detection (``TokenizerWrapper.think_start`` / ``think_end`` / ``*_tokens``, read from the
vocabulary); a model counts as a reasoning model here only when its chat template also
writes the close tag (the template is what taught the model the block).

- :func:`reasoning_format`: the model's :class:`ReasoningFormat`, or None.
- :func:`starts_thinking`: whether a prompt's last think block is still open (templates
  that open ``<think>\\n`` in the generation prompt), so the reply starts inside it.
- :class:`ReasoningSplitter`: text pieces in, ``(reasoning, answer)`` out, streamed; the
  tags are never shown, and a tag split across pieces is held back as stop strings and
  tool-call openings are (``stops.Holdback``, the one hold-back of all three).
  :func:`split_reasoning` is it run over a whole reply.
- :class:`ReasoningBudget`: a logits processor that forces the close tag once the
  thinking has taken ``reasoning_budget`` tokens (0: at once, thinking off).
- :func:`close_open_block`: a prompt that opened the block gets it closed when the reply
  must not think (``think=False``; a grammar, which must hold the answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx

from mlotspark.decoding.stops import Holdback

__all__ = ["EFFORT_BUDGETS", "ReasoningBudget", "ReasoningFormat", "ReasoningSplitter", "budget_of", "close_open_block",
           "reasoning_format", "splitter_of", "split_reasoning", "starts_thinking", "thinking_switch"]

_WS = " \t\r\n"

#: ``reasoning_effort`` as a budget of thinking tokens (None: unbounded), as OpenAI names efforts.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 0, "low": 512, "medium": 2048, "high": None}


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model writes its thinking.

    Attributes:
        start / end: the tags around the thinking (``<think>`` / ``</think>``).
        start_ids / end_ids: their token ids (one id each when the vocabulary has the tag).
        switch: the chat-template variable that turns thinking off (``enable_thinking``),
            or None when the template has none.
    """

    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    switch: str | None = None


def reasoning_format(tokenizer: Any) -> ReasoningFormat | None:
    """The thinking format of ``tokenizer``'s model, or None (not a reasoning model).

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (its think-tag detection is used) with
            a ``chat_template``.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not getattr(tokenizer, "has_thinking", False):
        return None
    end = tokenizer.think_end
    if not end or end not in template:
        return None
    return ReasoningFormat(tokenizer.think_start, end, tuple(tokenizer.think_start_tokens or ()),
                           tuple(tokenizer.think_end_tokens or ()), thinking_switch(template))


def thinking_switch(template: str) -> str | None:
    """The template variable that turns thinking off, when the template reads one."""
    return "enable_thinking" if "enable_thinking" in template else None


def _rfind(ids: Sequence[int], pattern: Sequence[int]) -> int:
    """Where ``pattern`` last starts in ``ids`` (-1: nowhere)."""
    n = len(pattern)
    if not n:
        return -1
    if n == 1:  # one-token tags (most vocabularies): list.index runs in C
        try:
            return len(ids) - 1 - list(reversed(ids)).index(pattern[0])
        except ValueError:
            return -1
    for i in range(len(ids) - n, -1, -1):
        if ids[i] == pattern[0] and list(ids[i:i + n]) == list(pattern):
            return i
    return -1


def starts_thinking(fmt: ReasoningFormat, prompt_ids: Sequence[int]) -> bool:
    """True when the prompt opened a think block it did not close (the template writes
    ``<think>\\n`` after the assistant's turn opener): the reply starts inside it."""
    start = _rfind(prompt_ids, fmt.start_ids)
    return start >= 0 and start > _rfind(prompt_ids, fmt.end_ids)


class ReasoningSplitter:
    """Text pieces of a reply in; ``(reasoning, answer)`` out, neither holding a tag.

    The thinking is the text between the start and end tags when the reply opens with the
    start tag (after white space), or, when the prompt opened the block (``thinking``),
    the text up to the end tag. White space around the thinking and before the answer is
    dropped. A tag cut between pieces is held back until the next piece tells.

    Args:
        fmt: the model's format.
        thinking: the reply starts inside the think block (:func:`starts_thinking`).

    Attributes:
        reasoning / answer: everything handed out so far.
    """

    def __init__(self, fmt: ReasoningFormat, thinking: bool = False):
        self.fmt = fmt
        self._state = "thinking" if thinking else "start"
        self._buf = ""
        self._lead = True  # no reasoning text handed out yet (its leading white space is dropped)
        self._open = Holdback.literal([fmt.start])
        self._close = Holdback.literal([fmt.end])
        self.reasoning = ""
        self.answer = ""

    @property
    def thinking(self) -> bool:
        """The reply is inside its think block now."""
        return self._state == "thinking"

    def feed(self, piece: str) -> tuple[str, str]:
        """Add a piece; return the ``(reasoning, answer)`` text that may be shown now."""
        self._buf += piece
        return self._run(final=False)

    def close(self) -> tuple[str, str]:
        """The reply ended: return what was held back (a tag cut short is dropped)."""
        return self._run(final=True)

    def split(self, text: str) -> tuple[str, str]:
        """A whole reply's ``(reasoning, answer)``: ``text`` fed, then closed."""
        r1, a1 = self.feed(text)
        r2, a2 = self.close()
        return r1 + r2, a1 + a2

    def _run(self, final: bool) -> tuple[str, str]:
        r: list[str] = []
        a: list[str] = []
        while self._step(r, a, final):
            pass
        out = "".join(r), "".join(a)
        self.reasoning += out[0]
        self.answer += out[1]
        return out

    def _step(self, r: list[str], a: list[str], final: bool) -> bool:
        """One move over the buffer; True while another may follow."""
        buf, start, end = self._buf, self.fmt.start, self.fmt.end
        if self._state == "start":
            s = buf.lstrip(_WS)
            if s.startswith(start):
                self._buf, self._state = s[len(start):], "thinking"
                return True
            if not final and self._open.safe_length(s) == 0:
                return False  # may still open the block (nothing yet, or the tag's start): held
            self._state = "answer"  # the reply does not think: shown as written
            return True
        if self._state == "thinking":
            if self._lead:
                buf = self._buf = buf.lstrip(_WS)
            at = buf.find(end)
            if at >= 0:
                r.append(buf[:at].rstrip(_WS))
                self._buf, self._state = buf[at + len(end):], "lead"
                return True
            if final:  # cut short while thinking: all of it was thinking; a partial tag is dropped
                keep = self._close.safe_length(buf)
                r.append(buf[:keep].rstrip(_WS))
                self._buf = ""
                return False
            keep = len(buf[:self._close.safe_length(buf)].rstrip(_WS))  # trailing space may precede the tag
            if keep:
                r.append(buf[:keep])
                self._buf, self._lead = buf[keep:], False
            return False
        if self._state == "lead":  # white space between the block and the answer
            self._buf = buf.lstrip(_WS)
            if not self._buf:
                return False
            self._state = "answer"
            return True
        if buf:
            a.append(buf)
            self._buf = ""
        return False


def splitter_of(tokenizer: Any, prompt_ids: Sequence[int]) -> ReasoningSplitter | None:
    """The splitter of a reply to ``prompt_ids``, or None when the model does not think."""
    fmt = reasoning_format(tokenizer)
    if fmt is None:
        return None
    return ReasoningSplitter(fmt, starts_thinking(fmt, prompt_ids))


def split_reasoning(fmt: ReasoningFormat, text: str, thinking: bool = False) -> tuple[str, str]:
    """A whole reply's ``(reasoning, answer)``: :class:`ReasoningSplitter` over all of it."""
    return ReasoningSplitter(fmt, thinking).split(text)


def close_open_block(tokenizer: Any, prompt_ids: list[int], options: Any) -> list[int]:
    """``prompt_ids``, with the think block the prompt opened closed (``end`` + a blank line,
    as templates write an empty block) when the reply must not think in it: ``think=False``,
    or a grammar (``response_format``, ``tools``) that must hold the answer, not the thinking.

    Args:
        tokenizer: the engine's tokenizer.
        prompt_ids: the prompt's ids (the ones still to prefill are enough: the tail counts).
        options: the request's ``GenerationOptions``.
    """
    fmt = reasoning_format(tokenizer)
    if fmt is None or not starts_thinking(fmt, prompt_ids):
        return prompt_ids
    if options.think is False or options.response_format is not None or options.tools is not None:
        return prompt_ids + list(tokenizer.encode(fmt.end + "\n\n", add_special_tokens=False))
    return prompt_ids


def budget_of(options: Any, fmt: ReasoningFormat | None) -> int | None:
    """The request's budget of thinking tokens: ``reasoning_budget``, else its
    ``reasoning_effort``'s, else 0 when ``think`` is False and the template has no switch
    (the block is closed as soon as it opens); None: unbounded."""
    if fmt is None:
        return None
    if getattr(options, "reasoning_budget", None) is not None:
        return int(options.reasoning_budget)
    effort = getattr(options, "reasoning_effort", None)
    if effort is not None:
        return EFFORT_BUDGETS[effort]
    if getattr(options, "think", None) is False and fmt.switch is None:
        return 0
    return None


class ReasoningBudget:
    """Logits processor: once the thinking has taken ``budget`` tokens, the end tag's tokens
    are forced, one per step, and the model goes on to its answer.

    The first call sees the prompt (it tells whether the reply starts inside the block);
    each later call reads the reply from the history it is handed, so beams, returned
    samples and speculative verification (histories that branch or roll back) all count
    their own thinking.

    Args:
        fmt: the model's format.
        budget: thinking tokens allowed (0: the block is closed as soon as it opens).
    """

    def __init__(self, fmt: ReasoningFormat, budget: int):
        self.fmt = fmt
        self.budget = budget
        self._prompt: int | None = None  # the prompt's length (known at the first call)
        self._opened = False  # the prompt left the block open
        self.forced = 0  # tokens forced (the end tag, when the budget ran out)

    def _state(self, reply: list[int]) -> tuple[bool, int, int]:
        """``(inside, thinking tokens so far, end-tag tokens already written)`` of a reply."""
        start, end = _rfind(reply, self.fmt.start_ids), _rfind(reply, self.fmt.end_ids)
        if start < 0 and not self._opened or end > start:
            return False, 0, 0
        begin = start + len(self.fmt.start_ids) if start >= 0 else 0
        tag = list(self.fmt.end_ids)
        partial = next((k for k in range(len(tag) - 1, 0, -1) if reply[len(reply) - k:] == tag[:k]), 0)
        return True, len(reply) - begin, partial

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._prompt is None:
            self._prompt = tokens.shape[-1]
            self._opened = starts_thinking(self.fmt, tokens.tolist())
        inside, used, partial = self._state(tokens[self._prompt:].tolist())
        if not inside or used < self.budget:
            return logits
        self.forced += 1
        force = self.fmt.end_ids[partial]  # the end tag's next token
        mask = mx.arange(logits.shape[-1]) == force
        return mx.where(mask, mx.zeros_like(logits), mx.full(logits.shape, -mx.inf, dtype=logits.dtype))
