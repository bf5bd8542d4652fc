"""Dated facts and events in semantic memory (issue 27, the multi-session eval's "count" and "when").

"I got the promotion today!" is kept with the day it was said, and shown with it;
"I baked bread today." said on three days is one entry said three times; an event
never supersedes nor is superseded. The store's clock dates entries, so the tests
replay days without waiting for them."""

from __future__ import annotations

import datetime

import pytest

from mlotspark.memory.semantic import HashingEmbedder, SemanticStore, extract_facts, format_memory_section, learn_turn
from mlotspark.memory.semantic.events import add_occurrence, describe, is_past, occurrences, relative_time
from mlotspark.memory.semantic.facts import tells_event
from mlotspark.memory.semantic.records import Entry


def noon(month: int, day: int) -> float:
    return datetime.datetime(2026, month, day, 12).timestamp()


@pytest.fixture
def store(tmp_path):
    with SemanticStore(tmp_path / "m.db", HashingEmbedder()) as s:
        yield s


@pytest.mark.parametrize(
    "text, kept",
    [
        ("I got the promotion today!", "I got the promotion today."),
        ("It's Tuesday 3 March. I bought another plant today.", "I bought another plant today."),
        ("We finally adopted a cat last weekend.", "We finally adopted a cat last weekend."),
        ("I went to the dentist two days ago.", "I went to the dentist two days ago."),
        ("I went fully vegan this year.", None),  # a change over months: no event (nor a lasting statement here)
        ("Today I went to the dentist.", "Today I went to the dentist."),  # the time first
        ("Last night, we watched a film about whales.", "Last night, we watched a film about whales."),
        ("I've been to the dentist today.", "I've been to the dentist today."),
        ("I moved to Porto last week.", "I moved to Porto last week."),  # a lasting fact, dated
        ("I went to school in Ghent.", None),  # no time: neither a lasting statement nor an event
        ("I asked you about this yesterday.", None),  # talk with the assistant, not an event
        ("I mentioned this earlier today.", None),
        ("I had a question yesterday.", None),
        ("Yesterday you said I passed the exam.", None),  # someone else's words
        ("I didn't go to the gym today.", None),  # what did not happen
        ("I never went to the gym yesterday.", None),
        ("I tried sushi yesterday.", "I tried sushi yesterday."),
        ("I need bread today.", None),  # not the past
        ("Did I go to the dentist yesterday?", None),  # a question
        ("The weather was strange today.", None),  # not about the user
    ],
)
def test_events_are_kept(text, kept):
    assert extract_facts(text) == ([kept] if kept else [])


def test_an_event_is_not_a_lasting_fact():
    assert tells_event("I went to the dentist today.") and tells_event("I baked bread yesterday.")
    # How a lasting fact changed: may update "I drive a Toyota." / "I work at Philips."
    assert not tells_event("I got a new car today, a Tesla.") and not tells_event("I quit my job today.")
    assert tells_event("I met a new colleague today.")
    assert relative_time("I have a dentist appointment tomorrow.") and relative_time("We fly in three days.")
    assert not tells_event("I moved to Porto last week.")  # where the user lives: may update "I live in Utrecht."
    assert not tells_event("I live in Utrecht.") and not tells_event("I went to school in Ghent.")
    assert relative_time("We met three weeks ago.") and not relative_time("We met in Lyon.")
    assert is_past("finished") and is_past("went") and not is_past("need") and not is_past("red")


def test_a_dated_entry_is_shown_with_its_day(store):
    store.clock = lambda: noon(3, 3)
    learn_turn(store, "I got the promotion today! I live in Utrecht.", "c")
    by_text = {e.text: e for e in store.list()}
    promo = by_text["I got the promotion today."]
    assert promo.created == noon(3, 3)
    section = format_memory_section(store.retrieve_for_prompt("When did I tell you I got the promotion?"))
    assert "I got the promotion today. (said on Tuesday 3 March 2026)" in section
    assert describe(by_text["I live in Utrecht."]) == "I live in Utrecht."  # undated: as it is


def test_an_event_said_on_other_days_counts_each_day_once(store):
    for month, day in [(3, 3), (3, 3), (3, 7), (3, 12)]:  # twice on 3 March: the same occurrence retold
        store.clock = lambda month=month, day=day: noon(month, day)
        learn_turn(store, "I baked bread today.", "c")
    (entry,) = store.list()
    assert occurrences(entry) == [noon(3, 3), noon(3, 7), noon(3, 12)]
    section = format_memory_section(store.retrieve_for_prompt("How many times did I tell you I baked bread?"))
    assert "I baked bread today. (said 3 times: on 3 March, 7 March and 12 March 2026)" in section
    # Undated facts said again stay one entry with no occurrences.
    store.clock = lambda: noon(3, 20)
    learn_turn(store, "I live in Utrecht.", "c")
    store.clock = lambda: noon(3, 21)
    learn_turn(store, "I live in Utrecht.", "c")
    utrecht = next(e for e in store.list() if "Utrecht" in e.text)
    assert "said" not in utrecht.meta and occurrences(utrecht) == [noon(3, 20)]
    # A dated lasting fact retold is one move, not two: dated by its first telling.
    for day in (22, 23):
        store.clock = lambda day=day: noon(3, day)
        learn_turn(store, "I moved to Porto last week.", "c")
    porto = next(e for e in store.list() if "Porto" in e.text)
    assert occurrences(porto) == [noon(3, 22)] and describe(porto).endswith("(said on Sunday 22 March 2026)")


