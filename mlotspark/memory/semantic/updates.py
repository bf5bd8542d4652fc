"""Knowledge updates and retractions: when a new fact replaces an old one, and what "forget that ..." names.

"I moved to Porto last month." after "I live in Utrecht." is about the same thing,
so the newer entry wins at retrieval and the older one is marked superseded (kept,
with the time, for ``mlotspark memory list``). Sentence vectors alone cannot tell
this from two facts of the same kind: with all-mpnet-base-v2, "I live in Utrecht" /
"I moved to Porto" score 0.51 while "My dog is called Rex" / "My cat is called Tom"
score 0.56. So a newer text supersedes an older one when all of these hold:

1. they are about the same holder: the same people named by "my <relation>"
   ("my sister", "my husband's ...") — "I live in Porto" never replaces "My
   mother lives in Lyon";
2. they are about the same thing: cosine at or above the calibration's
   ``supersede`` threshold when they share a content word, ``NO_OVERLAP`` more when
   they share none ("I live in Utrecht" / "I moved to Porto"); and either the newer
   one says it is an update ("now", "moved", "switched", "no longer", "instead",
   "actually", "sorry", "new", ...) or both start with the same "my <thing>" ("My
   favourite colour is ..." twice);
3. the newer one says something the older did not (a content word of its own),
   and does not say it is an addition ("also", "too", "another", "as well").

Retractions are explicit: "Forget that my cat is called Mochi.", "Please forget my
age.", "Forget what I said about my brother living in Toronto." name what to
forget; the store removes the entry that best matches it (``SemanticStore.retract``).

Only the nearest entry that passes is superseded (``history.replaced_by``): a
newer fact updates one older fact, and the nearest is the right one when several
pass ("I cycle to work now instead of taking the train." passes against "I take
the train to work." at 0.68 and "I go to the gym on Mondays." at 0.51).
Fitted on the fit half of ``benchmarks/data/memory_updates.json`` (written before
these rules): 28 of 30 updates found, none of 15 same-kind pairs taken for one.
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
    correction corrected new newly renamed replaced quit stopped started became become turned
    sold bought left transferred rescheduled raised lowered upgraded updated gave went lately
    nowadays currently days remarried finished cancelled joined sorry wrong mistake today
    """.split()
)
NO_OVERLAP = 0.1  # extra cosine needed when the two facts share no content word

ADDITION_CUES = frozenset("also too another additionally second both well".split())
_FILLER = STOPWORDS | UPDATE_CUES | ADDITION_CUES | {"not", "no", "never"}

_RETRACT = re.compile(
    r"^(?:(?:please|ok|okay|so|and|also|oh)[\s,]+)*(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|you\s+can\s+|you\s+may\s+)?"
    r"(?:please\s+)?(?:forget|delete|erase|remove|drop|disregard|ignore)\s+"
    r"(?:(?:that|about|what\s+i\s+(?:said|told\s+you)\s+about|the\s+fact\s+that|everything\s+about)\s+)?"
    r"(?P<what>.+?)[\s,]*(?:,?\s*please)?[.!?]*$",
    re.I,
)


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
        if w in RELATIONS and i > 0 and toks[i - 1] in ("my", "our", "s", "new", "best", "old", "younger", "older",
                                                         "little", "big", "late", "ex"):
            found.add({"mom": "mother", "mum": "mother", "mama": "mother", "dad": "father", "papa": "father",
                       "grandma": "grandmother", "granny": "grandmother", "grandpa": "grandfather",
                       "neighbor": "neighbour", "kids": "children", "kid": "child"}.get(w, w))
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
        if w in ("is", "are", "was", "were"):
            head = toks[1:i]
            if not head or head[-1] in RELATIONS:
                return None
            return " ".join(head)
    return None


def _has(text_words: list[str], cues: frozenset[str]) -> bool:
    return any(w in cues for w in text_words)


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
    if _has(new_w, ADDITION_CUES) and not _has(new_w, UPDATE_CUES - {"new"}):
        return False
    new_content = {w for w in new_w if w not in _FILLER}
    if not new_content - set(old_w):
        return False  # nothing new: a restatement, not an update
    if not new_content & {w for w in old_w if w not in _FILLER} and cosine < threshold + NO_OVERLAP:
        return False
    same_thing = subject(new) is not None and subject(new) == subject(old)
    return same_thing or _has(new_w, UPDATE_CUES)


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


__all__ = ["ADDITION_CUES", "RELATIONS", "UPDATE_CUES", "holders", "retraction", "subject", "supersedes"]
