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

from mlotspark.memory.semantic.text import STOPWORDS, words
from mlotspark.memory.semantic.updates import _PERSONAL  # "I", "my", "we": the user's own

RETRACT_SLACK = 0.07  # a retraction's best match may score this far under the threshold ...
RETRACT_APART = 0.1  # ... when it is this far above the next entry
# Two entries of other slots this close are a guess: "Don't keep my street name." scored "My
# middle name is ..." and "My name is ..." 0.47 each (on the fit halves every right match stood
# at least 0.05 above the next entry).
RETRACT_TIE = 0.04

# A retraction: a lead-in ("ugh,", "can you", "I'd like you to"), a verb that forgets and
# what it names. Verbs of memory ("forget", "don't keep", "I'd rather you didn't store") name
# anything; verbs of deleting ("remove", "drop", "scratch") only something of the user's or
# framed as what was said ("the bit about ...", "... from memory"): "Remove the print
# statements." is a request about code, not about memory; "ignore" and "disregard" only
# what was said ("Disregard what I said about my brother."), not "Ignore my last message.".
_LEAD = (r"(?:(?:please|ok|okay|so|and|also|oh|ugh|hmm|actually|wait|hey|um|uh|right|sorry|"
         r"on\s+second\s+thoughts?)[\s,]+)*"
         r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|you\s+(?:can|may|should)\s+|"
         r"i['’]?d\s+like\s+you\s+to\s+|i\s+(?:want|need)\s+you\s+to\s+)?(?:please\s+)?")
_KEEP = r"(?:remember|remembering|keep|keeping|store|storing|save|saving|hold\s+on\s+to|keep(?:ing)?\s+track\s+of)"
_MEMORY_VERB = (r"forget|never\s+mind|"
                rf"(?:don['’]?t|do\s+not|no\s+need\s+to|stop|never)\s+{_KEEP}|"
                rf"i['’]?d\s+(?:prefer|rather)\s+(?:that\s+)?you\s+(?:not|didn['’]?t|did\s+not|don['’]?t)\s+{_KEEP}|"
                rf"i\s+don['’]?t\s+want\s+you\s+to\s+{_KEEP}")
_DELETE_VERB = r"delete|erase|remove|drop|scratch|wipe|get\s+rid\s+of|throw\s+(?:away|out)"
_ASIDE_VERB = r"ignore|disregard"  # "Ignore my last message." is about the chat: only "what I said about ..."
_FRAMED = (r"(?:(?:that|this)\s+(?:bit\s+|part\s+)?about|what\s+i\s+(?:said|told\s+you|mentioned|wrote)"
           r"(?:\s+(?:about|regarding|of))?|the\s+fact\s+that|(?:everything|anything|all)\s+(?:you\s+know\s+)?about|"
           r"the\s+(?:bit|part|note|notes|thing|stuff|info|information|detail|details|line)\s+(?:about|on|regarding))")
_RETRACT = re.compile(
    rf"^{_LEAD}(?:(?P<memory>{_MEMORY_VERB})|(?P<delete>{_DELETE_VERB})|(?P<aside>{_ASIDE_VERB}))\s+"
    rf"(?:(?P<framed>{_FRAMED})\s+|(?:about|that)\s+)?"
    r"(?P<what>.+?)(?P<from_memory>\s+(?:from|out\s+of)\s+(?:your\s+)?memory)?[\s,]*(?:,?\s*please)?[.!?]*$",
    re.I,
)
# A clause after a comma that gives a reason, not more of what to forget ("..., I'd rather you didn't store it").
_REASON = re.compile(r",\s*(?:i|i['’]\w+|it|it['’]s|that['’]s|he|she|they|we|since|because|as|so|it\s+is)\b.*$", re.I)


def retraction(text: str) -> str | None:
    """What a "forget that ..." sentence asks to forget.

    Args:
        text: one sentence of the user's.

    Returns:
        The thing named ("my cat is called Mochi"), or None when the sentence is no retraction.
    """
    m = _RETRACT.match(_REASON.sub("", text.strip()))
    if not m:
        return None
    what = m.group("what").strip(" ,.")
    framed = m.group("framed") or m.group("from_memory")
    if m.group("delete") and not (framed or _PERSONAL & set(words(what))):
        return None  # "Remove the print statements.": not about anything the user told
    if m.group("aside") and not framed:
        return None  # "Ignore my last message.": about the chat, not what is remembered
    if not any(w not in STOPWORDS for w in words(what.split(",")[0])):
        return None  # "forget it", "Forget about it, let's talk about my trip.": nothing named
    return what


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
        ``RETRACT_APART`` above the next), unless the next entry, of another slot, scores
        within ``RETRACT_TIE`` of it. An older value gives way to its slot's current one when
        the words name that about as well ("Forget my address." after a move).
    """
    if not hits or hits[0][1] < threshold - RETRACT_SLACK:
        return None
    best, score = hits[0]
    runner_up = hits[1][1] if len(hits) > 1 else 0.0
    if score < threshold and score - runner_up < RETRACT_APART:
        return None  # weak and not clearly the one named
    slot = chain(best)
    if len(hits) > 1 and score - runner_up < RETRACT_TIE and hits[1][0] not in slot:
        return None  # two slots match alike: which one was meant is a guess
    end = slot[0]
    if end != best:  # an older value: the current one, when the words name it about as well
        end_score = next((s for i, s in hits if i == end), 0.0)
        if end_score >= max(threshold, score - RETRACT_APART):
            return end
    return best


__all__ = ["RETRACT_APART", "RETRACT_SLACK", "RETRACT_TIE", "named_entry", "retraction"]
