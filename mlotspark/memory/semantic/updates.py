"""Knowledge updates: when a new fact replaces an old one (retractions: ``retractions.py``).

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

Retractions ("Forget that my cat is called Mochi.") are read by ``retractions.py``.

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
Round 4, from the fit half of a third set written by another hand from the format alone
(``memory_updates_round3.json``, on which the rules above superseded 33% / 37%): a person
named beside a relation is that relation in the other fact ("My nephew Ruben ..." /
"Ruben graduated ..."; "Aunt Rosa", "Gran" open a sentence as "Dad" does); a chat sentence
with its "I" left out is the user's ("Switched to a Pixel 8 last month."); a cue after "to"
is a plan, not a change ("wants to become a vet"); "My salary is paid on ..." is passive, not
the salary's value; the older sentence's words again with another value is an update with no
cue ("Oops, my partner's birthday is the 21st of May."); and a said change of a thing both
name may pass ``CUE_SLACK`` under the threshold, when it picks out one entry alone
(``history.replaced_by``: "Lately ... Ethiopian food, it's my new favourite." passes four
favourites at 0.34-0.39 and takes none).
Round 5, from the fit half of a fifth set (``memory_updates_round5.json``, written by a helper
who read none of this): who holds a relation is the user's own fact ("My line manager is Rebecca
Stroud." is changed by "I report to Daniel Okafor now.", ``_identified``), changed only by a fact
that names the relation's slot; a word's stem is half a shared word ("iPhone" / "phone", ``_akin``);
and a question that finds an entry and a newer one saying a change of it gets the newer
(``replaces_alike``, with the question standing for part of the evidence the threshold gives).
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
    boss manager roommate flatmate landlord teacher doctor gran nan nana auntie
    """.split()
)
# Words by which a statement says it replaces an earlier one.
UPDATE_CUES = frozenset(
    """
    now anymore longer moved move relocated changed change switched switch instead actually
    correction corrected new newly renamed replaced quit stopped became become turned
    sold transferred rescheduled raised lowered upgraded updated went gone lately latest
    nowadays currently days remarried cancelled sorry wrong mistake retired
    """.split()
)
# Verbs and words that tell a change only beside an older fact of the same thing ("The
# landlord put my rent up", "My daughter just started grade 4"); alone they tell plain events
# ("We finished the marathon"), so ``facts`` does not read them as changes. Not "since": "I
# have been self-employed since 2022" is a lasting fact beside "My job title is data analyst".
CHANGE_WORDS = frozenset(
    """
    started start began begun swapped swap wiped installed promoted demoted joined just
    finished put set upped increased decreased reduced bumped doubled halved
    """.split()
)
NO_OVERLAP = 0.1  # extra cosine needed when the two facts share no content word
CUE_SLACK = 0.07  # cosine below the threshold allowed to a said change of a thing both name
SAME_SENTENCE = 0.7  # cosine at which another value, with no word of change, is an update

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
    **dict.fromkeys("work works working worked job jobs employed employer freelance freelancer freelancing "
                    "self-employed hired fired retired promotion promoted".split(), "work"),
    **dict.fromkeys("salary salaries earn earns earning earnings income wage wages".split(), "pay"),
    **dict.fromkeys("boss manager supervisor report reports reporting".split(), "boss"),
    **dict.fromkeys("partner girlfriend boyfriend wife husband spouse fiance fiancee married marry dating engaged".split(),
                    "partner"),
    **dict.fromkeys("doctor gp".split(), "doctor"),
    **dict.fromkeys("drive drives driving car".split(), "car"),
}

_SAME = {"mom": "mother", "mum": "mother", "mama": "mother", "dad": "father", "papa": "father",
         "grandma": "grandmother", "granny": "grandmother", "gran": "grandmother", "nan": "grandmother",
         "nana": "grandmother", "grandpa": "grandfather", "auntie": "aunt",
         "neighbor": "neighbour", "kids": "children", "kid": "child"}
# Kinship words that stand for a name at the start of a sentence ("Mum moved to Bruges.").
_KIN_NAMES = frozenset("mom mum mama dad papa grandma granny gran nan nana grandpa aunt auntie uncle".split())
# A relation after these is what the user's fact is about, not whose fact it is.
_OBJECT_PREPOSITIONS = frozenset("to for with from about at by like than".split())


