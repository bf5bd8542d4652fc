"""RULER-style long-context tasks on natural, varied text, generated offline and seeded.

In the spirit of RULER (Hsieh et al., 2024), the haystack is not repeated
filler: it is prose from Python's own reference documentation as shipped with
the interpreter (``pydoc_data.topics``, ~465k characters), paragraphs taken in a
seeded order, code samples and heading rules dropped; past its ~40k tokens, the
prose of the standard library's docstrings (``more_sentences``). Needles go between
sentences at a chosen depth. Tasks:

- ``niah_single``: one key, one 7-digit value; ask for it.
- ``niah_multikey``: four keys with a value each; ask for one.
- ``niah_multivalue``: one key with four values; ask for all of them.
- ``niah_multiquery``: four keys; ask for two of them.
- ``vt``: variable tracking, ``VAR QXKZT = 40713`` then ``VAR BRMWE = QXKZT`` ...
  (a chain of five); ask which variables hold the value.
- ``sentence``: a plain sentence ("The spare key to the boathouse is hidden under the
  blue flowerpot.") at the depth; ask a question whose answer is a word of it.

A case's score is the share of its expected answers found in the reply (RULER's
``string_match_all``). Nothing here loads a model: ``make_case`` takes a token
counter, and the suite (``suites/ruler.py``) or ``benchmarks/ruler.py`` runs it.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from mlotspark.errors import OptionError

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "sentence")

#: Answer tokens each task's reply may take. Digits are one token each with the
#: default model, and it opens with "The special magic numbers for <key> mentioned in
#: the provided text are:" (~20 tokens): 48 tokens cut its fourth multivalue value
#: mid-number, so the lists get room for every answer.
ANSWER_TOKENS = {"niah_single": 48, "niah_multikey": 48, "niah_multivalue": 96, "niah_multiquery": 72,
                 "vt": 72, "sentence": 48}

_NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
               "I will quiz you about the numbers afterwards.\n\n")
_VT_INTRO = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n")
_SENTENCE_INTRO = "Read the following text carefully. I will ask you about one detail of it afterwards.\n\n"

_ADJECTIVES = ("amber quiet brave silver hollow gentle rapid crimson frozen golden humble ancient bitter "
               "clever distant eager fragile hidden jolly lucky misty noble orange proud rustic shiny tidy "
               "velvet wild").split()
_NOUNS = ("harbor lantern meadow falcon engine violin canyon pillow glacier compass orchard beacon ladder "
          "island marble pepper quartz ribbon saddle tunnel walnut anchor basket candle dolphin feather "
          "garden helmet jacket kettle").split()

# (statement, question, answer word): details no reader could guess from the question alone.
_SENTENCES = (
    ("The spare key to the boathouse is hidden under the blue flowerpot.", "Where is the spare key to the boathouse hidden?", "flowerpot"),
    ("The chess club meets every Thursday in the basement of the old library.", "Where does the chess club meet?", "basement"),
    ("Marta's favourite pastry from the corner bakery is the cardamom bun.", "Which pastry does Marta like best?", "cardamom"),
    ("The lighthouse keeper named his grey cat Admiral.", "What did the lighthouse keeper name his cat?", "Admiral"),
    ("The expedition's only radio was packed inside a yellow biscuit tin.", "Where was the expedition's radio packed?", "biscuit tin"),
    ("The night train to Vienna leaves from platform nineteen.", "From which platform does the night train to Vienna leave?", "nineteen"),
    ("The treasurer keeps the club's ledger in a locked walnut drawer.", "Where does the treasurer keep the club's ledger?", "walnut"),
    ("The village festival is always opened by a goat called Bartholomew.", "Who opens the village festival?", "Bartholomew"),
    ("The museum's oldest clock was repaired by a watchmaker from Geneva.", "Where was the watchmaker who repaired the museum's oldest clock from?", "Geneva"),
    ("The password for the garden shed is written on a seashell.", "What is the password for the garden shed written on?", "seashell"),
    ("Professor Lindqvist drinks only jasmine tea during exams.", "What does Professor Lindqvist drink during exams?", "jasmine"),
    ("The ferry captain whistles an old sea shanty called Rolling Home.", "Which sea shanty does the ferry captain whistle?", "Rolling Home"),
)


@dataclass(frozen=True)
class RulerCase:
    """One generated prompt.

    Attributes:
        task: one of ``TASKS``.
        text: the user message (haystack with needles, then the question).
        answers: strings the reply must contain (score = share found).
        depth: where the (first) needle sits, 0 (start) .. 1 (end of the haystack).
        seed: what generated it.
        needles: the sentences hidden in the haystack.
        body: the haystack with its needles (``text`` less the instruction and question).
        question: the question alone.
    """

    task: str
    text: str
    answers: tuple[str, ...]
    depth: float
    seed: int
    needles: tuple[str, ...] = field(default=())
    body: str = ""
    question: str = ""

    def score(self, reply: str) -> float:
        """Share of ``answers`` found in ``reply`` (case-insensitive).

        Args:
            reply: the model's answer.

        Returns:
            A number in [0, 1].
        """
        low = reply.lower()
        return sum(a.lower() in low for a in self.answers) / len(self.answers)


def _prose(block: str) -> tuple[str, ...]:
    """The sentences of one paragraph, or () where it is code, grammar or a heading rule."""
    lines = block.splitlines()
    # Indented blocks are code or grammar; lines of *, = or - are heading rules.
    if not lines or lines[0].startswith((" ", "\t")) or all(re.fullmatch(r"[*=\-~^]+\s*", ln) for ln in lines[1:2]):
        return ()
    prose = " ".join(ln.strip() for ln in lines if ln.strip() and not re.fullmatch(r"[*=\-~^]+", ln.strip()))
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"(])", prose) if len(s.split()) >= 4]
    return tuple(sentences) if len(sentences) >= 2 else ()


@functools.lru_cache(maxsize=1)
def haystack_sentences() -> tuple[tuple[str, ...], ...]:
    """Prose sentences of ``pydoc_data.topics``, grouped by paragraph, in a fixed order.

    Returns:
        Paragraphs, each a tuple of sentences (code samples, grammar rules and
        heading underlines removed).
    """
    from pydoc_data.topics import topics

    paragraphs = []
    for name in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[name]):
            if sentences := _prose(block):
                paragraphs.append(sentences)
    return tuple(paragraphs)


def _docstring_paragraphs(root: Path, seen: set[str], skip: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Prose paragraphs of the docstrings (modules, classes, functions) of the ``*.py``
    files under ``root``, in path order, read without importing them; each sentence once
    (``seen`` grows: overridden methods repeat their docstrings). Test suites are skipped
    (3.11 keeps some inside packages), and the top folders named in ``skip``."""
    import ast

    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in skip or {"test", "tests"} & set(rel):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                for block in re.split(r"\n\s*\n", ast.get_docstring(node) or ""):
                    sentences = tuple(dict.fromkeys(s for s in _prose(block) if s not in seen))
                    if len(sentences) >= 2:
                        seen.update(sentences)
                        yield sentences


