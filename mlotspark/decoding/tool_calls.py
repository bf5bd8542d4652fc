"""Tool calls in a reply: the model's own call format, where a call opens, and one parser
that splits replies into text and calls for the chat, ``serve`` and the Python API.

A model calls tools in the format its chat template taught it, found from the template as
mlx-lm's ``_infer_tool_parser`` finds it, and parsed with mlx-lm's ``tool_parsers``:

- ``hermes`` (mlx-lm's ``json_tools``: Qwen2.5, Hermes, most ChatML tool templates):
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, several in a row for
  parallel calls. Qwen's vocabulary writes ``<tool_call>`` / ``</tool_call>`` as one token
  each (ids 151657 / 151658): ``ToolFormat.opener_id`` says so, for the grammar.
- ``llama3`` (Llama 3.1-3.3 JSON tool calling): the whole reply is ``{"name": ...,
  "parameters": {...}}``; one call per turn.

A template with neither has no tool support here: asking it for tools is an ``OptionError``.

Small models do not always write the template's tag: Qwen2.5-Coder-0.5B answers a tool
question under ``auto`` with a fenced ```` ```json {"name": ..., "arguments": ...} ``` ````
block, or with the bare object. So a call opens in any of three forms (:func:`find_opening`):
the template's tag, a ```` ``` ```` / ```` ```json ```` fence whose body starts ``{"name"``,
or a reply that starts ``{"name"``. Text that only mentions a tool stays text.

:class:`CallSplitter` turns a stream of text pieces into text and finished calls, so a
streamed reply never shows the raw call markup; :func:`parse_calls` is it run over a whole
reply. The grammar that keeps the calls valid is ``tools.py``'s.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterable

import regex

from mlotspark.decoding.stops import Holdback
from mlotspark.errors import OptionError
from mlotspark.results import ToolCall

_WS_ONLY = " \t\r\n"
# A call's JSON opens with its "name" key: ``{"name"``, with space allowed as JSON allows it.
_OBJECT = r'\{[ \t\r\n]*"name"'
_FENCE = r"```(?:json)?[ \t]*\r?\n?[ \t\r\n]*" + _OBJECT


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a tool call.

    Attributes:
        name: ``hermes`` | ``llama3``.
        opener / closer: the tags around a call (``""``: the reply itself is the call).
        args_key: ``arguments`` | ``parameters``.
        parallel: several calls in one reply.
        opener_id / closer_id: the tag's token id when the vocabulary writes it as one
            token (Qwen's ``<tool_call>``), else None.
    """

    name: str
    opener: str
    closer: str
    args_key: str
    parallel: bool
    opener_id: int | None = None
    closer_id: int | None = None


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", True)
LLAMA3 = ToolFormat("llama3", "", "", "parameters", False)


def _template_format(template: str) -> ToolFormat | None:
    kind = _mlx_lm_parser(template)
    if kind == "json_tools" or (kind is None and "<tool_call>" in template):
        return HERMES
    if kind is not None:
        return None  # a format of mlx-lm's that no grammar here holds (see require_format)
    if "<|python_tag|>" in template or '"parameters"' in template or "ipython" in template:
        return LLAMA3
    return None


def _mlx_lm_parser(template: str) -> str | None:
    """The name of the mlx-lm tool parser that reads the calls ``template`` teaches."""
    from mlx_lm.tokenizer_utils import _infer_tool_parser

    return _infer_tool_parser(_TemplateOnly(template))


class _TemplateOnly:
    """What ``_infer_tool_parser`` reads: the template, and a vocabulary (none here: the
    template decides for the formats parsed here)."""

    def __init__(self, template: str):
        self.chat_template = template

    def get_vocab(self) -> dict:
        return {}


def _single_token(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when the tokenizer writes it as one token, else None."""
    if not text or not hasattr(tokenizer, "encode"):
        return None
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return int(ids[0]) if len(ids) == 1 else None


def tool_format(tokenizer: Any) -> ToolFormat | None:
    """The tool-call format the model's chat template teaches, or None (no tool support).

    Args:
        tokenizer: the engine's tokenizer (its ``chat_template`` is read; with ``encode``,
            a tag the vocabulary writes as one token is named by its id).
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tools" not in template:
        return None
    fmt = _template_format(template)
    if fmt is None or not fmt.opener:
        return fmt
    return replace(fmt, opener_id=_single_token(tokenizer, fmt.opener), closer_id=_single_token(tokenizer, fmt.closer))


