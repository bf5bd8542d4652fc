"""OpenAI's Responses API (``/v1/responses``) through the real ``openai`` client on the tiny
tool model (``tool_models.py``; shapes, events and the store, not what a model says): plain
and streamed responses, a function-call round trip, stored responses (GET, DELETE,
``previous_response_id`` reusing the chain's KV snapshot, across a restart), the store's
disk budget, bad fields, and Anthropic's ``count_tokens`` through the real ``anthropic`` client."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tool_models import TIME, WEATHER, write_tool_model

TOOLS = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
T0 = {"temperature": 0}


def _server(path, **state):
    from live_server import LiveServer
    from mlotspark.engine import Engine

    return LiveServer(Engine.load(str(path), progress=False, cascade=None), **state)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tool_model(tmp_path_factory.mktemp("responses-model") / "tools.gguf")


@pytest.fixture(scope="module")
def live(model_path, tmp_path_factory):
    from mlotspark.server.response_store import ResponseStore

    srv = _server(model_path, response_store=ResponseStore(tmp_path_factory.mktemp("responses-store")))
    yield srv
    srv.stop()


def test_a_plain_response_is_stored_and_can_be_read_and_deleted(live):
    c = live.openai()
    r = c.responses.create(model=live.model, input="Hello there", instructions="Be brief.", max_output_tokens=4,
                           extra_body=T0)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.id.startswith("resp_")
    (msg,) = r.output
    assert msg.type == "message" and msg.content[0].type == "output_text" and r.output_text == msg.content[0].text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 4
    assert r.instructions == "Be brief." and r.max_output_tokens == 4
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    again = c.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == r.output_text
    items = c.responses.input_items.list(r.id)
    assert [(i.role, i.content[0].text) for i in items.data] == [("user", "Hello there")]
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)
    chains = live.state.response_store.stats()["chains"]
    unstored = c.responses.create(model=live.model, input="Hi", max_output_tokens=2, store=False, extra_body=T0)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)
    assert live.state.response_store.stats()["chains"] == chains  # nor is its KV kept


def test_streaming_follows_the_responses_event_sequence(live):
    c = live.openai()
    with c.responses.create(model=live.model, input="Tell me a story", max_output_tokens=6, stream=True,
                            extra_body=T0) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"], kinds  # six tokens of a story: cut by max_output_tokens
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.status == "incomplete" and final.usage.output_tokens == 6
    assert c.responses.retrieve(final.id).output_text == text


def test_a_function_call_round_trip(live):
    c = live.openai()
    r = c.responses.create(model=live.model, input="What is the weather in Paris?", tools=TOOLS,
                           tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
                           max_output_tokens=200, extra_body=T0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and r.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    follow = c.responses.create(model=live.model, previous_response_id=r.id, tools=TOOLS,
                                input=[{"type": "function_call_output", "call_id": call.call_id,
                                        "output": "18 degrees, sunny"}], max_output_tokens=3, extra_body=T0)
    assert follow.previous_response_id == r.id and follow.output[0].type == "message"
    counted = c.responses.input_tokens.count(model=live.model, previous_response_id=r.id, tools=TOOLS,
                                             input=[{"type": "function_call_output", "call_id": call.call_id,
                                                     "output": "18 degrees, sunny"}])
    assert counted.input_tokens == follow.usage.input_tokens
    # The follow-up continued the stored chain: its history's KV came from the snapshot (or the prompt cache).
    assert follow.usage.input_tokens_details.cached_tokens > r.usage.input_tokens // 2
    # The same round trip with the whole history sent back as items, streamed.
    history = [{"role": "user", "content": "What is the weather in Paris?"}, *[o.model_dump() for o in r.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}]
    with c.responses.stream(model=live.model, input=history, tools=TOOLS, max_output_tokens=200, extra_body=T0,
                            tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert call.name == "get_time" and json.loads(call.arguments)["zone"] in ("UTC", "CET")
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"


def test_json_schema_output_is_valid(live):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = live.openai().responses.create(
        model=live.model, input="A number, please", max_output_tokens=40, extra_body=T0,
        text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}})
    if r.status == "completed":
        jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize("kw, field", [
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "hi", "reasoning": {"effort": "maximal"}}, "reasoning.effort"),
    ({"input": "hi", "previous_response_id": "resp_" + "0" * 48}, "previous_response_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]}, "input[0].call_id"),
    ({"input": "hi", "temperature": 3}, "temperature"),
])
def test_a_bad_field_is_a_400_naming_it(live, kw, field):
    with pytest.raises(openai.BadRequestError) as e:
        live.openai().responses.create(model=live.model, **kw)
    err = e.value.body
    assert err["param"] == field and f"'{field}'" in err["message"] and "\n" not in err["message"], err


def test_reasoning_effort_is_accepted(live):
    r = live.openai().responses.create(model=live.model, input="Hi", max_output_tokens=2,
                                       reasoning={"effort": "low"}, extra_body=T0)
    assert r.reasoning.effort == "low" and r.output[-1].type == "message"


def test_previous_response_id_survives_a_restart_and_reuses_the_snapshot(model_path, tmp_path):
    from mlotspark.server.response_store import ResponseStore

    where = tmp_path / "store"
    srv = _server(model_path, response_store=ResponseStore(where))
    try:
        c = srv.openai()
        first = c.responses.create(model=srv.model, input="Remember the word 'teapot'. " * 10, max_output_tokens=3,
                                   extra_body=T0)
        second = c.responses.create(model=srv.model, previous_response_id=first.id, input="And now?",
                                    max_output_tokens=3, extra_body=T0)
    finally:
        srv.stop()
    assert second.usage.input_tokens > first.usage.input_tokens
    assert list((where / "kv").glob("*/*/snapshot.json")), "the chain's KV snapshot is on disk"
    srv = _server(model_path, response_store=ResponseStore(where))  # no prompt cache: only the snapshot can help
    try:
        c = srv.openai()
        assert c.responses.retrieve(second.id).output_text == second.output_text
        third = c.responses.create(model=srv.model, previous_response_id=second.id, input="Which word?",
                                   max_output_tokens=3, extra_body=T0)
        assert third.usage.input_tokens > second.usage.input_tokens
        assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens - 1
        assert third.model_extra["mlotspark"]["prefilled_tokens"] < third.usage.input_tokens // 3
        # The same turn forked from the first response: a chain of its own, warm from the shared prefix.
        fork = c.responses.create(model=srv.model, previous_response_id=first.id, input="Something else",
                                  max_output_tokens=2, extra_body=T0)
        assert fork.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 2
        assert len(list((where / "kv").glob("*/*/snapshot.json"))) == 2
        # Deleting a response drops its chain's snapshot; a later turn of the chain is refused by name.
        c.responses.delete(second.id)
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model=srv.model, previous_response_id=third.id, input="x", max_output_tokens=2)
        assert e.value.body["param"] == "previous_response_id" and second.id in e.value.body["message"]
    finally:
        srv.stop()


def test_snapshots_keep_within_the_store_budget(model_path, tmp_path):
    import httpx

    from mlotspark.server.response_store import ResponseStore

    store = ResponseStore(tmp_path / "store", budget_bytes=10**9)
    srv = _server(model_path, response_store=store)
    try:
        c = srv.openai()
        one = c.responses.create(model=srv.model, input="chain x", max_output_tokens=2, extra_body=T0)
        size = store.stats()["snapshot_bytes"]
        assert size > 0
        store.budget_bytes = int(size * 2.5)  # room for two chains like it
        ids = [one.id] + [c.responses.create(model=srv.model, input=f"chain {i}", max_output_tokens=2,
                                             extra_body=T0).id for i in range(3)]
        stats = httpx.get(srv.url + "/health").json()["response_store"]
        assert stats["chains"] == 2 and stats["evicted"] == 2 and stats["snapshot_bytes"] <= stats["budget_bytes"]
        kept = {p.parent.name for p in (tmp_path / "store" / "kv").glob("*/*/snapshot.json")}
        assert kept == set(ids[2:]), "the oldest chains' snapshots went first"
        # Their responses stay: a later turn of an evicted chain prefills cold, and works.
        later = c.responses.create(model=srv.model, previous_response_id=one.id, input="more", max_output_tokens=2,
                                   extra_body=T0)
        assert later.usage.input_tokens_details.cached_tokens == 0 and later.status in ("completed", "incomplete")
    finally:
        srv.stop()


def test_anthropic_count_tokens_matches_the_prompt_a_message_reads(live):
    c = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    counted = c.messages.count_tokens(model=live.model, system="Be brief.", messages=ask)
    sent = c.messages.create(model=live.model, system="Be brief.", messages=ask, max_tokens=1, extra_body=T0)
    assert counted.input_tokens == sent.usage.input_tokens + (sent.usage.cache_read_input_tokens or 0)
    with_tools = c.messages.count_tokens(model=live.model, messages=ask, tools=tools)
    assert with_tools.input_tokens > counted.input_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.count_tokens(model=live.model, messages=[])
    assert "'messages'" in e.value.body["error"]["message"]


def test_the_serve_benchmarks_responses_chain_runs_against_the_api(live):
    from mlotspark.bench.serve import responses_chain

    got = responses_chain(live.url, live.model, seed=7, turns=2, words=60)
    assert len(got["turns_s"]) == 2 and got["warm_s"] == got["turns_s"][-1] and got["cold_s"] > 0


def test_a_reply_with_reasoning_has_a_reasoning_item_first():
    import types

    from mlotspark.results import ToolCall
    from mlotspark.server.responses import Choice
    from mlotspark.server.responses_routes import output_items
    from mlotspark.server.runner import Outcome

    call = ToolCall("call_1", "get_time", {"zone": "UTC"})
    outcome = Outcome([Choice("", "stop", [call], reasoning="UTC, then.")], 10, 5, 0, types.SimpleNamespace())
    reasoning, fc = output_items(outcome)
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text", "text": "UTC, then."}]
    assert (fc["type"], fc["call_id"], json.loads(fc["arguments"])) == ("function_call", "call_1", {"zone": "UTC"})
    (msg,) = output_items(Outcome([Choice("Hi", "length")], 3, 1, 0, None))
    assert msg["type"] == "message" and msg["status"] == "incomplete" and msg["content"][0]["text"] == "Hi"


def test_a_store_that_cannot_be_written_still_answers_and_says_it_was_not_kept(live, tmp_path):
    from mlotspark.server.response_store import ResponseStore

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    kept, live.state.response_store = live.state.response_store, ResponseStore(blocker / "store")
    try:
        c = live.openai()
        r = c.responses.create(model=live.model, input="Hi", max_output_tokens=2, extra_body=T0)
        assert r.store is False and r.output[0].type == "message"
        with c.responses.create(model=live.model, input="Hi", max_output_tokens=2, stream=True,
                                extra_body=T0) as s:
            last = list(s)[-1]
        assert last.type in ("response.completed", "response.incomplete") and last.response.store is False
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
    finally:
        live.state.response_store.close()
        live.state.response_store = kept
