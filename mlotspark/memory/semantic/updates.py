"""Knowledge updates and retractions: when a new fact replaces an old one, and what "forget that ..." names.

"I moved to Porto last month." after "I live in Utrecht." is about the same thing,
so the newer entry wins at retrieval and the older one is marked superseded (kept,
with the time, for ``mlotspark memory list``). Sentence vectors alone cannot tell
this from two facts of the same kind: with all-mpnet-base-v2, "I live in Utrecht" /
"I moved to Porto" score 0.51 while "My dog is called Rex" / "My cat is called Tom"
score 0.56. So a newer text supersedes an older one when all of these hold:

0. both are about the user (first person: "I", "my", "we", "our"): notes such as
   "The pottery studio has a new kiln." never replace one another;
1. they are about the same holder: the same people named by "my <relation>"
   ("my sister", "my husband's ...") — "I live in Porto" never replaces "My
   mother lives in Lyon";
2. they are about the same thing: cosine at or above the calibration's
   ``supersede`` threshold when they share a content word, ``NO_OVERLAP`` more when
   they share none ("I live in Utrecht" / "I moved to Porto"); and either the newer
   one says it is an update ("now", "moved", "switched", "no longer", "instead",
   "actually", "sorry", "new", ...) or both give the same "my <thing> is" the same
   kind of value ("My favourite colour is ..." twice; but "My dog is called Biscuit"
   and "My dog is a border collie" are two facts);
3. the newer one says something the older did not (a content word of its own, or
   a negation the older lacks: "I no longer have a cat." after "I have a cat
   called Mochi."), and does not say it is an addition ("also", "too", "another",
   "as well").

A newer fact that says the older one's content words with a negation flipped ("I
don't eat meat." after "I eat meat.", "I have a cat again." after "I don't have a
cat anymore.") replaces it without a cue: it says the older one is no longer true.

Retractions are explicit: "Forget that my cat is called Mochi.", "Please forget my
age.", "Forget what I said about my brother living in Toronto." name what to
forget; the store removes the entry that best matches it (``SemanticStore.retract``).

Only the nearest entry that passes, and others within 0.1 of its cosine, are
superseded (``history.replaced_by``): "I cycle to work now instead of taking the
train." passes against "I take the train to work." at 0.68 and "I go to the gym on
Mondays." at 0.51, and only the first is the same thing. An entry the newer one
merely restates ("I cycle to work.", "I live in Porto." before "I moved to Porto
last month.") is superseded too but does not set that window (``restates``): on the
fit half it hid the entry that changed.

Round 2, from the fit half's misses: words naming one slot of a life (``SLOT_WORDS``:
"live"/"moved" home, "work"/"job", "boss"/"manager", "drive"/"car") count as a shared
word, so "I moved to Porto" meets "I currently live in Tromso" at the plain threshold;
when something was said is no shared word (``TIME_WORDS``: "last month" is not "1450
euros a month"); "my <word> <relation>" has a holder too ("my childhood friend Sven").
Round 3, from the fit half of a second set written in other words
(``memory_updates_round2.json``, on which the rules above superseded 50% / 63%): a change
told by its verb beside an older fact of the same thing (``CHANGE_WORDS``: "put my rent
up", "just started grade 4"); whose fact it is read from the subject ("I changed my PIN
hint to my grandmother's birthday" is the user's; "Dad sold his house" is the father's);
two sentences opening with "my <thing>" about two things ("My cat just turned 3" / "My dog
is 5") are kept apart.
Fitted on the fit half of ``benchmarks/data/memory_updates.json`` (written before
these rules) in a store that also holds the 420 facts and notes of the retrieval
eval (``benchmarks/memory_updates.py``; figures in ``benchmarks/figures/semantic.md``).
"""

from __future__ import annotations

import re

from mlotspark.memory.semantic.text import STOPWORDS, words

# People (and pets) a fact can be about besides the user: "my sister lives in Lyon".
RELATIONS = frozenset(
    """
    mother mom mum mama father dad papa parents parent sister sisters brother brothers son sons
    daughter daughters child children kid kids wife husband partner spouse girlfriend boyfriend
    fiance fiancee grandmother grandma granny grandfather grandpa grandparents aunt uncle cousin
    niece nephew friend friends neighbour neighbor neighbours neighbors colleague colleagues
    boss manager roommate flatmate landlord teacher doctor
    """.split()
)
# Words by which a statement says it replaces an earlier one.
UPDATE_CUES = frozenset(
    """
    now anymore longer moved move relocated changed change switched switch instead actually
    correction corrected new newly renamed replaced quit stopped became become turned
    sold transferred rescheduled raised lowered upgraded updated went lately
    nowadays currently days remarried cancelled sorry wrong mistake
    """.split()
)
# Verbs and words that tell a change only beside an older fact of the same thing ("The
# landlord put my rent up", "My daughter just started grade 4"); alone they tell plain events
# ("We finished the marathon"), so ``facts`` does not read them as changes. Not "since": "I
# have been self-employed since 2022" is a lasting fact beside "My job title is data analyst".
CHANGE_WORDS = frozenset(
    """
    started start began begun swapped swap wiped installed promoted demoted joined just
    finished put set
    """.split()
)
NO_OVERLAP = 0.1  # extra cosine needed when the two facts share no content word

