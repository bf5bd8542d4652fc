"""What a user's sentence explicitly asks of memory: "remember that …", "forget …".

These are the only sentences read for their words: a request to remember keeps what
follows it, a request to forget names what to remove (the writer finds the entry by
search). Everything else a turn says is kept as said (``writer.SimpleWriter``), so no rule
has to recognise a fact for a change to be found later.
"""

from __future__ import annotations

import re

MAX_TURN_CHARS = 2000  # a longer message is a paste, not something said about oneself
MAX_SENTENCES = 20
_LONGEST = 400  # a request is one sentence; the patterns stay quick on anything longer

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
# A sentence ends at . ! ? … before a capital, but not after a title or an initial ("Dr. Smit",
# "Ursula K. Le Guin").
_SPLIT = re.compile(r"(?<!\bMr\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bJr\.)(?<!\bSr\.)(?<!\bMrs\.)(?<!\bProf\.)"
                    r"(?<!\b[A-Z]\.)(?<=[.!?…])\s+(?=[^\W\d_a-z])|\s*\n\s*")
_LEAD = r"(?:(?:please|ok|okay|so|and|also|oh|ugh|actually|wait|hey|hmm|sorry|right|one more thing)[,!]?\s+)*"
_ASK = r"(?:(?:could|can|would|will) you (?:kindly |please )?|you (?:can|may|should) |please |kindly )*"
_KEEP = (r"(?:keep(?:ing)?(?: track of)?|remember(?:ing)?|stor(?:e|ing)|sav(?:e|ing)|record(?:ing)?"
         r"|hold(?:ing)? on to|know(?:ing)?)")
# Verbs that ask to forget whatever follows them.
_FORGET_VERB = (rf"forget|never mind|(?:don'?t|do not|no need to|stop|never|not) {_KEEP}"
                rf"|would you mind not {_KEEP}|i'?d (?:rather|prefer) you (?:didn'?t|did not|not|don'?t) {_KEEP}"
                rf"|i don'?t want (?:you to {_KEEP}|that (?:stored|kept|on (?:record|file)))")
# Verbs that ask to forget only what is framed as said ("the bit about …", "what I told you …"):
# "Delete my branch." is a request about something else.
_DELETE_VERB = r"delete|erase|remove|drop|scratch|scrap|wipe|get rid of|throw out|bin|ignore|disregard"
_SAID = (r"(?:(?:that|the|this|those|anything|everything)\s+)?(?:(?:bit|part|thing|stuff|note|info|details?|fact|news|plan)s?\s+)?"
         r"(?:(?:that\s+)?(?:what\s+)?i\s+(?:said|told you|mentioned|wrote|shared|typed)\s*)?")
_CLAUSE = r"(?:^|[,;:.!?]\s+|\s[-–—]+\s+)"
_FORGET = re.compile(rf"{_CLAUSE}{_LEAD}{_ASK}(?:{_FORGET_VERB})\b[,:]?\s*(?P<what>.*)$", re.I)
_DELETE = re.compile(rf"{_CLAUSE}{_LEAD}{_ASK}(?:{_DELETE_VERB})\s+(?P<what>(?:that|the|this|what|anything)\b.*"
                     r"|.*\b(?:from (?:your )?(?:memory|notes|records?)|on (?:file|record))\W*)$", re.I)
# "Delete my passport number.": what the user owns, with the verbs that only mean erasing.
_DELETE_MINE = re.compile(rf"{_CLAUSE}{_LEAD}{_ASK}(?:delete|erase|wipe)\s+(?P<what>my\b.*)$", re.I)
# "… - bin it", "…, please remove it": the request comes after what it names.
_AFTER = re.compile(rf"^(?P<what>.+?){_CLAUSE}{_LEAD}{_ASK}(?:{_DELETE_VERB}|forget|drop) (?:it|that|this)\W*$", re.I)
_REMEMBER = re.compile(
    rf"^{_LEAD}(?:please )?(?:remember|note|keep in mind|don'?t forget|make a note)(?: that|:)\s*(?P<what>.+)$", re.I)
_FRAME = re.compile(rf"^{_SAID}(?:about\s+|that\s+|on\s+|of\s+)?", re.I)
# What follows the thing named: where it is kept, a reason, a courtesy.
_TAIL = re.compile(r"\s*(?:(?:from|out of|in|on) (?:your )?(?:memory|notes|records?|file)\b.*|(?:[,;]|\s[-–—]+)\s.*)$", re.I)


def sentences(text: str) -> list[str]:
    """The sentences of a user's message (code blocks left out; at most ``MAX_SENTENCES``).

    Args:
        text: the message.

    Returns:
        Its sentences, stripped, in order; [] for a paste longer than ``MAX_TURN_CHARS``.
    """
    if not isinstance(text, str) or len(text) > MAX_TURN_CHARS:
        return []
    text = _FENCE.sub("\n", text)
    return [s.strip() for s in _SPLIT.split(text) if s and s.strip()][:MAX_SENTENCES]


def _what(raw: str) -> str:
    what = _FRAME.sub("", raw.strip(), count=1).lstrip(" ,;:-–—")
    return _TAIL.sub("", _FRAME.sub("", what, count=1)).strip(" .,!?;:'\"")


def forget_request(sentence: str) -> str | None:
    """What a sentence asks memory to forget, or None when it asks nothing of the kind.

    Args:
        sentence: one sentence of the user's.

    Returns:
        "my salary" for "Please delete the bit about my salary.", "it" when it names
        nothing ("Forget it."); None for "I forgot my keys".
    """
    if not isinstance(sentence, str) or len(sentence) > _LONGEST:
        return None
    text = sentence.strip().replace("’", "'")
    found = [_what(m.group("what")) for m in (_DELETE.search(text), _DELETE_MINE.search(text), _FORGET.search(text),
                                              _AFTER.match(text)) if m]
    if not found:
        return None
    # The first that names something ("Scratch that about my salary, I'd rather you didn't store it.").
    return next((w for w in found if w.lower() not in ("", "it", "that", "this", "about it")), "it")


def forget_queries(turn: str) -> list[str]:
    """What each request to forget in a turn names (those naming nothing, "Forget it.", left out)."""
    return [w for s in sentences(turn) if (w := forget_request(s)) is not None and w != "it"]


def remember_request(sentence: str) -> str | None:
    """What a sentence asks memory to keep ("Remember that my PIN hint is blue." -> "my PIN hint is blue")."""
    if not isinstance(sentence, str) or len(sentence) > _LONGEST:
        return None
    m = _REMEMBER.match(sentence.strip().replace("’", "'"))
    return m.group("what").strip(" .!") or None if m else None


__all__ = ["MAX_SENTENCES", "MAX_TURN_CHARS", "forget_queries", "forget_request", "remember_request", "sentences"]
