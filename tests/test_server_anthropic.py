"""Anthropic's Messages API through the real ``anthropic`` client, on the tiny tool model
(``tool_models.py``): messages, the streaming event sequence, a tool_use round trip, the
API key as ``x-api-key`` and errors in Anthropic's shape naming the field."""

from __future__ import annotations

import anthropic
import jsonschema
import pytest

from tool_models import TIME, WEATHER, write_tool_model

KEY = "sekret"
TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
T0 = {"temperature": 0}  # the client of late 2026 has no temperature argument; older ones send it


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from live_server import LiveServer
    from mlotspark.engine import Engine

    path = write_tool_model(tmp_path_factory.mktemp("anthropic-model") / "tools.gguf")
    srv = LiveServer(Engine.load(str(path), progress=False, cascade=None), api_key=KEY)
    yield srv
    srv.stop()


def client(live, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key=key, max_retries=0, timeout=120)


def test_a_message_with_system_and_usage(live):
    r = client(live).messages.create(model=live.model, system="Be brief.", messages=ASK, max_tokens=5,
                                     extra_body=T0)
    assert r.type == "message" and r.role == "assistant" and r.content[0].type == "text"
    assert r.stop_reason in ("end_turn", "max_tokens") and r.usage.input_tokens > 0
    assert 0 < r.usage.output_tokens <= 5


def test_cached_input_is_counted_apart_and_mlotspark_figures_come_along(tmp_path, monkeypatch):
    from live_server import LiveServer
    from mlotspark.engine import Engine
    from mlotspark.server import PromptCache

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path))
    engine = Engine.load(str(write_tool_model(tmp_path / "tools.gguf")), progress=False, cascade=None)
    srv = LiveServer(engine, prompt_cache=PromptCache(engine, budget_mb=64, persist=False))
    try:
        c = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=120)
        first = c.messages.create(model=srv.model, system="Be brief. " * 20, messages=ASK, max_tokens=3, extra_body=T0)
        again = c.messages.create(model=srv.model, system="Be brief. " * 20, messages=ASK, max_tokens=3, extra_body=T0)
        assert first.usage.cache_read_input_tokens == 0 and again.usage.cache_read_input_tokens > 0
        # Anthropic's input_tokens leave out what was read from the cache: the two add up to the prompt.
        assert again.usage.input_tokens + again.usage.cache_read_input_tokens == first.usage.input_tokens
        assert again.model_extra["mlotspark"]["cached_tokens"] == again.usage.cache_read_input_tokens
    finally:
        srv.stop()


def test_streaming_follows_anthropics_event_sequence(live):
    with client(live).messages.stream(model=live.model, messages=ASK, max_tokens=6, extra_body=T0) as s:
        seen = list(s)
        final = s.get_final_message()
    events = [e.type for e in seen]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events and "message_delta" in events
    whole = client(live).messages.create(model=live.model, messages=ASK, max_tokens=6, extra_body=T0)
    assert final.content[0].text == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens
    # the closing counts split the prompt as a whole reply's do: read from the cache, and not
    u, w = final.usage, whole.usage
    assert u.input_tokens + u.cache_read_input_tokens == w.input_tokens + w.cache_read_input_tokens
    delta = next(e for e in seen if e.type == "message_delta")
    assert delta.model_extra["mlotspark"]["cached_tokens"] == u.cache_read_input_tokens


def test_a_tool_use_round_trip(live):
    c = client(live)
    r = c.messages.create(model=live.model, messages=ASK, tools=TOOLS, max_tokens=200, extra_body=T0,
                          tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert r.stop_reason == "tool_use"
    (use,) = [b for b in r.content if b.type == "tool_use"]
    schema = next(t["input_schema"] for t in TOOLS if t["name"] == use.name)
    jsonschema.validate(use.input, schema)
    history = ASK + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "18 degrees, sunny"}]}]
    again = c.messages.create(model=live.model, messages=history, tools=TOOLS, max_tokens=4, extra_body=T0,
                              tool_choice={"type": "none"})
    assert again.content[0].type == "text" and again.stop_reason in ("end_turn", "max_tokens")
    with c.messages.stream(model=live.model, messages=ASK, tools=TOOLS, max_tokens=200, extra_body=T0,
                           tool_choice={"type": "tool", "name": "get_time",
                                        "disable_parallel_tool_use": True}) as s:
        final = s.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert use.name == "get_time" and use.input["zone"] in ("UTC", "CET") and final.stop_reason == "tool_use"


def test_errors_are_anthropic_shaped_and_name_the_field(live):
    with pytest.raises(anthropic.AuthenticationError):
        client(live, key="wrong").messages.create(model=live.model, messages=ASK, max_tokens=4)
    c = client(live)
    for kw, field in [(dict(max_tokens=0), "max_tokens"),
                      (dict(max_tokens=4, extra_body={"temperature": 1.5}), "temperature"),
                      (dict(max_tokens=4, stop_sequences=[""]), "stop_sequences"),
                      (dict(max_tokens=4, messages=[{"role": "user", "content": [{"type": "image"}]}]),
                       "messages[0].content[0].type"),
                      (dict(max_tokens=4, tools=[{"name": "f"}]), "tools[0].input_schema"),
                      (dict(max_tokens=4, messages=[{"role": "user", "content": [
                          {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "18 C"}]}]),
                       "messages[0].content[0].tool_use_id")]:
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(**{"model": live.model, "messages": ASK, **kw})
        body = e.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert f"'{field}'" in body["error"]["message"], body
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="claude-nope", messages=ASK, max_tokens=4)


def test_a_stop_sequence_is_reported_as_anthropic_does(live):
    c = client(live)
    whole = c.messages.create(model=live.model, messages=ASK, max_tokens=12, extra_body=T0).content[0].text
    assert len(whole) >= 4, whole
    stop = whole[len(whole) // 2:][:2]  # two characters from the middle of the greedy reply
    cut = whole[:whole.index(stop)]
    stops = ["never in a reply \u2603", stop]
    r = c.messages.create(model=live.model, messages=ASK, max_tokens=12, stop_sequences=stops, extra_body=T0)
    assert (r.stop_reason, r.stop_sequence, r.content[0].text) == ("stop_sequence", stop, cut)
    with c.messages.stream(model=live.model, messages=ASK, max_tokens=12, stop_sequences=stops,
                           extra_body=T0) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", stop, cut)
    other = c.messages.create(model=live.model, messages=ASK, max_tokens=3, stop_sequences=stops[:1], extra_body=T0)
    assert (other.stop_reason, other.stop_sequence) == ("max_tokens", None)
