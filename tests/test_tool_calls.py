"""Tool-call formats, parsing, streaming splits and the auto-mode grammar trigger
(``decoding/tools.py``), and the JSON-reply mask it shares (``decoding/constrained.py``),
without a server."""

from __future__ import annotations

import json
import types

import mlx.core as mx
import numpy as np
import pytest

from mlotspark.decoding.tool_calls import HERMES, LLAMA3, CallSplitter, parse_calls, tool_format
from mlotspark.errors import OptionError
from tool_models import QWEN_TOOL_TEMPLATE, TIME, WEATHER, write_tool_model

CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


def test_the_format_is_chosen_from_the_chat_template():
    assert tool_format(types.SimpleNamespace(chat_template=QWEN_TOOL_TEMPLATE)) == HERMES
    llama = "{% if tools %}Respond in the format {\"name\": function name, \"parameters\": ...}<|python_tag|>{% endif %}"
    assert tool_format(types.SimpleNamespace(chat_template=llama)) == LLAMA3
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}{% endfor %}"
    assert tool_format(types.SimpleNamespace(chat_template=chatml)) is None


def test_replies_split_into_text_and_calls():
    text, calls = parse_calls(HERMES, "Let me check.\n" + CALL + "\n" + CALL.replace("UTC", "CET"))
    assert text == "Let me check." and [c.arguments["zone"] for c in calls] == ["UTC", "CET"]
    assert parse_calls(HERMES, "no call here") == ("no call here", [])
    text, calls = parse_calls(HERMES, CALL + "\n<tool_call>\n{\"name\": \"get_ti")  # the second cut by max_tokens
    assert text == "" and len(calls) == 1
    text, calls = parse_calls(LLAMA3, ' {"name": "get_time", "parameters": {"zone": "UTC"}}')
    assert text == "" and calls[0].name == "get_time" and calls[0].arguments == {"zone": "UTC"}
    assert json.loads(calls[0].arguments_json()) == {"zone": "UTC"}


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_a_stream_never_shows_call_markup_however_it_is_cut(size):
    reply = "Sure. " + CALL + "\n" + CALL.replace("UTC", "CET") + " Done <"
    splitter = CallSplitter(HERMES)
    shown, calls = "", []
    for i in range(0, len(reply), size):
        t, c = splitter.feed(reply[i:i + size])
        shown += t
        calls += c
    t, c = splitter.close()
    shown, calls = shown + t, calls + c
    assert "<tool" not in shown and "tool_call" not in shown and "{" not in shown
    assert shown.startswith("Sure. ") and [c.arguments["zone"] for c in calls] == ["UTC", "CET"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from mlotspark.models.tokenizer import load_gguf_tokenizer

    path = write_tool_model(tmp_path_factory.mktemp("tool-tok") / "t.gguf")
    _, meta = mx.load(str(path), return_metadata=True)
    return load_gguf_tokenizer(meta)


def test_under_auto_the_grammar_takes_over_once_a_call_opens(tokenizer):
    from mlotspark.decoding.tools import ToolConstraint

    c = ToolConstraint(tokenizer, [WEATHER, TIME], "auto")
    prompt = tokenizer.encode("prompt", add_special_tokens=False)
    vocab = 300
    logits = mx.zeros((1, vocab))
    c(mx.array(prompt), logits)
    history = list(prompt)
    for t in tokenizer.encode("Let me look. ", add_special_tokens=False):
        history.append(t)
        out = c(mx.array(history), logits)
        assert np.isfinite(np.array(out)).all()  # free text: nothing masked
    for t in tokenizer.encode("<tool_call>\n", add_special_tokens=False):
        history.append(t)
        out = np.array(c(mx.array(history), logits))
    allowed = [tokenizer.decode([i]) for i in np.flatnonzero(np.isfinite(out[0]))]
    assert allowed and all(a in ("{", " ", "\n") for a in allowed), allowed  # only a call's JSON may follow


class _ShortDetokenizer:
    """A streaming detokenizer whose text is ``decode()``'s less its first character."""

    def __init__(self, inner):
        self.inner, self.offset = inner, 0

    def reset(self):
        self.inner.reset()
        self.offset = 0

    def add_token(self, t):
        self.inner.add_token(t)

    @property
    def text(self):
        return self.inner.text[1:]

    @property
    def last_segment(self):
        text = self.text
        piece, self.offset = text[self.offset:], len(text)
        return piece


class _ShortTokenizer:
    """``tokenizer`` whose streaming text is one character short of its ``decode()``."""

    def __init__(self, tokenizer):
        self._wrapped = tokenizer

    def __getattr__(self, name):
        return getattr(self._wrapped, name)

    @property
    def detokenizer(self):
        return _ShortDetokenizer(self._wrapped.detokenizer)


def _auto(tokenizer):
    """An auto-mode constraint that has seen a prompt; ``step(text)`` writes ``text``'s
    tokens one at a time and returns whether each step's logits came back masked."""
    from mlotspark.decoding.tools import ToolConstraint

    c = ToolConstraint(tokenizer, [WEATHER, TIME], "auto")
    history = tokenizer.encode("prompt", add_special_tokens=False)
    logits = mx.zeros((1, 300))
    c(mx.array(history), logits)

    def step(text: str) -> list[bool]:
        masked = []
        for t in tokenizer.encode(text, add_special_tokens=False):
            history.append(t)
            masked.append(not np.isfinite(np.array(c(mx.array(history), logits))).all())
        return masked

    return c, step


@pytest.mark.parametrize("opening", ["<tool_call>\n", '```json\n{"name"', '``` \n  {  "name"'])
def test_an_opening_written_across_many_tokens_is_found_the_step_it_completes(tokenizer, opening):
    c, step = _auto(tokenizer)
    assert not any(step("Let me look: <tool or ``` not yet. "))  # openings begun, then broken
    ids = tokenizer.encode(opening, add_special_tokens=False)
    assert len(ids) >= len(opening.strip()) // 2  # the vocabulary spells it in pieces
    masked = step(opening)
    first = masked.index(True)
    # No mask before the opening is whole; the grammar holds the call from the step it is.
    whole = next(i for i in range(1, len(ids) + 1)
                 if tokenizer.decode(ids[:i]).rstrip(" \n") == opening.rstrip(" \n"))
    assert first == whole - 1 and all(masked[first:])


def test_a_detokenizer_whose_text_is_not_the_decodes_still_hands_the_call_over(tokenizer):
    """The grammar gets the call's text from the decoded reply, the opening found where the
    streaming text put it (here one character earlier)."""
    c, step = _auto(_ShortTokenizer(tokenizer))
    assert not any(step("Let me look. "))
    masked = step('<tool_call>\n{"name": "get_')
    first = masked.index(True)
    assert first == len(tokenizer.encode("<tool_call>", add_special_tokens=False)) - 1 and all(masked[first:])


def test_each_step_reads_what_is_new_however_long_the_reply(tokenizer, monkeypatch):
    """Under auto, a reply of free text costs each step the same: its new characters are
    searched (and what may still open a call), nothing is decoded whole."""
    c, step = _auto(tokenizer)
    decoded = []
    real = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda ids, *a, **k: decoded.append(len(ids)) or real(ids, *a, **k))
    phrase, per_round = "Let me look it up < <tool ``` {\"nam ", []
    for _ in range(300):  # 300 rounds of 38 tokens: an 11,400-character reply
        before = c._scan.scanned
        step(phrase)
        per_round.append(c._scan.scanned - before)
    assert decoded == []  # the reply is decoded whole only when a call opens
    # Characters searched per round: the same in the last rounds as in the first (the
    # whole reply each step would be ~38 x its length: 400,000 by the last round).
    assert max(per_round[-50:]) <= max(per_round[:50]) <= 16 * len(phrase)
    # and a call still opens after 300 rounds of near misses
    masked = step('<tool_call>\n{"name": "get_time"')
    assert masked[-1] and decoded and len(c._scan._tail) < 100


def test_a_json_reply_is_masked_by_the_same_rule(tokenizer):
    """``response_format`` json_object (``constrained.JsonConstraint``) shares the calls' mask:
    the reply may open only with a JSON object, and the mask spans the logits' whole width."""
    from mlotspark.decoding.constrained import JsonConstraint

    c = JsonConstraint(tokenizer, {"type": "json_object"}, vocab_size=300)
    prompt = tokenizer.encode("prompt", add_special_tokens=False)
    out = np.array(c(mx.array(prompt), mx.zeros((1, 320))))
    assert out.shape == (1, 320) and not np.isfinite(out[0, 300:]).any()
    allowed = [tokenizer.decode([i]) for i in np.flatnonzero(np.isfinite(out[0]))]
    assert "{" in allowed and all(a.strip() in ("{", "") for a in allowed), allowed


def test_a_template_without_tools_refuses_them():
    from mlotspark.decoding.tools import ToolConstraint

    plain = types.SimpleNamespace(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(OptionError) as e:
        ToolConstraint(plain, [WEATHER])
    assert e.value.options == ("tools",) and "no tool support" in str(e.value)