# Who holds a relation is the user's own fact: "My manager is Rebecca Stroud.", "My partner's
# name is Sam.", "Lily's teacher this year is Mr Hughes.", "my doctor's a Dr Lindqvist now" say who
# the user's manager, partner, doctor is (an update names another: "I report to Daniel now.").
_IDENTITY = re.compile(
    r"(?:\b(?i:my|our)\s+|['’]s\s+)(?:\w+\s+)?(?P<rel>[a-z]+)(?P<name>['’]s\s+name)?(?:\s+(?:this|last|next)\s+\w+)?"
    r"(?:\s+is|['’]s)\s+(?:now\s+|still\s+|actually\s+)?(?P<called>called\s+|named\s+)?(?:an?\s+)?"
    r"(?:(?:Dr|Mr|Mrs|Ms|Miss|Prof)\.?\s+)?[A-Z][a-z]")
# Relations one person holds at a time, named by "is <Name>" alone ("My boss is Rebecca."); of
# the others only a name says who ("My sister is called Anna."; "My mother is French." is not who).
_ROLES = frozenset("partner girlfriend boyfriend wife husband spouse fiance fiancee boss manager teacher doctor "
                   "landlord roommate flatmate".split())


def _identified(text: str) -> set[str]:
    """The relations whose holder ``text`` names ("My manager is Rebecca Stroud." -> {"manager"})."""
    return {m.group("rel") for m in _IDENTITY.finditer(text)
            if m.group("rel") in _ROLES or (m.group("rel") in RELATIONS and (m.group("name") or m.group("called")))}


def holders(text: str) -> frozenset[str]:
    """The relations a fact is about ("my sister's cat" -> {"sister"}); empty for the user.

    Args:
        text: a fact.

    Returns:
        Relation words following "my"/"our" (or a possessive), as a set.
    """
    toks = words(text)
    found = set()
    identified = _identified(text)
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
        if w in identified:
            continue  # "My manager is Rebecca Stroud.": who the user's manager is
        found.add(_SAME.get(w, w) + ("-in-law" if toks[i + 1 : i + 3] == ["in", "law"] else ""))
    return frozenset(found)


def name_tokens(text: str) -> list[str]:
    """Words as written (case kept), punctuation and a possessive "'s" taken off."""
    out = []
    for t in text.split():
        t = t.strip(".,;:!?()\"'“”")
        out.append(t[:-2] if t.endswith(("'s", "’s")) else t)
    return out


def named(text: str) -> dict[str, str]:
    """People a fact names with their relation: "My nephew Ruben is studying in Delft." ->
    {"Ruben": "nephew"}; "Aunt Rosa quit teaching." -> {"Rosa": "aunt"}. Only a capitalised
    name right after the relation word itself ("My friend's Tesla" names no friend; "My friend
    Will" names Will, whom "I will start ..." does not mention)."""
    raw = text.split()
    toks = name_tokens(text)
    out = {}
    for i, t in enumerate(toks[:-1]):
        rel, name = t.lower(), toks[i + 1]
        base = rel.removesuffix("-in-law")  # "My father-in-law Gerald"
        if raw[i].rstrip(".,;:!?").endswith(("'s", "’s")) or base not in RELATIONS:
            continue
        rel = _SAME.get(base, base) + ("-in-law" if base != rel else "")
        if name[:1].isupper() and name.lower() not in STOPWORDS and name.lower() not in _PERSONAL:
            out[name] = rel
    return out


def _holders_by_name(new: str, old: str) -> tuple[frozenset[str], frozenset[str]]:
    """Both facts' holders, a person named by a relation in one counted in the other too:
    "Ruben graduated ..." is about the nephew of "My nephew Ruben is studying in Delft."."""
    hn, ho = holders(new), holders(old)
    for a, b in ((new, old), (old, new)):
        for name, rel in named(b).items():
            if name in name_tokens(a):
                hn, ho = (hn | {rel}, ho) if a is new else (hn, ho | {rel})
    return hn, ho


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
    if rest and (rest[0] in _FRAMES or _passive(rest)):
        return head, rest[0]  # "My salary is paid on the 25th": said of the salary, not its value
    return head, "value"


