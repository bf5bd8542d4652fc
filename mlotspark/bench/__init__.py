"""``mlotspark bench``: latency and tokens/sec, side by side with mlx-lm, like llama-bench.

- ``config``: ``BenchConfig``.
- ``suites/``: one module per suite (pp, tg, ttft, long, batch, spec), in ``SUITES``,
  and ``parse_suites`` for the ``--suite`` syntax (``pp,tg,ttft:cold``).
- ``context``: timed runs of mlotspark and of mlx-lm on the same weights, interleaved.
- ``runner``: ``run_bench(config) -> Report`` (header, thermal state, suites).
- ``figures``: ``Figure`` (every repetition, median/min/max, ratio) and ``Report``.
- ``formats``: table / JSON / CSV; ``plot``: the PNG chart; ``progress``: the bar.
- ``conformance``: the conformance matrix (``--suite conformance``, ``mlotspark check``):
  every documented feature on a model's real weights through ``serve`` and the real SDKs.
- ``serve``: ``mlotspark serve`` beside ``mlx_lm.server`` (``--suite serve``), and the server
  pair the scripts in ``benchmarks/`` start.
- ``memory_eval``: semantic memory as a user lives it (``--suite memory``).

``serve``, ``memory`` and ``conformance`` run alone (``suites.ALONE``), not inside one engine's run.

Example::

    from mlotspark.bench import BenchConfig, parse_suites, run_bench, render
    report = run_bench(BenchConfig(suites=parse_suites("pp,tg"), compare="mlx-lm"))
    print(render(report, "table"))

May import anything in ``mlotspark`` below the CLI (the engine, models, thermal).
"""

# Names load on first use (PEP 562): the CLI builds its parser from ``bench.config``
# without importing the suites, which import MLX (``mlotspark --help`` stays light).
_LAZY = {
    "BenchConfig": "config", "parse_suites": "suites",
    "SCHEMA": "figures", "Figure": "figures", "Report": "figures", "SuiteError": "figures",
    "CSV_COLUMNS": "formats", "render": "formats",
    "plot_report": "plot",
    "run_bench": "runner",
    "SUITES": "suites",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
