"""``BenchConfig``: what ``mlotspark bench`` measures and how often.

Suites are chosen as ``pp,tg,ttft`` (every case of each) or ``suite:case`` for one
case (``ttft:cold,ttft:warm``); ``suites.parse_suites`` checks the names against the
suite table and turns the text into ``BenchConfig.suites``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlotspark.errors import OptionError

COMPARE = (None, "mlx-lm")
FORMATS = ("table", "json", "csv")
DEFAULT_SUITES = "pp,tg,ttft"
DEFAULT_SELECTION: tuple[tuple[str, tuple[str, ...]], ...] = (("pp", ()), ("tg", ()), ("ttft", ()))  # parsed DEFAULT_SUITES


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
    suites: tuple[tuple[str, tuple[str, ...]], ...] = DEFAULT_SELECTION
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
            raise OptionError("no suite selected: give at least one (e.g. pp,tg,ttft)")
        object.__setattr__(self, "suites", tuple((s, tuple(c)) for s, c in self.suites))

    @property
    def suite_names(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.suites)


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


__all__ = ["BenchConfig", "COMPARE", "DEFAULT_SELECTION", "DEFAULT_SUITES", "FORMATS", "parse_int_list"]
