"""``extract_facts``: the sentences of a user's turn worth remembering.

Heuristic and deliberately narrow: a wrong memory is injected into every later
prompt it matches, a missed one costs only a repetition by the user, so rules
favour precision over recall. A sentence is kept when, after lead-ins such as
"Oh, by the way," or "Hi," are dropped:

1. it is an explicit request — "Remember that X", "Please don't forget X",
   "Can you remember that X?" — and X is a statement of three words or more
   (not "to buy milk": that is a reminder, not a fact); X is kept, about anything;
2. or it is a first-person statement that describes a lasting fact:
   - "My/Our <thing> ..." unless the thing is about the task at hand
     ("my code", "my question", "my bad") or someone reports or believes
     ("My colleague thinks I live in Lyon", "My friend said I should move");
   - "I/We <verb> ..." with a verb of lasting facts (live, work, prefer, like,
     have, speak, grew up, stopped, rent, earn, weigh, take, ...), adverbs and negations allowed ("I don't eat
     meat", "I no longer have a cat", "I usually cycle to work"), but not with a bare pronoun as object
     ("I like it", "I love that") or a conversational "have" ("I have a
     question", "I have to go");
   - a past verb with a year or an age: the user's history ("We adopted our dog in 2021.",
     "I learned to swim at age 30."), not the task at hand ("I got an error in line 2020");
   - "I am/I'm X" where X is a role or kind ("a nurse", "an engineer"), an age,
     a capitalised name or nationality ("I'm Anna", "I am Belgian"), or a
     lasting state (allergic, vegetarian, married, from, born, learning, ...),
     not a mood ("I'm fine", "I'm confused", "I'm trying to ..."); or an ongoing part of
     life in a fixed shape ("I'm training for ...", "I'm seeing a therapist", "I'm reading
     Dune"), not the task at hand ("I'm working on a bug", "I'm reading your answer");
   - "Call me X"; a habit whatever its verb ("I get up at 5am every day"); "X is my Y"
     ("Radiohead is my favourite band"); a name with its relation ("Biscuit, our beagle, is 9");
     "me and my wife ..." as "we";
   - in a sentence that goes on to ask or request, the statement that opens it ("I'm coeliac,
     so could you suggest a cake recipe?" keeps "I'm coeliac."), unless what follows asks what
     is wrong with it ("My soup is too sour, how do I fix it?");
3. or it tells something that happened, within days of now: a first-person verb
   in the past with "today", "yesterday", "last night", "three days ago", ... ("I
   went to the dentist today."), not talk with the assistant ("I asked you this
   yesterday") nor what did not happen ("I didn't go to the gym today"); kept with
   the day it was said (``events.py``).

Never kept: retractions ("Forget that ..."), questions (a "?" or a question-word start), hypotheticals ("If I
...", "Imagine I ...", "I'd ...", "I'll ..."), code (fenced or inline) and quoted
lines, sentences under three or over forty words, and — except for explicit
requests — anything in a long paste (over ``MAX_TURN_CHARS`` characters or
``MAX_SENTENCES`` sentences), which is a document, not the user talking about
themselves. Kept sentences keep the user's words; only the first letter is
capitalised and the end made a full stop.
"""

from __future__ import annotations

import re

from mlotspark.memory.semantic.events import is_event
from mlotspark.memory.semantic.records import MAX_TEXT_CHARS
from mlotspark.memory.semantic.retractions import retraction
from mlotspark.memory.semantic.text import normalize
from mlotspark.memory.semantic.updates import UPDATE_CUES

MAX_TURN_CHARS = 2000
MAX_SENTENCES = 20
MIN_WORDS, MAX_WORDS = 3, 40

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_SPLIT = re.compile(r"(?<=[.!?…])\s+|\s*\n\s*")
_WORD = re.compile(r"[\w'’-]+")
_INITIALS = re.compile(r"(?:[A-Z]\.)+$")  # "K." of "Ursula K. Le Guin", "J.R.R.", "U.S."
# Words that open a new sentence after an initial: "I grew up in the U.S. I love Tolkien."
_SENTENCE_OPENERS = frozenset("i i'm i've i'd i'll my we we're our the it it's he she they this that there".split())
_ABBREV = ("mr.", "mrs.", "ms.", "dr.", "st.", "prof.", "e.g.", "i.e.", "etc.", "vs.", "jr.", "sr.", "no.")

