"""The measuring kit every suite shares: timed runs of both engines, interleaved.

Both engines are timed at the same points: TTFT from the request to the first
token (runs of one token), decode speed as (tokens − 1) / (last − first token).
mlx-lm runs on our engine's thread (``Engine.run_on_engine``), so MLX is only ever
used from one thread and neither engine pays a thread switch the other does not. It
shares MLX's OpenBLAS, so its runs get the thread count our engine last fitted to the
free cores: ``run_mlx_lm`` notes each count it ran at, and the report's header names them.

Decode runs ignore EOS so that every run decodes the same number of tokens, as
``mlx_lm.benchmark`` does (it empties the tokenizer's EOS set).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import mlx.core as mx
import numpy as np

from mlotspark.bench.config import BenchConfig
from mlotspark.bench.figures import Figure
from mlotspark.bench.progress import Progress

if TYPE_CHECKING:
    from mlotspark.engine import Engine

Metrics = dict[str, float]


class SuiteUnavailable(Exception):
    """A suite (or case) cannot run here; the message says what it needs, on one line."""


@dataclass
class Run:
    """One timed generation.

    Attributes:
        ttft_s: request to first token, seconds.
        decode_tps: (tokens − 1) / (last token − first token); 0 for one token.
        tokens: tokens generated.
        peak_mb: MLX peak memory during the run (weights included), MB.
        extra: the engine's ``stats.extra`` (ours only).
    """

    ttft_s: float
    decode_tps: float
    tokens: int
    peak_mb: float
    extra: dict = field(default_factory=dict)


class BenchContext:
    """What a suite gets: the engine, the config, mlx-lm's twin and timed runs.

    Args:
        engine: the loaded engine (full attention).
        config: the run's settings.
        progress: the progress bar (``measure`` advances it).
        workdir: a private scratch directory (mlx-lm cache files, conversations).
    """

    def __init__(self, engine: "Engine", config: BenchConfig, progress: Progress, workdir: Path):
        self.engine = engine
        self.config = config
        self.progress = progress
        self.workdir = Path(workdir)
        self._rng = np.random.default_rng(config.seed)
        self._twin: Any = None
        self._ref_tokenizer: Any = None
        self.mlx_lm_threads: set[int | None] = set()  # BLAS thread counts mlx-lm ran at (None: not fitted)
        self.cells_not_run: list[tuple[str, str]] = []  # (suite, why): the report lists them under "not run"

    def not_run(self, suite: str, why: str) -> None:
        """Record a case of ``suite`` that cannot run here while its other cases do (a suite
        that cannot run at all raises ``SuiteUnavailable`` instead)."""
        self.cells_not_run.append((suite, why))

    # ----------------------------------------------------------------- facts
    @property
    def compare(self) -> bool:
        return self.config.compare == "mlx-lm"

    @property
    def cascade_here(self) -> str | None:
        """Why the loaded model cannot run the memory cascade, or None when it can."""
        if self.engine.loaded.supports_cascade:
            return None
        return (f"{self.engine.model_name} runs on mlx-lm's classes, and the memory cascade needs "
                "mlotspark's llama-family model (llama, mistral, qwen2, qwen3)")  # 'needs': a not-run line says what it lacks

    @property
    def context_length(self) -> int:
        return int(self.engine.loaded.context_length)

    @property
    def vocab_size(self) -> int:
        cfg = self.engine.loaded.config
        return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))

    def random_ids(self, n: int) -> list[int]:
        """``n`` random token ids (seeded), as llama-bench and mlx_lm.benchmark prompt."""
        return self._rng.integers(0, self.vocab_size, size=n).tolist()

    @property
    def rounds(self) -> int:
        """Progress steps one ``measure`` call takes."""
        return self.config.warmup + self.config.repetitions

    # ------------------------------------------------------------ mlotspark
    @contextlib.contextmanager
    def ignoring_eos(self, engine: "Engine | None" = None) -> Iterator[None]:
        """Decode through EOS for the duration (every run the same length)."""
        engine = engine or self.engine
        scheduler, tokenizer = engine.scheduler, engine.tokenizer
        saved = scheduler.eos, set(tokenizer.eos_token_ids or ())
        scheduler.eos = set()  # the batched path reads it when a request is admitted
        tokenizer.eos_token_ids = set()  # the one-at-a-time path reads the tokenizer's
        try:
            yield
        finally:
            scheduler.eos, tokenizer.eos_token_ids = saved

    def ours(self, ids: list[int], max_tokens: int, *, engine: "Engine | None" = None, **options: Any) -> Run:
        """Generate greedily with mlotspark and time it.

        Args:
            ids: prompt token ids.
            max_tokens: tokens to generate; with 1, TTFT is the wall time of the request.
            engine: another engine (e.g. with the cascade); default the main one.
            **options: more generation options (``cache``, ``cached_tokens``, ``speculative`` ...).
        """
        engine = engine or self.engine
        engine.run_on_engine(mx.reset_peak_memory)
        t0 = time.perf_counter()
        result = engine.submit(prompt_ids=list(ids), max_tokens=max_tokens, temperature=0.0, **options).result()
        wall = time.perf_counter() - t0
        s = result.stats
        ttft = wall if max_tokens == 1 else s.ttft_s + float(s.extra.get("queue_s", 0.0))
        peak = engine.run_on_engine(mx.get_peak_memory) / 1e6
        return Run(ttft, s.decode_tps, s.generation_tokens, peak, dict(s.extra))

    # --------------------------------------------------------------- mlx-lm
    @property
    def twin(self) -> Any:
        """mlx-lm's own model class sharing our weights (``reference.mlx_lm_twin``)."""
        if self._twin is None:
            from mlotspark.models.mlx_lm_twin import mlx_lm_twin

            self._twin = mlx_lm_twin(self.engine.loaded)
        return self._twin

    @property
    def ref_tokenizer(self) -> Any:
        """Our tokenizer wrapper with no EOS, for mlx-lm (as mlx_lm.benchmark does)."""
        if self._ref_tokenizer is None:
            tok = copy.copy(self.engine.tokenizer)
            tok.eos_token_ids = set()
            self._ref_tokenizer = tok
        return self._ref_tokenizer

    def mlx_lm(self, ids: list[int], max_tokens: int, *, prompt_cache: Callable[[], list] | None = None) -> Run:
        """Generate greedily with mlx-lm's ``stream_generate`` and time it.

        Args:
            ids: prompt token ids (those not yet in the cache).
            max_tokens: tokens to generate.
            prompt_cache: called inside the timed span to get the cache to continue
                from (e.g. loading a saved cache from disk); None = a fresh cache.
        """
        from mlx_lm.generate import stream_generate

        twin, tok = self.twin, self.ref_tokenizer

        def go() -> Run:
            mx.reset_peak_memory()
            t0 = time.perf_counter()
            cache = prompt_cache() if prompt_cache is not None else None
            first = last = t0
            n = 0
            for _ in stream_generate(twin, tok, list(ids), max_tokens=max_tokens, prompt_cache=cache):
                last = time.perf_counter()
                if n == 0:
                    first = last
                n += 1
            tps = (n - 1) / (last - first) if n > 1 and last > first else 0.0
            return Run(first - t0, tps, n, mx.get_peak_memory() / 1e6)

        return self.run_mlx_lm(go)

    def run_mlx_lm(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the engine thread, noting in ``mlx_lm_threads`` the OpenBLAS
        thread count in force (our engine's fitted count: the process shares one OpenBLAS).

        Every mlx-lm call of a suite goes through here.
        """
        from mlotspark.platform.blas import fitted_threads

        def go() -> Any:
            self.mlx_lm_threads.add(fitted_threads())
            return fn(*args)

        return self.engine.run_on_engine(go)

    def mlx_lm_prefilled(self, ids: list[int]) -> list:
        """An mlx-lm prompt cache holding ``ids`` (untimed setup for warm / restored cases)."""
        from mlx_lm.models.cache import make_prompt_cache

        twin = self.twin

        def go() -> list:
            cache = make_prompt_cache(twin)
            step = 512
            for i in range(0, len(ids), step):
                twin(mx.array(ids[i : i + step])[None], cache=cache)
                mx.eval([c.state for c in cache])
            return cache

        return self.run_mlx_lm(go)

    # ------------------------------------------------------------ repetition
    def measure(
        self,
        label: str,
        ours: Callable[[], Metrics],
        ref: Callable[[], Metrics] | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """Warm up, then run both sides ``repetitions`` times, interleaved.

        The order alternates (ours first on even repetitions, mlx-lm first on odd)
        so that a machine drifting during the run favours neither side.

        Args:
            label: what the progress bar shows.
            ours: one mlotspark repetition -> metrics by name.
            ref: one mlx-lm repetition -> metrics by name (None: not compared).

        Returns:
            (ours, mlx-lm): metric name -> value per repetition.
        """
        mine: dict[str, list[float]] = defaultdict(list)
        theirs: dict[str, list[float]] = defaultdict(list)
        sides = [("mlotspark", ours, mine), ("mlx-lm", ref, theirs)]
        for _ in range(self.config.warmup):
            for who, fn, _out in sides:
                if fn is not None:
                    self.progress.show(f"{label} {who} warm-up")
                    fn()
            self.progress.step()
        reps = self.config.repetitions
        for rep in range(reps):
            for who, fn, out in sides if rep % 2 == 0 else sides[::-1]:
                if fn is None:
                    continue
                self.progress.show(f"{label} {who} {rep + 1}/{reps}")
                for key, value in fn().items():
                    out[key].append(float(value))
            self.progress.step()
        return dict(mine), dict(theirs)


def figure(
    suite: str, case: str, metric: str, unit: str, higher_is_better: bool,
    mine: dict[str, list[float]], theirs: dict[str, list[float]] | None = None,
    key: str | None = None, notes: str = "",
) -> Figure:
    """A Figure from ``measure`` results (``key`` defaults to ``metric``)."""
    key = key or metric
    return Figure(suite, case, metric, unit, higher_is_better, list(mine.get(key, [])),
                  list((theirs or {}).get(key, [])), notes)


__all__ = ["BenchContext", "Run", "SuiteUnavailable", "figure"]
