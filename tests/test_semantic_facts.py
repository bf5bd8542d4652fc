"""Fact extraction: which sentences of a user's turn semantic memory keeps (``facts.py``).

Split from ``test_semantic.py`` (the store's tests); the rules' figures on turns nobody fitted
are in ``benchmarks/memory_eval.py`` (``extraction_round5.json``)."""

from __future__ import annotations

import pytest

from mlotspark.memory.semantic import extract_facts


def test_extract_facts_keeps_statements_and_drops_questions_commands_chitchat():
    text = (
        "Hi! My sister's name is Ilse. What is the capital of France? I live in Ghent. "
        "Please write me a poem about autumn. I prefer tea. Thanks, that's great! "
        "Oh, by the way, I am allergic to nuts. I'm fine. Can you help me with my code? "
        "I have a question. I like it. Tell me a joke."
    )
    assert extract_facts(text) == [
        "My sister's name is Ilse.",
        "I live in Ghent.",
        "I prefer tea.",
        "I am allergic to nuts.",
    ]


@pytest.mark.parametrize(
    "text, facts",
    [
        ("i live in ghent", ["I live in ghent."]),
        ("I don't eat meat. I'm a nurse. I'm 34.", ["I don't eat meat.", "I'm a nurse.", "I'm 34."]),
        ("Remember that the meeting is on Friday.", ["The meeting is on Friday."]),
        ("Could you remember that my dog is called Rex?", ["My dog is called Rex."]),
        ("Remember to buy milk.", []),
        ("Do you remember my sister's name?", []),
        ("What is my sister's name", []),
        ("If I were rich I would buy a boat.", []),
        ("I'd like a summary. I'll be in Paris tomorrow.", []),
        ("My code throws an error. My bad.", []),
        ("I'm trying to fix a bug. I am not sure.", []),
        ("```\nI live in a code block\n```\n`I live inline`", []),
        ("> I live in a quoted line", []),
        ("", []),
        # what someone else says or believes is not a fact about the user
        ("My colleague thinks I live in Lyon. My friend said I should move.", []),
        # a lasting fact that ended is one too: it updates the older one (updates.py)
        ("I no longer have a cat. I stopped eating meat. I stopped it.", ["I no longer have a cat.", "I stopped eating meat."]),
        # money, body, habits and doses are lasting facts too; "I take it ..." is talk
        ("I earn 52k a year. I weigh 92 kilos. I bank with Barclays. I rent a flat in Leipzig.",
         ["I earn 52k a year.", "I weigh 92 kilos.", "I bank with Barclays.", "I rent a flat in Leipzig."]),
        ("I take 20 mg of citalopram every morning. I take it you mean the other file. I take your point.",
         ["I take 20 mg of citalopram every morning."]),
        # hobbies, fears and the user's history with its year or age; not talk of the task at hand
        ("I knit scarves in winter. I am scared of spiders. We adopted our dog in 2021. I learned to swim at age 30. "
         "I got an error in line 2020. I asked you this in 2024. I tried that 5 minutes ago.",
         ["I knit scarves in winter.", "I am scared of spiders.", "We adopted our dog in 2021.",
          "I learned to swim at age 30."]),
        # a statement that opens a question or a request is read alone; "we" said as "my husband and I"
        ("I'm coeliac, so could you suggest a cake recipe?", ["I'm coeliac."]),
        ("Me and my husband moved to Tampere last spring and the flat is freezing, any tips?",
         ["Me and my husband moved to Tampere last spring."]),
        # "have been" / "have got", a name with its relation, "X is my Y", a habit whatever its verb
        ("I've been a welder for 20 years. We've got a tortoise called Gus. Pepper, our spaniel, is 4. "
         "Jazz is my favourite genre. I walk the dog every morning.",
         ["I've been a welder for 20 years.", "We've got a tortoise called Gus.", "Pepper, our spaniel, is 4.",
          "Jazz is my favourite genre.", "I walk the dog every morning."]),
        # ... but not the task at hand, a report, a retraction or talk
        ("I keep getting a 403 from the API. My Python script hangs on import. My brother swears Rust is faster. "
         "Forget that jazz is my favourite genre. This is my first question. I've been trying to fix this all day. "
         "I've got to go. I get this error every day. I only have five minutes.", []),
        # the task at hand or a topic of the moment
        ("I need a new laptop. I fix this bug again today. I have an essay due on Monday, outline it. "
         "I'm learning about the Cold War.", []),
        # who the user is, said as the frame of a request (in the user's words); not "as a result"
        ("As a vegetarian, what can I order at a steakhouse? Nurse here, how do I handle night shifts? "
         "As a result, the build failed. Quick question here: how do I sort? Same here, any ideas?",
         ["As a vegetarian.", "Nurse here."]),
        # what one has for a day, not for good; a lasting condition stays
        ("I have a headache, what should I take? I have a meeting at 3, can you help me prepare? "
         "I have an interview tomorrow. I have diabetes, what can I eat?", ["I have diabetes."]),
        ("My soup is too sour, how do I fix it? My formula returns #VALUE!, what does that mean?", []),
        # an initial ends no sentence unless a new one opens after it
        ("My favourite author is Ursula K. Le Guin. I grew up in the U.S. It shows.",
         ["My favourite author is Ursula K. Le Guin.", "I grew up in the U.S."]),
        # an ongoing part of the user's life, not the task at hand
        ("I'm training for the Bristol 10k. I'm seeing a therapist. I'm reading Dune. I'm reading your answer. "
         "I'm training a model. I'm working on a bug in the parser.",
         ["I'm training for the Bristol 10k.", "I'm seeing a therapist.", "I'm reading Dune."]),
    ],
)
def test_extract_facts_rules(text, facts):
    assert extract_facts(text) == facts


