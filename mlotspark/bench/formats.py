"""The report as a table (markdown, llama-bench style), JSON or CSV.

- table: a header block (model, weights, device, BLAS, MLX, thermal state at start
  and end), then one markdown row per figure: median [min–max], mlx-lm's median and
  the ratio when compared; suites that could not run are listed below with why.
- json: ``Report.to_dict()`` (schema ``mlotspark-bench/1``); non-finite numbers
  become null.
- csv: one row per figure, the columns in ``CSV_COLUMNS``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.bench.figures import Report

CSV_COLUMNS = (
    "suite", "case", "metric", "unit", "higher_is_better", "median", "min", "max", "n",
    "mlx_lm_median", "mlx_lm_min", "mlx_lm_max", "ratio", "notes",
)


def num(v: float | None) -> str:
    """A figure with about four significant digits; a dash when missing."""
    if v is None or not math.isfinite(v):
        return "—"
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}" if a < 1000 else f"{v:.0f}"
    return f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    mid = num(statistics.median(values))
    return f"{mid} [{num(min(values))}–{num(max(values))}]" if len(values) > 1 else mid


def _thermal(t: dict[str, Any] | None) -> str:
    if not t:
        return "unknown"
    parts = []
    if t.get("temperature_c") is not None:
        parts.append(f"{t['temperature_c']:.0f}°C")
    if t.get("load_avg_1m") is not None:
        parts.append(f"load avg {t['load_avg_1m']:.1f}")
    if t.get("cpu_load") is not None:
        parts.append(f"cpu {t['cpu_load']:.0%}")
    return f"{t.get('state', 'unknown')}" + (f" ({', '.join(parts)})" if parts else "")


def header_lines(report: Report) -> list[str]:
    """The facts a reader needs to trust or reproduce the numbers."""
    h = report.header
    lines = [
        f"mlotspark bench {h.get('mlotspark_version', '')}: {h.get('model')} "
        f"({h.get('weights')} weights, {num(h.get('weights_mb'))} MB, context {h.get('context_length')})",
        f"device {h.get('device')} · {h.get('cpu')} ({h.get('cores_logical')} cores) · BLAS {h.get('blas')}"
        + (f" · {h['blas_threads']}" if h.get("blas_threads") else ""),
        f"MLX {h.get('mlx_version')} · mlx-lm {h.get('mlx_lm_version')} · Python {h.get('python')} · {h.get('platform')}",
        f"thermal: {_thermal(h.get('thermal_start'))} → {_thermal(h.get('thermal_end'))}",
        f"{h.get('date')} · {h.get('duration_s')} s · -p {h.get('prompt_tokens')} -g {h.get('gen_tokens')} · "
        f"{h.get('repetitions')} repetitions after {h.get('warmup')} warm-up"
        + (", mlx-lm interleaved" if h.get("compare") else "")
        + " · median [min–max]"
        + (" · ratio > 1: mlotspark better" if h.get("compare") else ""),
    ]
    if h.get("command"):
        lines.append(f"command: {h['command']}")
    return lines


def to_table(report: Report) -> str:
    """Header lines, a blank line, then a markdown table."""
    compared = report.compared
    cols = ["suite", "case", "metric", "mlotspark"] + (["mlx-lm", "ratio"] if compared else []) + ["notes"]
    rows = [cols, ["---"] * len(cols)]
    for f in report.figures:
        row = [f.suite, f.case, f"{f.metric} ({f.unit})", _spread(f.values)]
        if compared:
            ratio = f.ratio
            ref = num(statistics.median(f.reference)) if f.reference else "—"
            row += [ref, f"{ratio:.2f}x" if ratio is not None else "—"]
        row.append(f.notes.replace("|", "/"))
        rows.append(row)
    lines = header_lines(report) + [""] + ["| " + " | ".join(r) + " |" for r in rows]
    for e in report.errors:
        lines.append(f"not run: {e.message}")
    return "\n".join(lines) + "\n"


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def to_json(report: Report) -> str:
    return json.dumps(_finite(report.to_dict()), indent=2, ensure_ascii=False, default=str) + "\n"


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for f in report.figures:
        d = _finite(f.to_dict())
        ref = d["mlx_lm"] or {}
        w.writerow([
            d["suite"], d["case"], d["metric"], d["unit"], d["higher_is_better"],
            d["median"], d["min"], d["max"], d["n"],
            ref.get("median"), ref.get("min"), ref.get("max"), d["ratio"], d["notes"],
        ])
    return buf.getvalue()


FORMATTERS = {"table": to_table, "json": to_json, "csv": to_csv}


def render(report: Report, fmt: str) -> str:
    """The report in ``fmt`` (``table | json | csv``).

    Raises:
        OptionError: an unknown format.
    """
    if fmt not in FORMATTERS:
        raise OptionError(f"invalid format {fmt!r}: choose one of {', '.join(FORMATTERS)}")
    return FORMATTERS[fmt](report)


__all__ = ["CSV_COLUMNS", "FORMATTERS", "header_lines", "num", "render", "to_csv", "to_json", "to_table"]
