"""The benchmark suites, one module each, registered in ``SUITES`` (in report order).

A suite module has:

- ``CASES``: names of its selectable cases (``suite:case`` on the command line);
  empty when it has a single case;
- ``DESCRIPTION``: one line for ``--help``;
- ``steps(ctx, cases) -> int``: progress steps it will take;
- ``check(ctx, cases)``: raise ``SuiteUnavailable`` (one line: what it needs) when
  the engine lacks what the suite measures, before anything is timed;
- ``run(ctx, cases) -> list[Figure]``.

``cases`` is the tuple chosen on the command line, empty for all of them.

``ALONE`` names the suites that run by themselves, not inside one engine's run (they
start servers, or load each model in a scratch home): ``mlotspark bench --suite NAME``
runs one of them on its own, and ``cli/bench.py`` dispatches it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Sequence

from mlotspark.bench.suites import batch, long, pp, ruler, spec, tg, ttft
from mlotspark.errors import OptionError

SUITES: dict[str, ModuleType] = {
    "pp": pp,
    "tg": tg,
    "ttft": ttft,
    "long": long,
    "batch": batch,
    "spec": spec,
    "ruler": ruler,
}

# Suites that run alone: name -> one line for ``--help``.
ALONE: dict[str, str] = {
    "serve": "mlotspark serve vs mlx_lm.server on the same weights: req/s and tok/s by client count "
             "(--clients, --requests, -g tokens a reply), cold vs warm TTFT of a resent 2k history (--histories)",
    "memory": "semantic memory as a user lives it, on the cases of --memory-set FILE",
    "conformance": "the conformance matrix (mlotspark check): every documented feature on real weights "
                   "through serve and the real SDKs; --model, else each catalogue chat model",
}


def parse_suites(text: str | Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``"pp,tg,ttft:cold"`` -> ``(("pp", ()), ("tg", ()), ("ttft", ("cold",)))``; ``all`` = every suite.

    Order follows the first mention of each suite; ``suite`` alone selects every case.

    Raises:
        OptionError: an unknown suite or case, naming it and the choices.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [n for i in items for n in (SUITES if i.strip() == "all" else [i])]  # "all": every suite
    chosen: dict[str, list[str] | None] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        name, _, case = item.partition(":")
        name, case = name.strip(), case.strip()
        if name in ALONE:
            raise OptionError(f"suite {name!r} runs alone: give --suite {name} by itself")
        if name not in SUITES:
            raise OptionError(f"unknown suite {name!r}: choose from {', '.join([*SUITES, *ALONE])}")
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



def selected(module: ModuleType, cases: tuple[str, ...]) -> tuple[str, ...]:
    """The cases to run: those chosen, or all of the suite's."""
    return cases or tuple(module.CASES)


__all__ = ["ALONE", "SUITES", "parse_suites", "selected"]