_IRREGULAR_PARTICIPLES = frozenset("paid made done kept held set built sent spent written given taken known".split())
_AFTER_PASSIVE = frozenset("on by in at for to every each from with monthly weekly yearly daily".split())


def _passive(rest: list[str]) -> bool:
    """Whether the words after "is" open a passive ("paid on the 25th", "booked for Friday"): an
    irregular participle, or an "-ed" word a preposition follows ("fried chicken", "Ahmed" are values)."""
    first, nxt = rest[0], rest[1] if len(rest) > 1 else ""
    return first in _IRREGULAR_PARTICIPLES or (first.endswith("ed") and len(first) > 4 and nxt in _AFTER_PASSIVE)


def _slots(text_words: list[str]) -> set[str]:
    """Content words, those naming a slot of ``SLOT_WORDS`` mapped to it ("moved" -> "home")."""
    # A slot is no word: "Our home network ..." shares nothing with "We've moved house."
    return {"slot:" + SLOT_WORDS[w] if w in SLOT_WORDS else w for w in text_words if w in SLOT_WORDS or w not in _FILLER}


def _share(new_w: list[str], old_w: list[str]) -> bool:
    """Whether two facts share a content word, or a word's slot (``_slots``)."""
    return bool(_slots(new_w) & _slots(old_w))


_SUFFIXES = ("ists", "ist", "ings", "ing", "als", "al", "ers", "er", "ed", "es", "s", "y", "e")


def _stem(word: str) -> str:
    """``word`` without one common ending, keeping four letters at least ("therapist", "therapy"
    -> "therap"; "renewal", "renews" -> "renew"; "smoking", "smoke" -> "smok")."""
    for end in _SUFFIXES:
        if word.endswith(end) and len(word) - len(end) >= 4:
            return word[: -len(end)]
    return word


def _akin(new_w: list[str], old_w: list[str]) -> bool:
    """Whether two facts share a word's stem (``_stem``: "therapist" / "therapy", "renews" /
    "renewal"), or one content word of five letters or more ends another ("iPhone" / "phone"; not
    "notebook" / "book", nor "internet" / "interview"). Weaker than a shared word ("flight" /
    "flights" in two trips): it lowers the extra cosine of ``NO_OVERLAP`` by half only."""
    a = {w for w in _slots(new_w) if len(w) >= 4 and w.isalpha()}
    b = {w for w in _slots(old_w) if len(w) >= 4 and w.isalpha()}
    stems = {_stem(w) for w in a}
    return bool(stems & {_stem(w) for w in b}) or any(
        (x.endswith(y) and len(y) >= 5) or (y.endswith(x) and len(x) >= 5) for x in a for y in b)


def may_update(text: str) -> bool:
    """Whether ``text`` could update an entry at all: it speaks of the user or the user's own
    people (``supersedes`` asks it of both sentences); a cheap test before any embedding."""
    return _personal(words(text)) or bool(holders(text))


def _personal(text_words: list[str]) -> bool:
    """About the user or the user's own people: "I", "my", "we", a kinship name first ("Dad"),
    or a chat's sentence with its "I" left out, opening with a verb of the past ("Switched to a
    Pixel 8 last month.", "Had allergy tests done.")."""
    if _has(text_words, _PERSONAL):
        return True
    if text_words and text_words[0] in _KIN_NAMES:
        return True
    lead = [w for w in text_words[:3] if w not in _OPENERS]  # "Just turned 35 today", "Finally sold the car"
    first = lead[0] if lead else ""
    return first in _PAST_VERBS or (first.endswith("ed") and len(first) > 4)


_OPENERS = frozenset("just finally recently so well anyway also oh ok okay today yesterday".split())


# Irregular past tenses that open a chat sentence with its "I" left out ("Got a new job.").
_PAST_VERBS = frozenset("got had went made took gave sold bought left began became found grew quit ran came "
                        "lost won sent spent paid".split())


