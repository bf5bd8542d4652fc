"""Tried 2026-11-29, not kept: the memory section's entries told of the user, or quoted.

Runs a benchmark with ``format_memory_section`` replaced in the conversation's path:
``VARIANT=T`` puts each entry in the third person ("I broke my left wrist ..." ->
"The user broke their left wrist ..."), ``VARIANT=Q`` quotes it ('The user said: "..."').

    VARIANT=T .venv/bin/python benchmarks/history/memory-section-voice-tried.py \
        benchmarks/memory_eval.py --embedder mpnet --e2e 30 --e2e-set fit --e2e-tell import \
        --model qwen2.5-coder-0.5b --out fit_T.json

Figures in ``benchmarks/figures/semantic.md``, "Round 12".
"""
import os
import re
import runpy
import sys

sys.path.insert(0, os.getcwd())
import mlotspark.conversations.persistence as P  # noqa: E402
from mlotspark.memory.semantic import prompt  # noqa: E402
from mlotspark.memory.semantic.events import IRREGULAR_PAST, PARTICIPLES, describe  # noqa: E402

_ADVERBS = frozenset("""often usually always never really just also still only sometimes recently now currently
    mostly rarely even already finally actually occasionally hardly normally generally typically regularly barely
    mainly honestly definitely probably absolutely totally""".split())
_KEEP = frozenset("""can could will would shall should may might must ought need dare
    quit put set cut hit let read hurt cost shut bet spread cast burst""".split()) | IRREGULAR_PAST | PARTICIPLES
_IRREGULAR = {"am": "is", "have": "has", "do": "does", "go": "goes", "be": "is", "was": "was"}
_CONTRACTED = {"m": "is", "ve": "has", "ll": "will", "d": "would"}
_NUMERAL_BEFORE = frozenset("type stage phase class grade level part chapter act volume war henry louis".split())
_TOKEN = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?|[^A-Za-z]+")


def _third_singular(verb: str) -> str:
    low = verb.lower()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if low.endswith("n't"):
        return {"don't": "doesn't", "haven't": "hasn't", "aren't": "isn't"}.get(low, verb)
    if low in _KEEP or (low.endswith("ed") and len(low) > 3) or not low.isalpha():
        return verb
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


def told_of_user(text: str) -> str:
    out: list[str] = []
    named = quoted = conjugate = subject = False
    previous = ""
    for tok in _TOKEN.findall(text):
        if not tok[0].isalpha():
            quoted ^= (tok.count('"') + tok.count("“") + tok.count("”")) % 2 == 1
            out.append(tok)
            continue
        low = tok.lower().replace("’", "'")
        start = not "".join(out).strip() or "".join(out).rstrip()[-1:] in ".!?"
        word = tok
        if quoted:
            pass
        elif conjugate:
            if low in _ADVERBS:
                out.append(tok)
                continue
            word, conjugate = _third_singular(tok), False
        elif (low == "i" and tok == "I" and previous not in _NUMERAL_BEFORE) or low.startswith("i'") and tok[0] == "I":
            word = "the user"
            tail = low.partition("'")[2]
            if tail in _CONTRACTED:
                word = f"the user {_CONTRACTED[tail]}"
            else:
                conjugate = subject or previous != "and"  # "My wife and I live ..."
            subject = named = True
        elif low == "me":
            word, named = ("them" if named else "the user"), True
        elif low == "my":
            word, named = ("their" if named else "the user's"), True
        elif low == "mine":
            word = "theirs" if named else "the user's"
        elif low == "myself":
            word = "themselves"
        if word is not tok and start:
            word = word[0].upper() + word[1:]
        out.append(word)
        previous = low
    return "".join(out)


def section(hits, header=prompt.MEMORY_HEADER, *, days=False):
    lines = [" ".join(prompt._SPECIAL.sub(" ", describe(h.entry, always=days)).split()) for h in hits]
    lines = [ln for ln in lines if ln]
    if os.environ.get("VARIANT", "T") == "T":
        lines = [told_of_user(ln) for ln in lines]
    else:
        lines = [f'The user said: "{ln}"' for ln in lines]
    return "\n".join([header, *(f"- {ln}" for ln in lines)]) if lines else ""


if __name__ == "__main__":
    P.format_memory_section = section
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
