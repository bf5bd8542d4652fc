"""``mlotspark bench``: latency and tokens/sec, side by side with mlx-lm, like llama-bench.

- ``config``: ``BenchConfig`` and the ``--suite`` syntax (``pp,tg,ttft:cold``).
- ``suites/``: one module per suite (pp, tg, ttft, long, batch, spec), in ``SUITES``.
- ``context``: timed runs of mlotspark and of mlx-lm on the same weights, interleaved.
- ``runner``: ``run_bench(config) -> Report`` (header, thermal state, suites).
- ``figures``: ``Figure`` (every repetition, median/min/max, ratio) and ``Report``.
- ``formats``: table / JSON / CSV; ``plot``: the PNG chart; ``progress``: the bar.

Example::

    from mlotspark.bench import BenchConfig, parse_suites, run_bench, render
    report = run_bench(BenchConfig(suites=parse_suites("pp,tg"), compare="mlx-lm"))
    print(render(report, "table"))
"""

from .config import BenchConfig, parse_suites
from .figures import SCHEMA, Figure, Report, SuiteError
from .formats import CSV_COLUMNS, render
from .plot import plot_report
from .runner import run_bench
from .suites import SUITES

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