_LEAD_IN = re.compile(
    r"^(?:(?:oh|ah|well|also|and|so|but|btw|by the way|fyi|actually|anyway|anyways|"
    r"just so you know|for the record|for your information|hi there|hello there|hi|hello|hey|"
    r"big news|news|guess what|update|quick update|correction|sorry|"
    r"ok|okay|yes|yeah|no|ps|p\.s\.)(?=\W)[\s,:;.!-]*)+",
    re.I,
)
_EXPLICIT = re.compile(
    r"^(?:please\s+)?(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?"
    r"(?:remember|memori[sz]e|don['’]?t forget|do not forget|never forget|make a note)"
    r"(?:\s+(?:that|this))?\s*[,:]?\s+(?P<fact>.+)$",
    re.I,
)
_QUESTION_START = frozenset(
    "what who whom whose where when why how which do does did is are was were can could "
    "would will should shall may might am have has had".split()
)
# A sentence that opens with one of these asks for something: no statement ("Erase the landlord's
# name, I've moved out anyway." had been kept as an update when it named nothing clearly).
_COMMANDS = frozenset("""forget delete erase remove drop scratch wipe ignore disregard write tell give show
    make help explain list find fix add send""".split())
_HYPOTHETICAL_START = frozenset("if suppose imagine pretend assume let let's lets what's whats".split())
_TRANSIENT_THINGS = frozenset(
    """
    question questions problem problems issue issues bad pleasure apologies apology point
    guess mistake answer request prompt message messages idea thought thoughts concern task
    code function script program error errors output input file files test tests query bug
    bugs app screen internet wifi connection turn reply response last previous first
    container containers repo repository branch build commit pipeline regex variable loop endpoint
    dataframe spreadsheet essay draft
    """.split()
)
_DURABLE_VERBS = frozenset(
    """
    live lived grew grow come came work worked study studied teach taught own have
    prefer like love enjoy hate dislike adore detest speak drive play use eat drink avoid
    cook bake run swim cycle ride support collect moved married graduated retired
    volunteer practise practice wear go visit celebrate wake sleep keep raise vote
    listen read watch write am are was were
    moved changed switched sold quit renamed joined became turned smoke stopped started
    rent earn weigh commute bank attend take owe voted
    knit sew crochet paint draw sing dance climb hike ski surf meditate garden fish
    """.split()
)
# A past verb with a year or an age is the user's history, a lasting fact: "I failed my driving
# test twice.", no; "We adopted our dog in 2021.", "I learned to swim at age 30.", yes.
_DATED_PAST = re.compile(r"\b(?:in|since|back in|from) (?:19|20)\d\d\b"
                         r"|\b(?:\d+|a|one|two|three|four|five|six|seven|eight|nine|ten|a few|several) years? ago\b"
                         r"|\bat (?:the )?age (?:of )?\d+|\bwhen (?:I|we) (?:was|were) \d+", re.I)
# "I'm <doing> ..." that states an ongoing part of the user's life, each with the word that must
# follow ("I'm training for a 10k", "I'm seeing a therapist"); "I'm working on a bug" is talk.
_ONGOING = {"training": ("for",), "saving": ("for", "up"), "applying": ("for", "to"), "subscribed": ("to",),
            "seeing": ("a", "an"), "enrolled": ("in", "at"), "renting": ("a", "an")}
