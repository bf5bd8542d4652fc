"""``long``: prefill, decode and peak memory vs context length, with and without the cascade.

For each context length (``--contexts``, default 1024,2048,4096) the prompt is that
many random tokens, then ``-g`` tokens are decoded (EOS ignored); prefill tok/s is the
prompt's tokens over the request's time to first token (queue and first step included,
as a user waits for it). Cases:

- ``full``: full attention, the main engine; lengths beyond the model's context
  cannot run and are skipped;
- ``cascade``: the same engine with the memory cascade always on
  (``engine.caches.cascade = CascadeConfig.for_model(context)``, what ``Engine.load(model,
  cascade=...)`` sets): no second copy of the weights, so each row's peak memory holds
  one model, as a user's process does.

Both run in the same repetition, alternating which goes first. With
``--compare mlx-lm`` each row's ratio is against mlx-lm's full attention at that length.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

from mlotspark.errors import OptionError
from mlotspark.bench.context import BenchContext, SuiteUnavailable, figure
from mlotspark.bench.figures import Figure

CASES = ("full", "cascade")
DESCRIPTION = "prefill tok/s, decode ms/token and peak memory vs context length, full attention vs the cascade"


def _cases(cases: tuple[str, ...]) -> tuple[str, ...]:
    return cases or CASES


def cascade_supported() -> bool:
    """Whether ``Engine.load`` takes a ``cascade=CascadeConfig(...)``."""
    from mlotspark.engine import Engine

    return "cascade" in inspect.signature(Engine.load).parameters


def _fits(ctx: BenchContext, length: int) -> bool:
    return length + ctx.config.gen_tokens < ctx.context_length


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return ctx.rounds * len(ctx.config.contexts)


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    chosen = _cases(cases)
    if chosen == ("cascade",) and ctx.cascade_here:
        raise SuiteUnavailable(f"long:cascade: {ctx.cascade_here}; --suite long:full measures full attention alone")
    if "cascade" in chosen and not cascade_supported():
        raise SuiteUnavailable(
            "long needs the memory cascade in the engine (Engine.load(model, cascade=CascadeConfig(...))), "
            "which this build does not have yet; --suite long:full measures full attention alone"
        )
    if chosen == ("full",) and not any(_fits(ctx, n) for n in ctx.config.contexts):
        raise OptionError(
            f"invalid --contexts {','.join(map(str, ctx.config.contexts))}: with -g {ctx.config.gen_tokens} "
            f"none fits the model's context of {ctx.context_length} tokens without the cascade"
        )


@contextlib.contextmanager
def _cascade_setting(engine: Any, setting: Any) -> Iterator[None]:
    """``engine.caches.cascade = setting`` for the duration (None: full attention), then the old one."""
    saved = engine.caches.cascade
    engine.caches.cascade = setting
    try:
        yield
    finally:
        engine.caches.cascade = saved


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    chosen = _cases(cases)
    g = ctx.config.gen_tokens
    cascade = None
    if "cascade" in chosen and ctx.cascade_here:  # full attention's rows still run
        ctx.not_run("long", f"long cascade: {ctx.cascade_here}")
    elif "cascade" in chosen:
        from mlotspark.memory.cascade import CascadeConfig

        cascade = CascadeConfig.for_model(ctx.context_length)
    out: list[Figure] = []
    for length in ctx.config.contexts:
        ids = ctx.random_ids(length)
        full = "full" in chosen and _fits(ctx, length)
        if not full and cascade is None:
            ctx.not_run("long", f"long {length}: full attention needs prompt + {g} tokens within the model's "
                                f"context of {ctx.context_length}, and only the cascade goes past it")
            for _ in range(ctx.rounds):
                ctx.progress.step(f"long {length}: beyond the context")
            continue
        variants = ([("full", None)] if full else []) + ([("cascade", cascade)] if cascade else [])
        turn = [0]

        def ours() -> dict[str, float]:
            metrics: dict[str, float] = {}
            turn[0] += 1
            for name, setting in variants if turn[0] % 2 else variants[::-1]:
                with ctx.ignoring_eos(), _cascade_setting(ctx.engine, setting):
                    r = ctx.ours(ids, g)
                metrics[f"{name} prefill"] = length / r.ttft_s if r.ttft_s else float("nan")
                metrics[f"{name} decode"] = 1000 / r.decode_tps if r.decode_tps else float("nan")
                metrics[f"{name} peak"] = r.peak_mb
            return metrics

        def ref() -> dict[str, float]:
            r = ctx.mlx_lm(ids, g)
            ms = 1000 / r.decode_tps if r.decode_tps else float("nan")
            tps = length / r.ttft_s if r.ttft_s else float("nan")
            return ({f"{name} prefill": tps for name, _ in variants} | {f"{name} decode": ms for name, _ in variants}
                    | {f"{name} peak": r.peak_mb for name, _ in variants})

        compared = ctx.compare and _fits(ctx, length)
        mine, theirs = ctx.measure(f"long {length}", ours, ref if compared else None)
        for name, _ in variants:
            note = "" if full or name == "full" else f"full attention: beyond the model's context ({ctx.context_length})"
            out.append(figure("long", f"{name} {length}", "prefill", "tok/s", True, mine, theirs,
                              key=f"{name} prefill",
                              notes="; ".join(n for n in ("prompt tokens / time to first token", note) if n)))
            out.append(figure("long", f"{name} {length}", "decode", "ms/token", False, mine, theirs,
                              key=f"{name} decode", notes=note))
            out.append(figure("long", f"{name} {length}", "peak memory", "MB", False, mine, theirs,
                              key=f"{name} peak"))
    return out
