"""Ollama's API through the real ``ollama`` client, on the tiny tool model (``tool_models.py``):
chat streamed and not (with a tool call), generate, format as a JSON schema, tags, show,
ps, version, embed, and errors as ``{"error": ...}`` naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from tool_models import WEATHER, write_tool_model

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
T0 = {"temperature": 0, "num_predict": 6}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from live_server import LiveServer
    from mlotspark.engine import Engine

    path = write_tool_model(tmp_path_factory.mktemp("ollama-model") / "tools.gguf")
    srv = LiveServer(Engine.load(str(path), progress=False, cascade=None))
    yield srv
    srv.stop()


def client(live) -> ollama.Client:
    return ollama.Client(host=live.url, timeout=120)


def test_chat_streamed_equals_chat_whole(live):
    c = client(live)
    parts = list(c.chat(model=live.model, messages=ASK, options=T0, stream=True, keep_alive="10m"))
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length") and not any(p.done for p in parts[:-1])
    whole = c.chat(model=live.model, messages=ASK, options=T0, stream=False)
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert whole.eval_count == parts[-1].eval_count and 0 < whole.eval_count <= 6 and whole.prompt_eval_count > 0
    one = c.chat(model=live.model, messages=ASK, options={**T0, "num_predict": 1}, stream=False)
    assert one.eval_count == 1 and one.eval_duration > 0  # clients divide by it: tokens per second


def test_chat_with_a_tool_call_and_a_format_schema(live):
    c = client(live)
    # A schema as 'format': the reply parses and validates (a tiny random model, held by the grammar).
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = c.chat(model=live.model, messages=ASK, format=schema, options={"temperature": 0, "num_predict": 40})
    jsonschema.validate(json.loads(r.message.content), schema)
    body = {"model": live.model, "messages": ASK, "tools": [WEATHER], "stream": False,
            "options": {"temperature": 0, "num_predict": 120}}
    # Ollama's API has no tool_choice: under auto a random model rarely calls, so the call is
    # checked on the OpenAI path; here the request is served and its shape is Ollama's.
    out = httpx.post(live.url + "/api/chat", json=body, timeout=120).json()
    assert out["done"] and out["message"]["role"] == "assistant"
    assert "<tool_call>" not in out["message"]["content"]


def test_generate_streamed_and_whole(live):
    c = client(live)
    whole = c.generate(model=live.model, prompt="Once upon a time", options=T0)
    parts = list(c.generate(model=live.model, prompt="Once upon a time", options=T0, stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = c.generate(model=live.model, prompt="Once upon a time", raw=True, options=T0)
    assert raw.done and raw.prompt_eval_count < whole.prompt_eval_count  # no chat template around it


def test_tags_show_ps_version_and_embed(live):
    c = client(live)
    names = [m.model for m in c.list().models]
    assert names == [live.model]
    shown = c.show(live.model)
    assert "tools" in shown.capabilities and shown.details.quantization_level
    running = c.ps().models
    assert [m.model for m in running] == [live.model] and running[0].size > 0
    assert httpx.get(live.url + "/api/version").json()["version"]
    e = c.embed(model=live.model + ":latest", input=["a red box", "a blue box"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == len(e.embeddings[1]) > 0


def test_bad_input_gets_ollamas_error_naming_the_field(live):
    c = client(live)
    for kw, field in [(dict(options={"temperature": -1}), "options.temperature"),
                      (dict(options={"num_predict": "many"}), "options.num_predict"),
                      (dict(think=True), "think")]:  # a model that does not reason: refused, as Ollama does
        with pytest.raises(ollama.ResponseError) as e:
            c.chat(model=live.model, messages=ASK, **kw)
        assert e.value.status_code == 400 and f"'{field}'" in e.value.error, e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="llama9:70b", messages=ASK)
    assert e.value.status_code == 404
    for body, field in [({"model": live.model, "messages": "hi"}, "messages"),
                        ({"model": live.model, "messages": ASK, "format": "xml"}, "format"),
                        ({"model": live.model, "messages": ASK, "format": {"type": "array", "minItems": 5,
                                                                           "maxItems": 2}}, "format")]:
        r = httpx.post(live.url + "/api/chat", json=body)
        assert r.status_code == 400 and set(r.json()) == {"error"} and f"'{field}'" in r.json()["error"], r.json()