_SKIP = frozenset(
    "also really usually always often still never mostly generally actually currently now normally only just "
    "sometimes do not no longer definitely absolutely strongly truly both all ca can cannot".split()
)
_PAST_IRREGULAR = frozenset("got had gave learnt took made met won lost broke built began ran swam flew".split())
_EVENT_SKIP = _SKIP | {"just", "finally", "again", "then", "recently"}  # "I finally finished ..."
_PRONOUN_OBJECTS = frozenset("it this that these those them you your yours how what when the way".split())
_HAVE_CHAT = frozenset("to been got just tried seen done read no".split())  # "I have to go"
_CHAT_NOUNS = frozenset("question questions problem issue idea follow-up request doubt suggestion minute minutes moment".split())
_BE_DURABLE = frozenset(
    """
    allergic intolerant vegetarian vegan married single divorced engaged widowed retired pregnant
    diabetic colorblind colourblind colour-blind color-blind left-handed right-handed from born based originally called
    named learning studying interested into fluent native lactose gluten blind deaf
    short-sighted long-sighted near-sighted far-sighted scared afraid terrified shy introverted
    dyslexic autistic asthmatic epileptic anaemic anemic coeliac celiac
    """.split()
)
# Verbs by which someone else reports or believes: "My friend said I should move to Lyon."
_REPORTS = frozenset(
    """
    thinks think thought says say said believes believe believed claims claimed told tells suggested
    swears swear swore
    suggests wants wanted wishes hopes hoped asked asks reckons guesses guessed insists insisted
    """.split()
)
_A_CHAT = frozenset("bit little lot few quick".split())  # "I am a bit confused"
# What one has for a day or a week, not for good: "I have a headache", "I have an interview".
_MOMENTARY = frozenset("""headache migraine cold fever flu cough hangover sore rash meeting interview appointment
    exam deadline call presentation flight""".split())
_SOON = re.compile(r"\b(?:today|tonight|tomorrow|this (?:morning|afternoon|evening|week|weekend))\b", re.I)
# A habit is lasting whatever its verb: "I get up at 5am every day", "I call my mum on Sundays".
_HABIT = re.compile(r"\b(?:every|each) (?:day|morning|evening|night|week|weekend|month|year|summer|winter"
                    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b"
                    r"|\b(?:once|twice|three times) a (?:day|week|month|year)\b|\bon (?:weekends|weekdays)\b"
                    r"|\b(?:daily|weekly)$", re.I)
# Where a question or a request follows a statement in one sentence, the statement before it
# is read alone: "I'm diabetic, so could you suggest some desserts?", "I've been a nurse for 10
# years and honestly I'm burnt out."
_CLAUSE = re.compile(r",?\s+(?:so|but|and|otherwise|because|which)\s+|\s+[—–-]+\s+|;\s*|,\s+(?=(?:can|could|would|what|how|any|is|are|do|does|please)\b)", re.I)
# A question after the statement about what is wrong with it: the task at hand ("My soup is too
# sour, how do I fix it?", "My formula returns #VALUE!, what does that mean?").
_TASK_TAIL = re.compile(r"\b(?:fix|fixed|wrong|mean|means|solve|debug|broken|going on|happening)\b", re.I)
# Who the user is, said as the frame of a request: "As a left-handed person, which pens ...?",
# "Single dad here, what are some quick dinners ...?" (kept in the user's words).
_AS_ROLE = re.compile(r"^(?P<clause>as an? (?P<role>[\w'-]+(?: [\w'-]+){0,3})),\s+\w", re.I)
_ROLE_HERE = re.compile(r"^(?P<clause>(?P<role>[\w'-]+(?: [\w'-]+){0,2}) here)\s*[,!.:;—–-]+\s*\w", re.I)
_NOT_ROLES = frozenset("""reminder note aside example result rule follow-up followup question matter fact side test
    start bonus alternative workaround fallback default summary recap update heads-up fyi first next last step
    quick whole team company group user customer same nothing help something everything anyone anybody me you
    it this that problem issue error bug code output thing way consequence precaution favour favor courtesy""".split())
