"""The one hold-back of streamed text (``decoding/stops.Holdback``): stop strings, think
tags and tool-call openings are held back by one rule, shown here on the real
vocabularies of DeepSeek-R1-Distill-Qwen and Qwen2.5-Coder-0.5B (GGUF headers, no
weights), with a reply that thinks, then calls a tool, then runs into a stop string."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlotspark.decoding.stops import Holdback, StopMatcher

THOUGHT = "Paris time is asked; I should call get_time. Not </thin or <tool_ either."
CALL = '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}'
REPLY = (f"<think>\n{THOUGHT}\n</think>\n\nLet me check.\n<tool_call>\n{CALL}\n</tool_call>"
         "\n\nUser: and this is past the stop")
STOP = "\n\nUser:"


def _may_begin(strings: list[str], text: str) -> int:
    """Where the earliest tail of ``text`` that a string may still complete begins."""
    for i in range(len(text)):
        if any(len(text) - i < len(s) and s.startswith(text[i:]) for s in strings):
            return i
    return len(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("ab<>/", min_size=1, max_size=6), min_size=1, max_size=3), st.text("ab<>/x", max_size=24))
def test_a_literal_hold_back_keeps_exactly_the_tail_that_may_begin_a_string(strings, text):
    assert Holdback.literal(strings).safe_length(text) == _may_begin(strings, text)
    assert StopMatcher(strings).safe_length(text) == _may_begin(strings, text)


def test_a_pattern_with_optional_parts_is_held_back_as_exactly_as_a_tag():
    from mlotspark.decoding.tool_calls import HERMES, find_opening

    text = "Here:\n```json\n  {\"na"
    for k in range(len("Here:\n") + 1, len(text) + 1):  # a fenced call cut anywhere after the text
        op = find_opening(HERMES, text[:k], partial=True, bare=False)
        assert op is not None and op.form.endswith("?") and op.at == len("Here:\n"), text[:k]
    assert find_opening(HERMES, "Here: `x` is code", partial=True, bare=False) is None


@pytest.fixture(scope="module")
def formats(r1_tokenizer_real, qwen_tokenizer_real):
    """Qwen3's pair, from the real vocabularies: think tags (R1-distill's template writes
    them) and Hermes tool calls (Qwen2.5's template teaches them)."""
    from mlotspark.decoding.reasoning import reasoning_format
    from mlotspark.decoding.tool_calls import tool_format

    return reasoning_format(r1_tokenizer_real), tool_format(qwen_tokenizer_real)


def _through_the_chain(formats, pieces):
    """Text pieces through the stop strings, the reasoning split and the call split, in the
    order a request's stream runs them; returns (reasoning, shown answer, calls, every piece
    handed out)."""
    from mlotspark.decoding.reasoning import ReasoningSplitter
    from mlotspark.decoding.tool_calls import CallSplitter

    stops, think, calls = StopMatcher([STOP]), ReasoningSplitter(formats[0]), CallSplitter(formats[1], ["get_time"])
    text, emitted, out, made = "", 0, [], []

    def answer(piece: str, final: bool) -> None:
        shown, new = calls.feed(piece)
        if final:
            rest, more = calls.close()
            shown, new = shown + rest, new + more
        out.append(("answer", shown))
        made.extend(new)

    for piece in pieces + [None]:
        final = piece is None
        if not final:
            text += piece
            cut = stops.cut(text)
            if cut is not None:
                text, final = text[:cut], True
        safe = len(text) if final else stops.safe_length(text)
        r, a = think.feed(text[emitted:safe])
        emitted = max(emitted, safe)
        if final:
            r2, a2 = think.close()
            r, a = r + r2, a + a2
        out.append(("reasoning", r))
        answer(a, final)
        if final:
            break
    reasoning = "".join(t for kind, t in out if kind == "reasoning")
    shown = "".join(t for kind, t in out if kind == "answer")
    return reasoning, shown, made, out


def _check(formats, pieces):
    reasoning, shown, calls, handed = _through_the_chain(formats, pieces)
    assert reasoning == THOUGHT
    assert shown.strip() == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_time", {"zone": "Europe/Paris"})]
    for kind, piece in handed:  # no piece held a tag, a call's markup or the stop string's text
        bits = ("<think>", "</think>", "User") if kind == "reasoning" else ("<th", "</th", "<tool", "</tool", "{", "User")
        for bit in bits:
            assert bit not in piece, (kind, bit, piece)


def test_every_two_piece_cut_of_the_reply_splits_the_same(formats):
    for k in range(len(REPLY) + 1):
        _check(formats, [REPLY[:k], REPLY[k:]])


def test_the_real_token_pieces_split_the_same(formats, r1_tokenizer_real):
    """The pieces the R1 vocabulary's streaming detokenizer hands out, token by token
    (``<think>`` and ``<tool_call>`` are one token each)."""
    ids = r1_tokenizer_real.encode(REPLY, add_special_tokens=False)
    assert r1_tokenizer_real.encode("<tool_call>", add_special_tokens=False) == [formats[1].opener_id]
    d = r1_tokenizer_real.detokenizer
    d.reset()
    pieces, seen = [], 0
    for t in ids:
        d.add_token(t)
        pieces.append(d.text[seen:])
        seen = len(d.text)
    d.finalize()
    pieces.append(d.text[seen:])
    assert "".join(pieces) == REPLY
    _check(formats, pieces)


def test_white_space_before_a_bare_call_is_held_and_never_shown_alone():
    """A reply's leading white space waits until the reply decides: before a bare call it
    is not shown at all (as ``parse_calls`` returns it), before text it comes with the text."""
    from mlotspark.decoding.tool_calls import LLAMA3, CallSplitter, parse_calls

    bare = '\n {"name": "get_time", "parameters": {"zone": "UTC"}}'
    splitter = CallSplitter(LLAMA3)
    shown = [splitter.feed(p)[0] for p in ("\n", " ", bare[2:])] + [splitter.close()[0]]
    assert "".join(shown) == parse_calls(LLAMA3, bare)[0] == ""
    splitter = CallSplitter(LLAMA3)
    assert [splitter.feed(p)[0] for p in ("\n", "Hi")] == ["", "\nHi"]


def test_the_scanner_finds_the_earlier_opening_after_it_dropped_old_text():
    """Past a long reply, a tag followed by a fenced object opens at the tag."""
    from mlotspark.decoding.tool_calls import HERMES, OpeningScanner, find_opening

    text = "x" * 100 + '<tool_call>\n```json\n{"name": "f"'
    scan = OpeningScanner(HERMES)
    scan.feed(text[:100])
    assert scan.next() is None
    scan.feed(text[100:])
    op = scan.next()
    assert (op.form, op.at) == ("tag", 100) == (find_opening(HERMES, text).form, find_opening(HERMES, text).at)


CALLS_ONLY = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}}\n</tool_call>\n')