def test_statements_are_what_a_turn_states():
    """What ``learn_turn`` checks for updates: statements tidied as facts are, without questions,
    hypotheticals, requests to remember (``extract_facts`` takes those) or a long paste."""
    from mlotspark.memory.semantic.facts import statements

    text = ("Big news, finally moved to Porto! Where should I eat? If I were rich I'd stay. "
            "Remember that my dog is Rex. Ok. Honestly it's purple these days")
    assert statements(text) == ["Finally moved to Porto.", "Honestly it's purple these days."]
    assert statements(" ".join(f"I walked to village number {i}." for i in range(30))) == []
    # a sentence that opens with a command asks for something; "please" alone may carry an update
    assert statements("Erase the landlord's name, I've moved out anyway. Please use my new email from now on.") == [
        "Please use my new email from now on."]


def test_long_paste_yields_only_explicit_requests():
    story = " ".join(f"I walked to village number {i}." for i in range(30))
    assert extract_facts(story) == []
    assert extract_facts(story + " Remember that my sister is Ilse.") == ["My sister is Ilse."]


def test_a_fact_longer_than_an_entry_may_be_is_not_kept_and_the_turn_keeps_the_rest(tmp_path):
    """Found by fuzzing learn_turn: "Remember that" and a 3,000-character blob passed the word count
    (few words) and the store refused it, which dropped the turn's later facts."""
    from mlotspark.memory.semantic import HashingEmbedder, SemanticStore, learn_turn
    from mlotspark.memory.semantic.facts import statements
    from mlotspark.memory.semantic.records import MAX_TEXT_CHARS

    blob = "Remember that I like " + "x" * 3000 + "."
    assert extract_facts(blob) == [] and statements("I like " + "y" * 3000 + ".") == []
    fits = "Remember that I like " + "x" * (MAX_TEXT_CHARS - 100) + "."
    assert len(extract_facts(fits)) == 1
    store = SemanticStore(tmp_path / "m.db", embedder=HashingEmbedder())
    # (a turn that long is a paste: only what it asks to remember is kept)
    learned = learn_turn(store, blob + "\nRemember that my cat is called Mochi.", "c")
    assert [store.get(i).text for i in learned.remembered] == ["My cat is called Mochi."]
    assert learned.not_remembered == 1  # the blob: the user asked, and hears it was not kept


@pytest.mark.parametrize("text, kept, not_kept", [
    ("Remember that my cat is called Mochi.", 1, 0),
    ("Remember that 🐱🐱", 0, 1),  # no words
    ("Please remember to buy milk.", 0, 1),  # a reminder, not a fact
    ("Can you remember what I said about my job?", 0, 0),  # a question asks nothing to keep
    ("Please remember what my sister is called.", 0, 0),
    ("My locker is 212.", 1, 0),  # no request
])
def test_a_turn_counts_its_requests_to_remember_that_kept_nothing(tmp_path, text, kept, not_kept):
    from mlotspark.memory.semantic import HashingEmbedder, SemanticStore, learn_turn

    store = SemanticStore(tmp_path / "m.db", embedder=HashingEmbedder())
    learned = learn_turn(store, text, "c")
    assert (len(learned.remembered), learned.not_remembered) == (kept, not_kept)


def test_any_text_a_user_types_is_learned_from_and_searched_without_an_error(tmp_path):
    """Property: a turn's learning and the next turn's retrieval never raise on any text (a
    20,000-example run of this found only the blob above)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from mlotspark.memory.semantic import HashingEmbedder, SemanticStore, format_memory_section, learn_turn

    store = SemanticStore(tmp_path / "m.db", HashingEmbedder())
    for t in ("I live in Utrecht.", "My cat is called Mochi.", "My sister is Ilse."):
        store.remember(t)
    words = st.sampled_from("I my forget remember that the live in moved now not cat Mochi . , ! ? ' \" ` "
                            "today 2019 you delete drop about".split(" ") + ["\n", " ", "x" * 2100])
    texts = st.one_of(st.text(max_size=200), st.lists(st.one_of(words, st.text(max_size=5)), max_size=30).map(" ".join))

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(texts)
    def turn(text):
        learn_turn(store, text, "c")
        format_memory_section(store.retrieve_for_prompt(text), days=True)

    turn()
