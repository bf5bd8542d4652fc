"""Retractions: what "forget that ..." names, and which entry it takes.

"Forget that my cat is called Mochi.", "Please forget my age.", "Scratch that about my
salary, I'd rather you didn't store it." name what to forget (``retraction``); the store
deletes the entry that best matches it (``named_entry``; ``SemanticStore.retract``), and
nothing on a guess: a weak match that does not stand apart, or two entries of other slots
matched alike, delete nothing.

Measured on three sets' retractions (``benchmarks/memory_updates.py``, figures in
``benchmarks/figures/semantic.md``); the phrasings of round 4 come from the third set's fit half.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from mlotspark.memory.semantic.text import STOPWORDS, content_words, words
from mlotspark.memory.semantic.updates import RELATIONS

RETRACT_SLACK = 0.07  # a retraction's best match may score this far under the threshold ...
RETRACT_APART = 0.1  # ... when it is this far above the next entry
# Two entries of other slots this close are a guess: "Don't keep my street name." scored "My
# middle name is ..." and "My name is ..." 0.47 each (on the fit halves every right match stood
# at least 0.05 above the next entry).
RETRACT_TIE = 0.04

# A retraction: a lead-in ("ugh,", "can you", "I'd like you to"), a verb that forgets and
# what it names. The verbs differ in how sure they are of being about memory:
# - "forget", "don't remember", "I'd rather you didn't keep": anything named;
# - "don't keep / store", "never mind": something of the user's ("Don't keep my street name.")
#   or framed as what was said; "Don't store passwords in plain text." and "Don't keep my key
#   in the repo." are advice ("don't save" is left out: "Don't save my changes.");
# - "can you not remember", "you don't need": only what is framed, or told to go ("..., get rid of it");
# - "remove", "drop", "delete", "scratch", "scrap": what is framed as what was said ("the bit about ...",
#   "what I told you about ...", "... from memory") or a bare thing of the user's ("Remove my
#   phone number."), not one somewhere else or with more to do ("Remove my cat from the photo.",
#   "Delete my virtualenv and recreate it."); "ignore", "disregard": only what is framed
#   ("Ignore my last message." is about the chat).
_LEAD = (r"(?:(?:please|ok|okay|so|and|also|oh|ugh|hmm|actually|wait|hey|um|uh|right|sorry|"
         r"on\s+second\s+thoughts?)[\s,]+)*"
         r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|you\s+(?:can|may|should)\s+|"
         r"i['’]?d\s+like\s+you\s+to\s+|i\s+(?:want|need)\s+you\s+to\s+)?(?:please\s+)?")
_KEEP = r"(?:remember|remembering|keep|keeping|store|storing|save|saving|know|hold\s+on\s+to|keep(?:ing)?\s+track\s+of)"
_FORGET_VERB = (r"forget|(?:don['’]?t|do\s+not|no\s+need\s+to|stop|never)\s+(?:remember|remembering|keep(?:ing)?\s+track\s+of)|"
                rf"i['’]?d\s+(?:prefer|rather)\s+(?:that\s+)?you\s+(?:not|didn['’]?t|did\s+not|don['’]?t)\s+{_KEEP}|"
                rf"i\s+don['’]?t\s+want\s+you\s+to\s+{_KEEP}|(?:would|do)\s+you\s+mind\s+not\s+{_KEEP}")
_KEEP_VERB = r"(?:don['’]?t|do\s+not|no\s+need\s+to|stop|never)\s+(?:keep|keeping|store|storing|hold\s+on\s+to)|never\s+mind"
# Unsure of being about memory at all: "Can you not remember my name?" is a complaint, "You don't
# need my API key to run this." a remark; a retraction only when framed as what was said ("the
# mental health stuff I mentioned") or told to go ("you don't need my number plate, get rid of it").
_UNSURE_VERB = r"not\s+(?:remember|keep|store)|(?:you\s+)?don['’]?t\s+need(?:\s+to\s+(?:know|keep|remember|store))?"
_DELETE_VERB = r"delete|erase|remove|drop|scratch|scrap|wipe|get\s+rid\s+of|throw\s+(?:away|out)"
_ASIDE_VERB = r"ignore|disregard"
_FRAMED = (r"(?:(?:that|this),?\s+(?:bit\s+|part\s+|thing\s+|stuff\s+)?about|what\s+i\s+(?:said|told\s+you|mentioned|wrote)"
           r"(?:\s+(?:about|regarding|of))?|the\s+fact\s+that|(?:everything|anything|all)\s+(?:you\s+know\s+)?about|"
           r"the\s+(?:bit|part|note|notes|thing|stuff|info|information|detail|details|line)\s+(?:about|on|regarding))")
_RETRACT = re.compile(
    rf"^{_LEAD}(?:(?P<forget>{_FORGET_VERB})|(?P<keep>{_KEEP_VERB})|(?P<delete>{_DELETE_VERB})|(?P<aside>{_ASIDE_VERB})|"
    rf"(?P<unsure>{_UNSURE_VERB}))\s+"
    rf"(?:(?P<framed>{_FRAMED})\s+|(?:about|that)\s+)?"
    r"(?P<what>.+?)[\s,]*(?:,?\s*please)?[.!?]*$",
    re.I,
)
# Where the thing is kept, a frame of what was told: "... from memory", "... from your notes".
_IN_MEMORY = re.compile(r"\s+(?:(?:from|out\s+of|in)\s+(?:your\s+)?memory|(?:from|in)\s+your\s+notes)$", re.I)
# Kept where: said of the thing, no frame ("Don't keep my address on file." names "my address").
_ON_FILE = re.compile(r"\s+on\s+(?:file|record)$", re.I)
# Told to go: "..., get rid of it", "..., please delete it".
_DELETE_IT = re.compile(r",\s*(?:please\s+)?(?:forget|delete|remove|erase|drop|scrap|scratch|get\s+rid\s+of)\s+(?:it|that|this)\W*"
                        r"(?:please\W*)?$", re.I)
# A clause after a comma that gives a reason, not more of what to forget ("..., I'd rather you didn't store it").
_REASON = re.compile(r",\s*(?:(?:i|i['’]\w+|it|it['’]s|that['’]s|he|she|they|we|since|because|as|so|it\s+is)\b.*|"
                     r"(?:please\s+)?(?:forget|delete|remove|erase|drop|scrap|scratch|get\s+rid\s+of)\s+(?:it|that|this)\W*(?:please\W*)?)$", re.I)
# A clause after a comma that asks or tells something else: the user changes the subject
# ("Never mind the weather, where does my sister live?", "Forget Rust, what's the best way to learn Go?").
_NEXT_TOPIC = re.compile(r"^(?:what|where|who|whom|whose|when|why|how|which|can|could|would|will|do|does|did|is|are|"
                         r"should|tell|show|give|let['’]?s|let|just|help|explain|write|now|instead|please)\b", re.I)
# Where a thing is, or what else to do with it: "my password in the config file", "my cat from
# the photo", "my virtualenv and recreate it".
_PLACE = re.compile(r"\s(?:in|into|on|at|inside|under|from|and|then)\s", re.I)
# What is said of a thing, not the thing: "the cat diet thing", "that stuff about ...".
_THING = re.compile(r"\b(?:thing|things|stuff|bit|part)(?:\s+(?:that\s+)?i\s+(?:said|mentioned|told\s+you|wrote))?$", re.I)
# A question word opens what is told about the user ("Don't store where my kid goes to school."): framed.
_TOLD = re.compile(r"^(?:where|what|who|when|how|which)\s", re.I)
_LONGEST = 400  # characters: a retraction is a sentence; the pattern stays quick on anything longer


# "Forget everything you know about me.", "Wipe your memory.": all of it, which no sentence deletes
# (one entry would be a guess; `memory list` / `memory forget ID` are exact). Said back as "not
# forgotten", never acted on.
_ALL_OF_IT = r"(?:everything|it all|all of it|all (?:that )?(?:you know|you have))"
_ABOUT_ME = r"(?:about me|you know|you have on me|you remember|you(?:'ve| have) learned)"
_FORGET_ALL = re.compile(
    r"^(?:please\s+|can you\s+|could you\s+)*(?:"
    rf"forget\s+{_ALL_OF_IT}"  # "forget" is about memory: any "everything"
    rf"|(?:delete|erase|wipe|clear|remove)\s+(?:{_ALL_OF_IT}\s+{_ABOUT_ME}|all you know"  # the others: framed
    r"|(?:all\s+(?:of\s+)?)?your memory|all (?:my|your) (?:memories|data|notes|facts|info|information)))\b", re.I)


def asks_to_forget_all(text: str) -> bool:
    """Whether a sentence asks to forget everything ("Forget everything you know about me."): not a
    retraction of one thing, and so nothing is deleted, but the turn says so (``not_forgotten``)."""
    return isinstance(text, str) and len(text) <= _LONGEST and bool(_FORGET_ALL.match(" ".join(text.split())))


def retraction(text: str) -> str | None:
    """What a "forget that ..." sentence asks to forget.

    Args:
        text: one sentence of the user's.

    Returns:
        The thing named ("my cat is called Mochi"), or None when the sentence is no retraction.
    """
    text = " ".join(text.split())
    if len(text) > _LONGEST:
        return None
    m = _RETRACT.match(_REASON.sub("", text))
    if not m:
        return None
    what, _, rest = m.group("what").partition(",")
    what = what.strip(" ,.")
    in_memory = _IN_MEMORY.search(what)
    what = what[: in_memory.start()] if in_memory else what
    what = _ON_FILE.sub("", what)
    if _NEXT_TOPIC.match(rest.strip()) or (rest and text.endswith("?")):
        return None  # "Never mind the weather, where does my sister live?": another subject
    framed = bool(m.group("framed") or in_memory or _THING.search(what))
    if m.group("unsure") and not (framed or _DELETE_IT.search(text)):
        return None  # "Can you not remember my name?", "You don't need my API key to run this."
    # A wh-clause about the user is what was told, for the verbs that speak of memory ("Don't store
    # where my kid goes to school."); "Ignore how my code is formatted." is about the code.
    told = (m.group("forget") or m.group("keep")) and _TOLD.match(what) and _USER & set(words(what))
    framed = framed or bool(told)
    own = _opens_with_my(what) and not _PLACE.search(what)  # "my phone number", no "from the photo"
    if m.group("delete") and not (framed or own):
        return None  # "Remove my cat from the photo.", "Drop the users table."
    if m.group("aside") and not framed:
        return None  # "Ignore my last message.": about the chat
    if m.group("keep") and not (framed or own):
        return None  # "Don't store passwords in plain text.", "Don't keep my key in the repo.": advice
    if not any(w not in STOPWORDS for w in words(what)):
        return None  # "forget it", "Forget about it, let's talk about my trip.": nothing named
    return what


def things_named(what: str) -> list[str]:
    """The things a retraction names, each searched alone: "my cat and my dog" -> ["my cat",
    "my dog"]; split only where every part opens with "my" / "our" ("my sister and I went to
    Paris" is one thing)."""
    parts = [p.strip(" ,") for p in re.split(r",?\s+and\s+|,\s*", what) if p.strip(" ,")]
    if len(parts) > 1 and all(map(_opens_with_my, parts)):
        return parts
    return [what]


_USER = frozenset("i me my mine myself we us our ours ourselves".split())


_TOKEN = re.compile(r"[\w'’-]+")
_PRONOUN_I = frozenset(("I", "I'm", "I've", "I'd", "I'll", "I’m", "I’ve", "I’d", "I’ll"))


def values_named(what: str) -> set[str]:
    """The names and numbers a retraction names, as words: "my cat is called Mochi" -> {"mochi"},
    "my salary of 50,000" -> {"50", "000"}; "I", function words that open it ("My ...") and a relation
    said as a name ("Mum's diagnosis") are none."""
    out: set[str] = set()
    for tok in _TOKEN.findall(what):
        if any(c.isdigit() for c in tok) or (tok[:1].isupper() and tok not in _PRONOUN_I
                                              and words(tok)[0] not in STOPWORDS | RELATIONS):  # "Mum's" is no name
            out.update(w for w in words(tok) if w != "s")  # "Jean-Luc's" -> jean, luc
    low = words(what)
    if len(low) >= 3 and low[-2] in _VALUE_SLOT and low[-1] not in STOPWORDS | RELATIONS:
        out.add(low[-1])  # a name typed in lower case: "my cat is called mochi"
    return out


# Words after which a retraction's last word is a name ("... is called mochi"); not "in", "to", ...:
# "where my kid goes to school" names a kind of thing, not a value.
_VALUE_SLOT = frozenset("called named".split())


def may_take(what: str, entry: str) -> bool:
    """Whether a retraction naming ``what`` may delete ``entry``.

    - A name or a number it names must be in the entry (a number's digits, however grouped):
      "Forget that my cat is called Mochi." takes no "My cat is called Luna.", "Forget that I live
      in Berlin." no "I live in Utrecht." (in a store of a few entries the best match stands alone,
      so the score rules let it go: a user's audit found both). Typed in lower case, only a name
      after "called" / "named" is told from other words.
    - One about the user's own things ("me handing in my notice") takes no entry that says nothing
      of the user ("Kevin from accounting is leaving the company.") unless they share a word. Found
      on the third update set's fit half, where that entry went instead of a fact the turn had never
      stored.
    """
    entry_words, digits = set(words(entry)), re.sub(r"\D", "", entry)
    if any(v not in entry_words and not (v.isdigit() and v in digits) for v in values_named(what)):
        return False
    if not _USER & set(words(what)) or _USER & set(words(entry)):
        return True
    return bool(set(content_words(what)) & set(content_words(entry)))


def _opens_with_my(text: str) -> bool:
    return words(text)[:1] in (["my"], ["our"])


def named_entry(hits: Sequence[tuple[int, float]], threshold: float,
                chain: Callable[[int], list[int]]) -> int | None:
    """The entry a retraction names, or None when it names none clearly.

    Args:
        hits: ``(entry id, score)`` for the words named, best first, superseded entries included.
        threshold: the calibration's threshold for messages about the user.
        chain: an entry's slot (``history.update_chain``): the current value first, then the
            older ones it replaced.

    Returns:
        The best match if it scores ``threshold`` (or ``RETRACT_SLACK`` less when it stands
        ``RETRACT_APART`` above every entry of another fact), unless an entry of another fact
        scores within ``RETRACT_TIE`` of it. An older value gives way to its slot's current one when
        the words name that about as well ("Forget my address." after a move).
    """
    if not hits or hits[0][1] < threshold - RETRACT_SLACK:
        return None
    best, score = hits[0]
    slot = chain(best)
    runner_up = next((s for i, s in hits[1:] if i not in slot), 0.0)  # the best of another fact
    if score < threshold and score - runner_up < RETRACT_APART:
        return None  # weak and not clearly the one named
    if score - runner_up < RETRACT_TIE:
        return None  # two facts match alike: which one was meant is a guess
    end = slot[0]
    if end != best:  # an older value: the current one, when the words name it about as well
        end_score = next((s for i, s in hits if i == end), 0.0)
        if end_score >= max(threshold, score - RETRACT_APART):
            return end
    return best


__all__ = ["RETRACT_APART", "RETRACT_SLACK", "RETRACT_TIE", "asks_to_forget_all", "may_take", "named_entry", "retraction",
           "things_named"]
