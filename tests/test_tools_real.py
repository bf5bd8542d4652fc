"""Tool calls on the real Qwen2.5-Coder-0.5B: its own tokenizer (``<tool_call>`` is one
special token, id 151657), its own chat template, its own weights, through the real
``openai``, ``anthropic`` and ``ollama`` clients and ``Engine``.

The token-level tests read the tokenizer from the GGUF without its weights (a second);
the end-to-end ones share the run's one Qwen engine and server (``conftest.py``).
"""

from __future__ import annotations

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from mlotspark.bench.conformance import TIME, WEATHER  # the conformance matrix's tools: one definition

TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
CHAT = [{"role": "user", "content": "Write a haiku about rain."}]


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_tokenizer_real):
    return qwen_tokenizer_real


def _allowed(constraint, history: list[int], vocab: int = 151936) -> np.ndarray:
    out = np.array(constraint(mx.array(history), mx.zeros((1, vocab))))
    return np.flatnonzero(np.isfinite(out[0]))


# ------------------------------------------------------------------ token level, real tokenizer
def test_qwen2_5_coder_tags_are_single_special_tokens_named_by_id(qwen_tokenizer):
    from mlotspark.decoding.tool_calls import tool_format

    fmt = tool_format(qwen_tokenizer)
    assert fmt is not None and fmt.name == "hermes"
    assert (fmt.opener_id, fmt.closer_id) == (151657, 151658)


def test_a_forced_call_lets_qwen_write_its_own_tool_call_token_first(qwen_tokenizer):
    """The bug users met: the grammar expected the bytes '<tool_call>' and refused token
    151657, so every forced call ended after one token with an empty reply."""
    from mlotspark.decoding.tools import ToolConstraint

    c = ToolConstraint(qwen_tokenizer, TOOLS, "required", vocab_size=151936)
    prompt = [1, 2, 3]
    assert _allowed(c, prompt).tolist() == [151657]
    history = prompt + [151657]
    for t in qwen_tokenizer.encode('\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n', add_special_tokens=False):
        assert t in _allowed(c, history)
        history.append(t)
    assert _allowed(c, history).tolist() == [151658]
    history.append(151658)
    assert set(_allowed(c, history).tolist()) == {198, c.eos}  # another call ("\n") or the end


def test_a_repeated_call_ends_a_forced_reply(qwen_tokenizer):
    from mlotspark.decoding.tool_calls import parse_calls
    from mlotspark.decoding.tools import ToolConstraint

    c = ToolConstraint(qwen_tokenizer, TOOLS, "required", vocab_size=151936)
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    two = one.replace("celsius", "fahrenheit")
    history = [1, 2, 3]
    _allowed(c, history)
    for t in qwen_tokenizer.encode(one + "\n" + two + "\n" + one, add_special_tokens=False):
        history.append(t)
        allowed = _allowed(c, history)
    assert allowed.tolist() == [c.eos]
    _, calls = parse_calls(c.fmt, qwen_tokenizer.decode(history[3:]), ["get_weather"])
    assert [x.arguments["unit"] for x in calls] == ["celsius", "fahrenheit"]  # the repeat is said once


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_schema_llguidance_refuses_is_one_line_naming_the_tool(qwen_tokenizer, choice):
    from mlotspark.decoding.tools import ToolConstraint
    from mlotspark.errors import OptionError

    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(OptionError) as e:
        ToolConstraint(qwen_tokenizer, TOOLS + [bad], choice, vocab_size=151936)
    assert str(e.value) == "invalid tools: tool 2 ('f'): its parameters schema: Invalid type: nonsense"


@pytest.mark.parametrize("opening", ['```json\n{"name"', '{"name"', "Let me check.\n```json\n{\"name\"",
                                     "Let me check.<tool_call>\n{\"name\""])
