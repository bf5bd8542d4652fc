"""Records of a benchmark run: one ``Figure`` per measured quantity, and the ``Report``.

A figure holds every repetition, not just a summary: mlotspark's values and, with
``--compare mlx-lm``, mlx-lm's values from the same interleaved repetitions. The
ratio is the median of the per-repetition ratios, oriented so that > 1 always means
mlotspark did better (faster, sooner, smaller), whatever the unit.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "mlotspark-bench/1"


@dataclass
class Figure:
    """One measured quantity of one suite case.

    Args:
        suite: the suite (``pp``, ``tg``, ``ttft`` ...).
        case: what was measured, e.g. ``pp512``, ``warm``, ``full 2048``, ``batch 4``.
        metric: e.g. ``prefill``, ``decode``, ``TTFT``, ``peak memory``.
        unit: e.g. ``tok/s``, ``ms``, ``MB``, ``x``, ``%``.
        higher_is_better: orientation of the ratio column.
        values: mlotspark's value per repetition.
        reference: mlx-lm's value per repetition (same repetitions), or empty.
        notes: one short line (prompt size, cache source, governor decision ...).
    """

    suite: str
    case: str
    metric: str
    unit: str
    higher_is_better: bool
    values: list[float]
    reference: list[float] = field(default_factory=list)
    notes: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def min(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def max(self) -> float:
        return max(self.values) if self.values else float("nan")

    @property
    def ratio(self) -> float | None:
        """Median over repetitions of mlotspark ÷ mlx-lm (inverted for lower-is-better)."""
        pairs = [(a, b) for a, b in zip(self.values, self.reference) if a > 0 and b > 0]
        if not pairs:
            return None
        return statistics.median(a / b if self.higher_is_better else b / a for a, b in pairs)

    def summary(self, values: list[float]) -> dict[str, Any]:
        if not values:
            return {"median": None, "min": None, "max": None, "n": 0, "values": []}
        return {
            "median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": list(values),
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON record of this figure (see ``Report.to_dict``)."""
        out: dict[str, Any] = {
            "suite": self.suite, "case": self.case, "metric": self.metric, "unit": self.unit,
            "higher_is_better": self.higher_is_better,
        }
        out.update(self.summary(self.values))
        out["mlx_lm"] = self.summary(self.reference) if self.reference else None
        out["ratio"] = self.ratio
        out["notes"] = self.notes
        return out


@dataclass
class SuiteError:
    """A suite (or one of its cases) that could not run, with the one-line reason.

    ``cell``: one case or length of a suite whose other cells ran (full attention past the
    model's context, the cascade on a model that has none): listed, but no failure of the
    command, since the suite ran what it could as documented."""

    suite: str
    message: str
    cell: bool = False


@dataclass
class Report:
    """Everything a run produced: header facts, figures and suites that could not run."""

    header: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    errors: list[SuiteError] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        return any(f.reference for f in self.figures) or self.header.get("compare") == "mlx-lm"

    def to_dict(self) -> dict[str, Any]:
        """JSON document: ``schema``, ``header``, ``results`` (figures), ``errors``."""
        return {
            "schema": SCHEMA,
            "header": dict(self.header),
            "results": [f.to_dict() for f in self.figures],
            "errors": [asdict(e) for e in self.errors],
        }


__all__ = ["Figure", "Report", "SCHEMA", "SuiteError"]