def _has(text_words: list[str], cues: frozenset[str]) -> bool:
    return any(w in cues for w in text_words)


def _says_change(text_words: list[str], cues: frozenset[str]) -> bool:
    """A cue of change, not one of a plan: "My daughter wants to become a vet." and "I'd like to
    move to Porto." change nothing yet."""
    return any((w in cues and (i == 0 or text_words[i - 1] != "to")
                and not (w in _GONE and text_words[i + 1 : i + 2] and text_words[i + 1] in _WHERE_TO))
               or (w in ("up", "down") and i > 0 and text_words[i - 1] in _GO)  # "Salary's going up to 61k"
               for i, w in enumerate(text_words))


_GO = frozenset("go goes going went gone put bumped".split())
# "went vegan" is a change, "went to primary school in Zwolle" a trip or a past.
_GONE = frozenset("went gone".split())
_WHERE_TO = frozenset("to on for out home through into in".split())  # not "went back", "went with Aviva"


_NEGATIONS = frozenset("not no never nor".split())


def _negated(text_words: list[str]) -> bool:
    """Whether a fact says something is not so ("I don't have a cat", "I no longer smoke")."""
    return _has(text_words, _NEGATIONS)


def _one_holder(new: str, old: str, new_w: list[str], old_w: list[str]) -> bool:
    """Whether two facts are about the same holder, each the user's or the user's people's (a named
    relative's fact is: "Ruben graduated." beside "My nephew Ruben ...")."""
    hn, ho = _holders_by_name(new, old)
    return hn == ho and (_personal(new_w) or bool(hn)) and (_personal(old_w) or bool(ho))


def _adds(new_w: list[str]) -> bool:
    """Whether a fact says it is an addition ("also", "too", "another"), with no word of update."""
    return _has(new_w, ADDITION_CUES) and not _has(new_w, UPDATE_CUES - {"new"})


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
    new_w, old_w = words(new), words(old)
    if cosine < threshold - CUE_SLACK or not _one_holder(new, old, new_w, old_w):
        return False
    if (_identified(new) or _identified(old)) and not _share(new_w, old_w):
        return False  # who holds a relation changes only a fact that names it ("my landlord is now ...")
    if cosine < threshold and not (_says_change(new_w, UPDATE_CUES) and _share(new_w, old_w)):
        return False  # under the threshold only a said change of a thing both name
    if _adds(new_w):
        return False
    new_content = {w for w in new_w if w not in _FILLER}
    old_content = {w for w in old_w if w not in _FILLER}
    if _negated(new_w) != _negated(old_w):
        if old_content and old_content <= set(new_w):
            return True  # the older one's words, negated or no longer negated: no longer true
    elif not new_content - set(old_w):
        return False  # nothing new: a restatement, not an update
    if not _share(new_w, old_w) and cosine < threshold + (NO_OVERLAP / 2 if _akin(new_w, old_w) else NO_OVERLAP):
        return False
    same_thing = frame(new) is not None and frame(new) == frame(old)
    if not same_thing and subject(new) is not None and subject(old) is not None:
        return False  # "My dog is a border collie" after "My dog is called Biscuit": another attribute
    if _other_things(new_w, old_w):
        return False  # "My cat just turned 3." is not about "My dog is 5."
    if same_thing or _says_change(new_w, UPDATE_CUES | CHANGE_WORDS):
        return True
    # No word of change, but the older sentence's words again with another value: "Oops, my
    # partner's birthday is the 21st of May." after "My partner's birthday is on the 12th of May."
    # Only for a one-value "my <thing> is" the newer one names: "I have a sister named Eva." is
    # a second sister, not a correction of "I have a sister named Anna.".
    if cosine < SAME_SENTENCE or subject(old) is None or not names_its_thing(new, old):
        return False
    vn, vo = set(_values(new)), set(_values(old))
    template = {w for w in old_w if w not in _FILLER} - vo  # two words at least: "My laptop is a
    same_words = len(template) >= 2 and template <= set(new_w)  # ThinkPad." / "My laptop runs Windows."
    return same_words and bool(vn - vo) and bool(vo - vn)


