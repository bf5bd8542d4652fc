"""``ruler``: RULER-style long-context accuracy through the cascade, sinks + window, and full attention.

Tasks (the suite's cases) and haystacks: ``bench/ruler.py``. For each length in
``--contexts`` and each task, ``-r`` cases with needles at evenly spread depths
(seeded by ``--seed``) are answered greedily (at most ``ANSWER_TOKENS[task]``) in three
modes: ``cascade`` (``CascadeConfig.for_model`` of the model's context),
``streaming`` (the same with top_k 0: sinks + window only) and ``full`` (plain KV
cache; only where prompt + answer fit the model's trained context). A figure is
the score per case, in percent (share of expected answers in the reply). It
measures accuracy, not speed: warm-up runs are skipped and ``--compare`` has no
mlx-lm counterpart here.
"""

from __future__ import annotations

from typing import Any

from mlotspark.bench.context import BenchContext
from mlotspark.bench.figures import Figure
from mlotspark.bench.ruler import ANSWER_TOKENS, TASKS, depths, make_case

CASES = TASKS
DESCRIPTION = "long-context accuracy (RULER-style needles in Python's docs): cascade vs sinks+window vs full attention"
MODES = ("cascade", "streaming", "full")


def _tasks(cases: tuple[str, ...]) -> tuple[str, ...]:
    return cases or CASES


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return len(_tasks(cases)) * len(ctx.config.contexts) * ctx.config.repetitions


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    return None


def _answer(engine: Any, ids: list[int], mode: str, config: Any, max_tokens: int) -> str:
    """Greedy reply through a cache of ``mode`` (runs on the engine thread)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache

    model = engine.loaded.model
    if mode == "full":
        cache = model.make_cache()
    else:
        cfg = config if mode == "cascade" else CascadeConfig(**{**config.to_dict(), "top_k": 0})
        cache = make_cascade_cache(model, cfg)
    eos = set(engine.tokenizer.eos_token_ids or ())
    out = []
    for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens, prompt_cache=cache, prefill_step_size=512):
        if t in eos:
            break
        out.append(t)
    return engine.tokenizer.decode(out)


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    from mlotspark.memory.cascade import CascadeConfig

    engine = ctx.engine
    config = CascadeConfig.for_model(ctx.context_length)
    trials = ctx.config.repetitions
    out: list[Figure] = []
    for length in ctx.config.contexts:
        for task in _tasks(cases):
            scores: dict[str, list[float]] = {m: [] for m in MODES}
            for i, depth in enumerate(depths(trials)):
                case = make_case(task, length, depth, seed=ctx.config.seed * 100003 + length + i,
                                 count_tokens=lambda text: len(engine.encode(text)))
                ids = engine.encode(case.text)
                for mode in MODES:
                    if mode == "full" and len(ids) + ANSWER_TOKENS[task] > ctx.context_length:
                        continue
                    reply = engine.run_on_engine(_answer, engine, ids, mode, config, ANSWER_TOKENS[task])
                    scores[mode].append(100.0 * case.score(reply))
                ctx.progress.step(f"ruler {task} {length}")
            for mode, values in scores.items():
                if not values:  # full attention beyond the model's context: no figure
                    continue
                note = (f"window {config.window}, sinks {config.sinks}, top-k {config.top_k} x {config.block_size}"
                        if mode != "full" else "plain KV cache")
                out.append(Figure("ruler", f"{task} {mode} {length}", "score", "%", True, values, notes=note))
    return out