ADDITION_CUES = frozenset("also too another additionally second both well".split())
# When a fact was said is not what it is about: "I moved to Porto last month." shares
# nothing with "I pay rent of 1450 euros a month."
TIME_WORDS = frozenset(
    """
    today yesterday tomorrow tonight day week weeks month months year years ago last since recently
    morning evening night weekend
    """.split()
)
_FILLER = STOPWORDS | UPDATE_CUES | CHANGE_WORDS | ADDITION_CUES | TIME_WORDS | {"not", "no", "never"}
# Words naming one slot of a person's life, so that two facts about it share a content
# word even in other words: "I moved to Porto" / "I currently live in Tromso".
SLOT_WORDS = {
    **dict.fromkeys("live lives moved move relocated reside based".split(), "home"),
    **dict.fromkeys("work works working worked job jobs employed employer".split(), "work"),
    **dict.fromkeys("boss manager supervisor".split(), "boss"),
    **dict.fromkeys("drive drives driving car".split(), "car"),
}

_RETRACT = re.compile(
    r"^(?:(?:please|ok|okay|so|and|also|oh)[\s,]+)*(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|you\s+can\s+|you\s+may\s+)?"
    r"(?:please\s+)?(?:forget|delete|erase|remove|drop|disregard|ignore|"
    r"(?:don['’]?t|do\s+not|no\s+need\s+to|stop)\s+(?:remember|remembering|keeping\s+track\s+of))\s+"
    r"(?:(?:that|about|what\s+i\s+(?:said|told\s+you)\s+about|the\s+fact\s+that|everything\s+about)\s+)?"
    r"(?P<what>.+?)[\s,]*(?:,?\s*please)?[.!?]*$",
    re.I,
)


_SAME = {"mom": "mother", "mum": "mother", "mama": "mother", "dad": "father", "papa": "father",
         "grandma": "grandmother", "granny": "grandmother", "grandpa": "grandfather",
         "neighbor": "neighbour", "kids": "children", "kid": "child"}
# Kinship words that stand for a name at the start of a sentence ("Mum moved to Bruges.").
_KIN_NAMES = frozenset("mom mum mama dad papa grandma granny grandpa".split())
# A relation after these is what the user's fact is about, not whose fact it is.
_OBJECT_PREPOSITIONS = frozenset("to for with from about at by like than".split())


def holders(text: str) -> frozenset[str]:
    """The relations a fact is about ("my sister's cat" -> {"sister"}); empty for the user.

    Args:
        text: a fact.

    Returns:
        Relation words following "my"/"our" (or a possessive), as a set.
    """
    toks = words(text)
    found = set()
    for i, w in enumerate(toks):
        if w not in RELATIONS:
            continue
        if i == 0 and w in _KIN_NAMES:
            found.add(_SAME.get(w, w))  # "Dad sold his house": a kinship word used as a name
            continue
        own = ("my", "our", "s")  # "s": a possessive, "my sister's husband"
        at = i - 1 if i > 0 and toks[i - 1] in own else i - 2 if i > 1 and toks[i - 2] in own else None
        if at is None:
            continue  # "my sister", and one word between: "my best friend", "my childhood friend"
        if at > 0 and toks[at - 1] in _OBJECT_PREPOSITIONS:
            continue  # "I changed my PIN hint to my grandmother's birthday": the user's fact
        found.add(_SAME.get(w, w))
    return frozenset(found)


def subject(text: str) -> str | None:
    """The "my <thing>" a fact opens with, when a copula gives it one value ("My favourite colour is green.").

    Args:
        text: a fact.

    Returns:
        The words between "my"/"our" and "is"/"are"/"was"/"were" ("favourite colour"),
        or None: the fact does not open so, another verb comes first ("My sister Ilse
        has a cat": people and their things have many values), or the thing is a person
        ("My sister is a nurse" and "My sister is Belgian" are both true).
    """
    toks = words(text)
    if not toks or toks[0] not in ("my", "our"):
        return None
    for i, w in enumerate(toks[1:6], start=1):
        if w in ("was", "were"):
            return None  # the past: "My bike was stolen" is an event, not its current value
        if w in ("is", "are"):
            head = toks[1:i]
            if not head or head[-1] in RELATIONS:
                return None
            return " ".join(head)
    return None


_PERSONAL = frozenset("i my we our me us".split())
_FRAMES = frozenset("called named on in at from".split())  # "is called X", "is on the third floor"


def frame(text: str) -> tuple[str, str] | None:
    """(the "my <thing>", the kind of value its copula gives) or None (see ``subject``).

    "My dog is called Rex." -> ("dog", "called"); "My dog is a border collie." ->
    ("dog", "value"); "My office is on the third floor." -> ("office", "on").
    """
    head = subject(text)
    if head is None:
        return None
    toks = words(text)
    rest = toks[len(head.split()) + 2 :]
    rest = [w for w in rest if w not in ("now", "actually", "still", "also", "currently", "really")]
    return head, rest[0] if rest and rest[0] in _FRAMES else "value"


