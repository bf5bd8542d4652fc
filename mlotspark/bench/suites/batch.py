"""``batch``: aggregate tok/s vs batch size, with the thermal governor's decisions.

For each batch size B (``--batch-sizes``, default 1,2,4,8) B requests of 32 random
prompt tokens are submitted at once and each decodes ``-g`` tokens (EOS ignored).
Aggregate speed = all generated tokens / wall time from the first submit to the last
result (prefill included). The notes give the mean batch the scheduler actually ran
and the governor's state, cap and reason at the end. mlx-lm: ``batch_generate`` on
the same prompts, timed the same way.
"""

from __future__ import annotations

import statistics
import time

from mlotspark.bench.context import BenchContext, SuiteUnavailable, figure
from mlotspark.bench.figures import Figure

CASES: tuple[str, ...] = ()
DESCRIPTION = "aggregate tok/s vs batch size, with the governor's decisions"
PROMPT_TOKENS = 32


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return ctx.rounds * len(ctx.config.batch_sizes)


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    if not hasattr(ctx.engine, "status"):
        raise SuiteUnavailable("batch needs the scheduler's continuous batching (Engine.status), "
                               "which this build does not have")
    if not ctx.engine.status().get("batching", True):
        raise SuiteUnavailable(f"batch: {ctx.engine.model_name} runs on mlx-lm's own model class, "
                               "which the scheduler decodes one request at a time")


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    engine, g = ctx.engine, ctx.config.gen_tokens
    out: list[Figure] = []
    for b in ctx.config.batch_sizes:
        prompts = [ctx.random_ids(PROMPT_TOKENS) for _ in range(b)]
        seen: dict[str, object] = {}

        def ours() -> dict[str, float]:
            with ctx.ignoring_eos():
                t0 = time.perf_counter()
                handles = [engine.submit(prompt_ids=p, max_tokens=g, temperature=0.0) for p in prompts]
                results = [h.result() for h in handles]
                wall = time.perf_counter() - t0
            seen.update(engine.status())
            tokens = sum(r.stats.generation_tokens for r in results)
            mean_batch = statistics.mean(float(r.stats.extra.get("mean_batch", 1.0)) for r in results)
            return {"aggregate": tokens / wall, "mean batch": mean_batch}

        def ref() -> dict[str, float]:
            from mlx_lm.generate import batch_generate

            twin, tok = ctx.twin, ctx.ref_tokenizer

            def go() -> dict[str, float]:
                t0 = time.perf_counter()
                response = batch_generate(twin, tok, prompts, max_tokens=g, return_token_ids=True)
                wall = time.perf_counter() - t0
                return {"aggregate": sum(len(t) for t in response.token_ids) / wall}

            return ctx.run_mlx_lm(go)

        mine, theirs = ctx.measure(f"batch {b}", ours, ref if ctx.compare else None)
        mean_batch = statistics.median(mine.get("mean batch", [1.0]))
        notes = (f"{b} x ({PROMPT_TOKENS} prompt + {g} generated); mean batch run {mean_batch:.1f}; "
                 f"governor {seen.get('state')} cap {seen.get('cap')} ({seen.get('mode')}): {seen.get('reason')}")
        out.append(figure("batch", f"batch {b}", "aggregate", "tok/s", True, mine, theirs, notes=notes))
    return out
