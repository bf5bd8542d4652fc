"""The engine's reasoning path: a tiny model on the R1 distill's real tokenizer and template
(``r1_tiny_engine``) thinks, then answers; the thinking comes back in ``result.reasoning``
and as ``ReasoningPiece``s, never in the answer."""

from __future__ import annotations

from model_cache import R1_TINY_ANSWER, R1_TINY_THOUGHT

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


def test_a_conversation_keeps_the_thinking_out_of_history_and_memory(r1_tiny_engine):
    """The thinking streams but is never stored: the next turn's prompt, re-rendered without
    it, reuses the KV up to where it first differs (the end of the first turn's prompt), and
    semantic memory learns only what the user said."""
    from mlotspark import Engine, GenerationOptions

    e = Engine(r1_tiny_engine.loaded, GenerationOptions(temperature=0.0, max_tokens=32))
    try:
        c = e.conversation("r1")
        pieces = list(c.stream("I live in Ghent. Two and two?"))
        first = pieces.pop()
        assert "".join(p.text for p in pieces if isinstance(p, ReasoningPiece)) == R1_TINY_THOUGHT
        assert "".join(p for p in pieces if isinstance(p, str)) == R1_TINY_ANSWER
        assert c.messages[-1]["content"] == R1_TINY_ANSWER
        prompt = e.tokenizer.decode(e.encode(c.render("And three and three?")))
        assert R1_TINY_THOUGHT not in prompt and "<think>" not in prompt and R1_TINY_ANSWER in prompt
        r = c.send("And three and three?")
        assert (r.reasoning, r.text) == (R1_TINY_THOUGHT, R1_TINY_ANSWER)
        assert r.stats.extra["cache_source"] == "warm" and r.stats.cached_tokens == first.prompt_tokens
        texts = [x.text for x in e.memory.list()]
        assert texts and not any("Okay" in t or "four" in t for t in texts), texts
    finally:
        e.close()


def _opened_prompt(engine) -> list[int]:
    """The R1 template's prompt with the think block opened after the turn marker, as later
    revisions of the template (and Qwen3's) write it: the reply starts inside the block."""
    tok = engine.tokenizer
    return engine.encode("Two and two?") + tok.encode("<think>\n", add_special_tokens=False)


def test_a_prompt_that_opens_the_block_starts_the_reply_inside_it(r1_tiny_engine):
    result = r1_tiny_engine.submit(prompt_ids=_opened_prompt(r1_tiny_engine)).result()
    assert (result.reasoning, result.text) == (R1_TINY_THOUGHT, R1_TINY_ANSWER)


def test_thinking_off_or_a_grammar_closes_a_block_the_prompt_opened(r1_tiny_engine):
    """The answer (and a grammar's JSON) goes to ``text``, never into the thinking."""
    import json

    off = r1_tiny_engine.submit(prompt_ids=_opened_prompt(r1_tiny_engine), think=False).result()
    assert (off.reasoning, off.text) == ("", R1_TINY_ANSWER)
    constrained = r1_tiny_engine.submit(prompt_ids=_opened_prompt(r1_tiny_engine), max_tokens=24,
                                        response_format={"type": "json_object"}).result()
    assert constrained.reasoning == ""
    if constrained.stats.finish_reason == "stop":
        json.loads(constrained.text)
    assert constrained.text.lstrip().startswith("{")


def test_every_returned_sequence_and_beam_keeps_its_thinking_apart(r1_tiny_engine):
    several = r1_tiny_engine.generate("Two and two?", num_return_sequences=2, temperature=0.5, seed=1)
    beams = r1_tiny_engine.generate("Two and two?", num_beams=2)
    for h in several.sequences + beams.sequences:
        assert (h.reasoning, h.text) == (R1_TINY_THOUGHT, R1_TINY_ANSWER)
    assert (beams.reasoning, beams.text) == (R1_TINY_THOUGHT, R1_TINY_ANSWER)


def test_the_cli_flags_become_the_options():
    import argparse

    from mlotspark.cli.common import add_sampling_args, sampling_options

    p = argparse.ArgumentParser()
    add_sampling_args(p)
    got = sampling_options(p.parse_args(["--reasoning-budget", "64", "--reasoning-effort", "low", "--no-think"]))
    assert got == {"reasoning_budget": 64, "reasoning_effort": "low", "think": False}
    assert sampling_options(p.parse_args([])) == {}


def test_generate_prints_the_answer_on_stdout_and_the_thinking_on_stderr(r1_tiny_engine, capsys):
    import json

    from mlotspark.cli.entry import build_parser
    from mlotspark.cli.generate import _reply

    args = build_parser().parse_args(["generate", "-p", "Two and two?"])
    assert _reply(r1_tiny_engine, args, "Two and two?", {}) == 0
    out, err = capsys.readouterr()
    assert out.strip() == R1_TINY_ANSWER and R1_TINY_THOUGHT in err
    args = build_parser().parse_args(["generate", "-p", "Two and two?", "--json"])
    _reply(r1_tiny_engine, args, "Two and two?", {})
    got = json.loads(capsys.readouterr().out)
    assert (got["text"], got["reasoning"]) == (R1_TINY_ANSWER, R1_TINY_THOUGHT)
