"""``mlotspark serve`` on a tiny model with the R1 distill's real tokenizer and template
(``r1_tiny_server``): through the real openai, anthropic and ollama clients, streamed and
whole, the thinking comes in each API's own field and never in the answer."""

from __future__ import annotations

import pytest

from model_cache import R1_TINY_ANSWER, R1_TINY_THOUGHT

ASK = [{"role": "user", "content": "Two and two?"}]


def _clean(answer: str) -> None:
    assert answer == R1_TINY_ANSWER
    assert "think" not in answer and "sum" not in answer


# ------------------------------------------------------------------------------- OpenAI
def test_openai_whole_reply_has_reasoning_content_and_reasoning(r1_tiny_server):
    r = r1_tiny_server.openai().chat.completions.create(model=r1_tiny_server.model, messages=ASK, max_tokens=32)
    m = r.choices[0].message
    _clean(m.content)
    assert m.model_extra["reasoning_content"] == R1_TINY_THOUGHT == m.model_extra["reasoning"]
    assert r.choices[0].finish_reason == "stop"


def test_openai_stream_sends_the_thinking_in_its_own_delta_field(r1_tiny_server):
    chunks = list(r1_tiny_server.openai().chat.completions.create(model=r1_tiny_server.model, messages=ASK,
                                                                   max_tokens=32, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    answer = "".join(d.content or "" for d in deltas)
    assert thought == R1_TINY_THOUGHT
    _clean(answer)
    assert all(not (d.content and (d.model_extra or {}).get("reasoning_content")) for d in deltas)


def test_openai_budget_and_thinking_off(r1_tiny_server):
    c = r1_tiny_server.openai()
    short = c.chat.completions.create(model=r1_tiny_server.model, messages=ASK, max_tokens=32,
                                      extra_body={"reasoning_budget": 2})
    assert short.choices[0].message.model_extra["reasoning_content"] == "Okay"
    _clean(short.choices[0].message.content)
    off = c.chat.completions.create(model=r1_tiny_server.model, messages=ASK, max_tokens=32, reasoning_effort="minimal")
    assert not (off.choices[0].message.model_extra or {}).get("reasoning_content")
    _clean(off.choices[0].message.content)


def test_openai_a_bad_effort_is_refused_naming_it(r1_tiny_server):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        r1_tiny_server.openai().chat.completions.create(model=r1_tiny_server.model, messages=ASK, max_tokens=4,
                                                        extra_body={"reasoning_effort": "huge"})
    assert "reasoning_effort" in str(e.value) and "huge" in str(e.value)


# ---------------------------------------------------------------------------- Anthropic
def test_anthropic_whole_reply_has_a_thinking_block_first(r1_tiny_server):
    r = r1_tiny_server.anthropic().messages.create(model=r1_tiny_server.model, messages=ASK, max_tokens=32)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == R1_TINY_THOUGHT
    _clean(r.content[1].text)
    assert r.stop_reason == "end_turn"


def test_anthropic_stream_assembles_the_same_blocks(r1_tiny_server):
    c = r1_tiny_server.anthropic()
    with c.messages.stream(model=r1_tiny_server.model, messages=ASK, max_tokens=32) as s:
        events = list(s)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == R1_TINY_THOUGHT
    _clean(final.content[1].text)
    kinds = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in kinds and kinds.index("text_delta") > max(i for i, k in enumerate(kinds) if k == "thinking_delta")


def test_anthropic_thinking_settings_and_history_with_thinking(r1_tiny_server):
    c = r1_tiny_server.anthropic()
    short = c.messages.create(model=r1_tiny_server.model, messages=ASK, max_tokens=32,
                              thinking={"type": "enabled", "budget_tokens": 2})
    assert short.content[0].thinking == "Okay"
    off = c.messages.create(model=r1_tiny_server.model, messages=ASK, max_tokens=32, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    _clean(off.content[0].text)
    # what a client sends back next turn: its earlier thinking block, which is dropped
    history = ASK + [{"role": "assistant", "content": [b.model_dump() for b in short.content]},
                     {"role": "user", "content": "And three and three?"}]
    again = c.messages.create(model=r1_tiny_server.model, messages=history, max_tokens=32)
    _clean(again.content[-1].text)


# ------------------------------------------------------------------------------- Ollama
def test_ollama_chat_thinking_streamed_and_whole(r1_tiny_server):
    c = r1_tiny_server.ollama()
    whole = c.chat(model=r1_tiny_server.model, messages=ASK, stream=False, think=True)
    assert whole.message.thinking == R1_TINY_THOUGHT
    _clean(whole.message.content)
    parts = list(c.chat(model=r1_tiny_server.model, messages=ASK, stream=True, think=True))
    assert "".join(p.message.thinking or "" for p in parts) == R1_TINY_THOUGHT
    _clean("".join(p.message.content or "" for p in parts))
    off = c.chat(model=r1_tiny_server.model, messages=ASK, stream=False, think=False)
    assert not off.message.thinking
    _clean(off.message.content)


def test_ollama_generate_thinking_and_capabilities(r1_tiny_server):
    c = r1_tiny_server.ollama()
    r = c.generate(model=r1_tiny_server.model, prompt="Two and two?", stream=False)
    assert r.thinking == R1_TINY_THOUGHT
    _clean(r.response)
    assert "thinking" in c.show(r1_tiny_server.model).capabilities


def test_a_text_completion_drops_the_thinking_from_its_text(r1_tiny_server):
    c = r1_tiny_server.openai()
    prompt = "<｜User｜>Two and two?<｜Assistant｜>"  # the R1 template's own turn markers, sent raw
    whole = c.completions.create(model=r1_tiny_server.model, prompt=prompt, max_tokens=32)
    _clean(whole.choices[0].text)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(model=r1_tiny_server.model, prompt=prompt,
                                                                           max_tokens=32, stream=True) if ch.choices)
    _clean(streamed)


def test_a_resent_history_reuses_the_prompt_cache_up_to_the_dropped_thinking(r1_tiny_engine):
    """The template drops the first answer's thinking from the resent history: the prompt
    cache serves the KV up to where the two renderings part (the first prompt), no further."""
    from live_server import LiveServer

    from mlotspark import Engine, GenerationOptions
    from mlotspark.server import PromptCache

    engine = Engine(r1_tiny_engine.loaded, GenerationOptions(temperature=0.0, max_tokens=32))
    srv = LiveServer(engine, prompt_cache=PromptCache(engine, budget_mb=64, persist=False))
    try:
        c = srv.openai()
        ask = [{"role": "user", "content": "What do two and two make? Answer in one word, please."}]
        first = c.chat.completions.create(model=srv.model, messages=ask, max_tokens=32)
        history = ask + [{"role": "assistant", "content": first.choices[0].message.content,
                          "reasoning_content": first.choices[0].message.model_extra["reasoning_content"]},
                         {"role": "user", "content": "And three and three?"}]
        second = c.chat.completions.create(model=srv.model, messages=history, max_tokens=32)
        _clean(second.choices[0].message.content)
        assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
        assert second.usage.prompt_tokens > first.usage.prompt_tokens + 3
    finally:
        srv.stop()


# ---------------------------------------------------------------------------- Responses
def test_responses_reasoning_item_whole_and_streamed(r1_tiny_server):
    c = r1_tiny_server.openai()
    r = c.responses.create(model=r1_tiny_server.model, input=ASK[0]["content"], max_output_tokens=32, store=False)
    kinds = [o.type for o in r.output]
    assert kinds[0] == "reasoning" and "message" in kinds, kinds
    assert r.output[0].content[0].text == R1_TINY_THOUGHT
    _clean(r.output_text)
    with c.responses.stream(model=r1_tiny_server.model, input=ASK[0]["content"], max_output_tokens=32,
                            store=False) as s:
        events = list(s)
        final = s.get_final_response()
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert thought == R1_TINY_THOUGHT and answer == final.output_text
    _clean(answer)
    assert [o.type for o in final.output] == kinds


def test_responses_effort_minimal_turns_the_thinking_off(r1_tiny_server):
    r = r1_tiny_server.openai().responses.create(model=r1_tiny_server.model, input=ASK[0]["content"],
                                                 max_output_tokens=32, reasoning={"effort": "minimal"}, store=False)
    assert [o.type for o in r.output] == ["message"]
    _clean(r.output_text)