def require_format(tokenizer: Any, model: str = "the model") -> ToolFormat:
    """:func:`tool_format`, or an ``OptionError`` naming ``tools`` when there is none."""
    fmt = tool_format(tokenizer)
    template = getattr(tokenizer, "chat_template", None)
    kind = _mlx_lm_parser(template) if fmt is None and isinstance(template, str) and "tools" in template else None
    if kind is not None:
        raise OptionError.about(f"{{0}} cannot be used with {model}: its tool-call format ({kind}) is read by "
                                "mlx-lm but no grammar here keeps its calls valid yet", "tools")
    if fmt is None:
        raise OptionError.about(f"{{0}} cannot be used with {model}: its chat template has no tool support "
                                "(no tool-call format in it)", "tools")
    return fmt


def tool_names(tools: Iterable[dict] | None) -> list[str]:
    """The function names of OpenAI ``tools``."""
    return [str((t.get("function") or {}).get("name")) for t in tools or ()]


@dataclass(frozen=True)
class Opening:
    """Where a call opens in a reply: its ``form`` (``tag`` | ``fence`` | ``bare``), where
    its markup starts (``at``) and where the call's own text starts (``body``)."""

    form: str
    at: int
    body: int


_OBJECT_RE = regex.compile(_OBJECT)
_FENCE_RE = regex.compile(_FENCE)
_BARE = Holdback([("bare", _OBJECT_RE)])  # matched at the reply's first non-space character


@functools.lru_cache(maxsize=16)
def _openings(opener: str) -> Holdback:
    """The forms a call opens in after the reply's start, compiled once per format (the
    auto-mode grammar looks for them at every decode step until a call opens)."""
    fence = ("fence", _FENCE_RE)
    return Holdback([("tag", regex.compile(regex.escape(opener))), fence] if opener else [fence])


def _body(form: str, text: str, m: "regex.Match") -> int:
    """Where the call's own text starts after its opening ``m``: after a tag, at a fence's
    ``{`` (or the match's end while the ``{`` has not come)."""
    if form == "tag" or (m.partial and "{" not in m.group()):
        return m.end()
    return text.index("{", m.start())


def find_opening(fmt: ToolFormat, text: str, start: int = 0, partial: bool = False,
                 bare: bool = True) -> Opening | None:
    """The first call opened in ``text`` at or after ``start``.

    Args:
        partial: also return an opening that the text's end may still complete (its
            ``form`` then ends with ``?``), so a stream holds that text back.
        bare: ``text`` is the reply from its start, so it may itself be the call's object.
    """
    if bare and start == 0:  # the bare form: the reply itself starts with the call's object
        lead = len(text) - len(text.lstrip(_WS_ONLY))
        hit = _BARE.first(text, lead, partial=partial, anchored=True) if lead < len(text) else None
        if hit is not None:
            return Opening("bare?" if hit[1].partial else "bare", lead, lead)
    hit = _openings(fmt.opener).first(text, start, partial=partial)
    if hit is None:
        return None
    form, m = hit
    return Opening(form + ("?" if m.partial else ""), m.start(), _body(form, text, m))