def replaces_alike(new: str, old: str, cosine: float, threshold: float) -> bool:
    """Whether ``new`` replaces ``old`` when one question finds both (``search.newest_of_alike``):
    the question says they are about one thing, so ``supersedes``' threshold is relaxed by
    ``CUE_SLACK`` as for a said change: ``new`` says a change in a word of ``UPDATE_CUES`` ("new"
    aside: "My sister just got a new dog." changes nothing of "My sister is a nurse."), of the same
    holder, is no addition, and shares a word with ``old`` besides what both are about (the
    holder's or the "my <thing>"'s word: "My dog is called Rex." / "My dog just got neutered.") or a
    stem, or scores ``NO_OVERLAP / 2`` over the threshold; and it does not say it replaced something
    else ("I cycle to work now instead of taking the train." replaces no run).

    Args:
        new: the newer entry's text.
        old: the older entry's text.
        cosine: their vectors' similarity (0 when one has none).
        threshold: the calibration's ``supersede`` threshold.

    Returns:
        True when ``old`` should give way to ``new``.
    """
    new_w, old_w = words(new), words(old)
    if cosine < threshold - CUE_SLACK or not _one_holder(new, old, new_w, old_w):
        return False
    if not _says_change(new_w, UPDATE_CUES - {"new", "newly"}) or _adds(new_w):
        return False
    if not {w for w in new_w if w not in _FILLER} - set(old_w) or _other_things(new_w, old_w):
        return False  # nothing new, or two "my <thing>"s
    ids = _identified(new) | _identified(old)
    about = _about(new_w, ids) | _about(old_w, ids)  # what both are about is no evidence of one attribute
    nw, ow = [w for w in new_w if w not in about], [w for w in old_w if w not in about]
    if not (_share(nw, ow) or _akin(nw, ow) or cosine >= threshold + NO_OVERLAP / 2):
        return False
    replaced = _replaced(new_w)
    if replaced and not (_share(replaced, old_w) or _akin(replaced, old_w)):
        return False
    fn, fo = frame(new), frame(old)
    return fn is None or fo is None or fn == fo


def _about(text_words: list[str], identified: set[str]) -> set[str]:
    """The words saying whom or what a fact is about: relations, and the word after "my"/"our";
    not a relation whose holder a fact names ("My line manager is Rebecca Stroud.": who the
    manager is, the attribute "I report to Daniel now." changes)."""
    out = {w for w in text_words if w in RELATIONS and w not in identified}
    out |= {text_words[i + 1] for i, w in enumerate(text_words[:-1]) if w in ("my", "our")}
    return out


def _replaced(text_words: list[str]) -> list[str]:
    """The content words of what a fact says it replaces ("... instead of taking the train" ->
    ["taking", "train"]; "rather than"), or [] when it names none."""
    for i in range(len(text_words) - 1):
        if (text_words[i], text_words[i + 1]) in (("instead", "of"), ("rather", "than")):
            return [w for w in text_words[i + 2 : i + 6] if w not in _FILLER]
    return []


def _other_things(new_w: list[str], old_w: list[str]) -> bool:
    """Whether both open with "my <thing>" (or both "our") and each thing is missing from the other
    sentence ("Our team moved to building F." may still update "My office is in building C.")."""
    if len(new_w) < 2 or len(old_w) < 2 or new_w[0] not in ("my", "our") or old_w[0] != new_w[0]:
        return False
    return new_w[1] != old_w[1] and new_w[1] not in old_w and old_w[1] not in new_w


def names_its_thing(new: str, old: str) -> bool:
    """Whether ``new`` names every word of the "my <thing>" ``old`` opens with (or ``old`` has
    none): "My phone number changed to ..." names the thing of "My phone number is ..." but not
    of "My work phone number is ..." (for the entries besides the nearest one, ``history``)."""
    head = subject(old)
    return head is None or all(w in words(new) for w in head.split() if w not in _FILLER)


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


__all__ = ["ADDITION_CUES", "CHANGE_WORDS", "CUE_SLACK", "names_its_thing", "RELATIONS", "UPDATE_CUES", "frame", "holders",
           "replaces_alike", "restates", "subject", "supersedes"]
