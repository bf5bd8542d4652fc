"""mlotspark serve without a model: request checks, the bind rule, the API key, the
queue bound (503 + Retry-After) and OpenAI-shaped errors, on a fake engine."""

from __future__ import annotations

import threading
import types

import pytest
from starlette.testclient import TestClient

from mlotspark.cli.entry import main
from mlotspark.cli.serve import check_bind, is_loopback
from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions
from mlotspark.server import APIError, ServerState, create_app
from mlotspark.server.schemas import MAX_N, parse_chat, parse_completion

MODEL = "tiny-model"
OK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


class FakeEngine:
    """What the app reads of an Engine; requests never reach it in these tests."""

    model_name = MODEL
    device = "cpu"
    defaults = GenerationOptions()
    persistence = types.SimpleNamespace(opened=False)

    def __init__(self, cap: int = 1):
        self.loaded = types.SimpleNamespace(weights="float32", context_length=8192, fingerprint="f" * 16,
                                            nbytes=lambda: 0)
        self.scheduling = types.SimpleNamespace(max_batch=cap)
        gov = types.SimpleNamespace(status=lambda last=0: {"cap": cap})
        self.scheduler = types.SimpleNamespace(governor=gov)
        self.closed = threading.Event()

    def status(self) -> dict:
        return {"state": "nominal", "cap": 1, "mode": "balanced", "batch_size": 0, "running": 0,
                "prefilling": 0, "queued": 0, "decode_tps": 0.0, "kv_bytes": 0}

    def close(self) -> None:
        self.closed.set()


class HeldSlot:
    def fail(self, error: APIError) -> None:
        pass


def client(**kw) -> tuple[TestClient, ServerState]:
    state = ServerState(FakeEngine(), **kw)
    return TestClient(create_app(state)), state