class OpeningScanner:
    """:func:`find_opening` over a reply that arrives piece by piece, each step reading only
    what is new and what may still become an opening.

    ``feed(piece)`` appends text; ``next()`` is the first complete opening at or after the
    resume point (reply offsets), as ``find_opening(fmt, reply, resume, bare=...)`` finds
    it. Where no opening is found, the resume point moves to where a pattern's partial
    match begins (an opening the next pieces may complete: ``<tool`` of ``<tool_call>``,
    a fence whose JSON has not come), else to the end; the text before it is dropped, so a
    step reads the new piece and an unfinished opening, not the whole reply.

    Attributes:
        scanned: characters searched so far (each search counts the text it was given).
    """

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self._tail = ""  # the reply from offset _base on
        self._base = 0
        self._resume = 0  # reply offset where the next search starts
        self._bare = True  # the reply's start may still be a bare call's object
        self.scanned = 0

    def feed(self, piece: str) -> None:
        self._tail += piece

    def skip(self, op: Opening) -> None:
        """``op`` broke the grammar already: search on from its next character (and the
        bare form, which is only at the reply's start, is out)."""
        self._resume, self._bare = op.at + 1, False

    def text_from(self, offset: int) -> str:
        """The reply from ``offset`` (an opening ``next`` returned, or later) to its end so far."""
        return self._tail[offset - self._base:]

    def next(self) -> Opening | None:
        text, base = self._tail, self._base
        start = self._resume - base
        if self._bare:  # the whole reply is kept while its start is undecided
            lead = len(text) - len(text.lstrip(_WS_ONLY))
            self.scanned += len(text)
            hit = _BARE.first(text, lead, partial=True, anchored=True) if lead < len(text) else None
            if hit is not None and not hit[1].partial:
                return Opening("bare", lead, lead)
            self._bare = lead == len(text) or hit is not None
        openings = _openings(self.fmt.opener)
        self.scanned += 2 * len(openings.patterns) * (len(text) - start)
        hit = openings.first(text, start)
        if hit is not None:
            return Opening(hit[0], base + hit[1].start(), base + _body(hit[0], text, hit[1]))
        resume = openings.safe_length(text, start)  # a partial opening the next pieces may complete
        self._resume = base + resume
        if not self._bare:
            self._tail, self._base = text[resume:], base + resume
        return None


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(fmt: ToolFormat, text: str, names: set[str] | None = None) -> ToolCall | None:
    from mlx_lm.tool_parsers.json_tools import parse_tool_call

    try:
        obj = parse_tool_call(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
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


def _json_end(text: str) -> int | None:
    """Where the JSON value at the start of ``text`` ends, or None while it is unfinished."""
    try:
        return json.JSONDecoder().raw_decode(text)[1]
    except ValueError:
        return None


class CallSplitter:
    """Text pieces in; text to show and finished calls out, never the call markup.

    Args:
        fmt: the model's tool format.
        tools: the names of the tools given (or OpenAI tools): a call must name one to
            count as a call. None accepts any name.

    ``feed(piece)`` returns ``(text, calls)`` ready now; ``close()`` returns what is left
    at the end. A call cut short by ``max_tokens`` is dropped, never shown as markup, and
    counted in ``cut_short``; a whole one that is no call of a given tool stays text.
    White space alone before a call (at the reply's start, or after another call) is never
    shown, and white space after the last call only with words after it, so a streamed
    reply shows the text ``parse_calls`` finds in the whole one (a reply of calls alone: none).
    """

    def __init__(self, fmt: ToolFormat, tools: Iterable[Any] | None = None):
        self.fmt = fmt
        names = None if tools is None else [t if isinstance(t, str) else tool_names([t])[0] for t in tools]
        self.names = None if names is None else set(names)
        self._buf = ""
        self._open: Opening | None = None  # the call being written, offsets into _buf
        self._started = False  # text shown or a call made: the bare form is only at the start
        self._after_call = False  # a call made, and no words shown since: white space is held
        self._worded = False  # words (not only white space) shown
        self.cut_short = 0
        self._said: set[tuple[str, str]] = set()

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        self._buf += piece
        return self._run(final=False)

    def close(self) -> tuple[str, list[ToolCall]]:
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, list[ToolCall]]:
        shown: list[str] = []
        calls: list[ToolCall] = []
        while self._step(shown, calls, final):
            pass
        if final:
            cut = find_opening(self.fmt, self._buf, partial=True, bare=not self._started)
            if cut is not None and cut.form == "tag?":
                self._buf = self._buf[:cut.at]  # an opener cut short: dropped
            self._show(shown, len(self._buf))  # empties the buffer
        text = "".join(shown)
        if calls and not text.strip(_WS_ONLY):
            text = ""
        return text, calls

    def _step(self, shown: list[str], calls: list[ToolCall], final: bool) -> bool:
        """One move over the buffer; True while another may follow."""
        if self._open is None:
            op = find_opening(self.fmt, self._buf, partial=not final, bare=not self._started)
            if op is None:
                words = bool(self._buf.strip(_WS_ONLY))
                if not final and (words or self._started and not self._after_call):
                    self._show(shown, len(self._buf))
                return False
            # White space alone before an opening, after a call or before any words, is what
            # the whole reply's split drops: held with an opening that may still come to
            # nothing, dropped before one that opens.
            quiet = not self._buf[:op.at].strip(_WS_ONLY) and (self._after_call or not self._worded)
            if op.form.endswith("?"):
                if not quiet:
                    self._show(shown, op.at)
                return False  # may still open a call: hold it
            if quiet:
                self._buf = self._buf[op.at:]
            else:
                self._show(shown, op.at)
            self._open = Opening(op.form, 0, op.body - op.at)
        return self._finish(calls, shown, final)

    def _show(self, shown: list[str], upto: int) -> None:
        if upto <= 0:
            return
        text, self._buf = self._buf[:upto], self._buf[upto:]
        words = bool(text.strip(_WS_ONLY))
        if self._after_call and not words:
            return  # white space between calls, or after the last: dropped
        if self._after_call and not self._worded:
            text = text.lstrip(_WS_ONLY)  # the reply's first words, after its calls
        shown.append(text)
        self._started = self._started or words
        self._worded = self._worded or words
        self._after_call = self._after_call and not words

    def _finish(self, calls: list[ToolCall], shown: list[str], final: bool) -> bool:
        """Close the open call once its end is written (or the reply ended); True when
        text is left to look at."""
        op = self._open
        assert op is not None
        body = self._buf[op.body:]
        if op.form == "tag" and self.fmt.closer:
            end = body.find(self.fmt.closer)
            stop, rest = (end, end + len(self.fmt.closer)) if end >= 0 else (None, len(body))
        else:  # fence or bare: the JSON object's end, then the fence's close
            lead = len(body) - len(body.lstrip(_WS_ONLY))
            end = _json_end(body[lead:])
            stop = None if end is None else lead + end
            rest = len(body) if stop is None else stop
            if stop is not None and op.form == "fence":
                close = body.find("```", stop)
                if close < 0 and not final:
                    return False
                rest = close + 3 if close >= 0 else len(body)
        if stop is None and not final:
            return False
        call = _call(self.fmt, body[:stop] if stop is not None else body, self.names)
        consumed = op.body + rest
        if call is not None:
            self._after_call = True
            key = (call.name, call.arguments_json())
            if key not in self._said:  # a call repeated word for word is said once
                self._said.add(key)
                calls.append(call)
        elif stop is None:  # cut short (max_tokens): dropped, not shown as markup
            self.cut_short += 1
        else:  # not a call after all: shown as written, words after the calls
            shown.append(self._buf[:consumed])
            self._worded, self._after_call = True, False
        self._buf = self._buf[consumed:]
        self._open = None
        self._started = True
        return bool(self._buf)