def test_events_neither_supersede_nor_are_superseded(tmp_path):
    from test_semantic_updates import TopicEmbedder  # same-topic texts at cosine ~0.8: the update rules decide

    with SemanticStore(tmp_path / "m.db", TopicEmbedder()) as store:
        event = store.remember("I met a new nurse at work today.")
        job = store.remember("I work as a tester now.")  # an update cue, same topic: would replace a fact
        assert store.get(event).current and store.get(job).current
        nurse = store.remember("I work as a nurse.")
        store.remember("I met a new nurse today.")  # "new": an update cue, but a meeting
        assert store.get(nurse).current
        home = store.remember("I live in Utrecht.")
        store.remember("I moved to Porto last week.")  # dated, but a lasting fact: still an update
        assert not store.get(home).current


def test_occurrences_meta_is_checked():
    entry = Entry(1, "I baked bread today.", meta={"said": ["yesterday", 3]}, created=noon(3, 3))
    assert occurrences(entry) == [noon(3, 3)]  # a hand-edited meta does not break the prompt
    assert add_occurrence(entry, noon(3, 3) + 3600) is None  # the same day: the same occurrence retold
    assert add_occurrence(entry, noon(3, 4))["said"] == [noon(3, 3), noon(3, 4)]  # the bad list replaced
    empty = Entry(3, "I baked bread today.", meta={"said": []}, created=noon(3, 3))
    assert add_occurrence(empty, noon(3, 5))["said"] == [noon(3, 3), noon(3, 5)]
    across = Entry(2, "I baked bread today.", meta={"said": [noon(3, 3), datetime.datetime(2027, 1, 2, 12).timestamp()]})
    assert describe(across) == "I baked bread today. (said 2 times: on 3 March 2026 and 2 January 2027)"


def test_memory_list_shows_the_days_an_event_was_told(store, capsys):
    from mlotspark.cli.memory import _line

    for day in (3, 7):
        store.clock = lambda day=day: noon(3, day)
        store.remember("I baked bread today.")
    assert "[said on 2 days, last 2026-03-07 12:00]" in _line(store.list()[0])


def test_a_change_over_months_is_no_event():
    # How a lasting fact changed (it may update "I'm vegetarian."), not a visit or a purchase.
    assert not tells_event("I went fully vegan this year.") and not tells_event("I switched banks last month.")
    assert tells_event("I went to the dentist three days ago.") and tells_event("We finally finished the marathon last weekend.")


def test_a_question_asking_when_shows_every_entrys_day(store):
    from mlotspark.memory.semantic.events import asks_when

    store.clock = lambda: noon(3, 3)
    store.remember("My sister is called Ilse.")
    hits = store.retrieve_for_prompt("When did I tell you my sister is called Ilse?")
    assert format_memory_section(hits, days=True) == "Things you know about the user:\n- My sister is called Ilse. (said on Tuesday 3 March 2026)"
    assert format_memory_section(hits) == "Things you know about the user:\n- My sister is called Ilse."
    assert asks_when("When did I tell you my sister is called Ilse?") and asks_when("what day did I move?")
    assert not asks_when("When do I need to renew my passport?") and not asks_when("When is my birthday?")


def test_a_near_duplicate_with_another_day_is_another_entry(store):
    store.near_duplicate = 0.5  # hashing vectors: make "today"/"yesterday" near duplicates
    store.clock = lambda: noon(3, 3)
    first = store.remember("I baked bread today.")
    store.clock = lambda: noon(3, 4)
    second = store.remember("I baked bread yesterday.")  # the same baking, told the next day
    assert second != first and occurrences(store.get(first)) == [noon(3, 3)]
    store.clock = lambda: noon(3, 4) + 3 * 3600  # another day, another baking
    assert store.remember("I baked bread today!") == first
    assert occurrences(store.get(first)) == [noon(3, 3), noon(3, 4) + 3 * 3600]
    store.clock = lambda: noon(3, 4) + 5 * 3600  # later that day: the same baking retold
    store.remember("I baked bread today.")
    assert occurrences(store.get(first)) == [noon(3, 3), noon(3, 4) + 3 * 3600]
    assert store.remember("I bake bread.") != first  # undated: the near-duplicate rule as before (0.5 here)