@pytest.mark.parametrize("body, param", [
    ({**OK, "model": 3}, "model"),
    ({**OK, "messages": []}, "messages"),
    ({**OK, "messages": "hi"}, "messages"),
    ({**OK, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({**OK, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**OK, "max_tokens": -1}, "max_tokens"),
    ({**OK, "max_tokens": "10"}, "max_tokens"),
    ({**OK, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({**OK, "temperature": 3}, "temperature"),
    ({**OK, "top_p": 0}, "top_p"),
    ({**OK, "n": MAX_N + 1}, "n"),
    ({**OK, "n": 2, "stream": True}, "n"),
    ({**OK, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**OK, "presence_penalty": 0.5}, "presence_penalty"),
    ({**OK, "logit_bias": {"9707": -100}}, "logit_bias"),  # refused, never ignored
    ({**OK, "logit_bias": [1]}, "logit_bias"),
    ({**OK, "messages": [{"role": "tool", "content": "18 C"}]}, "messages[0].tool_call_id"),
    ({**OK, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({**OK, "top_logprobs": 2}, "top_logprobs"),
    ({**OK, "logprobs": 3}, "logprobs"),
    ({**OK, "tools": [{"type": "function"}]}, "tools"),
    ({**OK, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, "tool_choice"),
    ({**OK, "tool_choice": "required"}, "tool_choice"),
    ({**OK, "messages": [{"role": "assistant", "content": None,
                          "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({**OK, "stream": "yes"}, "stream"),
    ({**OK, "response_format": {"type": "xml"}}, "response_format"),
    ({**OK, "seed": -4}, "seed"),
])
def test_a_bad_chat_field_is_named(body, param):
    with pytest.raises(APIError) as e:
        parse_chat(body, [MODEL])
    assert e.value.status == 400 and e.value.param == param and param.split("[")[0] in e.value.message


def test_an_unknown_model_is_a_404_naming_the_served_one():
    with pytest.raises(APIError) as e:
        parse_chat({**OK, "model": "gpt-4"}, [MODEL])
    assert e.value.status == 404 and e.value.code == "model_not_found" and MODEL in e.value.message


def test_requests_map_to_generation_options():
    req = parse_chat({**OK, "max_completion_tokens": 9, "temperature": 0, "top_p": 0.5, "seed": 3,
                      "stop": "x", "frequency_penalty": 0, "stream": True,
                      "stream_options": {"include_usage": True},
                      "response_format": {"type": "json_object"}}, [MODEL])
    assert req.stream and req.include_usage
    opts = GenerationOptions().merged(**req.options)  # every mapped option is a valid engine option
    assert (opts.max_tokens, opts.temperature, opts.top_p, opts.seed, opts.stop) == (9, 0.0, 0.5, 3, ("x",))
    assert opts.response_format == {"type": "json_object"}
    c = parse_completion({"model": MODEL, "prompt": ["Once"]}, [MODEL])
    assert c.prompt == "Once" and c.options["max_tokens"] == 16  # OpenAI's completions default
    with pytest.raises(APIError, match="prompt"):
        parse_completion({"model": MODEL, "prompt": [1, "a"]}, [MODEL])


def test_response_format_with_several_returns_is_refused():
    with pytest.raises(OptionError, match="response_format"):
        GenerationOptions(response_format={"type": "json_object"}, num_return_sequences=2)


def test_a_non_loopback_host_needs_an_api_key(capsys):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.8.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    check_bind("0.0.0.0", 8080, "secret")
    with pytest.raises(OptionError, match="without --api-key"):
        check_bind("0.0.0.0", 8080, None)
    assert main(["serve", "--host", "0.0.0.0"]) == 2  # refused before any model loads
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to listen on 0.0.0.0 without --api-key" in err[0]


def test_errors_are_openai_shaped_and_the_key_is_checked():
    c, _ = client(api_key="sekret")
    with c:
        r = c.post("/v1/chat/completions", json=OK)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        auth = {"Authorization": "Bearer sekret"}
        assert c.get("/v1/models", headers=auth).json()["data"][0]["id"] == MODEL
        assert c.get("/health").status_code == 200  # open: liveness probes carry no key
        r = c.post("/v1/chat/completions", content=b"{not json", headers=auth)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = c.get("/v1/nothing", headers=auth)
        assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert "mlotspark_requests_total" in c.get("/metrics").text


def test_a_full_queue_answers_503_with_retry_after():
    c, state = client(max_queue=0)
    with c:
        state.jobs.add(HeldSlot())  # one request holds the only batch slot
        r = c.post("/v1/chat/completions", json=OK)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        assert "mlotspark_rejected_requests_total 1.0" in c.get("/metrics").text
    assert state.engine.closed.is_set()  # the lifespan's exit closed the engine


def test_prompt_cache_keeps_the_longest_history_and_survives_a_restart():
    import mlx.core as mx

    from mlotspark.memory.cascade import CascadeConfig
    from mlotspark.caches.kv import KVCache
    from mlotspark.options import GenerationOptions
    from mlotspark.server import PromptCache
    from tiny import tiny_model

    model = tiny_model()
    engine = types.SimpleNamespace(loaded=types.SimpleNamespace(fingerprint="tiny", weights="float32",
                                                               context_length=512),
                                   # engine.caches.cascade_for under "auto": a KV cache while prompt + max_tokens fit
                                   caches=types.SimpleNamespace(
                                       cascade_for=lambda n, options: None if n + options.max_tokens <= 512 else
                                       CascadeConfig.for_model(512)))

    def run(ids):
        cache = [KVCache() for _ in model.layers]
        model(mx.array(ids)[None], cache=cache)
        return cache

    turn1 = list(range(1, 41))
    turn2 = turn1 + list(range(100, 120))
    pc = PromptCache(engine, budget_mb=64)
    assert pc.take(turn1, GenerationOptions(max_tokens=8)) == (None, 0)
    assert pc.add(turn1, run(turn1)) and pc.add(turn2, run(turn2))
    assert list(pc.cache.entries) == [tuple(turn2)]  # turn 2 extends turn 1: one entry left
    cache, n = pc.take(turn2 + [7, 8, 9], GenerationOptions(max_tokens=8))
    assert n == len(turn2) and cache[0].offset == n
    assert pc.take(turn2, GenerationOptions(max_tokens=600))[1] == 0  # would pass the context: left to the cascade
    pc.save()
    again = PromptCache(engine, budget_mb=64)  # a restarted server
    assert again.load() == 1 and again.take(turn2 + [5], GenerationOptions(max_tokens=8))[1] == len(turn2)
