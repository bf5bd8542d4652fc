"""Tool calls: the model's own call format, a grammar that keeps every call valid, a parser.

A model calls tools in the format its chat template taught it. Two families are known
here, chosen from the template text as mlx-lm's ``_infer_tool_parser`` does:

- ``hermes`` (Qwen2.5, Hermes, most ChatML tool templates): ``<tool_call>\\n{"name": ...,
  "arguments": {...}}\\n</tool_call>``, several in a row for parallel calls; parsed with
  mlx-lm's ``tool_parsers.json_tools``.
- ``llama3`` (Llama 3.1-3.3 JSON tool calling): the whole reply is ``{"name": ...,
  "parameters": {...}}``; one call per turn.

A template with neither has no tool support: asking it for tools is an ``OptionError``.

:class:`ToolConstraint` is a logits processor (mlx-lm's ``(tokens, logits) -> logits``)
over llguidance, as ``JsonConstraint`` is for ``response_format``: with ``tool_choice``
``required`` or a named function the whole reply is the grammar of calls; under ``auto``
the model writes freely until it opens a call, and from there the grammar takes over. A
call's JSON must name a given tool and its arguments must validate against that tool's
``parameters`` schema, so every emitted call parses and validates.

:class:`CallSplitter` turns a stream of text pieces into text and finished calls, so a
streamed reply never shows the raw call markup.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlotspark.decoding.constrained import ll_tokenizer, mask_logits
from mlotspark.errors import OptionError
from mlotspark.results import ToolCall

_WS_ONLY = " \t\r\n"
_DETECT_TAIL = 16  # generated tokens decoded to spot a call's opener


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a tool call."""

    name: str  # "hermes" | "llama3"
    opener: str  # text that opens a call ("" = the reply itself is the call)
    closer: str
    args_key: str  # "arguments" | "parameters"
    parallel: bool  # several calls in one reply


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", True)
LLAMA3 = ToolFormat("llama3", "", "", "parameters", False)


def tool_format(tokenizer: Any) -> ToolFormat | None:
    """The tool-call format the model's chat template teaches, or None (no tool support).

    Args:
        tokenizer: the engine's tokenizer (its ``chat_template`` is read).
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or '"parameters"' in template or "ipython" in template:
        return LLAMA3
    return None


def require_format(tokenizer: Any, model: str = "the model") -> ToolFormat:
    """:func:`tool_format`, or an ``OptionError`` naming ``tools`` when there is none."""
    fmt = tool_format(tokenizer)
    if fmt is None:
        raise OptionError.about(f"{{0}} cannot be used with {model}: its chat template has no tool support "
                                "(no tool-call format in it)", "tools")
    return fmt


def _functions(tools: list[dict], choice: Any) -> list[dict]:
    funcs = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        funcs = [f for f in funcs if f["name"] == name]
    return funcs


def call_schema(fmt: ToolFormat, tools: list[dict], choice: Any = "auto") -> dict:
    """The JSON schema of one call: a given tool's name and arguments valid for it."""
    options = []
    for f in _functions(tools, choice):
        params = f.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "properties": {"name": {"const": f["name"]}, fmt.args_key: params},
                        "required": ["name", fmt.args_key], "additionalProperties": False})
    schema: dict = options[0] if len(options) == 1 else {"anyOf": options}
    # Compact JSON: a small model otherwise pads with newlines (as JsonConstraint).
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


def call_grammar(fmt: ToolFormat, tools: list[dict], choice: Any = "auto", parallel: bool = True,
                 opened: bool = False) -> str:
    """An llguidance Lark grammar of the calls (``opened``: the opener is already written)."""
    body = f"%json{json.dumps(call_schema(fmt, tools, choice))}"
    # Space between the pieces is bounded: a weak model must not pad a call forever.
    if not fmt.opener:
        return f"%llguidance {{}}\nstart: call\ncall: {body}\n"
    more = f'more: "" | WS? {json.dumps(fmt.opener)} WS? call more\n' if parallel and fmt.parallel else 'more: ""\n'
    start = "start: WS? call more\n" if opened else f"start: {json.dumps(fmt.opener)} WS? call more\n"
    return (f"%llguidance {{}}\n{start}{more}call: body WS? {json.dumps(fmt.closer)}\n"
            f"body: {body}\nWS: /[ \\n]{{1,2}}/\n")


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
        forced = choice == "required" or isinstance(choice, dict)
        # Llama 3's call is the whole reply: under auto it can only be seen once it is over.
        if forced:
            self.matcher = self._matcher(opened=False)
        elif self.fmt.opener:
            self._matcher(opened=True)  # compile once now, so a bad schema fails at submit

    def _matcher(self, opened: bool) -> Any:
        import llguidance

        grammar = call_grammar(self.fmt, self.tools, self.choice, self.parallel, opened=opened)
        m = llguidance.LLMatcher(self.ll, grammar)
        if m.is_error():
            raise OptionError(f"invalid tools: {m.get_error()}", options=("tools",))
        return m

    def _opened(self, history: list[int]) -> bool:
        """True when the reply now ends with the call opener (and maybe space): the first
        time it does, as the matcher takes over from then on."""
        reply = history[self._start or 0:]
        tail = self.tokenizer.decode(reply[-_DETECT_TAIL:])
        at = tail.rfind(self.fmt.opener)
        return at >= 0 and tail[at + len(self.fmt.opener):].strip(_WS_ONLY) == ""

    def __call__(self, tokens: mx.array | None, logits: mx.array) -> mx.array:
        """Mask ``logits`` (1, V) to the tokens the grammar allows next (none masked before a call)."""
        n = 0 if tokens is None else int(tokens.shape[0])
        if self._seen is None:
            self._seen = self._start = n  # the first call sees the prompt only
        elif n > self._seen:
            new = tokens[self._seen:].tolist()  # type: ignore[index]
            self._seen = n
            if self.matcher is not None:
                for t in new:
                    self.matcher.consume_token(int(t))
            elif self.fmt.opener and self._opened(tokens.tolist()):  # type: ignore[union-attr]
                self.matcher = self._matcher(opened=True)
        if self.matcher is None:
            return logits
        return mask_logits(self.matcher, logits, self.eos)