# "Me and my wife just moved to Leeds", "My wife and I ...": "we" as the subject.
_WE = re.compile(r"^(?:me and (?:my|our) [\w'-]+(?: [\w'-]+)??|(?:my|our) [\w'-]+(?: [\w'-]+)?? and (?:I|me))\s+", re.I)
# "Biscuit, our beagle, is 9 now.": a name with its relation to the user, then what is said of it.
_APPOSITIVE = re.compile(r"^[A-Z][\w'-]+, (?:my|our) [\w' -]{2,30}, (?P<rest>\w.+)$")
# "Radiohead is my all-time favourite band.", "Portuguese is my first language."
_IS_MY = re.compile(r"^(?P<subject>[\w'-]+(?: [\w'-]+){0,2}) (?:is|are) (?:my|our) (?P<thing>[\w' -]+)$", re.I)
_ORDINALS = frozenset("first last previous".split())  # "my first language" is no task at hand
_TASK_THINGS = _TRANSIENT_THINGS - _ORDINALS
_HAVE_TALK = _CHAT_NOUNS | _TASK_THINGS | _MOMENTARY  # "I have a question / a bug / a headache"
# The task at hand named by a thing's second word: "my Docker container", "my Python script".
_TECH_HEADS = frozenset("""container containers repo repository branch build commit pipeline regex variable loop
    endpoint dataframe script function program app server query bug error errors""".split())
_NOT_SUBJECTS = frozenset("this that it these those there here what which who it's that's".split())
_NOT_IN_SUBJECT = frozenset("that if when not forget ignore delete remove drop note".split())  # "Forget that X is my Y"
_FILLERS = _SKIP | {"very", "so", "quite", "pretty", "severely"}
_CONTRACTIONS = {"m": "am", "re": "are", "ve": "have"}


def _sentences(text: str) -> list[str]:
    text = _INLINE_CODE.sub(" ", _FENCE.sub("\n", text))
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(">")]  # quoted replies
    pieces = [p.strip() for p in _SPLIT.split("\n".join(lines)) if p and p.strip()]
    merged: list[str] = []
    for piece in pieces:  # "Dr. Peeters", "Ursula K. Le Guin" must not end a sentence (but "... in August." does)
        last = merged[-1].split()[-1] if merged else ""
        initial = _INITIALS.match(last) and piece.split()[0].lower().strip(",;:") not in _SENTENCE_OPENERS
        if merged and (initial or last.lower().endswith(_ABBREV) and (
            last.lower() in _ABBREV or last.lower().endswith(("e.g.", "i.e."))
        )):
            merged[-1] += " " + piece
        else:
            merged.append(piece)
    return merged


def sentences(text: str) -> list[str]:
    """The sentences of a user turn, code and quoted lines left out (what ``extract_facts`` reads).

    Args:
        text: a user's message.

    Returns:
        Sentences in order.
    """
    return _sentences(text)


def _tidy(sentence: str) -> str:
    s = sentence.strip().strip("\"'“”‘’").strip()
    s = re.sub(r"[.!…\s]+$", "", s)
    s = re.sub(r"\bi\b", "I", s)
    return s[:1].upper() + s[1:] + "." if s else ""


def _tokens(sentence: str) -> tuple[list[str], list[str]]:
    """(lower-case tokens, original tokens), contractions split: "I'm" -> i, m."""
    raw = [w.replace("’", "'") for w in _WORD.findall(sentence)]
    low, orig = [], []
    for w in raw:
        head, *tail = w.split("'")
        if head:
            low.append(normalize(head))
            orig.append(head)
        for t in tail:
            if t:
                t_low = normalize(t)
                if t_low == "t" and low and low[-1].endswith("n"):  # don't -> do not
                    low[-1] = low[-1][:-1] or "ca"
                    t_low = "not"
                low.append(t_low)
                orig.append(t)
    return low, orig


