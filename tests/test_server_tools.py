"""Tool calls and logprobs through the real ``openai`` client, on a tiny random model whose
chat template teaches Qwen2.5's ``<tool_call>`` format (``tool_models.py``): with
``tool_choice`` required or named, the grammar leaves it only valid calls to write."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tool_models import TIME, WEATHER, write_tool_model

TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from live_server import LiveServer
    from mlotspark.engine import Engine

    path = write_tool_model(tmp_path_factory.mktemp("tool-model") / "tools.gguf")
    srv = LiveServer(Engine.load(str(path), progress=False, cascade=None))
    yield srv
    srv.stop()


def _valid(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_a_required_call_parses_and_validates(live):
    r = live.openai().chat.completions.create(model=live.model, messages=ASK, tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, max_tokens=200, temperature=0.8, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    _valid(call.function.name, call.function.arguments)
    assert "<tool_call>" not in (choice.message.content or "")


def test_a_named_function_is_the_one_called(live):
    r = live.openai().chat.completions.create(
        model=live.model, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, max_tokens=200, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and _valid("get_time", call.function.arguments)["zone"] in ("UTC", "CET")


def test_streamed_calls_arrive_as_deltas_never_as_text(live):
    chunks = list(live.openai().chat.completions.create(
        model=live.model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300, temperature=0.7,
        seed=5, stream=True, parallel_tool_calls=False))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "<tool_call" not in content and "</tool_call" not in content
    calls: dict[int, dict] = {}
    for ch in chunks:
        for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            c = calls.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
    assert calls and chunks[-1].choices[0].finish_reason in ("tool_calls", "length")
    for c in calls.values():
        _valid(c["name"], c["arguments"])


def test_tool_results_in_the_history_are_accepted(live):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "celsius": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    r = live.openai().chat.completions.create(model=live.model, messages=history, tools=TOOLS, tool_choice="none",
                                              max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    ids = live.state.engine.encode([{**m, "content": m["content"] or ""} for m in history], tools=TOOLS)
    assert "18 degrees, sunny" in live.state.engine.tokenizer.decode(ids)  # the template rendered the result


def test_engine_generate_returns_calls_in_python(live):
    r = live.state.engine.generate(ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                   max_tokens=200, temperature=0)
    assert len(r.tool_calls) == 1 and "<tool_call>" not in r.text
    jsonschema.validate(r.tool_calls[0].arguments, SCHEMAS[r.tool_calls[0].name])


def test_logprobs_on_chat_and_completions_streamed_too(live):
    c = live.openai()
    r = c.chat.completions.create(model=live.model, messages=ASK, max_tokens=6, temperature=0, logprobs=True,
                                  top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob)  # greedy: the most likely token
    streamed = list(c.chat.completions.create(model=live.model, messages=ASK, max_tokens=6, temperature=0,
                                              logprobs=True, top_logprobs=3, stream=True))
    got = [e for ch in streamed if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in content])
    t = c.completions.create(model=live.model, prompt="Once upon", max_tokens=4, temperature=0, logprobs=2)
    lp = t.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == t.usage.completion_tokens
    assert all(len(alts) <= 2 for alts in lp.top_logprobs)


def test_bad_tool_input_is_an_openai_error_naming_the_field(live):
    import openai

    c = live.openai()
    for kw, param in [(dict(tools=[{"type": "function", "function": {"name": ""}}]), "tools"),
                      (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
                      (dict(logprobs=True, top_logprobs=50), "top_logprobs")]:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=live.model, messages=ASK, max_tokens=4, **kw)
        assert e.value.body["param"] == param, e.value.body


def test_embeddings_float_and_base64_with_usage(live):
    import numpy as np

    c = live.openai()
    texts = ["my sister is allergic to peanuts", "peanut allergy in the family", "the train leaves at nine"]
    r = c.embeddings.create(model=live.model, input=texts)  # the client asks for base64 by default
    vecs = np.array([d.embedding for d in r.data])
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 0
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]  # related sentences are closer
    f = c.embeddings.create(model=live.model, input=texts[0], encoding_format="float")
    assert np.allclose(f.data[0].embedding, vecs[0], atol=1e-6)
    assert np.allclose(live.state.engine.memory.embed([texts[0]])[0], vecs[0], atol=1e-6)  # the Python API, the same
    import openai

    for body, param in [({"model": live.model, "input": [1, 2]}, "input"),
                        ({"model": live.model, "input": "x", "encoding_format": "hex"}, "encoding_format")]:
        with pytest.raises(openai.BadRequestError) as e:
            c.embeddings.create(**body)
        assert e.value.body["param"] == param
