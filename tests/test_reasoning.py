"""Reasoning kept apart from the answer, on DeepSeek-R1-Distill-Qwen's own vocabulary and
chat template (read from its GGUF header: ``model_cache.r1_distill_tokenizer_json``):
the format is found from the template, the split holds at every chunk boundary, and the
budget forces the close tag."""

from __future__ import annotations

import mlx.core as mx
import pytest

THOUGHT = "The user asks for 17 × 3. 17 × 3 = 51 — check: 50 + 1. Not </thin or <think either."
ANSWER = "**51**. 北京 is Beijing; emoji 🚀 too."
REPLY = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"


@pytest.fixture(scope="module")
def r1(r1_tokenizer_real):
    return r1_tokenizer_real


@pytest.fixture(scope="module")
def fmt(r1):
    from mlotspark.decoding.reasoning import reasoning_format

    f = reasoning_format(r1)
    assert f is not None
    return f


def _run(fmt, pieces, thinking=False):
    from mlotspark.decoding.reasoning import ReasoningSplitter

    s = ReasoningSplitter(fmt, thinking)
    out = [s.feed(p) for p in pieces] + [s.close()]
    return out


def test_the_r1_template_is_found_a_reasoning_model_with_one_token_tags(r1, fmt):
    assert (fmt.start, fmt.end) == ("<think>", "</think>")
    assert len(fmt.start_ids) == len(fmt.end_ids) == 1
    assert r1.decode(list(fmt.end_ids)) == "</think>"
    assert fmt.switch is None  # this template cannot turn thinking off


def test_models_whose_template_never_closes_a_think_block_do_not_think(r1):
    from mlotspark.decoding.reasoning import reasoning_format

    class Plain:  # the R1 vocabulary (it has the tags) under a template without them
        has_thinking, think_start, think_end = True, r1.think_start, r1.think_end
        chat_template = r1.chat_template.replace("</think>", "")

    assert reasoning_format(Plain()) is None


def test_the_r1_generation_prompt_leaves_the_block_to_the_model(r1, fmt):
    from mlotspark.decoding.reasoning import starts_thinking
    from mlotspark.models.tokenizer import encode_chat

    ids = encode_chat(r1, [{"role": "user", "content": "17 × 3?"}])
    assert not starts_thinking(fmt, ids)
    # A template that opens the block in the prompt (later R1 revisions, Qwen3) ends the
    # prompt with the start tag: the reply starts inside it.
    opened = ids + r1.encode("<think>\n", add_special_tokens=False)
    assert starts_thinking(fmt, opened)
    closed = opened + r1.encode("\n</think>\n\n", add_special_tokens=False)
    assert not starts_thinking(fmt, closed)


@pytest.mark.parametrize("thinking", [False, True])
def test_split_at_every_chunk_boundary(fmt, thinking):
    """Every cut of the reply into two and into three pieces: the reasoning and the answer
    come out whole, and no answer piece ever holds thinking text or a tag fragment."""
    reply = REPLY[len("<think>"):] if thinking else REPLY
    n = len(reply)
    cuts = [(i,) for i in range(n + 1)] + [(i, j) for i in range(0, n + 1, 3) for j in range(i, n + 1, 2)]
    for cut in cuts:
        bounds = (0, *cut, n)
        pieces = [reply[a:b] for a, b in zip(bounds, bounds[1:])]
        out = _run(fmt, pieces, thinking)
        assert "".join(r for r, _ in out) == THOUGHT, cut
        assert "".join(a for _, a in out) == ANSWER, cut
        for r, a in out:
            assert "think>" not in r and "think>" not in a
            assert not a or ANSWER.startswith(a) or a in ANSWER
            # thinking text never reaches an answer piece
            assert not any(w in a for w in ("17 × 3", "check", "</"))


@pytest.mark.parametrize("size", [1, 2, 5])
def test_split_streamed_token_by_token_through_the_real_detokenizer(r1, fmt, size):
    ids = r1.encode(REPLY, add_special_tokens=False)
    assert fmt.end_ids[0] in ids  # the tags are one token each in this vocabulary
    d = r1.detokenizer
    d.reset()
    pieces, seen = [], 0
    for i in range(0, len(ids), size):
        for t in ids[i:i + size]:
            d.add_token(t)
        pieces.append(d.text[seen:])
        seen = len(d.text)
    d.finalize()
    pieces.append(d.text[seen:])
    out = _run(fmt, pieces)
    assert "".join(r for r, _ in out) == THOUGHT
    assert "".join(a for _, a in out) == ANSWER


def test_a_reply_without_thinking_is_left_as_written(fmt):
    from mlotspark.decoding.reasoning import split_reasoning

    assert split_reasoning(fmt, "  Hello <thin") == ("", "  Hello <thin")
    assert split_reasoning(fmt, "Paris. <think>not thinking</think>") == ("", "Paris. <think>not thinking</think>")
    assert split_reasoning(fmt, "<thi") == ("", "<thi")  # the reply ended: the start was no tag


def test_a_reply_cut_short_while_thinking_is_all_reasoning(fmt):
    from mlotspark.decoding.reasoning import split_reasoning

    assert split_reasoning(fmt, "<think>\nStill going </thi") == ("Still going", "")
    assert split_reasoning(fmt, "Still going\n", thinking=True) == ("Still going", "")


def test_the_budget_forces_the_close_tag_after_that_many_thinking_tokens(r1, fmt):
    from mlotspark.decoding.reasoning import ReasoningBudget
    from mlotspark.models.tokenizer import encode_chat

    prompt = encode_chat(r1, [{"role": "user", "content": "Hi"}])
    proc = ReasoningBudget(fmt, budget=3)
    history = list(prompt)
    V = 152064
    forced_at = None
    thought = r1.encode("<think>\nLet me see, it is", add_special_tokens=False)
    for step, tok in enumerate(thought):
        logits = mx.zeros((1, V))
        out = proc(mx.array(history), logits)
        if int(mx.argmax(out, axis=-1).item()) == fmt.end_ids[0] and out[0, 0].item() == float("-inf"):
            forced_at = step
            break
        history.append(tok)
    assert forced_at == 4  # the start tag, then three thinking tokens: the next is the close tag
    history.append(fmt.end_ids[0])
    out = proc(mx.array(history), mx.zeros((1, V)))
    assert out[0, 0].item() == 0.0  # after the tag, the answer is free again
