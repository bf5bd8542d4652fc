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
"""

from __future__ import annotations

from types import ModuleType

from mlotspark.bench.suites import batch, long, pp, spec, tg, ttft

SUITES: dict[str, ModuleType] = {
    "pp": pp,
    "tg": tg,
    "ttft": ttft,
    "long": long,
    "batch": batch,
    "spec": spec,
}


def selected(module: ModuleType, cases: tuple[str, ...]) -> tuple[str, ...]:
    """The cases to run: those chosen, or all of the suite's."""
    return cases or tuple(module.CASES)


__all__ = ["SUITES", "selected"]