@functools.lru_cache(maxsize=1)
def more_sentences() -> tuple[tuple[str, ...], ...]:
    """Prose paragraphs of the standard library's docstrings: the haystack past the
    ~40k tokens of ``haystack_sentences`` (~625k characters more, ~140k tokens), so a
    case to ~180k tokens repeats no paragraph and no sentence of its own.

    Returns:
        Paragraphs of two sentences or more, each sentence once and none also in
        ``haystack_sentences``.
    """
    import sysconfig

    seen = {s for p in haystack_sentences() for s in p}
    skip = ("site-packages", "dist-packages", "idlelib", "lib2to3")  # installed packages: the next tier
    return tuple(_docstring_paragraphs(Path(sysconfig.get_paths()["stdlib"]), seen, skip))


class _PackageProse:
    """The third tier, past the standard library (~180k tokens; for the 1M-token stretch):
    docstring prose of the installed packages (site-packages, in path order), read only as
    far as a haystack needs, and kept. Its text depends on what the machine has installed."""

    def __init__(self) -> None:
        self.read: list[tuple[str, ...]] = []
        self._source: Iterator[tuple[str, ...]] | None = None

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        i = 0
        while True:
            if i == len(self.read):
                if self._source is None:
                    self._source = self._scan()
                paragraph = next(self._source, None)
                if paragraph is None:
                    return
                self.read.append(paragraph)
            yield self.read[i]
            i += 1

    @staticmethod
    def _scan() -> Iterator[tuple[str, ...]]:
        import sysconfig

        seen = {s for tier in (haystack_sentences(), more_sentences()) for p in tier for s in p}
        for root in dict.fromkeys(Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")):
            yield from _docstring_paragraphs(root, seen)


#: Paragraphs of the third tier (iterate it; ``.read`` holds what was read so far).
package_sentences = _PackageProse()


def _haystack(rng: random.Random, n_chars: int) -> list[str]:
    """Sentences of consecutive paragraphs from a random start, about ``n_chars`` long.

    Past the end of ``haystack_sentences`` (~180k characters, ~40k tokens) it goes on with
    ``more_sentences`` (to ~180k tokens), then ``package_sentences`` (what is installed:
    millions of characters where a deep-learning stack is); only past all three does it
    come round again.
    """
    paragraphs = haystack_sentences()
    start = rng.randrange(len(paragraphs))
    first = [paragraphs[(start + k) % len(paragraphs)] for k in range(len(paragraphs))]

    def tiers() -> Iterator[tuple[str, ...]]:  # each tier read only when reached (the stdlib's: ~4 s)
        yield from first
        yield from more_sentences()
        yield from package_sentences
        yield from itertools.cycle(first)

    out: list[str] = []
    size = 0
    for paragraph in tiers():
        if size >= n_chars:
            break
        for s in paragraph:
            out.append(s)
            size += len(s) + 1
    return out


def haystack_text(n_chars: int, seed: int = 0) -> str:
    """About ``n_chars`` of the suite's natural prose (seeded), for other benchmarks' long prompts."""
    return " ".join(_haystack(random.Random(seed), n_chars))


def _insert(sentences: list[str], needles: list[str], depths: list[float]) -> str:
    out = list(sentences)
    # Insert from the deepest so earlier positions stay valid.
    for needle, depth in sorted(zip(needles, depths), key=lambda p: -p[1]):
        out.insert(int(round(depth * len(sentences))), needle)
    return " ".join(out)


def _keys(rng: random.Random, n: int) -> list[str]:
    pairs = rng.sample([f"{a}-{b}" for a in _ADJECTIVES for b in _NOUNS], n)
    return pairs


def _number(rng: random.Random, used: set[str]) -> str:
    while True:
        v = str(rng.randint(1_000_000, 9_999_999))
        if v not in used:
            used.add(v)
            return v


def _parts(task: str, rng: random.Random, depth: float) -> tuple[str, list[str], list[float], str, tuple[str, ...]]:
    """(intro, needles, depths, question, answers) of one case."""
    used: set[str] = set()
    spread = [min(0.999, max(0.0, depth + d)) for d in (0.0, 0.07, 0.14, 0.21)]  # the other needles just after
    if task in ("niah_single", "niah_multikey", "niah_multiquery"):
        n = 1 if task == "niah_single" else 4
        keys = _keys(rng, n)
        values = [_number(rng, used) for _ in keys]
        needles = [f"One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, values)]
        order = list(range(n))
        rng.shuffle(order)
        depths = [spread[order[i]] for i in range(n)] if n > 1 else [depth]
        if task == "niah_multiquery":
            asked = sorted(rng.sample(range(n), 2))
            question = (f"What are all the special magic numbers for {keys[asked[0]]} and {keys[asked[1]]} "
                        "mentioned in the provided text?")
            return _NIAH_INTRO, needles, depths, question, tuple(values[i] for i in asked)
        asked_one = rng.randrange(n)
        question = f"What is the special magic number for {keys[asked_one]} mentioned in the provided text?"
        return _NIAH_INTRO, needles, depths, question, (values[asked_one],)
    if task == "niah_multivalue":
        key = _keys(rng, 1)[0]
        values = [_number(rng, used) for _ in range(4)]
        needles = [f"One of the special magic numbers for {key} is: {v}." for v in values]
        question = f"What are all the special magic numbers for {key} mentioned in the provided text?"
        return _NIAH_INTRO, needles, spread, question, tuple(values)
    if task == "vt":
        names: list[str] = []
        while len(names) < 5:
            name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
            if name not in names:
                names.append(name)
        value = str(rng.randint(10000, 99999))
        needles = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = {a}." for a, b in zip(names, names[1:])]
        depths = [min(0.999, depth + 0.05 * i) for i in range(5)]
        question = f"Find all variables that are assigned the value {value} in the text above."
        return _VT_INTRO, needles, depths, question, tuple(names)
    if task == "sentence":
        statement, question, answer = rng.choice(_SENTENCES)
        return _SENTENCE_INTRO, [statement], [depth], question, (answer,)
    raise OptionError(f"unknown RULER task {task!r}: choose from {', '.join(TASKS)}")


def make_case(task: str, n_tokens: int, depth: float, seed: int, count_tokens: Callable[[str], int]) -> RulerCase:
    """One prompt of ``task`` about ``n_tokens`` long (as ``count_tokens`` counts).

    Args:
        task: one of ``TASKS``.
        n_tokens: target length of the whole user message in tokens.
        depth: where the needle(s) go, 0 .. 1.
        seed: the same seed gives the same case.
        count_tokens: the model tokenizer's counter (chat template included if the
            caller wants the whole prompt counted).

    Returns:
        The case.

    Raises:
        OptionError: an unknown task, a depth outside [0, 1] or a length under 16.
    """
    if task not in TASKS:
        raise OptionError(f"unknown RULER task {task!r}: choose from {', '.join(TASKS)}")
    if not 0.0 <= depth <= 1.0:
        raise OptionError(f"invalid needle depth {depth!r}: use a number in [0, 1]")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 16:
        raise OptionError(f"invalid RULER length {n_tokens!r}: use at least 16 tokens")
    rng = random.Random(f"{task}:{seed}")
    intro, needles, depths, question, answers = _parts(task, rng, depth)
    chars = n_tokens * 4  # first guess; corrected below with the real tokenizer

    def build(n_chars: int) -> tuple[str, str]:
        body = _insert(_haystack(random.Random(seed), n_chars), needles, depths)
        return f"{intro}{body}\n\n{question} Answer briefly.", body

    text, body = build(chars)
    for _ in range(5):  # a few corrections land within a sentence or two of the target
        have = count_tokens(text)
        if abs(have - n_tokens) <= max(16, n_tokens // 100):
            break
        chars = max(200, int(chars * n_tokens / max(1, have)))
        text, body = build(chars)
    return RulerCase(task, text, answers, depth, seed, tuple(needles), body, question)


#: Where a case's question goes (``messages``, ``turns``). The cascade's question pass reads
#: the prompt's last tokens, and RULER puts the question last; users also ask first:
#: ``end`` (RULER's: instruction, text, question), ``first`` (the question, then the text;
#: no instruction, since it says "afterwards"), ``system`` (as ``first``, after a system
#: prompt of a user's own, ~110 tokens, so the question lies past the cascade's 64 sinks),
#: ``turns`` (the instruction and text in one turn of a conversation, the question in the next).
LAYOUTS = ("end", "first", "system", "turns")

_READER_SYSTEM = (
    "You are a careful reading assistant. The user gives you a question and then a long document. "
    "Read the whole document before answering. Answer only from the document, never from what you know "
    "otherwise. Quote numbers, names and dates exactly as the document writes them. If the document does "
    "not contain the answer, say that it does not. Keep answers short: one sentence unless the user asks "
    "for more. Do not repeat the question. Do not explain how you found the answer unless asked.")


def messages(case: RulerCase, layout: str = "end") -> list[dict[str, str]]:
    """The chat messages that ask ``case`` with its question where ``layout`` puts it.

    Args:
        case: a case from ``make_case``.
        layout: one of ``LAYOUTS``.

    Returns:
        ``[{"role", "content"}, ...]`` for ``Engine.encode`` / ``Engine.generate``.

    Raises:
        OptionError: an unknown layout.
    """
    if layout not in LAYOUTS or layout == "turns":
        raise OptionError(f"unknown RULER layout {layout!r} for one prompt: choose from end, first, system")
    if layout == "end":
        return [{"role": "user", "content": case.text}]
    question = case.question.replace("provided text", "text below").replace("text above", "text below")
    user = {"role": "user", "content": f"{question} Answer briefly.\n\n{case.body}"}
    return [user] if layout == "first" else [{"role": "system", "content": _READER_SYSTEM}, user]


def depths(n: int) -> list[float]:
    """``n`` depths spread evenly over (0, 1): the middle of n equal slices.

    Args:
        n: how many.

    Returns:
        e.g. [0.125, 0.375, 0.625, 0.875] for 4.
    """
    return [(i + 0.5) / n for i in range(n)]


def turns(case: RulerCase) -> tuple[str, str]:
    """The two user turns of the ``turns`` layout: the instruction and text (asking for a
    short acknowledgement), then the question.

    Args:
        case: a case from ``make_case``.

    Returns:
        (first turn, second turn).
    """
    text = case.text[: case.text.rindex("\n\n")]
    return f"{text}\n\nReply with OK once you have read it.", f"{case.question} Answer briefly."


__all__ = ["ANSWER_TOKENS", "LAYOUTS", "TASKS", "RulerCase", "depths", "haystack_sentences", "haystack_text",
           "make_case", "messages", "more_sentences", "package_sentences", "turns", "answer_in_turns"]


#: How a case is answered: ``cascade`` (the given config), ``streaming`` (the same with
#: top_k 0: sinks + window only), ``full`` (the engine's plain KV cache).
MODES = ("cascade", "streaming", "full")


def answer(engine: Any, ids: list[int], mode: str, config: Any, max_tokens: int) -> Any:
    """Answer one case greedily through ``engine`` as a user's request runs: submitted to
    its scheduler (the engine's prefill chunks, the caches' ``prepare_decode`` step — the
    cascade's question pass — and batched decode steps), with a cache of ``mode``.

    Args:
        engine: a loaded ``Engine``.
        ids: the case's prompt token ids (chat template applied).
        mode: one of ``MODES``.
        config: the ``CascadeConfig`` of the ``cascade`` and ``streaming`` modes (the one
            ``Engine.load(cascade=...)`` would make: ``CascadeConfig.for_model``).
        max_tokens: answer budget.

    Returns:
        The request's ``GenerationResult`` (``text``; ``stats.extra["cascade"]`` counts
        the question passes that ran).
    """
    from mlotspark.memory.cascade import CascadeConfig

    if mode not in MODES:
        raise OptionError(f"unknown RULER mode {mode!r}: expected one of {', '.join(MODES)}")
    cache = None  # full: the engine's own choice, a KV cache within the trained context
    if mode == "full":
        if engine.cache_kind_for(len(ids), engine.options(max_tokens=max_tokens)) != "kv":
            raise OptionError(f"full attention over {len(ids)} tokens needs an engine whose cascade is "
                              f"'auto' or off, and a prompt within the model's context")
    else:
        cfg = config if mode == "cascade" else CascadeConfig(**{**config.to_dict(), "top_k": 0})
        cache = engine.caches.cascade_cache(cfg)  # the budget the engine's own cascade gets
    return engine.submit(prompt_ids=ids, cache=cache, max_tokens=max_tokens, temperature=0.0).result()


def answer_in_turns(engine: Any, case: RulerCase, max_tokens: int, name: str) -> Any:
    """Answer ``case`` in the ``turns`` layout as a chat user does: the text in one turn of
    ``engine.conversation(name)`` (8 tokens of reply), the question in the next (the
    conversation's cache carried over: the cascade's, if ``engine`` runs one), greedy;
    the conversation is deleted after.

    Args:
        engine: a loaded ``Engine`` (its own cascade setting is the mode).
        case: a case from ``make_case``.
        max_tokens: the answer's budget.
        name: a conversation name not in use.

    Returns:
        The second turn's ``GenerationResult``.
    """
    first, question = turns(case)
    conv = engine.conversation(name)
    conv.memory = False  # the cascade is measured, not semantic memory: the text is not learned
    try:
        conv.send(first, max_tokens=8, temperature=0.0)
        return conv.send(question, max_tokens=max_tokens, temperature=0.0)
    finally:
        conv.delete()