def _is_lasting_statement(low: list[str], orig: list[str]) -> bool:
    if not MIN_WORDS <= len(low) <= MAX_WORDS:
        return False
    first = low[0]
    if first in ("my", "our"):
        # "My colleague thinks I live in Lyon": what someone else says or believes, not a fact
        return (low[1] not in _TRANSIENT_THINGS and len(low) >= 3 and not _REPORTS & set(low[2:5])
                and low[2] not in _TECH_HEADS)  # "My Docker container exits ...", not "My locker code is ..."
    if first == "call" and low[1] == "me":
        return True
    if first not in ("i", "we"):
        return False
    if low[1] in ("d", "ll"):  # I'd / I'll: wishes and plans, not facts
        return False
    body = [_CONTRACTIONS.get(low[1], low[1]), *low[2:]]
    # The verb is the first word after adverbs and negations ("I really don't eat meat").
    j = next((j for j, w in enumerate(body) if w not in _SKIP), None)
    if j is None:
        return False
    verb, rest, rest_orig = body[j], body[j + 1 :], orig[j + 2 :]
    while rest and rest[0] in _FILLERS:  # "I am not a smoker", "I am very allergic"
        rest, rest_orig = rest[1:], rest_orig[1:]
    if verb == "have" and rest[:1] == ["got"] and len(rest) > 1:  # "I've got an Ender 3", "We've got two cats"
        rest, rest_orig = rest[1:], rest_orig[1:]
    elif verb == "have" and rest[:1] == ["been"] and len(rest) > 1:  # "I've been a nurse for 10 years"
        verb, rest, rest_orig = "am", rest[1:], rest_orig[1:]
    if verb == "keep" and rest and rest[0].endswith("ing"):  # "I keep getting a 403" is the task at hand
        return False
    if (verb not in _DURABLE_VERBS and rest and not verb.endswith(("ed", "ing")) and verb not in _PAST_IRREGULAR
            and _HABIT.search(" ".join(orig)) and not _TRANSIENT_THINGS & set(rest[:4])
            and rest[0] not in _PRONOUN_OBJECTS - {"the", "your"}):
        return True  # a habit: "I get up at 5am every day", "I walk the dog every morning"
    if verb not in _DURABLE_VERBS and rest and (verb.endswith("ed") or verb in _PAST_IRREGULAR):
        # "We adopted our dog in 2021."; not "I got an error in 2021's build" (the task at hand)
        return (bool(_DATED_PAST.search(" ".join(orig))) and not _TRANSIENT_THINGS & set(rest[:4])
                and rest[0] not in _PRONOUN_OBJECTS)  # "I asked you this in 2024" is talk
    if verb not in _DURABLE_VERBS or not rest:
        return False
    if verb in ("am", "are", "was", "were"):
        nxt = rest[0]
        if nxt in ("a", "an"):
            return len(rest) > 1 and rest[1] not in _A_CHAT
        if nxt == "learning" and rest[1:2] == ["about"]:  # a topic of the moment, not a skill
            return False
        if nxt.isdigit() or nxt in _BE_DURABLE:
            return True
        if nxt in ("working", "living"):  # "working as a nurse", not "working on a bug"
            return len(rest) > 1 and rest[1] in ("as", "at", "for", "in", "with")
        if nxt in _ONGOING:
            return len(rest) > 1 and rest[1] in _ONGOING[nxt]
        if nxt == "reading":  # a title: "I'm reading Dune", not "I'm reading your answer"
            return len(rest_orig) > 1 and rest_orig[1][:1].isupper()
        # A capitalised word after "I am" is a name or a nationality.
        return rest_orig[0][:1].isupper() and rest_orig[0].lower() not in ("ok", "fine", "sorry", "not")
    if verb == "have":  # "I have a dog", not "I have a quick question" or "I have to go"
        # nor the task at hand or the moment: "I have an essay due on ...", "I have a headache",
        # "I have a meeting at 3, can you help me prepare?"
        return (rest[0] not in _HAVE_CHAT and not _HAVE_TALK & set(rest[:3])
                and not _SOON.search(" ".join(orig)))
    if verb in ("like", "love", "enjoy", "prefer", "hate", "dislike", "adore", "detest", "stopped", "started", "take"):
        # "I stopped eating meat" is a change of a lasting fact; "I stopped it" is talk
        return rest[0] not in _PRONOUN_OBJECTS
    return True


