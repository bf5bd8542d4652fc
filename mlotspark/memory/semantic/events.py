"""Things that happened: facts dated by when they were said, and events said again on other days.

"I got the promotion today!" means nothing a week later without its day, and "I
baked bread today." said on three days is three times, not one fact said thrice.
So a remembered sentence with a time relative to when it was said ("today",
"yesterday", "last week", "this morning", "two days ago") is *dated*:

- the memory section shows the day it was said ("I got the promotion today. (said
  on Tuesday 3 March 2026)"), so "When did I tell you I got the promotion?" has an
  answer (``describe``);
- an event (below) said again in the same words on another calendar day is one
  more occurrence of the entry (``meta["said"]``: the Unix times), not a duplicate
  dropped; a repeat on the same day is the same occurrence retold
  (``add_occurrence``); a dated lasting fact retold ("I moved to Porto last week.")
  is one fact, dated by its first telling.

``is_event`` is what ``extract_facts`` keeps besides lasting statements: a
first-person sentence in the past tense with such a time, within days ("I went to
the dentist today.", "We finally finished the marathon last weekend."; "I went
fully vegan this year." tells how a lasting fact changed, not an occurrence). Events
never supersede nor are superseded (``facts.tells_event``, ``history.replaced_by``): an
event is not a slot's new value; a dated lasting fact ("I moved to Porto last week.")
still may be.
"""

from __future__ import annotations

import re
import time
from typing import Any, Container

_WEEKDAY = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_FEW = r"(?:\d+|a|an|one|two|three|four|five|six|seven|a few|few|several)"
# A time within days of when it was said: what happened then is an occurrence, not a new
# state. "I went fully vegan this year." is how a lasting fact changed (it may update "I'm
# vegetarian."); "I went to the dentist today." is a visit.
_DAYS_PART = (rf"today|tonight|yesterday|this (?:morning|afternoon|evening|weekend)|last (?:night|weekend|{_WEEKDAY})|"
              rf"{_FEW} days? ago|earlier today|the other day|just now")
_DAYS = re.compile(rf"\b(?:{_DAYS_PART})\b", re.I)
# Any time relative to the moment the sentence was said, past or future.
_RELATIVE = re.compile(
    rf"\b(?:{_DAYS_PART}|tomorrow|this (?:week|month|year)|(?:last|next) (?:week|month|year|weekend|{_WEEKDAY})|"
    rf"{_FEW} (?:weeks?|months?|years?) ago|in {_FEW} (?:days?|weeks?|months?))\b",
    re.I,
)
# Past tenses that do not end in -ed (the common ones a person tells of their day).
IRREGULAR_PAST = frozenset(
    """
    went got bought had ran made saw met took began won lost found gave came left ate drank wrote sold
    flew drove rode swam sang caught built broke fell felt heard kept paid sent spent taught thought told
    chose forgot held hurt knew lent lit put quit rang rose sat shot slept spoke stood stole threw
    understood woke wore did became brought fought sought dug hung led read
    """.split()
)
# Past participles unlike the past tense ("I've been to the dentist today").
PARTICIPLES = frozenset("been gone done seen eaten written given taken driven ridden swum run begun drunk sung flown".split())
# -ed words that are not verbs in the past.
_NOT_PAST = frozenset("need seed feed bleed breed speed weed shed bed red embed proceed indeed exceed succeed".split())
# Talk with the assistant, not something that happened to the user: "I mentioned this
# earlier today.", "I said yesterday that ..." ("I asked you ...", "I tried your code ...":
# any "you" or "your" is talk too).
_TALK_VERBS = frozenset("said mentioned meant thought wondered".split())
_TALK_OBJECTS = frozenset("you your this that it question questions doubt".split())


def relative_time(text: str) -> bool:
    """Whether ``text`` gives a time relative to when it was said ("today", "last week", ...).

    Args:
        text: a fact.

    Returns:
        True when the text needs the day it was said to be understood later.
    """
    return bool(_RELATIVE.search(text))


def is_past(word: str) -> bool:
    """Whether a lower-case word is a verb in the past tense (-ed, or a common irregular one)."""
    return word in IRREGULAR_PAST or (len(word) > 4 and word.endswith("ed") and word not in _NOT_PAST)