def parse_calls(fmt: ToolFormat, text: str, tools: Iterable[Any] | None = None) -> tuple[str, list[ToolCall]]:
    """Split a finished reply into its text and its tool calls (:class:`CallSplitter` over
    the whole reply).

    Returns:
        ``(text, calls)``: the text outside calls (stripped when calls were found), and
        the calls in order. A call that does not parse stays in the text; one cut short is
        dropped.
    """
    splitter = CallSplitter(fmt, tools)
    shown, calls = splitter.feed(text)
    rest, more = splitter.close()
    out, calls = shown + rest, calls + more
    return (out.strip() if calls else out), calls


def splitter_for(tokenizer: Any, options: Any) -> CallSplitter | None:
    """The splitter of a request's streamed reply: None unless ``options.tools`` were given.

    Raises:
        OptionError: tools for a model whose template has no tool support.
    """
    if options is None or options.tools is None:
        return None
    return CallSplitter(require_format(tokenizer), tool_names(options.tools))


def with_tool_calls(result: Any, tokenizer: Any, options: Any) -> Any:
    """``result`` with its calls parsed into ``tool_calls`` when ``options.tools`` were given
    (``text`` keeps the words outside the calls)."""
    if options.tools is None:
        return result
    fmt = tool_format(tokenizer)
    if fmt is not None:
        result.text, result.tool_calls = parse_calls(fmt, result.text, tool_names(options.tools))
    return result



__all__ = ["CallSplitter", "HERMES", "LLAMA3", "Opening", "OpeningScanner", "ToolFormat", "find_opening", "new_call_id",
           "parse_calls", "require_format", "splitter_for", "tool_format", "tool_names", "with_tool_calls"]