def tells_event(sentence: str) -> bool:
    """Whether a sentence tells something that happened rather than a lasting fact.

    "I went to the dentist today." does; "I moved to Porto last week." is a lasting
    fact (where the user lives) that happens to be dated, and "I got a new car today,
    a Tesla." says how one changed: both may update an older one.

    Args:
        sentence: one sentence (a remembered entry's text).

    Returns:
        True for a dated first-person event (``events.is_event``) that is no lasting statement.
    """
    low, orig = _tokens(_LEAD_IN.sub("", sentence).strip())
    return bool(low) and is_event(low, sentence, _EVENT_SKIP) and not _is_lasting_statement(low, orig) and not _changes(low)


# Verbs after which "new" names a lasting thing replaced: "I got a new car today" (but "I met
# a new colleague today" is a meeting).
_ACQUIRE = frozenset("got bought started began found joined adopted"
                     " get buy start begin find join adopt".split())


# Update cues that also tell plain events: "I went to the dentist", "I met a new colleague",
# "three days ago".
_CHANGE_CUES = UPDATE_CUES - {"went", "new", "newly", "days"}


def _changes(low: list[str]) -> bool:
    """Whether a dated sentence says how a lasting fact changed ("I quit my job today", "I got a
    new car today, a Tesla"): such a sentence may update an older fact (``updates.py``)."""
    if any(w in _CHANGE_CUES for w in low):
        return True
    return any(w in ("new", "newly") and _ACQUIRE & set(low[max(0, i - 3) : i]) for i, w in enumerate(low))


def statements(user_text: str) -> list[str]:
    """The turn's sentences that state something, tidied as ``extract_facts`` tidies them:
    no question, hypothetical, request to remember, sentence under three or over forty words,
    and nothing of a long paste. ``learn_turn`` keeps those of them that update an entry
    ("Traded in the old car, I've got a Mazda CX-5 now." after "I drive a Honda Civic."), which
    the narrow rules above leave out.

    Args:
        user_text: the user's message.

    Returns:
        Sentences in order, without repeats.
    """
    if not isinstance(user_text, str) or not user_text.strip():
        return []
    found = _sentences(user_text)
    if len(user_text) > MAX_TURN_CHARS or len(found) > MAX_SENTENCES:
        return []
    out: dict[str, None] = {}
    for raw in found:
        s = _LEAD_IN.sub("", raw).strip()
        if not s or s.endswith("?") or _EXPLICIT.match(s):
            continue
        low, _ = _tokens(s)
        if MIN_WORDS <= len(low) <= MAX_WORDS and low[0] not in _QUESTION_START | _HYPOTHETICAL_START | _COMMANDS:
            out.setdefault(_tidy(s), None)
    return [s for s in out if s and len(s) <= MAX_TEXT_CHARS]


def extract_facts(user_text: str) -> list[str]:
    """The sentences of a finished user turn worth remembering (see module docstring).

    Args:
        user_text: the user's message.

    Returns:
        Facts in the user's words, tidied ("i live in ghent" -> "I live in ghent."),
        in order, without repeats; empty for questions, commands and chit-chat.
    """
    if not isinstance(user_text, str) or not user_text.strip():
        return []
    sentences = _sentences(user_text)
    pasted = len(user_text) > MAX_TURN_CHARS or len(sentences) > MAX_SENTENCES
    facts: dict[str, None] = {}
    for raw in sentences:
        s = _LEAD_IN.sub("", raw).strip()
        if not s:
            continue
        fact = _requested(s)
        if fact is not None:
            low, _ = _tokens(fact)
            if (
                MIN_WORDS <= len(low) <= MAX_WORDS
                and low[0] not in _QUESTION_START | {"to", "me", "this", "it"}
            ):
                facts.setdefault(_tidy(fact), None)
            continue
        if pasted or retraction(s) is not None:  # "Forget that Jazz is my favourite genre, I ...": nothing to keep
            continue
        fact = _fact_in(s)
        if fact:
            facts.setdefault(_tidy(fact), None)
    # A "sentence" of few words can still be longer than an entry may be ("Remember that " and a
    # pasted blob): the store would refuse it, and with it the rest of the turn's facts.
    return [f for f in facts if f and len(f) <= MAX_TEXT_CHARS]


