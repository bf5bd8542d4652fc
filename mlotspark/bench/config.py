"""``BenchConfig``: what ``mlotspark bench`` measures and how often.

Suites are chosen as ``pp,tg,ttft`` (every case of each) or ``suite:case`` for one
case (``ttft:cold,ttft:warm``). Names are checked against the suite table in
``suites/__init__.py``; a bad one is an ``OptionError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from mlotspark.errors import OptionError

COMPARE = (None, "mlx-lm")
FORMATS = ("table", "json", "csv")
DEFAULT_SUITES = "pp,tg,ttft"


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark run, validated.

    Args:
        model: alias, ``.gguf`` path, mlx-lm directory or repo id; None = default model.
        weights: weight format (``auto | quantized | float16 | bfloat16 | float32``).
        prompt_tokens: prompt length of ``pp`` (default 512, llama-bench's pp512).
        gen_tokens: tokens decoded by ``tg``, ``long``, ``batch`` and ``spec`` (default 128).
        repetitions: timed repetitions per figure (default 5); median, min, max reported.
        warmup: untimed runs before the repetitions (default 1).
        suites: ``((suite, (case, ...)), ...)``; an empty case tuple means every case.
        compare: ``"mlx-lm"`` to time mlx-lm on the same weights, interleaved.
        contexts: context lengths of the ``long`` suite.
        batch_sizes: batch sizes of the ``batch`` suite.
        seed: seed of the random prompt tokens.
    """

    model: str | None = None
    weights: str = "auto"
    prompt_tokens: int = 512
    gen_tokens: int = 128
    repetitions: int = 5
    warmup: int = 1
    suites: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=lambda: parse_suites(DEFAULT_SUITES))
    compare: str | None = None
    contexts: tuple[int, ...] = (1024, 2048, 4096)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    seed: int = 0

    def __post_init__(self) -> None:
        def integer(name: str, value: Any, lo: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise OptionError(f"invalid {name} {value!r}: must be an integer >= {lo}")

        integer("prompt_tokens", self.prompt_tokens, 1)
        # Decode speed is measured between the first and the last token: two at least.
        integer("gen_tokens", self.gen_tokens, 2)
        integer("repetitions", self.repetitions, 1)
        integer("warmup", self.warmup, 0)
        integer("seed", self.seed, 0)
        for name, one in (("contexts", "context length"), ("batch_sizes", "batch size")):
            values = tuple(getattr(self, name))
            if not values:
                raise OptionError(f"invalid {name} {values!r}: give at least one value")
            for v in values:
                integer(one, v, 1)
            object.__setattr__(self, name, values)
        if self.compare not in COMPARE:
            raise OptionError(f"invalid compare {self.compare!r}: the only engine to compare with is mlx-lm")
        if not self.suites:
            raise OptionError("no suite selected: choose from " + ", ".join(_suite_names()))
        object.__setattr__(self, "suites", tuple((s, tuple(c)) for s, c in self.suites))

    @property
    def suite_names(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.suites)


def _suite_names() -> tuple[str, ...]:
    from mlotspark.bench.suites import SUITES

    return tuple(SUITES)


def parse_suites(text: str | Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``"pp,tg,ttft:cold"`` -> ``(("pp", ()), ("tg", ()), ("ttft", ("cold",)))``; ``all`` = every suite.

    Order follows the first mention of each suite; ``suite`` alone selects every case.

    Raises:
        OptionError: an unknown suite or case, naming it and the choices.
    """
    from mlotspark.bench.suites import SUITES

    items = text.split(",") if isinstance(text, str) else list(text)
    items = [n for i in items for n in (SUITES if i.strip() == "all" else [i])]  # "all": every suite
    chosen: dict[str, list[str] | None] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        name, _, case = item.partition(":")
        name, case = name.strip(), case.strip()
        if name not in SUITES:
            raise OptionError(f"unknown suite {name!r}: choose from {', '.join(SUITES)}")
        cases = SUITES[name].CASES
        if case and case not in cases:
            listed = ", ".join(cases) if cases else "none (it has a single case)"
            raise OptionError(f"unknown case {case!r} of suite {name!r}: choose from {listed}")
        if not case:
            chosen[name] = None  # every case
        elif name not in chosen:
            chosen[name] = [case]
        elif chosen[name] is not None and case not in chosen[name]:  # type: ignore[operator]
            chosen[name].append(case)  # type: ignore[union-attr]
    if not chosen:
        raise OptionError(f"no suite selected in {text!r}: choose from {', '.join(SUITES)}")
    return tuple((n, tuple(c) if c else ()) for n, c in chosen.items())


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``.

    Raises:
        OptionError: a value that is not a positive integer.
    """
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise OptionError(f"invalid {what} {part!r}: must be a positive integer") from None
        if v < 1:
            raise OptionError(f"invalid {what} {v}: must be a positive integer")
        out.append(v)
    if not out:
        raise OptionError(f"invalid {what} list {text!r}: give at least one value")
    return tuple(out)


__all__ = ["BenchConfig", "COMPARE", "DEFAULT_SUITES", "FORMATS", "parse_int_list", "parse_suites"]
