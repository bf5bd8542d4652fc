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
