"""``ruler``: RULER-style long-context accuracy through the cascade, sinks + window, and full attention.

Tasks (the suite's cases) and haystacks: ``bench/ruler.py``. For each length in
``--contexts`` and each task, ``-r`` cases with needles at evenly spread depths
(seeded by ``--seed``) are answered greedily (at most ``ANSWER_TOKENS[task]``) in three
modes: ``cascade`` (``CascadeConfig.for_model`` of the model's context),
``streaming`` (the same with top_k 0: sinks + window only) and ``full`` (plain KV
cache; only where prompt + answer fit the model's trained context). A figure is
the score per case, in percent (share of expected answers in the reply). It
measures accuracy, not speed: warm-up runs are skipped and ``--compare`` has no
mlx-lm counterpart here. Every case runs through the engine as a user's request does
(``bench.ruler.answer``: the engine's prefill chunks and the cascade's question pass).
"""

from __future__ import annotations


from mlotspark.bench.context import BenchContext, SuiteUnavailable
from mlotspark.bench.figures import Figure
from mlotspark.bench.ruler import ANSWER_TOKENS, MODES, TASKS, answer, depths, make_case

CASES = TASKS
DESCRIPTION = "long-context accuracy (RULER-style needles in Python's docs): cascade vs sinks+window vs full attention"


def _tasks(cases: tuple[str, ...]) -> tuple[str, ...]:
    return cases or CASES


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return len(_tasks(cases)) * len(ctx.config.contexts) * ctx.config.repetitions


def _fits(ctx: BenchContext, length: int, task: str) -> bool:
    """Whether full attention can answer ``task`` at ``length`` tokens (prompt + answer within the context)."""
    return length + ANSWER_TOKENS[task] <= ctx.context_length


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    if ctx.cascade_here and not any(_fits(ctx, n, t) for n in ctx.config.contexts for t in _tasks(cases)):
        raise SuiteUnavailable(f"ruler: {ctx.cascade_here}, and full attention needs lengths within the "
                               f"model's context of {ctx.context_length} tokens")


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    from mlotspark.memory.cascade import CascadeConfig

    engine = ctx.engine
    config = CascadeConfig.for_model(ctx.context_length)
    trials = ctx.config.repetitions
    modes = ("full",) if ctx.cascade_here else MODES
    if ctx.cascade_here:  # full attention's cells still run
        ctx.not_run("ruler", f"ruler cascade and sinks + window: {ctx.cascade_here}")
    out: list[Figure] = []
    for length in ctx.config.contexts:
        for task in _tasks(cases):
            if not _fits(ctx, length, task):
                ctx.not_run("ruler", f"ruler {task} full {length}: full attention needs prompt + answer within "
                                     f"the model's context of {ctx.context_length} tokens")
                if ctx.cascade_here:
                    for _ in range(trials):
                        ctx.progress.step(f"ruler {task} {length}: not run")
                    continue
            scores: dict[str, list[float]] = {m: [] for m in modes}
            passes: dict[str, int] = {m: 0 for m in modes}  # requests whose question pass ran
            for i, depth in enumerate(depths(trials)):
                case = make_case(task, length, depth, seed=ctx.config.seed * 100003 + length + i,
                                 count_tokens=lambda text: len(engine.encode(text)))
                ids = engine.encode(case.text)
                for mode in modes:
                    if mode == "full" and len(ids) + ANSWER_TOKENS[task] > ctx.context_length:
                        continue
                    result = answer(engine, ids, mode, config, ANSWER_TOKENS[task])
                    scores[mode].append(100.0 * case.score(result.text))
                    passes[mode] += bool(result.stats.extra.get("cascade", {}).get("question_passes"))
                ctx.progress.step(f"ruler {task} {length}")
            for mode, values in scores.items():
                if not values:  # full attention beyond the model's context: no figure
                    if _fits(ctx, length, task):  # its prompt came out longer than the length asked
                        ctx.not_run("ruler", f"ruler {task} full {length}: full attention needs prompt + answer within "
                                             f"the model's context of {ctx.context_length} tokens (every "
                                             "case's prompt came out longer)")
                    continue
                top_k = config.top_k if mode == "cascade" else 0  # streaming: sinks + window only
                note = (f"window {config.window}, sinks {config.sinks}, top-k {top_k} x {config.block_size}"
                        + (f"; question pass in {passes[mode]}/{len(values)}" if mode == "cascade" else "")
                        if mode != "full" else "plain KV cache")
                out.append(Figure("ruler", f"{task} {mode} {length}", "score", "%", True, values, notes=note))
    return out