def is_event(low: list[str], text: str, skip: Container[str]) -> bool:
    """Whether a sentence tells something that happened to the speaker at a dated time.

    Args:
        low: the sentence's lower-case tokens (``facts._tokens``).
        text: the sentence.
        skip: adverbs allowed before the verb ("just", "finally", "also").

    Returns:
        True for "I went to the dentist today.", "We finally finished the marathon last
        weekend."; False without a time within days ("I went to school in Ghent.", "I
        went fully vegan this year.": a lasting fact or none) or without a first-person
        verb in the past.
    """
    if not _DAYS.search(text):
        return False
    # "Today I went ...", "Last night, we ...": a time, and nothing else, may open the sentence.
    start = next((i for i, w in enumerate(low[:5]) if w in ("i", "we")), None)
    if start is None or (start and not _DAYS.fullmatch(" ".join(low[:start]))) or len(low) - start < 3:
        return False
    if any(w in ("you", "your", "not", "never") for w in low):  # talk with the assistant; what did not happen
        return False
    rest = [w for w in low[start + 1 :] if w not in skip]
    if rest[:1] in (["have"], ["ve"], ["has"]):  # "I've been to the dentist today"
        rest = rest[1:]
        return bool(rest) and (is_past(rest[0]) or rest[0] in PARTICIPLES) and rest[0] not in _TALK_VERBS
    if not rest or not is_past(rest[0]) or rest[0] in _TALK_VERBS:
        return False
    return not _TALK_OBJECTS & set(rest[1:3])  # "I did it yesterday", "I had a question yesterday"


def occurrences(entry: Any) -> list[float]:
    """The Unix times a dated entry was said, oldest first (its creation time alone if said once).

    Args:
        entry: an ``Entry``.

    Returns:
        The times.
    """
    said = entry.meta.get("said") if isinstance(entry.meta, dict) else None
    if isinstance(said, list) and said and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in said):
        return sorted(float(t) for t in said)
    return [float(entry.created)]


def _day(t: float) -> tuple[int, int, int]:
    lt = time.localtime(t)
    return lt.tm_year, lt.tm_mon, lt.tm_mday


def add_occurrence(entry: Any, when: float) -> dict[str, Any] | None:
    """The meta of a dated entry said again at ``when``, or None when it was already said that day.

    Args:
        entry: the ``Entry`` (its ``said`` times, else its creation time, are what was said before).
        when: the time it was said again.

    Returns:
        A new meta with ``when`` added to ``said``, or None (same calendar day, local time).
    """
    said = occurrences(entry)
    if any(_day(t) == _day(when) for t in said):
        return None
    return {**entry.meta, "said": sorted([*said, float(when)])}


def _date(t: float, weekday: bool = True, year: bool = True) -> str:
    lt = time.localtime(t)
    parts = [time.strftime("%A", lt)] if weekday else []
    parts += [str(lt.tm_mday), time.strftime("%B", lt)]
    return " ".join(parts + ([str(lt.tm_year)] if year else []))


# Asking when something was said or happened, not when something is ("When do I need to
# renew my passport?" asks for the fact's own date, which a day it was said would blur).
_WHEN = re.compile(r"\b(?:when|what day|which day|on what date|how long ago) (?:did|was|were|had|have) (?:i|we)\b", re.I)


def asks_when(query: str) -> bool:
    """Whether a message asks when something was said or happened ("When did I tell you ...?",
    "When did I move to Porto?"; not "When do I need to renew my passport?").

    Args:
        query: the user's message.

    Returns:
        True when every entry shown for it should carry its day (``describe(..., always=True)``).
    """
    return isinstance(query, str) and bool(_WHEN.search(query))


def describe(entry: Any, always: bool = False) -> str:
    """The entry's text, with the days it was said when it is dated.

    Args:
        entry: an ``Entry``.
        always: give the day of undated entries too (for a question asking when:
            "When did I tell you my sister is called Ilse?").

    Returns:
        "I got the promotion today. (said on Tuesday 3 March 2026)", "I baked bread
        today. (said 3 times: on 3 March, 7 March and 12 March 2026)", or the text as
        it is when it gives no relative time.
    """
    text = entry.text
    if not (always or relative_time(text)):
        return text
    times = occurrences(entry)
    if len(times) == 1:
        return f"{text} (said on {_date(times[0])})"
    one_year = len({_day(t)[0] for t in times}) == 1
    days = [_date(t, weekday=False, year=not one_year) for t in times]
    year = f" {_day(times[-1])[0]}" if one_year else ""
    return f"{text} (said {len(times)} times: on {', '.join(days[:-1])} and {days[-1]}{year})"


__all__ = ["IRREGULAR_PAST", "PARTICIPLES", "add_occurrence", "asks_when", "describe", "is_event", "is_past", "occurrences", "relative_time"]
