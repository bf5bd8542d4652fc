"""``mlotspark bench``: latency and tokens/sec, side by side with mlx-lm, like llama-bench.

- ``config``: ``BenchConfig``.
- ``suites/``: one module per suite (pp, tg, ttft, long, batch, spec), in ``SUITES``,
  and ``parse_suites`` for the ``--suite`` syntax (``pp,tg,ttft:cold``).
- ``context``: timed runs of mlotspark and of mlx-lm on the same weights, interleaved.
- ``runner``: ``run_bench(config) -> Report`` (header, thermal state, suites).
- ``figures``: ``Figure`` (every repetition, median/min/max, ratio) and ``Report``.
- ``formats``: table / JSON / CSV; ``plot``: the PNG chart; ``progress``: the bar.

Example::

    from mlotspark.bench import BenchConfig, parse_suites, run_bench, render
    report = run_bench(BenchConfig(suites=parse_suites("pp,tg"), compare="mlx-lm"))
    print(render(report, "table"))

May import anything in ``mlotspark`` below the CLI (the engine, models, thermal).
"""

from mlotspark.bench.config import BenchConfig
from mlotspark.bench.figures import SCHEMA, Figure, Report, SuiteError
from mlotspark.bench.formats import CSV_COLUMNS, render
from mlotspark.bench.plot import plot_report
from mlotspark.bench.runner import run_bench
from mlotspark.bench.suites import SUITES, parse_suites

__all__ = [
    "CSV_COLUMNS",
    "SCHEMA",
    "SUITES",
    "BenchConfig",
    "Figure",
    "Report",
    "SuiteError",
    "parse_suites",
    "plot_report",
    "render",
    "run_bench",
]
