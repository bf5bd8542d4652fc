"""The memory writers and the question-time rule, on the hashing embedder (shapes; the real
models' figures are the memory suite's and ``test_memory_real.py``'s)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from mlotspark.memory.semantic import (HashingEmbedder, MemoryWriter, Operation, SemanticStore, SimpleWriter,
                                       format_memory_section, learn_turn)
from mlotspark.memory.semantic.dates import ago, describe
from mlotspark.memory.semantic.model_writer import ModelWriter, operations_schema, parse_outdated, prompt_messages
from mlotspark.memory.semantic.requests import forget_request, remember_request, sentences
from mlotspark.memory.semantic.writer import statements

DAY = 86400.0


@pytest.fixture
def store(tmp_path):
    with SemanticStore(tmp_path / "m.db", HashingEmbedder()) as s:
        yield s


@pytest.mark.parametrize("said, what", [
    ("Please forget what I told you about my salary.", "my salary"),
    ("please don't keep my address on file", "my address"),
    ("Delete the bit about my allergy, thanks.", "my allergy"),
    ("Forget it.", "it"),
    ("I forgot my keys at home.", None),
    ("Can you remember my birthday?", None),
])
def test_a_request_to_forget_names_what(said, what):
    assert forget_request(said) == what


def test_requests_to_remember_and_sentences():
    assert remember_request("Remember that my PIN hint is blue.") == "my PIN hint is blue"
    assert remember_request("I remember my first car.") is None
    assert sentences("I live in Ghent. It rains a lot!\n```\ncode here\n```\nOk?") == [
        "I live in Ghent.", "It rains a lot!", "Ok?"]
    assert sentences("x" * 3000) == []  # a paste, not something said
    assert statements("Sold the Focus last week, I take the tram now. What's a good bike? Ok") == [
        "Sold the Focus last week, I take the tram now."]


def test_both_writers_follow_the_protocol():
    assert isinstance(SimpleWriter(), MemoryWriter)
    assert isinstance(ModelWriter(lambda messages, schema: '{"outdated": []}'), MemoryWriter)


def test_the_simple_writer_keeps_what_is_said_and_deletes_what_is_asked(store):
    keys = learn_turn(store, "Got the keys to the Bristol house on Friday. Any tips for unpacking?", "a")
    assert [store.get(i).text for i in keys.remembered] == ["Got the keys to the Bristol house on Friday."]
    assert store.get(keys.remembered[0]).conversation == "a"
    salary = store.remember("My salary is 52000 a year.")
    gone = learn_turn(store, "Please delete what I told you about my salary.")
    assert [e.id for e in gone.forgotten] == [salary] and store.get(salary) is None
    nothing = learn_turn(store, "Forget my shoe size.")  # nothing stored matches: the user is told
    assert nothing.not_forgotten == 1 and nothing.forgotten == []


def test_apply_supersedes_deletes_and_skips_unknown_ids(store):
    leeds = store.remember("I live in Leeds.")
    out = store.apply([Operation("supersede", "I moved to Bristol.", ids=(leeds,)), Operation("delete", ids=(999,))])
    (bristol,) = out.remembered
    assert store.get(leeds).superseded_by == bristol and out.updated == [leeds] and out.forgotten == []
    assert [e.id for e in store.list(current_only=True)] == [bristol]


def test_the_newest_about_a_thing_is_shown_alone_and_dated(store):
    store.clock = lambda: 1_000_000.0
    store.remember("My favourite colour is green.")
    store.clock = lambda: 1_000_000.0 + 12 * DAY
    store.remember("My favourite colour is purple now.")
    hits = store.retrieve_for_prompt("What is my favourite colour?")
    assert [h.entry.text for h in hits] == ["My favourite colour is purple now."]
    section = format_memory_section(hits, now=1_000_000.0 + 14 * DAY)
    said = time.strftime("%-d %B %Y", time.localtime(1_000_000.0 + 12 * DAY))
    assert section.endswith(f"- My favourite colour is purple now. (said {said})"), section
    assert "a newer one replaces an older one" in section.splitlines()[0]


def test_a_question_about_one_of_two_things_keeps_it(store):
    """Same kind, different things: the question scores the other one clearly lower."""
    store.remember("My dog is called Pepper and loves the beach.")
    store.remember("Our cat Miso sleeps all day.")
    assert [h.entry.text for h in store.retrieve_for_prompt("What is my dog called?", top_k=1)] == [
        "My dog is called Pepper and loves the beach."]


def test_with_no_gap_nothing_gives_way(store):
    store.calibration = dataclasses.replace(store.calibration, newer_gap=-1.0)
    store.remember("My favourite colour is green.")
    store.remember("My favourite colour is purple now.")
    assert "green" in " ".join(h.entry.text for h in store.retrieve_for_prompt("What is my favourite colour?"))


def test_dates_read_as_days():
    now = 1_700_000_000.0
    assert ago(now, now) == "today" and ago(now - DAY, now) == "yesterday"
    assert ago(now - 5 * DAY, now) == time.strftime("%-d %B %Y", time.localtime(now - 5 * DAY))
    entry = type("E", (), {"text": "I bake bread.", "created": now - 3 * DAY, "meta": {"said": [now - 3 * DAY, now]}})()
    assert describe(entry, now) == "I bake bread. (said 2 times, last today)"  # dated by the last time


def test_the_model_writers_schema_names_only_candidates_and_its_reply_is_checked():
    schema = operations_schema([4, 9])
    assert schema["properties"]["outdated"]["items"] == {"enum": [4, 9]}
    assert parse_outdated('{"outdated": [9, 9]}', [4, 9]) == [9]
    assert parse_outdated('{"outdated": [5]}', [4, 9]) is None  # not a candidate
    assert parse_outdated('{"outd', [4]) is None


def test_the_model_writer_keeps_what_was_said_and_marks_what_the_model_names(store):
    leeds = store.remember("I live in Leeds.")
    pepper = store.remember("My dog is called Pepper.")
    seen = {}

    def generate(messages, schema):
        seen["messages"], seen["schema"] = messages, schema
        return json.dumps({"outdated": [leeds]})

    out = learn_turn(store, "I live in Bristol now, I moved last month. Our cat is called Miso.",
                     writer=ModelWriter(generate))
    assert f"[{leeds}] I live in Leeds." in seen["messages"][1]["content"]
    texts = [store.get(i).text for i in out.remembered]
    assert texts == ["I live in Bristol now, I moved last month.", "Our cat is called Miso."]  # kept as said
    assert store.get(leeds).superseded_by == out.remembered[0] and store.get(pepper).current
    cut = learn_turn(store, "My sister Ilse lives in Ghent.", writer=ModelWriter(lambda m, s: '{"outd'))
    assert store.get(cut.remembered[0]).text == "My sister Ilse lives in Ghent."  # a bad reply loses nothing
    asked = learn_turn(store, "Please forget that I live in Bristol.",
                       writer=ModelWriter(lambda m, s: pytest.fail("a request alone needs no model call")))
    assert asked.forgotten  # the user's request, whatever the model would say
    assert prompt_messages("hi", [])[1]["content"].startswith("Memories:\n(none)")
