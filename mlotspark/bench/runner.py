"""``run_bench``: load the model, check the suites, run them, and build the ``Report``.

Order of a run: read the thermal state; load the engine; check every chosen suite
(a suite that cannot run here is reported with its one-line reason before anything
is timed); run the others, each with its warm-up, both engines interleaved; close
the engine; read the thermal state again. Conversations and cache files the suites
create live in a private scratch ``$MLOTSPARK_HOME`` removed at the end, so a run
never touches the user's conversations or prefix cache.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from mlotspark import __version__
from mlotspark.errors import MlotsparkError, OptionError
from mlotspark.bench.config import BenchConfig
from mlotspark.bench.context import BenchContext, SuiteUnavailable
from mlotspark.bench.figures import Report, SuiteError
from mlotspark.bench.progress import Progress
from mlotspark.bench.suites import SUITES
from mlotspark.bench.suites.tg import PROMPT_TOKENS as TG_PROMPT_TOKENS


def thermal_state() -> dict[str, Any]:
    """The governor's verdict on the machine now, with the CPU load and load average."""
    import psutil

    from mlotspark.thermal.governor import ThermalGovernor

    governor = ThermalGovernor(min_interval_s=0.0)
    decision = governor.update(force=True)
    reading = governor.status().get("reading", {})
    out: dict[str, Any] = {"state": decision.state, "reason": decision.reason}
    out["cpu_load"] = round(psutil.cpu_percent(interval=0.25) / 100.0, 2)
    with contextlib.suppress(OSError, AttributeError):
        out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if reading.get("temperature_c") is not None:
        out["temperature_c"] = reading["temperature_c"]
    return out


@contextlib.contextmanager
def _scratch_home(path: Path) -> Iterator[None]:
    old = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MLOTSPARK_HOME", None)
        else:
            os.environ["MLOTSPARK_HOME"] = old


def blas_threads(mlx_lm_counts: set[int | None]) -> str:
    """The OpenBLAS thread counts each side ran with, in words, for the header.

    Args:
        mlx_lm_counts: the counts in force at mlx-lm's runs (``BenchContext.mlx_lm_threads``;
            None: nothing fitted, OpenBLAS's own default); empty when not compared.
    """
    from mlotspark.platform.blas import fitted_threads

    if "OPENBLAS_NUM_THREADS" in os.environ:
        return f"BLAS threads {os.environ['OPENBLAS_NUM_THREADS']} on both sides (OPENBLAS_NUM_THREADS)"

    def count(n: int | None) -> str:
        return "default" if n is None else str(n)

    text = f"BLAS threads: mlotspark fitted to the free cores (last {count(fitted_threads())})"
    if mlx_lm_counts:
        ran = "/".join(count(n) for n in sorted(mlx_lm_counts, key=lambda n: -1 if n is None else n))
        text += f", mlx-lm {ran} (one OpenBLAS in this process: our engine's count)"
    return text


def _check_fits(config: BenchConfig, context: int) -> None:
    """An impossible setting fails before anything is timed, naming the value."""
    names = config.suite_names
    if "pp" in names and config.prompt_tokens + 1 >= context:
        raise OptionError(f"invalid -p {config.prompt_tokens}: a prompt of that length and one generated "
                          f"token do not fit the model's context of {context} tokens")
    if "tg" in names and TG_PROMPT_TOKENS + config.gen_tokens >= context:
        raise OptionError(f"invalid -g {config.gen_tokens}: {TG_PROMPT_TOKENS} prompt tokens and that many "
                          f"generated do not fit the model's context of {context} tokens")


def run_bench(
    config: BenchConfig,
    *,
    show_progress: bool | None = None,
    command: str | None = None,
    engine_options: dict[str, Any] | None = None,
) -> Report:
    """Run the configured suites and return the report.

    Args:
        config: what to run.
        show_progress: draw the progress bar on stderr; None = when stderr is a terminal.
        command: the command line, recorded in the header.
        engine_options: more ``Engine.load`` keywords (e.g. a scripted ``governor``).

    Returns:
        The Report; suites that could not run are in ``report.errors``.

    Raises:
        OptionError: an impossible setting (e.g. a prompt longer than the context).
        ModelError: the model cannot be loaded.
    """
    from mlotspark.platform.device import device_info
    from mlotspark.engine import Engine

    started, t0 = _dt.datetime.now().astimezone(), time.perf_counter()
    thermal_start = thermal_state()
    info = device_info()
    options = {"max_batch": max(8, *config.batch_sizes), **(engine_options or {})}
    progress = Progress(1, enabled=show_progress)
    progress.show(f"loading {config.model or 'the default model'}")
    try:
        engine = Engine.load(config.model, weights=config.weights, progress=show_progress is not False, **options)
    except BaseException:
        progress.close()
        raise
    figures, errors = [], []
    mlx_lm_threads: set[int | None] = set()
    closed = False
    try:
        _check_fits(config, int(engine.loaded.context_length))
        with tempfile.TemporaryDirectory(prefix="mlotspark-bench-") as tmp, _scratch_home(Path(tmp) / "home"):
            progress.show("checking the suites")
            ctx = BenchContext(engine, config, progress, Path(tmp))
            mlx_lm_threads = ctx.mlx_lm_threads
            chosen = []
            for name, cases in config.suites:
                module = SUITES[name]
                try:
                    module.check(ctx, cases)
                    chosen.append((name, module, cases))
                except SuiteUnavailable as e:
                    errors.append(SuiteError(name, str(e)))
            progress.total = max(1, sum(m.steps(ctx, c) for _, m, c in chosen))
            try:
                for name, module, cases in chosen:
                    try:
                        figures += module.run(ctx, cases)
                    except SuiteUnavailable as e:
                        errors.append(SuiteError(name, str(e)))
                    except MlotsparkError as e:  # the other suites' figures are kept
                        errors.append(SuiteError(name, f"{name} failed: {e}"))
            finally:
                errors += [SuiteError(suite, why, cell=True) for suite, why in ctx.cells_not_run]
                progress.close()
                closed = True
                engine.close()  # inside the scratch home: it saves the prefix cache there
    finally:
        if not closed:
            progress.close()
            engine.close()
    header = {
        "command": command,
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - t0, 1),
        "mlotspark_version": __version__,
        "model": engine.model_name,
        "model_path": str(engine.loaded.source.path),
        "weights": engine.loaded.weights,
        "weights_mb": round(engine.loaded.nbytes() / 1e6, 1),
        "context_length": engine.loaded.context_length,
        **{k: info.get(k) for k in ("device", "blas", "mlx_version", "mlx_lm_version", "cpu",
                                    "cores_logical", "platform", "python")},
        "blas_threads": blas_threads(mlx_lm_threads),
        "thermal_start": thermal_start,
        "thermal_end": thermal_state(),
        "prompt_tokens": config.prompt_tokens,
        "gen_tokens": config.gen_tokens,
        "repetitions": config.repetitions,
        "warmup": config.warmup,
        "compare": config.compare,
        "suites": [f"{n}:{'+'.join(c)}" if c else n for n, c in config.suites],
        "seed": config.seed,
    }
    return Report(header, figures, errors)


__all__ = ["blas_threads", "run_bench", "thermal_state"]
