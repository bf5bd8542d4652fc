"""Tool calls held valid: a grammar of the model's own call format, as a logits processor.

:class:`ToolConstraint` is a logits processor (mlx-lm's ``(tokens, logits) -> logits``)
over llguidance, as ``JsonConstraint`` is for ``response_format``: with ``tool_choice``
``required`` or a named function the whole reply is the grammar of tagged calls; under
``auto`` the model writes freely until a call opens in any form ``tool_calls.find_opening``
knows (the template's tag, a fence, a bare object), and from there the grammar holds it to
a declared tool whose arguments validate. So every emitted call parses and validates.

A tag the vocabulary writes as one token (Qwen2.5's ``<tool_call>``, id 151657) is named by
its id (llguidance's ``<[id]>``): a grammar of the tag's bytes refuses the model's own first
token, and every forced call ended after one token with an empty reply.

Under ``auto`` the reply is read as it grows: a streaming detokenizer turns each step's
new tokens into text and ``tool_calls.OpeningScanner`` searches that text and what may still
become an opening, so a step's work does not grow with the reply (decoding and searching
the whole reply every step made a long reply quadratic). The reply is decoded whole only
when an opening is found (its call text is handed to the grammar) and when a call closes
(``_repeated``).

Formats, finding calls and splitting replies live in ``tool_calls.py``.
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx

from mlotspark.decoding.constrained import ll_tokenizer, mask_logits
from mlotspark.decoding.tool_calls import _WS_ONLY, Opening, OpeningScanner, ToolFormat, parse_calls, require_format
from mlotspark.errors import OptionError

# A call's JSON as chat templates render it (``tojson``: ", " and ": "), so the grammar's
# path is the one the model was trained on; no free space (a weak model pads with it).
_JSON_STRICT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# A call opened under auto in the model's own spacing: some space, bounded.
_JSON_SPACE = {"whitespace_flexible": True, "whitespace_pattern": "[ \\n]{0,4}"}
# The reply's last characters kept to see a call's closing tag (a closer and the space
# after it), and how far before the detokenizer's offset an opening is looked for in the
# decoded reply when the two disagree.
_RECENT = 256


def _functions(tools: list[dict], choice: Any) -> list[dict]:
    funcs = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        funcs = [f for f in funcs if f["name"] == name]
    return funcs


def call_schema(fmt: ToolFormat, tools: list[dict], choice: Any = "auto", strict: bool = True) -> dict:
    """The JSON schema of one call: a given tool's name and arguments valid for it
    (``strict``: spaced as templates render JSON; else any bounded space)."""
    options = []
    for f in _functions(tools, choice):
        params = f.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "properties": {"name": {"const": f["name"]}, fmt.args_key: params},
                        "required": ["name", fmt.args_key], "additionalProperties": False})
    schema: dict = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": _JSON_STRICT if strict else _JSON_SPACE}


def _tag(text: str, token_id: int | None) -> str:
    """A tag in a grammar: by token id when the vocabulary writes it as one token."""
    return f"<[{token_id}]>" if token_id is not None else json.dumps(text)


def call_grammar(fmt: ToolFormat, tools: list[dict], choice: Any = "auto", parallel: bool = True,
                 opened: str | None = None) -> str:
    """An llguidance Lark grammar of the calls.

    A tagged call is held to the template's own layout (tag, newline, JSON spaced as
    ``tojson`` spaces it, newline, tag): the path the model was trained on. A fenced or
    bare call opened under ``auto`` keeps the model's own spacing, bounded.

    Args:
        opened: None for a whole reply of calls (``tool_choice`` required or named);
            else the form already opened under ``auto``: ``tag`` (the opener is written),
            ``fence`` (a ```` ``` ```` fence is open: one call, then the closing fence) or
            ``bare`` (one call, the whole reply).
    """
    strict = opened in (None, "tag") and bool(fmt.opener)
    body = f"%json{json.dumps(call_schema(fmt, tools, choice, strict=strict))}"
    head = f"%llguidance {{}}\nbody: {body}\n"
    if opened == "fence":
        return head + 'start: body WS? "```"\nWS: /[ \\n]{1,2}/\n'
    if not fmt.opener or opened == "bare":
        return head + "start: body\n"
    opener, closer = _tag(fmt.opener, fmt.opener_id), _tag(fmt.closer, fmt.closer_id)
    more = f'more: "" | "\\n" {opener} call more\n' if parallel and fmt.parallel else 'more: ""\n'
    start = 'start: "\\n"? body "\\n" ' + closer + " more\n" if opened == "tag" else f"start: {opener} call more\n"
    return head + start + more + f'call: "\\n" body "\\n" {closer}\n'


def _schema_error(tools: list[dict]) -> str | None:
    """Which tool's parameters schema llguidance refuses, and why, in a line (the combined
    grammar's own error is a dump of the grammar)."""
    import llguidance

    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        schema = fn.get("parameters") or {"type": "object"}
        try:
            why = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
        except (ValueError, RuntimeError, TypeError) as e:
            why = str(e)
        if why:
            return f"tool {i} ({fn.get('name')!r}): its parameters schema: {why.splitlines()[0]}"
    return None


class ToolConstraint:
    """A logits processor keeping tool calls valid (see the module docstring).

    Args:
        tokenizer: the engine's tokenizer (mlx-lm TokenizerWrapper).
        tools: validated OpenAI ``tools``.
        choice: ``auto`` | ``required`` | ``{"type": "function", "function": {"name": ...}}``.
        parallel: allow several calls in one reply (``parallel_tool_calls``).
        vocab_size: the model's logits width (the mask is padded to it).

    Raises:
        OptionError: a template without tool support, or a schema llguidance cannot compile.
    """

    def __init__(self, tokenizer: Any, tools: list[dict], choice: Any = "auto", parallel: bool = True,
                 vocab_size: int | None = None):
        self.fmt = require_format(tokenizer)
        self.tokenizer = tokenizer
        self.tools, self.choice, self.parallel = tools, choice, parallel
        self.ll = ll_tokenizer(tokenizer, vocab_size)
        self.eos = int(self.ll.eos_token)
        self.matcher: Any = None
        self._seen: int | None = None  # history length at the last call
        self._start: int | None = None  # where the reply starts in the history
        self._detok: Any = None  # the reply's streaming detokenizer
        self._scan = OpeningScanner(self.fmt)  # where a call opens in the reply so far (auto)
        self._recent = ""  # the reply's last characters: has a call just closed?
        self._ended = False  # a call repeated an earlier one: only EOS is left
        self.forced = choice == "required" or isinstance(choice, dict)
        if self.forced:
            self.matcher = self._matcher(None)
        else:
            self._matcher("tag" if self.fmt.opener else "bare")  # compile once now: a bad schema fails at submit

    def _matcher(self, opened: str | None) -> Any:
        import llguidance

        grammar = call_grammar(self.fmt, self.tools, self.choice, self.parallel, opened=opened)
        m = llguidance.LLMatcher(self.ll, grammar, log_level=0)
        if m.is_error():
            raise OptionError(f"invalid tools: {_schema_error(self.tools) or m.get_error().splitlines()[0]}",
                              options=("tools",))
        return m

    def _take_over(self, tokens: mx.array) -> Any:
        """A matcher that has consumed the call opened in the reply so far, or None."""
        reply = None
        while (op := self._scan.next()) is not None:
            matcher = self._matcher(op.form)
            # The call's text exactly as the tokens decode (a detokenizer may hold a space back).
            reply = reply if reply is not None else self.tokenizer.decode(tokens[self._start:].tolist())
            written = self._written(reply, op)
            ids = self.tokenizer.encode(written, add_special_tokens=False) if written else []
            if written is not None and all(matcher.consume_token(int(t)) for t in ids) and not matcher.is_error():
                return matcher
            self._scan.skip(op)  # its text broke the grammar already: leave it as text
        return None

    def _written(self, reply: str, op: Opening) -> str | None:
        """What the reply holds of the call opened at ``op`` (the detokenizer's offsets),
        from the decoded ``reply``; where the detokenizer's text is not the decode's (some
        tokenizer's own spacing), the opening's markup is looked up near its offset. None
        when it is not there."""
        mark = self._scan.text_from(op.at)[:op.body - op.at]
        at = op.at if reply.startswith(mark, op.at) else reply.find(mark, max(0, op.at - _RECENT))
        return None if at < 0 else reply[at + len(mark):]

    def _read(self, new: list[int]) -> str:
        """Text of the reply's ``new`` tokens (what the detokenizer can say so far)."""
        for t in new:
            self._detok.add_token(int(t))
        piece = self._detok.last_segment
        self._recent = (self._recent + piece)[-_RECENT:]
        return piece

    def __call__(self, tokens: mx.array | None, logits: mx.array) -> mx.array:
        """Mask ``logits`` (1, V) to the tokens the grammar allows next (none masked before a call)."""
        n = 0 if tokens is None else int(tokens.shape[0])
        if self._seen is None:
            self._seen = self._start = n  # the first call sees the prompt only
            self._detok = self.tokenizer.detokenizer  # a fresh one per caller
        elif n < self._seen and self.matcher is None:  # the history was cut back: read the reply again
            self._detok.reset()
            self._scan, self._recent, self._seen = OpeningScanner(self.fmt), "", self._start
        if tokens is not None and n > self._seen:
            new = tokens[self._seen:].tolist()
            self._seen = n
            piece = self._read(new)
            if self.matcher is not None:
                for t in new:
                    self.matcher.consume_token(int(t))
                if self.fmt.closer and not self._ended and self._repeated(tokens):
                    self._ended = True
            else:
                self._scan.feed(piece)
                self.matcher = self._take_over(tokens)
        if self.matcher is None:
            return logits
        if self._ended:
            return mx.where(mx.arange(logits.shape[-1]) == self.eos, logits, mx.array(-mx.inf, dtype=logits.dtype))
        return mask_logits(self.matcher, logits, self.eos)

    def _repeated(self, tokens: mx.array) -> bool:
        """True when the reply's last call repeats an earlier one word for word: a small
        model forced to call tools can cycle through the same calls until ``max_tokens``.
        The whole reply is decoded only when a call has just closed."""
        if self.fmt.closer_id is not None:
            if int(tokens[-1].item()) != self.fmt.closer_id:
                return False
        elif not self._recent.rstrip(_WS_ONLY).endswith(self.fmt.closer):
            return False
        reply = self.tokenizer.decode(tokens[self._start or 0:].tolist())
        if not reply.rstrip(_WS_ONLY).endswith(self.fmt.closer):
            return False
        _, calls = parse_calls(self.fmt, reply)  # says a repeated call once
        return reply.count(self.fmt.closer) > len(calls)



__all__ = ["ToolConstraint", "call_grammar", "call_schema"]