def test_under_auto_a_call_opened_in_any_form_is_held_to_a_declared_tool(qwen_tokenizer, opening):
    from mlotspark.decoding.tools import ToolConstraint

    c = ToolConstraint(qwen_tokenizer, TOOLS, "auto", vocab_size=151936)
    history = [1, 2, 3]
    assert len(_allowed(c, history)) == 151936  # free text until a call opens
    for t in qwen_tokenizer.encode(opening, add_special_tokens=False):
        history.append(t)
        allowed = _allowed(c, history)
    texts = {qwen_tokenizer.decode([int(i)]) for i in allowed}
    # only the key's colon may follow (after some space, in the model's own spacing)
    assert 0 < len(allowed) < 100 and all(x.lstrip(" \n").startswith(":") or not x.strip() for x in texts), texts


def test_text_that_only_mentions_a_tool_stays_text(qwen_tokenizer):
    from mlotspark.decoding.tool_calls import parse_calls, tool_format
    from mlotspark.decoding.tools import ToolConstraint

    c = ToolConstraint(qwen_tokenizer, TOOLS, "auto", vocab_size=151936)
    history = [1, 2, 3]
    _allowed(c, history)
    said = 'You could call get_weather, e.g. {"name": "get_weather"} in JSON, or use ```python\nprint(1)\n```'
    for t in qwen_tokenizer.encode(said, add_special_tokens=False):
        history.append(t)
        assert len(_allowed(c, history)) == 151936
    assert parse_calls(tool_format(qwen_tokenizer), said, ["get_weather", "get_time"]) == (said, [])


@pytest.mark.parametrize("size", [1, 2, 5])
def test_every_form_streams_as_calls_never_as_markup_on_qwen_text(qwen_tokenizer, size):
    """Replies as Qwen2.5-Coder writes them, cut into pieces as its detokenizer streams them."""
    from mlotspark.decoding.tool_calls import CallSplitter, tool_format

    fmt = tool_format(qwen_tokenizer)
    replies = [
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        'Sure.\n```json\n{\n  "name": "get_time",\n  "arguments": {"zone": "CET"}\n}\n```',
    ]
    for reply in replies:
        ids = qwen_tokenizer.encode(reply, add_special_tokens=False)
        pieces = [qwen_tokenizer.decode(ids[i:i + size]) for i in range(0, len(ids), size)]
        splitter = CallSplitter(fmt, ["get_weather", "get_time"])
        shown, calls = "", []
        for p in pieces + [None]:
            t, c = splitter.feed(p) if p is not None else splitter.close()
            shown, calls = shown + t, calls + c
        assert len(calls) == 1 and "{" not in shown and "tool_call" not in shown and "```" not in shown, (reply, shown)
        jsonschema.validate(calls[0].arguments, SCHEMAS[calls[0].name])


# ------------------------------------------------------------------ end to end, real weights
# OpenAI required / named / auto / streamed, Anthropic "any" and Ollama's tools are cells of
# the conformance matrix on this same server (tests/test_conformance.py); these are the rest.
def _valid(name: str, arguments: str | dict) -> dict:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_auto_answers_a_question_no_tool_serves_with_text(qwen_server):
    r = qwen_server.openai().chat.completions.create(model=qwen_server.model, messages=CHAT, tools=TOOLS,
                                                     max_tokens=30, temperature=0)
    ch = r.choices[0]
    assert ch.message.tool_calls is None and len(ch.message.content.split()) >= 3


def test_anthropic_named_tool_returns_a_tool_use_block(qwen_server):
    import anthropic

    client = anthropic.Anthropic(base_url=qwen_server.url, api_key="unused", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    # "any" is the conformance matrix's anthropic_tools cell; "auto" goes through the same
    # take-over as OpenAI's tools_auto cell.
    m = client.messages.create(model=qwen_server.model, max_tokens=120, messages=ASK, tools=tools,
                               tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                               extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"], m
    assert all(_valid(u.name, u.input) for u in uses)


def test_engine_generate_returns_the_forced_call_in_python(qwen_engine):
    r = qwen_engine.generate(ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120)
    assert len(r.tool_calls) == 1 and r.text == "" and r.stats.finish_reason == "stop"
    assert r.tool_calls[0].name == "get_weather" and r.tool_calls[0].arguments["city"] == "Paris"
    assert all(_valid(c.name, c.arguments) for c in r.tool_calls)