def _slots(text_words: list[str]) -> set[str]:
    """Content words, those naming a slot of ``SLOT_WORDS`` mapped to it ("moved" -> "home")."""
    return {SLOT_WORDS.get(w, w) for w in text_words if w in SLOT_WORDS or w not in _FILLER}


def _personal(text_words: list[str]) -> bool:
    """About the user or the user's own people: "I", "my", "we", or a kinship name first ("Dad")."""
    return _has(text_words, _PERSONAL) or bool(text_words and text_words[0] in _KIN_NAMES)


def _has(text_words: list[str], cues: frozenset[str]) -> bool:
    return any(w in cues for w in text_words)


_NEGATIONS = frozenset("not no never nor".split())


def _negated(text_words: list[str]) -> bool:
    """Whether a fact says something is not so ("I don't have a cat", "I no longer smoke")."""
    return _has(text_words, _NEGATIONS)


def supersedes(new: str, old: str, cosine: float, threshold: float) -> bool:
    """Whether ``new`` replaces ``old`` (the rules of the module docstring).

    Args:
        new: the newer fact.
        old: the older fact.
        cosine: their vectors' similarity.
        threshold: the calibration's ``supersede`` threshold.

    Returns:
        True when ``new`` is an update of ``old``.
    """
    if cosine < threshold or holders(new) != holders(old):
        return False
    new_w, old_w = words(new), words(old)
    if not (_personal(new_w) and _personal(old_w)):
        return False
    if _has(new_w, ADDITION_CUES) and not _has(new_w, UPDATE_CUES - {"new"}):
        return False
    new_content = {w for w in new_w if w not in _FILLER}
    old_content = {w for w in old_w if w not in _FILLER}
    if _negated(new_w) != _negated(old_w):
        if old_content and old_content <= set(new_w):
            return True  # the older one's words, negated or no longer negated: no longer true
    elif not new_content - set(old_w):
        return False  # nothing new: a restatement, not an update
    if not _slots(new_w) & _slots(old_w) and cosine < threshold + NO_OVERLAP:
        return False
    same_thing = frame(new) is not None and frame(new) == frame(old)
    if not same_thing and subject(new) is not None and subject(old) is not None:
        return False  # "My dog is a border collie" after "My dog is called Biscuit": another attribute
    if _other_things(new_w, old_w):
        return False  # "My cat just turned 3." is not about "My dog is 5."
    return same_thing or _has(new_w, UPDATE_CUES | CHANGE_WORDS)


def _other_things(new_w: list[str], old_w: list[str]) -> bool:
    """Whether both open with "my <thing>" (or both "our") and each thing is missing from the other
    sentence ("Our team moved to building F." may still update "My office is in building C.")."""
    if len(new_w) < 2 or len(old_w) < 2 or new_w[0] not in ("my", "our") or old_w[0] != new_w[0]:
        return False
    return new_w[1] != old_w[1] and new_w[1] not in old_w and old_w[1] not in new_w


def restates(new: str, old: str) -> bool:
    """Whether ``new`` says everything ``old`` does (and perhaps more): "I cycle to work now
    instead of taking the train." restates "I cycle to work."; "I moved to Porto last month."
    restates "I live in Porto." (the same value: names and numbers of ``old`` all in ``new``).

    Such an entry is no evidence of which slot ``new`` updates, so it does not anchor the
    window of ``history.replaced_by`` (the entry that changes is found beyond it).
    """
    new_w, old_w = set(words(new)), words(old)
    values = [w for w in _values(old) if w]
    if values:
        return all(v in new_w for v in values)
    content = [w for w in old_w if w not in _FILLER]
    return bool(content) and all(w in new_w for w in content)


def _values(text: str) -> list[str]:
    """Names and numbers in ``text`` (capitalised words past the first, digits), lower-cased."""
    toks = text.replace("'s", " ").split()
    out = []
    for i, t in enumerate(toks):
        w = t.strip(".,;:!?()\"'")
        if w and (any(c.isdigit() for c in w) or (i > 0 and w[0].isupper() and w.lower() not in _PERSONAL)):
            out.extend(words(w))
    return out


def retraction(text: str) -> str | None:
    """What a "forget that ..." sentence asks to forget.

    Args:
        text: one sentence of the user's.

    Returns:
        The thing named ("my cat is called Mochi"), or None when the sentence is no retraction.
    """
    m = _RETRACT.match(text.strip())
    if not m:
        return None
    what = m.group("what").strip(" ,.")
    if len(words(what)) < 2 and not any(w not in STOPWORDS for w in words(what)):
        return None  # "forget it", "forget that": nothing named
    return what


__all__ = ["ADDITION_CUES", "CHANGE_WORDS", "RELATIONS", "UPDATE_CUES", "frame", "holders", "restates", "retraction", "subject", "supersedes"]