# ------------------------------------------------------------------ parsing
def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(fmt: ToolFormat, text: str) -> ToolCall | None:
    from mlx_lm.tool_parsers.json_tools import parse_tool_call

    try:
        obj = parse_tool_call(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(fmt.args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=new_call_id(), name=obj["name"], arguments=args)


def parse_calls(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """Split a finished reply into its text and its tool calls.

    Returns:
        ``(text, calls)``: the text outside calls (stripped when calls were found), and
        the calls in order. A call that does not parse stays in the text.
    """
    if not fmt.opener:
        stripped = text.strip()
        if stripped.startswith("{"):
            call = _call(fmt, stripped)
            if call is not None:
                return "", [call]
        return text, []
    calls: list[ToolCall] = []
    kept: list[str] = []
    rest = text
    while True:
        at = rest.find(fmt.opener)
        if at < 0:
            kept.append(rest)
            break
        end = rest.find(fmt.closer, at + len(fmt.opener))
        body = rest[at + len(fmt.opener): end if end >= 0 else len(rest)]
        call = _call(fmt, body)
        if call is None:
            # A call cut short (max_tokens) is dropped, not shown as markup.
            kept.append(rest[:at] if end < 0 else rest)
            break
        kept.append(rest[:at])
        calls.append(call)
        rest = rest[end + len(fmt.closer):] if end >= 0 else ""
    out = "".join(kept)
    cut = _partial_suffix(out, fmt.opener)  # an opener cut short, too
    if cut:
        out = out[:-cut]
    return (out.strip() if calls else out), calls


def with_tool_calls(result: Any, tokenizer: Any, options: Any) -> Any:
    """``result`` with its calls parsed into ``tool_calls`` when ``options.tools`` were given
    (``text`` keeps the words outside the calls)."""
    if options.tools is None:
        return result
    fmt = tool_format(tokenizer)
    if fmt is not None:
        result.text, result.tool_calls = parse_calls(fmt, result.text)
    return result


class CallSplitter:
    """Text pieces in; text to show and finished calls out, never the call markup.

    ``feed(piece)`` returns ``(text, calls)`` ready now; ``close()`` returns what is left
    at the end (a call cut short by ``max_tokens`` is dropped: never shown as markup).
    """

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self._buf = ""
        self._in_call = False
        self._started = False  # llama3: the reply's first non-space character is seen

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        self._buf += piece
        if not self.fmt.opener:
            return self._feed_whole()
        shown, calls = [], []
        while True:
            if self._in_call:
                end = self._buf.find(self.fmt.closer)
                if end < 0:
                    break
                call = _call(self.fmt, self._buf[:end])
                if call is not None:
                    calls.append(call)
                else:  # not a call after all: show it as written
                    shown.append(self.fmt.opener + self._buf[: end + len(self.fmt.closer)])
                self._buf = self._buf[end + len(self.fmt.closer):]
                self._in_call = False
                continue
            at = self._buf.find(self.fmt.opener)
            if at >= 0:
                shown.append(self._buf[:at])
                self._buf = self._buf[at + len(self.fmt.opener):]
                self._in_call = True
                continue
            keep = _partial_suffix(self._buf, self.fmt.opener)  # may be the start of an opener
            shown.append(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            break
        text = "".join(shown)
        if calls and not text.strip(_WS_ONLY):
            text = ""
        return text, calls

    def _feed_whole(self) -> tuple[str, list[ToolCall]]:
        if not self._started:
            head = self._buf.lstrip(_WS_ONLY)
            if not head:
                return "", []
            self._started = True
            self._in_call = head.startswith("{")
        if self._in_call:
            return "", []  # a call is judged once it is whole
        out, self._buf = self._buf, ""
        return out, []

    def close(self) -> tuple[str, list[ToolCall]]:
        rest, self._buf = self._buf, ""
        if not self.fmt.opener:
            if self._in_call:
                text, calls = parse_calls(self.fmt, rest)
                return text, calls
            return rest, []
        if self._in_call:
            call = _call(self.fmt, rest)  # a call whose closer was cut off still counts if whole
            return ("", [call]) if call is not None else ("", [])
        return rest[: len(rest) - _partial_suffix(rest, self.fmt.opener)], []  # an opener cut short: dropped


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for k in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:k]):
            return k
    return 0


__all__ = ["CallSplitter", "HERMES", "LLAMA3", "ToolConstraint", "ToolFormat", "call_grammar", "call_schema",
           "parse_calls", "require_format", "tool_format", "with_tool_calls"]