_ASKS = frozenset("what where when who whom whose why how which whether if".split())


def _requested(sentence: str) -> str | None:
    """The X of an explicit request ("Remember that X", "Please don't forget X"; lead-ins dropped), or None."""
    explicit = _EXPLICIT.match(sentence)
    return explicit.group("fact").strip().rstrip("?").strip() if explicit else None


def asked_to_remember(user_text: str) -> list[str]:
    """What the turn explicitly asks to keep ("Remember that X", "Please don't forget X"), tidied as
    ``extract_facts`` tidies it, whether or not it is kept: a request it leaves out (under three
    words, a reminder "to buy milk", longer than an entry may be) is one the user should hear about
    (``Learned.not_remembered``). Questions ("Can you remember what I said?") ask nothing to keep."""
    if not isinstance(user_text, str):
        return []
    out = []
    for raw in _sentences(user_text):
        s = _LEAD_IN.sub("", raw).strip()
        fact = _requested(s) if not s.endswith("?") else None
        if fact is not None and not _ASKS & set(_tokens(fact)[0][:1]):  # "remember what X is" asks
            out.append(_tidy(fact))
    return out


def _fact_in(sentence: str) -> str | None:
    """The part of one sentence (lead-ins dropped) worth remembering: the whole sentence, or the
    statement that opens it when a question or a request follows ("I'm diabetic, so could you
    suggest some desserts?" -> "I'm diabetic"); None when there is none."""
    if not sentence.rstrip().endswith("?") and _states_fact(sentence):
        return sentence
    role = _AS_ROLE.match(sentence) or _ROLE_HERE.match(sentence)  # "as a left-handed person, ...", "single dad here, ..."
    if role and not _NOT_ROLES & set(_tokens(role["role"])[0]):  # (extract_facts skipped retractions)
        return role["clause"]
    we = _WE.match(sentence)  # "Me and my wife moved ...": its "and" opens no clause
    cut = _CLAUSE.search(sentence, we.end() if we else 0)
    head = sentence[: cut.start()].strip(" ,") if cut else ""
    if head and not head.endswith("?") and not _TASK_TAIL.search(sentence[cut.end():]) and _states_fact(head, whole=False):
        return head
    return None


def _states_fact(s: str, whole: bool = True) -> bool:
    """Whether ``s`` (a sentence, or with ``whole`` False the clause that opens one) states a
    lasting fact or a dated event of the user's (module docstring)."""
    low, orig = _tokens(s)
    if not low or low[0] in _QUESTION_START or low[0] in _HYPOTHETICAL_START:
        return False
    if _is_lasting_statement(low, orig):
        return True
    we = _WE.match(s)  # "Me and my wife just moved to Leeds": what "we" did
    if we and _is_lasting_statement(*_tokens("we " + s[we.end():])):
        return True
    apposed = _APPOSITIVE.match(s)  # "Biscuit, our beagle, is 9 now."
    if apposed and MIN_WORDS <= len(low) <= MAX_WORDS and not _REPORTS & set(_tokens(apposed["rest"])[0][:3]):
        return True
    is_my = _IS_MY.match(s.rstrip(".!…"))  # "Radiohead is my all-time favourite band."
    if is_my and is_my["subject"].lower() not in _NOT_SUBJECTS:
        subject_words, thing_words = set(_tokens(is_my["subject"])[0]), set(_tokens(is_my["thing"])[0])
        if not (_NOT_IN_SUBJECT | _TRANSIENT_THINGS) & subject_words and not _TASK_THINGS & thing_words:
            return True
    return whole and MIN_WORDS <= len(low) <= MAX_WORDS and is_event(low, s, _EVENT_SKIP)
