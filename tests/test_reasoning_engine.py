"""The engine's reasoning path: a tiny model on the R1 distill's real tokenizer and template
(``r1_tiny_engine``) thinks, then answers; the thinking comes back in ``result.reasoning``
and as ``ReasoningPiece``s, never in the answer."""

from __future__ import annotations

from conftest import R1_TINY_ANSWER, R1_TINY_THOUGHT

from mlotspark import ReasoningPiece


def test_generate_keeps_the_thinking_out_of_the_text(r1_tiny_engine):
    result = r1_tiny_engine.generate("Two and two?")
    assert result.reasoning == R1_TINY_THOUGHT
    assert result.text == R1_TINY_ANSWER
    assert result.stats.finish_reason == "stop"


def test_stream_tags_the_thinking_pieces(r1_tiny_engine):
    pieces = [p for p in r1_tiny_engine.stream("Two and two?") if isinstance(p, (str, ReasoningPiece))]
    thought = "".join(p.text for p in pieces if isinstance(p, ReasoningPiece))
    answer = "".join(p for p in pieces if isinstance(p, str))
    assert thought == R1_TINY_THOUGHT and answer == R1_TINY_ANSWER
    assert all("think>" not in str(p) for p in pieces)
    first_answer = next(i for i, p in enumerate(pieces) if isinstance(p, str))
    assert all(isinstance(p, ReasoningPiece) for p in pieces[:first_answer])


def test_a_budget_forces_the_close_tag_and_the_answer_follows(r1_tiny_engine):
    tok = r1_tiny_engine.tokenizer
    result = r1_tiny_engine.generate("Two and two?", reasoning_budget=2)
    thought_ids = tok.encode("\n" + R1_TINY_THOUGHT, add_special_tokens=False)
    assert result.reasoning == tok.decode(thought_ids[:2]).strip()
    assert result.reasoning != R1_TINY_THOUGHT
    assert result.text == R1_TINY_ANSWER


def test_thinking_off_on_a_template_without_a_switch_closes_the_block_at_once(r1_tiny_engine):
    result = r1_tiny_engine.generate("Two and two?", think=False)
    assert result.reasoning == "" and result.text == R1_TINY_ANSWER
    low = r1_tiny_engine.generate("Two and two?", reasoning_effort="none")
    assert low.reasoning == "" and low.text == R1_TINY_ANSWER