def _token_pieces(tokenizer, text: str) -> list[str]:
    """The pieces a streaming detokenizer hands out for ``text``, token by token."""
    d = tokenizer.detokenizer
    d.reset()
    pieces, seen = [], 0
    for t in tokenizer.encode(text, add_special_tokens=False):
        d.add_token(t)
        pieces.append(d.text[seen:])
        seen = len(d.text)
    d.finalize()
    return pieces + [d.text[seen:]]


@pytest.mark.parametrize("before, after", [
    ("", ""), ("", "It is noon in Paris."), ("", "\n\nIt is noon in Paris.\n"), ("\n", ""),
    ("Checking.", "\n\n```python\nprint(1)\n```"),  # a fence after the calls that is no call
])
def test_white_space_between_and_after_calls_is_never_streamed_as_text(qwen_tokenizer_real, before, after):
    """A forced reply of two calls (Qwen2.5's own markup, a newline after each close tag),
    streamed in its real token pieces and cut at every point: the text shown is what the
    whole reply's split finds (none for calls alone), and no white space comes alone before it."""
    from mlotspark.decoding.tool_calls import CallSplitter, parse_calls, tool_format

    fmt, reply = tool_format(qwen_tokenizer_real), before + CALLS_ONLY + after
    whole, calls = parse_calls(fmt, reply, ["get_time"])
    assert len(calls) == 2 and (before.strip() or whole == after.strip())
    cuts = [[reply[:k], reply[k:]] for k in range(len(reply) + 1)]
    for pieces in cuts + [_token_pieces(qwen_tokenizer_real, reply)]:
        splitter, shown, made = CallSplitter(fmt, ["get_time"]), [], []
        for piece in pieces:
            text, new = splitter.feed(piece)
            shown.append(text)
            made += new
        text, new = splitter.close()
        shown, made = shown + [text], made + new
        assert "".join(shown).rstrip() == whole, pieces  # (a streamed reply's last newline is shown before it ends)
        assert [(c.name, c.arguments) for c in made] == [(c.name, c.arguments) for c in calls]
        words = next((i for i, p in enumerate(shown) if p.strip()), len(shown))
        assert not any(shown[:words]), (pieces, shown)  # no white space alone before the words
