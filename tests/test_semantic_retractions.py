"""Which sentences are retractions, and what they name (``retractions.retraction``).

Moved from test_semantic_updates.py (the store's retraction behaviour stays there).
"""

from __future__ import annotations

import pytest

from mlotspark.memory.semantic.retractions import retraction


@pytest.mark.parametrize("text,what", [
    ("Forget that my cat is called Mochi.", "my cat is called Mochi"),
    ("Please forget my age, please.", "my age"),
    ("Forget what I said about my brother living in Toronto.", "my brother living in Toronto"),
    ("You can forget about my Fiat Panda.", "my Fiat Panda"),
    ("Can you forget my neighbour's name?", "my neighbour's name"),
    ("Don't forget that my cat is called Mochi.", None),  # a request to remember
    ("I forgot where my keys are.", None),
    ("Forget it.", None),
    ("Don't remember where I work.", "where I work"),
    ("Please stop remembering my address.", "my address"),
    ("I don't remember where I parked.", None),  # the user's own memory
    # Round 4: other words people use (a third set's fit half)
    ("Scratch that about my salary, I'd rather you didn't store it.", "my salary"),
    ("Don't keep my street name, please.", "my street name"),
    ("I'd prefer you not keep anything about my father's dementia.", "my father's dementia"),
    ("Ugh, delete that bit about my driving test attempts.", "my driving test attempts"),
    ("Never mind the cat diet thing.", "the cat diet thing"),
    ("Scratch the Spotify application from memory, it's confidential.", "the Spotify application"),
    ("Please get rid of what I told you about my mother-in-law.", "my mother-in-law"),
    ("Remove the print statements.", None),  # a request about code, not memory
    ("Ignore my last message, I sent it too early.", None),  # about the chat
    ("Disregard what I said about my brother living in Toronto.", "my brother living in Toronto"),
    ("Never mind, I'll do it myself.", None),
    ("Forget that, I was joking.", None),
    ("Forget about it, let's talk about my trip to Japan.", None),  # names nothing
    # A fourth set's fit half
    ("I don't want you to know about the tattoo, forget it.", "the tattoo"),
    ("Would you mind not remembering who my therapist is?", "who my therapist is"),
    ("I'd prefer you didn't keep how I voted on record, please delete it.", "how I voted"),
    ("Delete that, about my back operation.", "my back operation"),
    ("Do you know my address?", None),
    # A fifth set's fit half: "not remember", "don't need", "scrap", "on file", "from your notes"
    ("please don't keep my address on file", "my address"),
    ("Actually, can you not remember the mental health stuff I mentioned?", "the mental health stuff I mentioned"),
    ("scratch that thing about my passport", "my passport"),
    ("Don't store where my kid goes to school, please.", "where my kid goes to school"),
    ("Can you drop the politics thing I said?", "the politics thing I said"),
    ("you don't need my number plate, get rid of it", "my number plate"),
    ("scrap the emigration plan from your notes, nothing's decided", "the emigration plan"),
    ("You don't need a loop here.", None),
    ("Can you not use semicolons?", None),
    ("Don't store how the files are laid out in git.", None),  # no user's thing told
    # Review: "not remember" / "don't need" only when framed or told to go; a wh-clause frames for memory verbs only
    ("Can you not remember my name?", None),  # a complaint
    ("You don't need my API key to run this.", None),
    ("Ignore how my code is formatted.", None),
    ("Remove what I added to the README.", None),
    ("Delete the duplicate rows on file.", None),
    ("Remove the TODO items in notes.", None),
    # Review: ordinary chat and coding requests
    ("Never mind the weather, where does my sister live?", None),  # another subject
    ("Forget Rust, what's the best way to learn Go?", None),
    ("Forget the docs, just tell me what my cat is called.", None),
    ("Don't store passwords in plain text.", None),  # advice
    ("Don't keep my password in the config file.", None),
    ("Drop the users table from my database.", None),
    ("Can you remove my API key from this config file?", None),
    ("Remove my cat from the photo.", None),
    ("Delete my Python virtualenv and recreate it.", None),
    ("Remove my phone number.", "my phone number"),  # a bare thing of the user's: the search decides
    ("forget my" + " " * 4000, None),  # quick on long input
    ("forget my " + ", " * 20000, None),
    ("", None),
    ("Forget it.", None),
])
def test_retraction_sentences(text, what):
    assert retraction(text) == what


@pytest.mark.parametrize("text, asks", [
    ("Forget everything you know about me.", True),
    ("Please wipe your memory.", True),
    ("Erase everything you know about me please", True),
    ("Delete all your memories.", True),
    ("Forget it all.", True),
    ("Delete everything in the folder.", False),  # files, not memory
    ("Delete everything.", False),
    ("Remove all the duplicates from my list.", False),
    ("Forget about it.", False),
])
def test_asking_to_forget_everything_is_told_apart(text, asks):
    from mlotspark.memory.semantic.retractions import asks_to_forget_all

    assert asks_to_forget_all(text) is asks


def test_a_turn_asking_to_forget_everything_deletes_nothing_and_says_so(tmp_path):
    # A user's audit: "Forget everything you know about me." deleted nothing (right) and said
    # nothing (the panel showed "—"); "Forget all my memories please." said "? 1 not forgotten".
    from mlotspark.memory.semantic import HashingEmbedder, SemanticStore, learn_turn

    store = SemanticStore(tmp_path / "m.db", HashingEmbedder())
    store.remember("I live in Utrecht.")
    learned = learn_turn(store, "Forget everything you know about me.", "c")
    assert (learned.forgotten, learned.not_forgotten) == ([], 1) and len(store) == 1
